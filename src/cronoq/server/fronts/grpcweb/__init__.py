"""gRPC-Web on the gRPC port (docs/grpc-web.md): `framing` (frames, text mode, trailers,
CORS headers), `tls` (the ClientHello, TLS ended here), `http1` (requests and answers), `relay`
(native gRPC to grpcio) and `front` (`GrpcWebFront`, the listener that serves it).

grpcio cannot answer HTTP/1.1, so with `[server.grpc_web]` the app binds grpcio on an internal
loopback port and `GrpcWebFront` owns the public one: a connection that opens with the HTTP/2
preface is relayed byte for byte to grpcio (native gRPC, unchanged), any other is read as
HTTP/1.1 gRPC-Web and answered here by calling the very handlers the registrars gave grpcio,
through the app's own interceptor chain (authentication, roles, readiness, request timeout,
decoding), so both paths refuse and answer alike.

With `[server.tls]` (docs/grpc-web.md, "TLS") grpcio's internal port has the same TLS, and the
front reads each connection's ClientHello first: a client offering only `h2` is relayed as it
came (its TLS is grpcio's); one offering `http/1.1`, or no ALPN, gets its TLS ended here
(`tls.TlsEnd`) and HTTP/1.1 gRPC-Web, its client certificate reaching the interceptors as grpcio's
`auth_context` would give it.
"""

from .framing import (
    ALLOW_HEADERS,
    EXPOSE_HEADERS,
    MESSAGE,
    TRAILER,
    answer_type,
    cors_headers,
    frame,
    grpc_web_mode,
    origin_key,
    split_frames,
    text_chunk,
    trailer_frame,
)
from .front import NOT_BIDI, NOT_GRPC_WEB, GrpcWebFront
from .tls import client_hello_alpn

__all__ = [
    "ALLOW_HEADERS",
    "EXPOSE_HEADERS",
    "MESSAGE",
    "NOT_BIDI",
    "NOT_GRPC_WEB",
    "TRAILER",
    "GrpcWebFront",
    "answer_type",
    "client_hello_alpn",
    "cors_headers",
    "frame",
    "grpc_web_mode",
    "origin_key",
    "split_frames",
    "text_chunk",
    "trailer_frame",
]
