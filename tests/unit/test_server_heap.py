"""The server's heap after it leads: frozen out of full collections, and what an earlier
leadership left collected at the next one (cronoq.server.cli.settle_heap). Run in a child
process: freezing and unfreezing the test process's own heap would change its collections."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import gc
    import weakref

    from cronoq.server.cli import settle_heap

    class Node:
        pass

    node = Node()
    node.me = node  # a cycle, alive when the server leads
    alive = weakref.ref(node)
    settle_heap()
    assert gc.get_freeze_count() > 0
    del node
    gc.collect()
    assert alive() is not None, "a frozen cycle is out of the collections' sight"
    settle_heap()  # the next leadership
    assert alive() is None, "what the earlier leadership left is collected"
    print("ok")
    """
)


def test_settle_heap_freezes_and_the_next_settle_collects_what_was_left() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
