"""Telling HTTP/2 from HTTP/1.1 by a connection's first bytes, as the HTTP listener (for a
misdirected gRPC client) and the gRPC-Web front (to relay native gRPC) both must."""

HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def preface_pending(head: bytes) -> bool:
    """Could more bytes still make `head` the HTTP/2 connection preface?"""
    return len(head) < len(HTTP2_PREFACE) and HTTP2_PREFACE.startswith(head)
