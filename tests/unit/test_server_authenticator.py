"""cronoq.server.auth without a transport: credential resolution, the role
table, what a principal allows (docs/server.md, "Authentication"), and token hygiene
(docs/configuration.md, "[auth]")."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
from collections.abc import Iterator
from typing import Any

import pytest

from cronoq.server import auth
from cronoq.server.auth import ADMIN, Authenticator, Principal, Unauthenticated, allowed
from cronoq.server.config import AuthSettings, CertSettings, Grant, TokenSettings, load_config

TOKENS = {
    "c": ("client-token-0123456789abcdef", Grant("client", ("a",), None, "t1")),
    "w": ("worker-token-0123456789abcdef", Grant("worker", None, (("gpu", "a100"),))),
    "m": ("metrics-token-0123456789abcdef", Grant("metrics")),
}


def settings(certs: tuple[CertSettings, ...] = ()) -> AuthSettings:
    tokens = tuple(
        TokenSettings(hashlib.sha256(t.encode()).digest(), g) for t, g in TOKENS.values()
    )
    return AuthSettings(tokens, certs)


def bearer(name: str, scheme: str = "Bearer") -> str:
    return f"{scheme} {TOKENS[name][0]}"


def test_a_token_gives_its_grant_and_keeps_the_bearer_out_of_repr() -> None:
    p = Authenticator(settings()).authenticate(bearer("c"), ())
    assert (p.role, p.pools, p.labels, p.tenant) == ("client", frozenset({"a"}), None, "t1")
    assert p.bearer == TOKENS["c"][0] and TOKENS["c"][0] not in repr(p)
    w = Authenticator(settings()).authenticate(bearer("w"), ())
    assert w.labels == frozenset({("gpu", "a100")}) and w.pools is None


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer", "bEaReR"])
def test_the_scheme_in_any_case(scheme: str) -> None:
    assert Authenticator(settings()).authenticate(bearer("m", scheme), ()).role == "metrics"


@pytest.mark.parametrize(
    "header",
    ["", "Bearer", "Bearer ", "Basic " + TOKENS["c"][0], TOKENS["c"][0],
     "Bearer " + TOKENS["c"][0] + "x", "Bearer not-a-configured-token-000"],
)  # fmt: skip
def test_bad_headers_are_unauthenticated(header: str) -> None:
    with pytest.raises(Unauthenticated):
        Authenticator(settings()).authenticate(header, ())


@pytest.mark.parametrize(
    "header",
    ["Bearer " + TOKENS["c"][0] + " ", "Bearer " + TOKENS["c"][0] + "\t",
     "Bearer  " + TOKENS["c"][0], " Bearer " + TOKENS["c"][0]],
)  # fmt: skip
def test_blanks_around_the_token_are_ignored(header: str) -> None:
    # as the published server reads the header (docs/server.md, "Authentication")
    assert Authenticator(settings()).authenticate(header, ()).role == "client"


@pytest.fixture
def compares(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[bytes, bytes]]]:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    yield calls


@pytest.mark.parametrize("header", [bearer("c"), bearer("m"), "Bearer unknown-0123456789abcdef"])
def test_every_digest_is_compared_in_constant_time(
    header: str, compares: list[tuple[bytes, bytes]]
) -> None:
    """No early exit: the first token, the last and none all cost one comparison each."""
    with pytest.raises(Unauthenticated) if "unknown" in header else contextlib.nullcontext():
        Authenticator(settings()).authenticate(header, ())
    digest = hashlib.sha256(header.split()[1].encode()).digest()
    assert [a for a, _ in compares] == [digest] * len(TOKENS)
    assert [b for _, b in compares] == [t.digest for t in settings().tokens]


def test_certificates_by_dns_name() -> None:
    certs = (
        CertSettings("ops.example", Grant("admin", ("a",))),
        CertSettings("Robot.Example", Grant("worker")),
    )
    a = Authenticator(settings(certs))
    assert a.uses_certs
    assert a.authenticate(None, ["x.example", "OPS.example"]).pools == frozenset({"a"})
    assert a.authenticate(None, ["robot.example"]).role == "worker"
    # several names mapped: the first [[auth.certs]] entry wins
    assert a.authenticate(None, ["robot.example", "ops.example"]).role == "admin"
    assert a.authenticate(None, ["ops.example"]).bearer is None  # nothing to forward
    with pytest.raises(Unauthenticated, match="not mapped"):
        a.authenticate(None, ["stranger.example"])
    with pytest.raises(Unauthenticated, match="missing credentials"):
        a.authenticate(None, [])
    # a present header decides alone, even with a mapped certificate
    with pytest.raises(Unauthenticated):
        a.authenticate("Bearer unknown-0123456789abcdef", ["ops.example"])
    assert a.authenticate(bearer("m"), ["ops.example"]).role == "metrics"


def test_without_credentials_everyone_is_the_unrestricted_admin() -> None:
    a = Authenticator(AuthSettings())
    assert not a.enabled
    for header in (None, "", "Bearer whatever", "garbage"):
        assert a.authenticate(header, ()) is ADMIN
    assert Principal("admin") == ADMIN and ADMIN.sees("any") and ADMIN.may_claim({"x": "y"})
    assert auth.current_principal() is ADMIN  # also what a call without the interceptor sees


TASKS = ["Submit", "SubmitBatch", "Cancel", "Get", "ListTasks", "Wait", "Watch"]
ROLE_TABLE = {  # docs/server.md, "Authentication"
    **{f"/cronoq.v1.Tasks/{m}": {"client", "admin"} for m in TASKS},
    "/cronoq.v1.Workers/Work": {"worker", "admin"},
    **{
        f"/cronoq.v1.Admin/{m}": {"metrics", "admin"}
        for m in ("Snapshot", "ListWorkers", "ListRecurring")
    },
    "/cronoq.v1.Admin/AddRecurring": {"admin"},
    "/cronoq.v1.Admin/RemoveRecurring": {"admin"},
    "/cronoq.v1.Tasks/Nope": {"admin"},
    "/cronoq.v1.Admin/Submit": {"admin"},
    "/other.Service/Get": {"admin"},
}


@pytest.mark.parametrize("method", sorted(ROLE_TABLE))
def test_the_role_table(method: str) -> None:
    for role in ("client", "worker", "metrics", "admin"):
        assert allowed(Principal(role), method) is (role in ROLE_TABLE[method]), role
    # narrowing a principal never changes what it may call
    assert allowed(Principal("client", frozenset({"a"}), tenant="t"), method) is (
        "client" in ROLE_TABLE[method]
    )


def test_pools_and_labels() -> None:
    p = Principal("worker", frozenset({"a"}), frozenset({("gpu", "a100"), ("zone", "eu")}))
    assert p.sees("a") and not p.sees("b")
    assert p.may_claim({}) and p.may_claim({"gpu": "a100", "zone": "eu"})
    assert not p.may_claim({"gpu": "h100"}) and not p.may_claim({"gpu": "a100", "x": "1"})
    assert Principal("worker").may_claim({"anything": "goes"})


def _strings(obj: object, seen: set[int] | None = None) -> Iterator[object]:
    """Every value reachable from `obj` through attributes, slots and containers."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    yield obj
    children: list[object] = []
    if isinstance(obj, dict):
        children = [*obj.keys(), *obj.values()]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        children = list(obj)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        children = list(vars(obj).values())
    for child in children:
        yield from _strings(child, seen)


def test_only_digests_are_kept() -> None:
    secret = "from-the-environment-0123456789"
    cfg = load_config(
        '[[auth.tokens]]\ntoken = "plain-config-token-0123456789"\nrole = "admin"\n'
        '[[auth.tokens]]\ntoken_env = "TOK"\nrole = "client"\n',
        env={"TOK": secret},
    )
    a = Authenticator(cfg.auth)
    for plain in ("plain-config-token-0123456789", secret):
        for value in (*_strings(cfg), *_strings(a)):
            if isinstance(value, (str, bytes)):
                assert plain not in (value if isinstance(value, str) else value.decode("latin1"))
        assert plain not in repr(cfg) and plain not in repr(vars(a))
    assert a.authenticate(f"Bearer {secret}", ()).role == "client"
