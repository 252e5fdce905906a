"""Two App objects: `cronoq worker two_apps` (no :APP) cannot choose."""

from __future__ import annotations

import cronoq

one = cronoq.App("one")
two = cronoq.App("two")
