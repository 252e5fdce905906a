"""Which host names are this machine's own: the rule of docs/http.md, "Host check".

The HTTP listener's Host check (with no credential configured) and the webhook scaler's
"plain http to another host" warning use the same rule, so that a name one accepts as loopback
the other does not call foreign.
"""

from __future__ import annotations

import ipaddress

__all__ = ["loopback_host", "loopback_name"]


def loopback_name(name: str) -> bool:
    """`localhost`, a name ending in `.localhost`, or a loopback IP literal (all of
    127.0.0.0/8, ::1); case-insensitive, trailing dots ignored, IPv6 with or without brackets."""
    name = name.rstrip(".").lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def loopback_host(host: str) -> bool:
    """A `Host` header (or HTTP/2 `:authority`) naming a loopback host, with or without a
    `:port`; for `[v6]:port` the part in brackets counts."""
    host = host.strip()
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            return False
        name, rest = host[1:end], host[end + 1 :]
    elif host.count(":") > 1:  # a bare IPv6 literal: no port to take off
        name, rest = host, ""
    else:
        name, sep, port = host.partition(":")
        rest = sep + port
    if rest and not (rest[0] == ":" and rest[1:].isdigit() and rest[1:].isascii()):
        return False
    return bool(name) and loopback_name(name)
