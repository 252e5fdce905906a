"""Task functions: declare work as functions on an `App`, submit it with the functions' own
typed parameters, and run it in-process or on remote workers (docs/app.md).

    app = cronoq.App()

    @app.task
    async def add(a: int, b: int) -> int:
        return a + b

    async with app.local():
        print(await (await add.submit(2, 3)))   # 5
"""

from ._app import *  # noqa: F403 (the names of its __all__, which is this package's)
from ._app import __all__ as __all__
