"""`cronoq-server` for the browser tests of the charts: `python dash_server_child.py STEP -c
CONFIG` runs the server's command line with its history sampled every STEP seconds instead of
every 10, so that a test sees several points within seconds (the points kept stay 360)."""

from __future__ import annotations

import functools
import sys

from cronoq.server import app, cli
from cronoq.server.history import History

if __name__ == "__main__":
    app.History = functools.partial(History, step=float(sys.argv.pop(1)))
    sys.exit(cli.main())
