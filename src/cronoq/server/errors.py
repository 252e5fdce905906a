"""The server's one "end this call with that status" error, shared by auth, tasks and work."""

from __future__ import annotations

import grpc

__all__ = ["Refused"]


class Refused(Exception):
    """An RPC ends with this status code (not found, deadline, unavailable, denied...)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
