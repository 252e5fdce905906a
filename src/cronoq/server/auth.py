"""Authentication and authorization: who is calling, and may they call this.

The rules are those of docs/server.md, "Authentication". `Authenticator` turns a call's credentials
into a `Principal` without knowing the transport, so the gRPC interceptor here and an HTTP listener
resolve callers the same way; `allowed` is the role table by gRPC method path, which HTTP routes can
name too.

`AuthInterceptor` does steps 1 and 2 of docs/server-api.md, "Check order" (authenticate, check the
role) before any other interceptor, in particular before the app's readiness gate, so a standby
tells an unauthenticated caller UNAUTHENTICATED rather than UNAVAILABLE. It leaves the principal in
a context variable for the servicers, which scope what they do by its pools, labels and tenant
(`current_principal()`). grpc.aio awaits the interceptor and then runs the handler, whatever its
kind, in the call's own task, so a value set there is the call's and no other's. Without the
interceptor (auth disabled) the variable's default is the unrestricted admin.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeAlias

import grpc

from .config import AuthSettings, Grant
from .errors import Refused, refusal

__all__ = [
    "ADMIN",
    "AuthInterceptor",
    "Authenticator",
    "Principal",
    "Unauthenticated",
    "allowed",
    "current_principal",
    "denial",
    "use_principal",
]

Context = grpc.aio.ServicerContext[Any, Any]
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # generic only in the stubs

_TASKS = "/cronoq.v1.Tasks/"
_ADMIN = "/cronoq.v1.Admin/"
# The role table of docs/server.md, "Authentication", by method path; `admin` may call
# everything, so it is not listed.
_ROLES: dict[str, frozenset[str]] = {
    **{
        _TASKS + m: frozenset({"client"})
        for m in ("Submit", "SubmitBatch", "Cancel", "Get", "ListTasks", "Wait", "Watch")
    },
    "/cronoq.v1.Workers/Work": frozenset({"worker"}),
    **{_ADMIN + m: frozenset({"metrics"}) for m in ("Snapshot", "ListWorkers", "ListRecurring")},
    # Operations: PausePool, ResumePool and BulkTasks are the admin's alone.
    "/cronoq.v1.Operations/SearchTasks": frozenset({"client"}),
}


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller (docs/server.md, "Authentication"): a role, narrowed to pools (None: all),
    worker labels (None: any) and a tenant (None: the caller names it). `bearer` is the token
    presented, kept for the call only so that a shard can forward it."""

    role: str
    pools: frozenset[str] | None = None
    labels: frozenset[tuple[str, str]] | None = None
    tenant: str | None = None
    bearer: str | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def of(cls, grant: Grant) -> Principal:
        return cls(
            grant.role,
            None if grant.pools is None else frozenset(grant.pools),
            None if grant.labels is None else frozenset(grant.labels),
            grant.tenant,
        )

    def sees(self, pool: str) -> bool:
        """May this caller see and use `pool`? Other pools' tasks do not exist for it."""
        return self.pools is None or pool in self.pools

    def may_claim(self, labels: Mapping[str, str]) -> bool:
        """May a worker with this credential register with these labels?"""
        return self.labels is None or all(item in self.labels for item in labels.items())


ADMIN = Principal("admin")  # everyone, when no credential is configured

# Each refusal starts with the published server's words, which clients may match, and then
# says how to present a credential.
_HOW = (
    "pass a token with --token or CRONOQ_TOKEN (cronoq), token= (cronoq.client) or an "
    '"authorization: Bearer <token>" header'
)
_MISSING = f"missing credentials (bearer token or client certificate); {_HOW}"

_current: ContextVar[Principal] = ContextVar("cronoq_principal", default=ADMIN)


def current_principal() -> Principal:
    """The caller of the call being served."""
    return _current.get()


def use_principal(principal: Principal) -> None:
    """Make `principal` the caller for the rest of the current task (one call)."""
    _current.set(principal)


def allowed(principal: Principal, method: str) -> bool:
    """The role check (docs/server.md, "Authentication") for a gRPC method path such as
    `/cronoq.v1.Tasks/Get`. Paths outside the table, unknown methods included, are the admin's
    alone."""
    return principal.role == "admin" or principal.role in _ROLES.get(method, ())


def denial(principal: Principal, method: str) -> str:
    """The PERMISSION_DENIED text when `allowed` said no: the roles `method` needs and the
    one the caller has, so that the fix (another token) is plain."""
    needed = " or ".join(f'"{role}"' for role in (*sorted(_ROLES.get(method, ())), "admin"))
    return (
        f"credentials lack the required role: this call needs role {needed}, these "
        f'credentials have role "{principal.role}"; {_HOW}'
    )


def certificate_dns_names(peercert: Mapping[str, Any] | None) -> list[str]:
    """The DNS subject alternative names of a peer certificate as `ssl.getpeercert()` gives it
    (None without one): what `[[auth.certs]]` entries match, never IP or URI SANs."""
    return [value for kind, value in (peercert or {}).get("subjectAltName", ()) if kind == "DNS"]


