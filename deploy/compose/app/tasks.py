"""The example application of deploy/compose: one task, served by `cronoq worker tasks:app`.

Submit it from the host (the client token is compose.yaml's default):

    cd deploy/compose/app && python - <<'PY'
    import asyncio
    from tasks import add, app

    async def main() -> None:
        token = "dev-client-token-change-me-0123456789"
        async with app.connect("http://127.0.0.1:7070", token=token):
            print(await (await add.submit(2, 3)).result(timeout=30))

    asyncio.run(main())
    PY
"""

from __future__ import annotations

import cronoq

app = cronoq.App("compose-example")


@app.task(pool="default")
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b
