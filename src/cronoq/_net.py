"""Which hosts a bearer token may reach over plain http: shard redirects followed by workers
(docs/worker.md) and calls forwarded between shards (docs/sharding.md, "Forwarding") share one
rule, so that a server forwards a token only where its own workers would send it."""

from __future__ import annotations

import ipaddress

__all__ = ["loopback"]


def loopback(host: str) -> bool:
    """`localhost` or a loopback IP literal (127.0.0.0/8, ::1), as a URL's host parses; other
    names, `*.localhost` included, may resolve anywhere."""
    host = host.lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
