"""Ports for processes that must be told theirs in advance (shards naming each other, a server
kept on its port across restarts, a PostgreSQL cluster)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Linux's default ephemeral range, for a kernel that does not say its own.
_EPHEMERAL_LOW = 32768
_LOWEST = 10000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_LOW


def free_ports(n: int) -> list[int]:
    """`n` different ports, each as `free_port` picks one."""
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return sorted(ports)


def free_port() -> int:
    """A loopback TCP port nobody listens on now, drawn below the kernel's ephemeral range: a
    port that `bind(0)` hands out is one any outgoing connection may take as its source port
    before the process told of it binds, which happened to a shard's server when the suites
    ran side by side. (SO_REUSEADDR lets a server bind it again while old connections are in
    TIME_WAIT.)"""
    top = max(_ephemeral_low(), _LOWEST + 1000)
    for _ in range(1000):
        port = random.randrange(_LOWEST, top)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port between {_LOWEST} and {top}")
