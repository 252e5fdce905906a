"""Submit one task to each language from Python and print the typed results:
`python submit.py [TARGET]`, the target defaulting to $CRONOQ_TARGET or http://127.0.0.1:7070.
"""

from __future__ import annotations

import asyncio
import os
import sys

from tasks import add, app, resize


async def main(target: str) -> None:
    async with app.connect(target):
        image = await (await resize.submit("cat.png", 320)).result(timeout=60)  # Go
        total = await (await add.submit(2, 3)).result(timeout=60)  # Python
    print(f"resize -> {type(image).__name__} {image}")
    print(f"add -> {type(total).__name__} {total}")


if __name__ == "__main__":
    default = os.environ.get("CRONOQ_TARGET", "http://127.0.0.1:7070")
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else default))