class Unauthenticated(Exception):
    """No credential, or one that is not configured: UNAUTHENTICATED (gRPC), 401 (HTTP)."""


class Authenticator:
    """Resolves credentials against `[auth]` (docs/server.md, "Authentication"). Only token
    digests are held."""

    def __init__(self, auth: AuthSettings) -> None:
        self.enabled = auth.enabled
        self.uses_certs = bool(auth.certs)
        self._tokens = tuple((t.digest, Principal.of(t.grant)) for t in auth.tokens)
        self._certs = tuple((c.dns_name.casefold(), Principal.of(c.grant)) for c in auth.certs)

    def authenticate(
        self, authorization_header: str | None, cert_dns_names: Sequence[str]
    ) -> Principal:
        """The caller, from its `authorization` header or else its client certificate's DNS
        names. A header decides alone: a wrong one is not rescued by a certificate."""
        if not self.enabled:
            return ADMIN
        if authorization_header is not None:
            return self._bearer(authorization_header)
        names = {n.casefold() for n in cert_dns_names}
        for dns, principal in self._certs:
            if dns in names:
                return principal
        if names:
            raise Unauthenticated(f"the client certificate is not mapped to a role; {_HOW}")
        raise Unauthenticated(_MISSING)

    def _bearer(self, header: str) -> Principal:
        # `Bearer <token>`, the scheme in any case and blanks around the token ignored, as the
        # published server reads it (docs/server.md, "Authentication"); any other scheme
        # counts as no credentials at all.
        scheme, _, token = header.strip().partition(" ")
        token = token.strip()
        if scheme.casefold() != "bearer" or not token:
            raise Unauthenticated(_MISSING)
        digest = hashlib.sha256(token.encode()).digest()
        # Every digest is compared, in constant time, so the time taken tells nothing about
        # which token (if any) matched or how much of it.
        found: Principal | None = None
        for known, principal in self._tokens:
            if hmac.compare_digest(digest, known):
                found = principal
        if found is None:
            raise Unauthenticated(f"invalid token: the server knows no such token; {_HOW}")
        return dataclasses.replace(found, bearer=token)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Authenticate and check the role of every call, then set its principal.

    A bearer token is in the call's metadata, so it is checked here, before the handler is
    even chosen. A client certificate is only visible in the servicer context: then the
    handler is wrapped so that the check runs first when the call starts, still ahead of
    whatever the readiness gate chose for it.
    """

    def __init__(self, authenticator: Authenticator) -> None:
        self._auth = authenticator

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        method: str = handler_call_details.method
        header = _authorization(handler_call_details.invocation_metadata)
        if header is None and self._auth.uses_certs:
            handler = await continuation(handler_call_details)
            if handler is None:
                handler = refusal(grpc.StatusCode.UNIMPLEMENTED, f"unknown method {method}")
            return _checked_first(handler, self._by_certificate(method))
        try:
            use_principal(self._admit(header, (), method))
        except Refused as denied:
            return refusal(denied.code, denied.message)
        return await continuation(handler_call_details)

    def _admit(self, header: str | None, names: Sequence[str], method: str) -> Principal:
        try:
            principal = self._auth.authenticate(header, names)
        except Unauthenticated as e:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, str(e)) from None
        if not allowed(principal, method):
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, denial(principal, method))
        return principal

    def _by_certificate(self, method: str) -> Callable[[Context], Awaitable[None]]:
        async def check(context: Context) -> None:
            # `peer_dns` holds the DNS SANs only; `x509_subject_alternative_name` mixes in IP,
            # URI and e-mail SANs, which must not match a `dns_name` entry.
            names = [n.decode() for n in context.auth_context().get("peer_dns", ())]
            try:
                use_principal(self._admit(None, names, method))
            except Refused as denied:
                await context.abort(denied.code, denied.message)

        return check


def _authorization(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode(errors="replace")
    return None


def _checked_first(handler: Handler, check: Callable[[Context], Awaitable[None]]) -> Handler:
    """`handler` with `check(context)` awaited before its behavior runs. grpc.aio tells a
    coroutine behavior from an async generator by its function, so the wrapper is the same."""
    kind = ("stream" if handler.request_streaming else "unary") + (
        "_stream" if handler.response_streaming else "_unary"
    )
    behavior: Any = getattr(handler, kind)
    wrapped: Callable[..., Any]
    if inspect.isasyncgenfunction(behavior):

        async def generate(request: Any, context: Context) -> AsyncIterator[Any]:
            await check(context)
            async with contextlib.aclosing(behavior(request, context)) as responses:
                async for response in responses:
                    yield response

        wrapped = generate
    else:

        async def call(request: Any, context: Context) -> Any:
            await check(context)
            return await behavior(request, context)

        wrapped = call
    make: Any = getattr(grpc, f"{kind}_rpc_method_handler")
    result: Handler = make(
        wrapped,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
    return result
