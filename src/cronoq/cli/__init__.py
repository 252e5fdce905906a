"""The `cronoq` command line: submit and inspect tasks, and watch a server with `cronoq top`.

Installed with the `client` extra (docs/cli.md). Without grpc, click or rich the command says
how to install them instead of failing with a traceback.
"""

from __future__ import annotations

import sys

__all__ = ["main"]

_EXTRA_MODULES = ("grpc", "google", "click", "rich")


def main() -> None:
    """Entry point of the `cronoq` script and of `python -m cronoq.cli`."""
    try:
        from ._commands import run
    except ImportError as e:
        if not _missing_extra(e):
            raise
        print(
            "cronoq: error: the command line needs the client extra: pip install 'cronoq[client]'",
            file=sys.stderr,
        )
        sys.exit(2)
    sys.exit(run())


def _missing_extra(error: BaseException | None) -> bool:
    """Whether an ImportError (or the one it was raised from) is about a client dependency."""
    while error is not None:
        name = getattr(error, "name", None) or ""
        if name.split(".")[0] in _EXTRA_MODULES:
            return True
        error = error.__cause__
    return False
