"""Refusing a taken listener address before anything binds (docs/server.md, "Connections").

grpcio shares a port by default (it sets SO_REUSEPORT), so a second server on a taken gRPC
address would start and take part of the traffic; the app turns that off (`grpc.so_reuseport`
0). Then grpcio refuses the address, but its C core first prints its own error line on stderr,
outside the server's log format. So `ensure_free` tries each configured address itself first,
with a socket that binds the way the listener will (SO_REUSEADDR on POSIX, as gRPC and aiohttp
both set it, so a port whose old connections linger in TIME_WAIT still counts as free) and is
closed at once, never listening.

The gRPC core's logging is left as it is (GRPC_VERBOSITY is not touched), so its real errors,
an `accept` failing for lack of file descriptors for instance, still reach stderr. Only an
address taken in the instant between this check and gRPC's own bind would still let gRPC print
its line; the start is refused all the same.
"""

from __future__ import annotations

import errno
import os
import socket

from .config import SocketAddress

__all__ = ["ensure_free"]


def ensure_free(address: SocketAddress, *, dual_stack: bool = False) -> None:
    """OSError "cannot listen on <address>: <reason>" if `address` cannot be bound now (taken,
    not an address of this host, a privileged port). Port 0 is always free. `dual_stack`: for
    an IPv6 address, also check the IPv4 side, as gRPC listens on both for `[::]` (aiohttp's
    IPv6 sockets are IPv6 only)."""
    if address.port == 0:
        return
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        if os.name == "posix":  # (on Windows SO_REUSEADDR would let it bind a taken port)
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
        try:
            probe.bind((address.host, address.port))
        except OSError as exc:
            reason = (
                "address already in use"
                if exc.errno == errno.EADDRINUSE
                else (exc.strerror or str(exc)).lower()
            )
            raise OSError(f"cannot listen on {address}: {reason}") from None
