"""The task functions of the cross-language example.

`add` runs in Python (`cronoq worker tasks:app`); `resize` is only declared here
(`serve=False`), so that Python code can submit it with typed arguments and get a typed
result, and is served by the Go program of this directory (`go run . -serve`).
"""

from __future__ import annotations

import cronoq

app = cronoq.App("crosslang")


@app.task(pool="default")
def add(a: int, b: int) -> int:
    """Served by Python."""
    return a + b


@app.task(pool="images", serve=False)
def resize(path: str, width: int) -> dict[str, object]:
    """Scale the image at `path` to `width` pixels: served by the Go worker (main.go), which
    reads the arguments as {"path": ..., "width": ...} and returns a JSON object."""
    raise NotImplementedError  # never runs here: the Python worker does not serve it
