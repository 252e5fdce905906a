"""The server's configuration: TOML in, validated frozen dataclasses out (docs/configuration.md).

Loading has the three steps of docs/configuration.md, "Loading order and errors", one function each
so that the command line can run them in that order: `read_config` parses the TOML without judging
it, `apply_overrides` writes `--insecure-no-auth` and `--shard` into the raw tables, and `validate`
checks everything and builds a `ServerConfig`. `load_config` runs all three. An empty file, like no
file at all, gives docs/configuration.md, "The embedded default".

Validation never stops at the first problem. Every reader records a complaint as one line
`<key path>: <rule>` and carries on with the key's default, and `ConfigError` lists every line.
Rules that the library's option types already enforce (pool bounds, overflow policies, retry
policies, autoscaler settings, resources) are checked by building those types, so the server
and the library cannot disagree about what a valid pool is; `library_pools` and
`library_resources` build those types for the server's Scheduler, and `core_pools` and
`core_resources` take the engine's view from them.

Secrets: a bearer token is kept only as its SHA-256 digest. The two secrets the server has to
pass on (a webhook token, a PostgreSQL URL) are kept as given but left out of every repr.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.util
import ipaddress
import json
import logging
import math
import os
import re
import socket
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar
from urllib.parse import urlsplit

from cronoq._options import AutoscaleConfig, Pool, Resource
from cronoq.core.autoscale import AutoscaleSettings
from cronoq.core.model import DEFAULT_RETRY, PoolConfig, RetryPolicy
from cronoq.core.resources import ResourceConfig
from cronoq.errors import SchedulerError
from cronoq.server.hosts import loopback_name

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "AuthSettings",
    "CertSettings",
    "ConfigError",
    "Grant",
    "GrpcWebSettings",
    "LimitsSettings",
    "OutputsSettings",
    "PeerTlsSettings",
    "PoolSettings",
    "ResourceSettings",
    "RetrySettings",
    "ScalerSettings",
    "SemaphoreSettings",
    "ServerConfig",
    "ServerSettings",
    "ShardSettings",
    "SocketAddress",
    "StoreSettings",
    "TlsSettings",
    "TokenBucketSettings",
    "TokenSettings",
    "apply_overrides",
    "core_pools",
    "core_resources",
    "library_pools",
    "library_resources",
    "load_config",
    "read_config",
    "validate",
]

_log = logging.getLogger(__name__)

YEAR = 31_536_000.0  # the longest duration any key may hold (docs/reference/limits.md)
LEADER_LEASE_S = 10.0  # [store] leader_lease_s: its default
MIN_LEADER_LEASE_S = 1.0  # and its least value
MIB = 1_048_576
# The bounds of docs/configuration.md, "[limits]", "[[pools]]", "[store]" and "[outputs]"
MIN_MESSAGE_BYTES = 4096  # limits.max_message_bytes and max_http_body_bytes
GRPC_MAX_MESSAGE_BYTES = 2**31 - 1  # grpcio takes message limits as a C int: larger is lowered
MIN_TIMEOUT_S = 0.1  # limits.request_timeout_s, keepalive_*_s; also pools[].lease_ttl_s
MAX_LIST = 100_000  # limits.max_list
MIN_DRAIN_TIME_S = 0.001  # pools[].drain_time_s
MAX_MULTIPLIER = 1000.0  # pools[].retry.multiplier (and a task's own, docs/server-api.md)
MIN_KEEP_FINISHED_S = 60.0  # store.keep_finished_s
MAX_ORIGINS = 64  # server.grpc_web.allowed_origins
TRANSPORTS = ("auto", "native", "grpcio")  # server.transport
TRANSPORT_ENV = "CRONOQ_TRANSPORT"
NOT_BUILT = "the native transport (cronoq._native) is not built in this installation"
MIN_TOKEN_LEN = 16  # shorter is an error (docs/configuration.md, "[auth]")
SHORT_TOKEN_LEN = 32  # shorter logs a warning
ROLES = ("client", "worker", "metrics", "admin")
LOG_LEVELS = ("debug", "info", "warning", "error")
STORE_KINDS = ("memory", "sqlite", "postgres")
SCALER_KINDS = ("external", "webhook")
RESOURCE_KINDS = ("semaphore", "token_bucket")
# Pool names travel in metrics labels and gRPC metadata: keep them plain.
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_NAME_RULE = "must be 1-64 characters of A-Z, a-z, 0-9, '_', '.', ':' and '-'"
# Shard names are plainer still: they also go into schema names and file paths ({shard}).
_SHARD_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
_SHARD_NAME_RULE = "must be 1-32 characters of a-z, 0-9 and '_', starting with a letter"
MAX_ENDPOINT_LEN = 256  # shards[].endpoint
SHARD_MARK = "{shard}"  # replaced by this server's shard name in store.schema and store.path
# The schema name is put into SQL statements, so only a plain identifier will do.
_SQL_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

_T = TypeVar("_T")
_Settings = TypeVar("_Settings", bound="DataclassInstance")


class ConfigError(SchedulerError):
    """The configuration is invalid; `errors` holds one `<key path>: <rule>` line per problem.

    A SchedulerError rather than a ValueError: the server cannot start, just as when its store
    cannot open (SchedulerError's own purpose), and callers catching cronoq's errors catch it.
    It reports a file an operator wrote, not a bad argument of some Python call.
    """

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = tuple(errors)
        super().__init__("\n".join(self.errors))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.errors,))


# --- the validated configuration ---------------------------------------------------------------


@dataclass(frozen=True)
class SocketAddress:
    """A listener address: an IP literal (a host name is resolved first, so loopback is known)
    and a port."""

    host: str
    port: int

    @property
    def is_loopback(self) -> bool:
        return ipaddress.ip_address(self.host).is_loopback

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class TlsSettings:
    """`[server.tls]`: PEM files; with `client_ca`, clients must present a certificate (mTLS)."""

    cert: str
    key: str
    client_ca: str | None = None


@dataclass(frozen=True)
class PeerTlsSettings:
    """`[server.peer_tls]`: how this server calls other shards' https:// endpoints."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None


@dataclass(frozen=True)
class GrpcWebSettings:
    """`[server.grpc_web]`: browser origins allowed to call the gRPC API through gRPC-Web."""

    allowed_origins: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServerSettings:
    """`[server]`: listeners, TLS, shutdown and the shard this server serves."""

    grpc_addr: SocketAddress = SocketAddress("127.0.0.1", 7070)
    http_addr: SocketAddress = SocketAddress("127.0.0.1", 7071)
    metrics_addr: SocketAddress | None = None
    tls: TlsSettings | None = None
    grpc_web: GrpcWebSettings | None = None
    insecure_no_auth: bool = False
    shutdown_grace_s: float = 10.0
    shard: str | None = None
    peer_tls: PeerTlsSettings | None = None
    insecure_peer_http: bool = False
    log_level: str = "info"
    dashboard: bool = True
    # "auto", "native" or "grpcio": what serves the gRPC port (docs/server.md, "Transports")
    transport: str = "auto"


@dataclass(frozen=True)
class Grant:
    """What a credential allows: a role, optionally narrowed to pools, labels and a tenant.

    `pools` None means every pool, and an empty tuple none at all; `labels` None means any
    label; `tenant` None lets the caller name the tenant.
    """

    role: str
    pools: tuple[str, ...] | None = None
    labels: tuple[tuple[str, str], ...] | None = None
    tenant: str | None = None


@dataclass(frozen=True)
class TokenSettings:
    """`[[auth.tokens]]`: a bearer token, kept only as its SHA-256 digest."""

    digest: bytes
    grant: Grant


@dataclass(frozen=True)
class CertSettings:
    """`[[auth.certs]]`: a client certificate, recognised by a DNS subject alternative name
    (`dns_name`, or its alias `dns`), matched case-insensitively."""

    dns_name: str
    grant: Grant


@dataclass(frozen=True)
class AuthSettings:
    tokens: tuple[TokenSettings, ...] = ()
    certs: tuple[CertSettings, ...] = ()

    @property
    def enabled(self) -> bool:
        """Without any credential, authentication is off and every caller is an admin."""
        return bool(self.tokens or self.certs)


@dataclass(frozen=True)
class StoreSettings:
    """`[store]`: which keys apply depends on `kind` (memory, sqlite or postgres)."""

    kind: str = "memory"
    path: str | None = None  # sqlite
    keep_finished_s: float | None = None  # sqlite, postgres
    # sqlite: the leadership lease (docs/durability.md, "Leader and standbys"), renewed every
    # fifth of it
    leader_lease_s: float | None = None
    url: str | None = field(default=None, repr=False)  # postgres; may hold a password
    url_env: str | None = None  # postgres: where `url` came from, if from the environment
    schema: str | None = None  # postgres


@dataclass(frozen=True)
class LimitsSettings:
    """`[limits]`: every key of docs/configuration.md, "[limits]", with its default.

    A count (int) is at least its field's `min` metadata (1 unless given) and at most its
    `max`; a larger one is accepted and lowered to its `clamp`. A duration (float, seconds) is
    at least its `min` (> 0 unless given) and at most one year. 0 where allowed: `max_wait_s`
    (waits return at once), `key_retention_s` and `key_retention_max` (finished tasks' keys are
    not retained), `max_tags`, `max_deps` and `max_resources` (none allowed).
    """

    max_tasks_per_batch: int = 1000
    max_pending_total: int = 1_000_000
    max_pending_per_pool: int = 100_000
    max_message_bytes: int = field(
        default=16 * MIB, metadata={"min": MIN_MESSAGE_BYTES, "clamp": GRPC_MAX_MESSAGE_BYTES}
    )
    max_http_body_bytes: int = field(default=16 * MIB, metadata={"min": MIN_MESSAGE_BYTES})
    max_key_len: int = 256
    max_kind_len: int = 128
    max_tags: int = field(default=32, metadata={"min": 0})
    max_tag_len: int = 1024
    max_deps: int = field(default=256, metadata={"min": 0})
    max_resources: int = field(default=16, metadata={"min": 0})
    max_wait_s: float = field(default=300.0, metadata={"min": 0.0})
    request_timeout_s: float = field(default=30.0, metadata={"min": MIN_TIMEOUT_S})
    max_concurrent_requests: int = 4096
    max_concurrent_streams: int = 1024
    max_unsent_bytes_per_connection: int = field(
        default=64 * MIB, metadata={"min": MIN_MESSAGE_BYTES}
    )
    max_slots_per_worker: int = 1024
    keepalive_interval_s: float = field(default=20.0, metadata={"min": MIN_TIMEOUT_S})
    keepalive_timeout_s: float = field(default=20.0, metadata={"min": MIN_TIMEOUT_S})
    key_retention_s: float = field(default=3600.0, metadata={"min": 0.0})
    key_retention_max: int = field(default=1_000_000, metadata={"min": 0})
    max_list: int = field(default=1000, metadata={"max": MAX_LIST})


@dataclass(frozen=True)
class RetrySettings:
    """A pool's `retry` table; the defaults are the engine's (docs/configuration.md,
    "[[pools]]")."""

    max_attempts: int = DEFAULT_RETRY.max_attempts
    initial_backoff_s: float = DEFAULT_RETRY.initial_backoff
    multiplier: float = DEFAULT_RETRY.multiplier
    max_backoff_s: float = DEFAULT_RETRY.max_backoff
    jitter: bool = DEFAULT_RETRY.jitter


@dataclass(frozen=True)
class ScalerSettings:
    """A pool's `scaler`: export the desired capacity (external) or POST it to a webhook."""

    kind: str = "external"
    url: str | None = None
    token_env: str | None = None
    token: str | None = field(default=None, repr=False)  # sent as a bearer token


@dataclass(frozen=True)
class PoolSettings:
    """`[[pools]]`: the server's defaults of docs/configuration.md, "[[pools]]" (`min` 0, `max`
    10, autoscaling on, `overflow` "reject", `lease_ttl_s` 30), otherwise those of the engine's
    PoolConfig and AutoscaleSettings. They are the server's own: a library Pool keeps its
    defaults."""

    name: str
    min: int = 0
    max: int = 10
    autoscale: bool = True
    scaler: ScalerSettings = ScalerSettings()
    lease_ttl_s: float = 30.0
    max_pending: int = LimitsSettings.max_pending_per_pool  # limits.max_pending_per_pool
    overflow: str = "reject"
    retry: RetrySettings = RetrySettings()
    default_duration_s: float = PoolConfig.default_duration
    reservable_fraction: float = PoolConfig.reservable_fraction
    await_unknown_dependencies_s: float | None = None
    target_utilization: float = AutoscaleSettings.target_utilization
    drain_time_s: float = AutoscaleSettings.drain_time
    cooldown_s: float = AutoscaleSettings.cooldown
    cost_per_worker_second: float = 0.0
    max_slots_per_worker: int | None = None
    fair_share: bool = False
    tenant_weights: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SemaphoreSettings:
    """`[[resources]]` of kind semaphore: at most `permits` units held at once."""

    name: str
    permits: int
    shard: str | None = None


@dataclass(frozen=True)
class TokenBucketSettings:
    """`[[resources]]` of kind token_bucket: `rate` units per second, up to `burst` at once."""

    name: str
    rate: float
    burst: int
    shard: str | None = None


ResourceSettings = SemaphoreSettings | TokenBucketSettings


@dataclass(frozen=True)
class OutputsSettings:
    """`[outputs]`: what finished tasks leave in memory for Get and Wait; 0 keeps nothing
    (`cache_bytes` = 0 only with `cache_entries` = 0)."""

    cache_entries: int = field(default=10_000, metadata={"min": 0})
    cache_bytes: int = field(default=64 * MIB, metadata={"min": 0})
    info_entries: int = field(default=100_000, metadata={"min": 0})


@dataclass(frozen=True)
class ShardSettings:
    """`[[shards]]`: a shard's name, id prefix (`number`), pools and leader endpoint."""

    name: str
    number: int
    pools: tuple[str, ...]
    endpoint: str


@dataclass(frozen=True)
class ServerConfig:
    """The whole validated configuration."""

    server: ServerSettings = ServerSettings()
    auth: AuthSettings = AuthSettings()
    store: StoreSettings = StoreSettings()
    limits: LimitsSettings = LimitsSettings()
    pools: tuple[PoolSettings, ...] = (PoolSettings("default"),)
    resources: tuple[ResourceSettings, ...] = ()
    outputs: OutputsSettings = OutputsSettings()
    shards: tuple[ShardSettings, ...] = ()

    @property
    def own_shard(self) -> ShardSettings | None:
        """The `[[shards]]` entry this server serves (named by `server.shard`); None without
        shards."""
        return next((s for s in self.shards if s.name == self.server.shard), None)


# --- loading -----------------------------------------------------------------------------------


def load_config(
    text_or_path: str | os.PathLike[str] | None,
    *,
    env: Mapping[str, str] = os.environ,
    insecure_no_auth: bool = False,
    shard: str | None = None,
) -> ServerConfig:
    """Read, override and validate a configuration; ConfigError if invalid.

    `text_or_path` is TOML text (str), a file (a path object) or None for the embedded default.
    `env` supplies the variables named by `token_env` and `url_env`. Reading CRONOQ_CONFIG
    and CRONOQ_SHARD is the command line's business, like the flags they stand for.
    """
    raw = read_config(text_or_path)
    return validate(apply_overrides(raw, insecure_no_auth=insecure_no_auth, shard=shard), env=env)


def read_config(text_or_path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The raw TOML tables, not yet validated; ConfigError if the file is unreadable or not TOML."""
    if text_or_path is None:
        return {}
    if isinstance(text_or_path, str):
        source, text = "config", text_or_path
    else:
        source = os.fspath(text_or_path)
        try:
            with open(source, encoding="utf-8") as file:
                text = file.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError([f"{source}: cannot read the file ({exc})"]) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{source}: not valid TOML ({exc})"]) from None


def apply_overrides(
    raw: Mapping[str, Any], *, insecure_no_auth: bool = False, shard: str | None = None
) -> dict[str, Any]:
    """A copy of `raw` with the command line's settings in `[server]`, where they override."""
    out = dict(raw)
    server = out.get("server", {})
    if not isinstance(server, dict) or (not insecure_no_auth and shard is None):
        return out  # nothing to override, or a `server` that validation will reject anyway
    server = dict(server)
    if insecure_no_auth:
        server["insecure_no_auth"] = True
    if shard is not None:
        server["shard"] = shard
    out["server"] = server
    return out


def validate(raw: Mapping[str, Any], *, env: Mapping[str, str] = os.environ) -> ServerConfig:
    """Check every table and key of docs/configuration.md; ConfigError lists every problem.

    Sections are read in dependency order (pools before the shards, resources and tokens that
    name them), so the errors come section by section in that order.
    """
    errors: list[str] = []
    top = _Table(errors, "", raw)
    server = _server(top.table("server"), env)
    # The store's {shard} is this server's shard (docs/configuration.md, "The store of a
    # shard"); whether that names one of the [[shards]] is for _shards to say.
    plan = raw.get("shards")
    sharded = isinstance(plan, list) and bool(plan)
    own = server.shard if server.shard and _SHARD_NAME.fullmatch(server.shard) else None
    store = _store(top.table("store"), env, sharded=sharded, shard=own)
    limits = _counts(top.table("limits"), LimitsSettings)
    pools = _pools(top, limits, env)
    shards = _shards(top.tables("shards"), pools, server.shard, errors)
    resources = _resources(top.tables("resources"), shards)
    outputs = _outputs(top.table("outputs"))
    known_pools = {p.name for p in pools} | {name for s in shards for name in s.pools}
    auth = _auth(top.table("auth"), env, known_pools, server)
    top.close()
    _check_listeners(errors, server, auth)
    _check_peer_identity(errors, server, auth)
    if errors:
        raise ConfigError(errors)
    return ServerConfig(server, auth, store, limits, pools, resources, outputs, shards)


# --- converting to the engine's types ----------------------------------------------------------


def core_pools(cfg: ServerConfig) -> list[PoolConfig]:
    """The engine's view of each pool, built through the library's Pool.

    Capacity starts at 0: a server pool's capacity is the sum of the slots granted to its
    connected workers, which the runtime sets as they come and go. `min` and
    `max` stay the autoscaler's bounds even without autoscaling (a library pool without
    autoscaling is fixed at `max`), and the cost rate applies either way.
    """
    return [
        dataclasses.replace(
            pool.core_config(),
            capacity=0,
            min=p.min,
            max=p.max,
            cost_per_worker_second=p.cost_per_worker_second,
        )
        for p, pool in zip(_own_pools(cfg), library_pools(cfg), strict=True)
    ]


def core_resources(cfg: ServerConfig) -> list[ResourceConfig]:
    """The engine's view of each resource, built through the library's Resource."""
    return [r.core_config() for r in library_resources(cfg)]


def library_pools(cfg: ServerConfig) -> list[Pool]:
    """Each pool this server serves as the library's Pool, for a Scheduler whose attempts go to
    remote workers: with [[shards]], only its own shard's."""
    return [_library_pool(p) for p in _own_pools(cfg)]


def library_resources(cfg: ServerConfig) -> list[Resource]:
    """Each resource this server counts as the library's Resource: with [[shards]], only its
    own shard's (each shard counts its resources separately)."""
    own = cfg.own_shard
    return [_library_resource(r) for r in cfg.resources if own is None or r.shard == own.name]


def _own_pools(cfg: ServerConfig) -> list[PoolSettings]:
    """The configured pools of this server's shard, in the file's order; every pool without
    [[shards]]. Other shards' pools may be configured too (the same file for every shard),
    but their servers run them (docs/configuration.md, "[[shards]]")."""
    own = cfg.own_shard
    return [p for p in cfg.pools if own is None or p.name in own.pools]


def _remote(ctx: object, payload: object) -> NoReturn:
    """The executor of every server pool: attempts run on remote workers, never in-process."""
    raise RuntimeError("server pools run on remote workers")


class _ServerPool(Pool):
    """A server pool: its cost rate applies with or without autoscaling (docs/configuration.md,
    "The engine's view"). The library's Pool carries the rate only in its autoscaler settings
    and prices a pool without autoscaling at 0, which stays the library's behaviour."""

    __slots__ = ("_cost",)

    def __init__(self, *args: Any, cost_per_worker_second: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cost = cost_per_worker_second

    def core_config(self) -> PoolConfig:
        return dataclasses.replace(super().core_config(), cost_per_worker_second=self._cost)


def _library_pool(p: PoolSettings) -> Pool:
    retry = p.retry
    scaling = AutoscaleConfig(
        target_utilization=p.target_utilization,
        drain_time=p.drain_time_s,
        cooldown=p.cooldown_s,
        cost_per_worker_second=p.cost_per_worker_second,
    )
    waits = p.await_unknown_dependencies_s
    return _ServerPool(
        p.name,
        _remote,
        cost_per_worker_second=p.cost_per_worker_second,
        min=p.min,
        max=p.max,
        autoscale=scaling if p.autoscale else False,
        lease_ttl=p.lease_ttl_s,
        max_pending=p.max_pending,
        overflow=p.overflow,
        retry=RetryPolicy(
            retry.max_attempts,
            retry.initial_backoff_s,
            retry.multiplier,
            retry.max_backoff_s,
            retry.jitter,
        ),
        unknown_dependency="reject" if waits is None else "await",
        await_timeout=waits,
        default_duration=p.default_duration_s,
        reservable_fraction=p.reservable_fraction,
        tenant_weights=p.tenant_weights,
        fair_share=p.fair_share,
    )


def _library_resource(r: ResourceSettings) -> Resource:
    if isinstance(r, SemaphoreSettings):
        return Resource.semaphore(r.name, r.permits)
    return Resource.token_bucket(r.name, r.rate, r.burst)


# --- reading tables ----------------------------------------------------------------------------


class _Absent:
    """A key that is missing or was rejected: the getter falls back to the default."""


_ABSENT = _Absent()


def _toml_type(value: object) -> str:
    """The TOML name of a value's type, for 'must be X (got Y)'."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return "a date or time"


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class _Table:
    """One TOML table being read, with the path that names it in error messages.

    Each getter returns the key's value, or the default when the key is missing or wrong. A
    wrong value is recorded as `<path>.<key>: <rule>` and its key put in `bad`, so that later
    checks can leave it out instead of reporting consequences of the same mistake. `close`
    reports each key that no getter asked for: that is how unknown keys are rejected.
    """

    def __init__(self, errors: list[str], path: str, data: Mapping[str, Any]) -> None:
        self.errors = errors
        self.path = path
        self.data = data
        self.bad: set[str] = set()
        self._asked: set[str] = set()

    def path_of(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, rule: str) -> None:
        self.bad.add(key)
        self.errors.append(f"{self.path_of(key)}: {rule}")

    def error(self, rule: str) -> None:
        """A problem of the table as a whole (a missing pair of keys, a conflict)."""
        self.errors.append(f"{self.path}: {rule}")

    def has(self, key: str) -> bool:
        return key in self.data

    def require(self, *keys: str) -> None:
        for key in keys:
            if key not in self.data:
                self.fail(key, "is required")

    def close(self) -> None:
        for key in self.data:
            if key not in self._asked:
                self.errors.append(f"{self.path_of(key)}: unknown key{self._closest(key)}")

    def _closest(self, key: str) -> str:
        """`; did you mean "limits"?` for the known key of this table nearest to a misspelt
        one (the keys its getters asked for), or nothing when none is near."""
        near = difflib.get_close_matches(key, sorted(self._asked), n=1)
        return f"; did you mean {_quote(near[0])}?" if near else ""

    def _raw(self, key: str, types: tuple[type, ...], what: str) -> Any:
        self._asked.add(key)
        if key not in self.data:
            return _ABSENT
        value = self.data[key]
        # bool is an int subclass in Python, but TOML's true is no integer
        if isinstance(value, types) and (bool in types or not isinstance(value, bool)):
            return value
        self.fail(key, f"must be {what} (got {_toml_type(value)})")
        return _ABSENT

    def string(self, key: str, default: _T, *, choices: Sequence[str] | None = None) -> str | _T:
        value = self._raw(key, (str,), "a string")
        if value is _ABSENT:
            return default
        if not value:
            self.fail(key, "must not be empty")
            return default
        if choices is not None and value not in choices:
            listed = ", ".join(_quote(c) for c in choices)
            self.fail(key, f"must be one of {listed} (got {_quote(value)})")
            return default
        return str(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self._raw(key, (bool,), "a boolean")
        return default if value is _ABSENT else bool(value)

    def integer(
        self, key: str, default: _T, *, low: int | None = None, high: int | None = None
    ) -> int | _T:
        value = self._raw(key, (int,), "an integer")
        if value is _ABSENT:
            return default
        if (low is not None and value < low) or (high is not None and value > high):
            rule = f"must be >= {low}" if high is None else f"must be from {low} to {high}"
            self.fail(key, f"{rule} (got {value})")
            return default
        return int(value)

    def number(self, key: str, default: _T) -> float | _T:
        value = self._raw(key, (int, float), "a number")
        if value is _ABSENT:
            return default
        if not math.isfinite(value):
            self.fail(key, f"must be a finite number (got {value})")
            return default
        return float(value)

    def duration(
        self, key: str, default: _T, *, positive: bool = True, least: float | None = None
    ) -> float | _T:
        """Seconds: finite, at most one year, and > 0, or >= 0 where 0 has a meaning
        (`positive=False`), or at least `least` where a smaller value would misbehave."""
        value = self._raw(key, (int, float), "a number of seconds")
        if value is _ABSENT:
            return default
        if least is not None:
            enough, low = value >= least, f">= {least:g}"
        else:
            enough, low = (value > 0, "> 0") if positive else (value >= 0, ">= 0")
        # NaN fails both comparisons, infinity the second
        if not (enough and value <= YEAR):
            self.fail(key, f"must be {low} and at most one year (got {value})")
            return default
        return float(value)

    def strings(self, key: str) -> tuple[str, ...] | None:
        value = self._raw(key, (list,), "an array of strings")
        if value is _ABSENT:
            return None
        for i, item in enumerate(value):
            if not isinstance(item, str):
                self.fail(f"{key}[{i}]", f"must be a string (got {_toml_type(item)})")
            elif not item:
                self.fail(f"{key}[{i}]", "must not be empty")
        if any(k.startswith(f"{key}[") for k in self.bad):
            self.bad.add(key)
            return None
        return tuple(value)

    def table(self, key: str) -> _Table:
        """The sub-table `key`; an empty one (all defaults) when it is missing or not a table."""
        return self.optional_table(key) or _Table(self.errors, self.path_of(key), {})

    def optional_table(self, key: str) -> _Table | None:
        """The sub-table `key`; None when it is missing or not a table."""
        value = self._raw(key, (dict,), "a table")
        return None if value is _ABSENT else _Table(self.errors, self.path_of(key), value)

    def tables(self, key: str) -> list[_Table] | None:
        """The array of tables `key`, None when it is missing."""
        value = self._raw(key, (list,), "an array of tables")
        if value is _ABSENT:
            return None if key not in self.data else []
        out = []
        for i, item in enumerate(value):
            path = f"{self.path_of(key)}[{i}]"
            if isinstance(item, dict):
                out.append(_Table(self.errors, path, item))
            else:
                self.errors.append(f"{path}: must be a table (got {_toml_type(item)})")
        return out


def _library_rules(table: _Table, build: Callable[..., object], args: dict[str, Any]) -> None:
    """Check values against the rules of the library type that `build` constructs.

    The library raises at its first complaint, phrased `<argument> must ...`, where every
    argument is named like its key. That argument is reported, dropped (the library default
    takes its place) and the rest checked again, until the library accepts what is left.
    Values that already failed the server's own checks are not passed at all.
    """
    args = {key: value for key, value in args.items() if key not in table.bad}
    while True:
        try:
            build(**args)
            return
        except (TypeError, ValueError, OverflowError) as exc:
            message = str(exc)
            subject, sep, rule = message.partition(" must ")
            key = subject.replace(" ", "_")  # "tenant weights must ..." names tenant_weights
            if not sep or key not in args:
                table.error(message)
                return
            table.fail(key, f"must {rule}")
            del args[key]


# --- [server] ----------------------------------------------------------------------------------


def _socket_address(text: str) -> SocketAddress:
    """ "host:port" or "[v6 host]:port" with a port 0-65535 and an IP literal host, or a host
    name that resolves (`localhost:7070`): a ValueError says why not."""
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit() and len(port) <= 5) or int(port) > 65535:
        raise ValueError(f"not a socket address ({_quote(text)})")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if bracketed or not host:
            raise ValueError(f"not a socket address ({_quote(text)})") from None
        return SocketAddress(_resolve(text, host), int(port))
    if (ip.version == 6) != bracketed:
        raise ValueError(f"not a socket address ({_quote(text)})")
    return SocketAddress(str(ip), int(port))


def _resolve(text: str, name: str) -> str:
    """The IP a listener on host `name` binds: its first IPv4 address, else its first IPv6
    one, so that `localhost` means 127.0.0.1 as the clients' default address does. The
    SocketAddress keeps the IP, so whether the listener is loopback is still known."""
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        found = []
    ips = [str(info[4][0]) for info in found if info[0] in (socket.AF_INET, socket.AF_INET6)]
    if not ips:
        raise ValueError(
            f"not a socket address ({_quote(text)}): the host name {_quote(name)} does not "
            "resolve; give an IP address, such as 127.0.0.1:7070"
        )
    return next((ip for ip in ips if ":" not in ip), ips[0])


def _address(t: _Table, key: str, default: _T) -> SocketAddress | _T:
    text = t.string(key, None)
    if text is None:
        return default
    try:
        return _socket_address(text)
    except ValueError as e:
        t.fail(key, str(e))
        return default


def _url_problem(text: str, *, bare: bool = False) -> str | None:
    """Why `text` is not a usable http(s) URL, or None; `bare` forbids a path, query and
    fragment (origins, endpoints)."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018  (a ValueError for a port that is no number or above 65535)
    except ValueError:
        return "not a valid URL"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if not parts.hostname:
        return "must name a host"
    if parts.username is not None or parts.password is not None:
        return "must not contain a user name or password"
    if bare and (parts.path or parts.query or parts.fragment):
        return "must not have a path, query or fragment"
    return None


def _endpoint_problem(text: str) -> str | None:
    """Why `text` is no shard endpoint (docs/configuration.md, "[[shards]]"), or None: a bare
    http(s) URL, its port optional (80 and 443 by default), that workers can follow."""
    if len(text) > MAX_ENDPOINT_LEN:
        return f"must be at most {MAX_ENDPOINT_LEN} characters (got {len(text)})"
    # checked first: urlsplit quietly drops tabs and newlines, and a space would pass it
    if any(c.isspace() or not c.isprintable() for c in text):
        return f"must not contain whitespace or control characters (got {_quote(text)})"
    problem = _url_problem(text, bare=True)
    if problem is None and (_endpoint_key(text)[2] == 0 or urlsplit(text).netloc.endswith(":")):
        problem = "must have a port from 1 to 65535, or none"
    return None if problem is None else f"{problem} (got {_quote(text)})"


def _endpoint_key(text: str) -> tuple[str, str, int]:
    """What an endpoint reaches, to find two shards at one endpoint however each is spelled:
    the scheme, the host (in lower case) and the port (the scheme's default when absent)."""
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    default = 443 if scheme == "https" else 80
    return scheme, (parts.hostname or "").lower(), default if parts.port is None else parts.port


def _file(t: _Table, key: str) -> str | None:
    """A path to a PEM file; checked here so that --check catches a missing certificate."""
    path = t.string(key, None)
    if path is not None and not os.path.isfile(path):
        t.fail(key, f"no such file ({_quote(path)})")
    return path


def _server(t: _Table, env: Mapping[str, str]) -> ServerSettings:
    default = ServerSettings()
    grpc_addr = _address(t, "grpc_addr", default.grpc_addr)
    http_addr = _address(t, "http_addr", default.http_addr)
    metrics_addr = _address(t, "metrics_addr", None)

    tls = None
    sub = t.optional_table("tls")
    if sub is not None:
        sub.require("cert", "key")
        cert = _file(sub, "cert") or ""
        key = _file(sub, "key") or ""
        tls = TlsSettings(cert, key, _file(sub, "client_ca"))
        sub.close()

    grpc_web = None
    sub = t.optional_table("grpc_web")
    if sub is not None:
        sub.require("allowed_origins")
        origins = sub.strings("allowed_origins") or ()
        listed = sub.has("allowed_origins") and "allowed_origins" not in sub.bad
        if listed and not 1 <= len(origins) <= MAX_ORIGINS:
            rule = f"must list 1 to {MAX_ORIGINS} origins (got {len(origins)})"
            sub.fail("allowed_origins", rule)
        for i, origin in enumerate(origins):
            problem = _url_problem(origin, bare=True)
            if problem is not None:
                sub.fail(f"allowed_origins[{i}]", f"{problem} (got {_quote(origin)})")
        grpc_web = GrpcWebSettings(origins)
        sub.close()

    peer_tls = None
    sub = t.optional_table("peer_tls")
    if sub is not None:
        # without ca, the system roots verify the peers: nothing to check
        peer_tls = PeerTlsSettings(_file(sub, "ca"), _file(sub, "cert"), _file(sub, "key"))
        for given, missing in (("cert", "key"), ("key", "cert")):
            if sub.has(given) and not sub.has(missing):
                sub.fail(
                    missing,
                    f"is required with {given}: the two are this server's client identity "
                    "for mTLS with other shards",
                )
        sub.close()

    settings = ServerSettings(
        grpc_addr=grpc_addr,
        http_addr=http_addr,
        metrics_addr=metrics_addr,
        tls=tls,
        grpc_web=grpc_web,
        insecure_no_auth=t.boolean("insecure_no_auth", default.insecure_no_auth),
        shutdown_grace_s=t.duration("shutdown_grace_s", default.shutdown_grace_s, positive=False),
        shard=t.string("shard", None),
        peer_tls=peer_tls,
        insecure_peer_http=t.boolean("insecure_peer_http", default.insecure_peer_http),
        log_level=t.string("log_level", default.log_level, choices=LOG_LEVELS),
        dashboard=t.boolean("dashboard", default.dashboard),
        transport=_transport(t, env, grpc_web is not None),
    )
    listeners = {"grpc_addr": grpc_addr, "http_addr": http_addr, "metrics_addr": metrics_addr}
    taken: dict[SocketAddress, str] = {}
    for key, address in listeners.items():
        if address is None or key in t.bad or address.port == 0:
            continue
        if address in taken:
            t.fail(key, f"same address as {t.path_of(taken[address])} ({address})")
        taken.setdefault(address, key)
    t.close()
    return settings


def _transport(t: _Table, env: Mapping[str, str], grpc_web: bool) -> str:
    """`server.transport`, else CRONOQ_TRANSPORT, else "auto" (docs/server.md, "Transports")."""
    if t.has("transport"):
        transport = t.string("transport", "auto", choices=TRANSPORTS)
    else:
        transport = env.get(TRANSPORT_ENV) or "auto"
        if transport not in TRANSPORTS:
            listed = ", ".join(_quote(c) for c in TRANSPORTS)
            t.fail(
                "transport", f"{TRANSPORT_ENV} must be one of {listed} (got {_quote(transport)})"
            )
            return "auto"
    if transport == "native" and not native_built():
        t.fail("transport", f'"native": {NOT_BUILT}; use "auto" or "grpcio"')
    elif transport == "native" and grpc_web:
        t.fail(
            "transport",
            '"native" does not serve gRPC-Web ([server.grpc_web]): use "auto" or "grpcio"',
        )
    return transport


def transport_of(server: ServerSettings) -> str:
    """The transport `server.transport` names: "auto" is "native" when the extension is built
    and neither TLS nor gRPC-Web is on, else "grpcio" (docs/server.md, "Transports")."""
    if server.transport != "auto":
        return server.transport
    plain = server.tls is None and server.grpc_web is None
    return "native" if native_built() and plain else "grpcio"


def native_built() -> bool:
    """Is the native transport (the `cronoq._native` extension) in this installation?"""
    return importlib.util.find_spec("cronoq._native") is not None


def _check_listeners(errors: list[str], server: ServerSettings, auth: AuthSettings) -> None:
    """Without credentials, only loopback listeners, unless insecure_no_auth.

    The metrics listener is exempt: it never asks for credentials anyway. Both rules are
    docs/configuration.md, "Listeners and credentials".
    """
    if auth.enabled or server.insecure_no_auth:
        return
    for key, address in (("grpc_addr", server.grpc_addr), ("http_addr", server.http_addr)):
        if not address.is_loopback:
            errors.append(
                f"server.{key}: {address} is not a loopback address, so it needs a credential "
                "([[auth.tokens]] or [[auth.certs]]) or --insecure-no-auth"
            )


def _check_peer_identity(errors: list[str], server: ServerSettings, auth: AuthSettings) -> None:
    """A client certificate for other shards needs credentials on this server: a call is
    forwarded with its caller's own credentials, and without any it would act with the
    server's certificate instead (docs/configuration.md, "[server]")."""
    peer_tls = server.peer_tls
    if peer_tls is not None and peer_tls.cert is not None and not auth.enabled:
        errors.append(
            "server.peer_tls.cert: needs credentials on this server ([[auth.tokens]] or "
            "[[auth.certs]]): a forwarded call must never act with the server's own certificate"
        )


# --- [store], [limits], [outputs] --------------------------------------------------------------


def _store(t: _Table, env: Mapping[str, str], *, sharded: bool, shard: str | None) -> StoreSettings:
    """`[store]`; with [[shards]] (`sharded`), its `{shard}` becomes `shard`, this server's shard
    name, or stays when that is unknown or wrong (reported under server.shard or [[shards]])."""
    kind = t.string("kind", "memory", choices=STORE_KINDS)
    if "kind" in t.bad:
        return StoreSettings()  # the other keys depend on the kind: report only the kind
    if kind == "memory":
        return _closed(t, StoreSettings())
    keep = t.duration("keep_finished_s", 604_800.0, least=MIN_KEEP_FINISHED_S)
    if kind == "sqlite":
        t.require("path")
        path = t.string("path", "")
        if SHARD_MARK in path and not sharded:
            rule = f"contains {SHARD_MARK} but no [[shards]] is configured"
            t.fail("path", f"{rule} (got {_quote(path)})")
        elif shard is not None:
            path = path.replace(SHARD_MARK, shard)
        lease = t.duration("leader_lease_s", LEADER_LEASE_S, least=MIN_LEADER_LEASE_S)
        settings = StoreSettings(kind, path=path, keep_finished_s=keep, leader_lease_s=lease)
        return _closed(t, settings)

    url = t.string("url", None)
    url_env = t.string("url_env", None)
    schema = _schema(t, sharded, shard)
    if url is not None and url_env is not None:
        t.error("give either url or url_env, not both")
        return _closed(t, StoreSettings(kind, keep_finished_s=keep, schema=schema))
    if url is None and "url" not in t.bad:
        url_env = url_env or "DATABASE_URL"
        url = env.get(url_env)
        if url is None:
            t.fail("url_env", f"environment variable {url_env} (store URL) is not set")
    # The URL itself is never shown, in errors or warnings: it may hold a password.
    key, whose = ("url", "") if url_env is None else ("url_env", f"the value of {url_env} ")
    if url is not None and url.partition("://")[0].lower() not in ("postgres", "postgresql"):
        t.fail(key, f"{whose}must be a postgres:// or postgresql:// URL")
    elif url is not None:
        if url_env is None:
            _log.warning(
                "%s: prefer url_env: a URL written in the file may hold a password", t.path_of(key)
            )
        if not (_local_url(url) or _verified_tls(url)):
            _log.warning(
                "%s: %sreaches a database that is not local without sslmode=verify-full or "
                "sslmode=verify-ca: the server's certificate is not verified",
                t.path_of(key),
                whose,
            )
    return _closed(
        t, StoreSettings(kind, keep_finished_s=keep, url=url, url_env=url_env, schema=schema)
    )


def _schema(t: _Table, sharded: bool, shard: str | None) -> str:
    """`store.schema`, with `{shard}` replaced (docs/configuration.md, "The store of a shard"):
    each shard has a schema of its own, so with [[shards]] the name must contain `{shard}`."""
    schema = t.string("schema", f"cronoq_{SHARD_MARK}" if sharded else "public")
    if "schema" in t.bad:
        return schema
    if not sharded:
        if SHARD_MARK in schema:
            rule = f"contains {SHARD_MARK} but no [[shards]] is configured"
            t.fail("schema", f"{rule} (got {_quote(schema)})")
        elif not _SQL_IDENTIFIER.fullmatch(schema):
            rule = "must be a plain SQL identifier of 1-63 characters"
            t.fail("schema", f"{rule} (got {_quote(schema)})")
        return schema
    if SHARD_MARK not in schema:
        t.fail(
            "schema",
            f"must contain {SHARD_MARK} with [[shards]], so that each shard has a schema of its "
            f"own (got {_quote(schema)})",
        )
        return schema
    # an unknown shard is reported elsewhere: the shortest shard name stands in for it
    named = schema.replace(SHARD_MARK, shard or "s")
    if not _SQL_IDENTIFIER.fullmatch(named):
        rule = f"must be a plain SQL identifier of 1-63 characters once {SHARD_MARK} is replaced"
        giving = "" if shard is None else f", giving {_quote(named)}"
        t.fail("schema", f"{rule} (got {_quote(schema)}{giving})")
    return schema if shard is None else named


# docs/configuration.md, "[store]": what makes a PostgreSQL URL local (no TLS warning).
_LOCAL_MARKS = ("@localhost", "@127.0.0.1", "@[::1]", "@/", "host=/")
_VERIFYING = ("sslmode=verify-full", "sslmode=verify-ca")


def _local_url(url: str) -> bool:
    """A database on this host: over loopback or a Unix socket."""
    return any(mark in url for mark in _LOCAL_MARKS)


def _verified_tls(url: str) -> bool:
    """Does the URL ask for TLS with the server's certificate verified?"""
    return any(mode in url for mode in _VERIFYING)


def _closed(t: _Table, value: _T) -> _T:
    t.close()
    return value


def _counts(t: _Table, cls: type[_Settings]) -> _Settings:
    """Read a table of counts and durations described by the fields of a settings class.

    A float default makes the key a duration: at least the field's `min` metadata (> 0 without
    one) and at most one year. An int default makes it a count: at least its `min` (default 1)
    and at most its `max`, or, with a `clamp`, any larger value lowered to the clamp.
    """
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if isinstance(f.default, float):
            values[f.name] = t.duration(f.name, f.default, least=f.metadata.get("min"))
        else:
            low, high = f.metadata.get("min", 1), f.metadata.get("max")
            value = t.integer(f.name, f.default, low=low, high=high)
            values[f.name] = min(value, f.metadata.get("clamp", value))
    t.close()
    return cls(**values)


def _outputs(t: _Table) -> OutputsSettings:
    outputs = _counts(t, OutputsSettings)
    if outputs.cache_entries > 0 and outputs.cache_bytes == 0 and "cache_entries" not in t.bad:
        t.fail(
            "cache_bytes",
            "must be > 0 while cache_entries > 0 (set cache_entries = 0 to cache no outputs)",
        )
    return outputs


# --- [[pools]] ---------------------------------------------------------------------------------


def _pools(top: _Table, limits: LimitsSettings, env: Mapping[str, str]) -> tuple[PoolSettings, ...]:
    tables = top.tables("pools")
    if tables is None:
        return (PoolSettings("default", max_pending=limits.max_pending_per_pool),)
    if top.data["pools"] == []:
        top.fail("pools", "must list at least one pool (leave it out for the default pool)")
    pools: list[PoolSettings] = []
    first: dict[str, str] = {}
    for t in tables:
        pool = _pool(t, limits, env)
        if "name" not in t.bad and pool.name:
            if pool.name in first:
                t.fail("name", f"duplicate pool name {_quote(pool.name)} (see {first[pool.name]})")
            first.setdefault(pool.name, t.path)
        pools.append(pool)
    return tuple(pools)


def _pool(t: _Table, limits: LimitsSettings, env: Mapping[str, str]) -> PoolSettings:
    d = PoolSettings("", max_pending=limits.max_pending_per_pool)
    t.require("name")
    name = t.string("name", "")
    if name and not _NAME.fullmatch(name):
        t.fail("name", f"{_NAME_RULE} (got {_quote(name)})")
    fraction = t.number("reservable_fraction", d.reservable_fraction)
    if "reservable_fraction" not in t.bad and not 0 < fraction <= 1:
        # stricter than the library's [0, 1]: a server pool reserves at least a sliver
        t.fail("reservable_fraction", f"must be in (0, 1] (got {t.data['reservable_fraction']})")
        fraction = d.reservable_fraction
    pool = PoolSettings(
        name=name,
        min=t.integer("min", d.min),
        max=t.integer("max", d.max),
        autoscale=t.boolean("autoscale", d.autoscale),
        scaler=_scaler(t.table("scaler"), env),
        lease_ttl_s=t.duration("lease_ttl_s", d.lease_ttl_s, least=MIN_TIMEOUT_S),
        max_pending=t.integer("max_pending", d.max_pending, low=1),
        overflow=t.string("overflow", d.overflow),
        retry=_retry(t.optional_table("retry")),
        default_duration_s=t.duration("default_duration_s", d.default_duration_s, positive=False),
        reservable_fraction=fraction,
        # 0 is accepted: an unknown dependency is then awaited for no time at all
        await_unknown_dependencies_s=t.duration(
            "await_unknown_dependencies_s", None, positive=False
        ),
        target_utilization=t.number("target_utilization", d.target_utilization),
        drain_time_s=t.duration("drain_time_s", d.drain_time_s, least=MIN_DRAIN_TIME_S),
        cooldown_s=t.duration("cooldown_s", d.cooldown_s, positive=False),
        cost_per_worker_second=t.number("cost_per_worker_second", d.cost_per_worker_second),
        max_slots_per_worker=t.integer("max_slots_per_worker", None, low=1),
        fair_share=t.boolean("fair_share", d.fair_share),
        tenant_weights=_tenant_weights(t),
    )
    # min <= max compares two values: if either is wrong, the comparison means nothing
    bounds = {} if {"min", "max"} & t.bad else {"min": pool.min, "max": pool.max}
    _library_rules(
        t,
        lambda **kw: Pool("_", _remote, autoscale=False, **kw),
        {
            **bounds,
            "max_pending": pool.max_pending,
            "overflow": pool.overflow,
            "reservable_fraction": pool.reservable_fraction,
            "tenant_weights": pool.tenant_weights,
        },
    )
    _library_rules(
        t,
        AutoscaleConfig,
        {
            "target_utilization": pool.target_utilization,
            "cost_per_worker_second": pool.cost_per_worker_second,
        },
    )
    t.close()
    return pool


def _retry(t: _Table | None) -> RetrySettings:
    """A pool's `retry` table; without one, the engine's policy. A table must give
    `max_attempts`, as the HTTP API's retry object must."""
    d = RetrySettings()
    if t is None:
        return d
    t.require("max_attempts")
    retry = RetrySettings(
        max_attempts=t.integer("max_attempts", d.max_attempts),
        initial_backoff_s=t.duration("initial_backoff_s", d.initial_backoff_s, positive=False),
        multiplier=t.number("multiplier", d.multiplier),
        max_backoff_s=t.duration("max_backoff_s", d.max_backoff_s, positive=False),
        jitter=t.boolean("jitter", d.jitter),
    )
    if "multiplier" not in t.bad and retry.multiplier > MAX_MULTIPLIER:
        t.fail("multiplier", f"must be at most {MAX_MULTIPLIER:g} (got {t.data['multiplier']})")
        retry = dataclasses.replace(retry, multiplier=d.multiplier)
    _library_rules(
        t, RetryPolicy, {"max_attempts": retry.max_attempts, "multiplier": retry.multiplier}
    )
    t.close()
    return retry


def _tenant_weights(pool: _Table) -> dict[str, float]:
    t = pool.table("tenant_weights")
    weights = {tenant: t.number(tenant, 1.0) for tenant in t.data}
    if t.bad:
        pool.bad.add("tenant_weights")
    return weights


def _scaler(t: _Table, env: Mapping[str, str]) -> ScalerSettings:
    kind = t.string("kind", "external", choices=SCALER_KINDS)
    if "kind" in t.bad:
        return ScalerSettings()  # the other keys depend on the kind: report only the kind
    if kind == "external":
        return _closed(t, ScalerSettings())
    t.require("url")
    url = t.string("url", "")
    token_env = t.string("token_env", None)
    token = None
    if token_env is not None:
        token = env.get(token_env)
        if token is None:
            t.fail("token_env", f"environment variable {_quote(token_env)} is not set")
    problem = _url_problem(url) if url else None
    if problem is not None:
        t.fail("url", f"{problem} (got {_quote(url)})")
    elif url and urlsplit(url).scheme == "http" and not loopback_name(urlsplit(url).hostname or ""):
        # accepted, but said out loud (docs/configuration.md, "[[pools]]")
        _log.warning("%s: plain http to another host; prefer https", t.path_of("url"))
        if token_env is not None:
            _log.warning("%s: the webhook token would cross the network in clear text", t.path)
    return _closed(t, ScalerSettings(kind, url, token_env, token))


# --- [[shards]] and [[resources]] --------------------------------------------------------------


def _shards(
    tables: list[_Table] | None,
    pools: Sequence[PoolSettings],
    shard: str | None,
    errors: list[str],
) -> tuple[ShardSettings, ...]:
    """docs/configuration.md, "[[shards]]" (parsed and checked; routing between shards is the
    server's business)."""
    shards: list[ShardSettings] = []
    by_name: dict[str, str] = {}
    by_number: dict[int, str] = {}
    by_endpoint: dict[tuple[str, str, int], str] = {}
    serving: dict[str, str] = {}  # pool -> path of the shard that serves it
    for t in tables or []:
        t.require("name", "number", "pools", "endpoint")
        name = t.string("name", "")
        if name and not _SHARD_NAME.fullmatch(name):
            t.fail("name", f"{_SHARD_NAME_RULE} (got {_quote(name)})")
        elif name in by_name:
            t.fail("name", f"duplicate shard name {_quote(name)} (see {by_name[name]})")
        by_name.setdefault(name, t.path)
        number = t.integer("number", None, low=0, high=255)
        if number is not None:
            if number in by_number:
                t.fail("number", f"{number} is already the number of {by_number[number]}")
            by_number.setdefault(number, t.path)
        served = t.strings("pools") or ()
        if t.has("pools") and not served and "pools" not in t.bad:
            t.fail("pools", "must not be empty")
        for pool in served:
            if serving.get(pool) == t.path:
                t.fail("pools", f"lists pool {_quote(pool)} twice")
            elif pool in serving:
                t.fail("pools", f"pool {_quote(pool)} is already served by {serving[pool]}")
            serving.setdefault(pool, t.path)
        endpoint = t.string("endpoint", "")
        problem = _endpoint_problem(endpoint) if endpoint else None
        if problem is not None:
            t.fail("endpoint", problem)
        elif endpoint:
            key = _endpoint_key(endpoint)
            if key in by_endpoint:
                t.fail(
                    "endpoint",
                    f"{_quote(endpoint)} is already the endpoint of {by_endpoint[key]}",
                )
            by_endpoint.setdefault(key, t.path)
        shards.append(ShardSettings(name, 0 if number is None else number, served, endpoint))
        t.close()

    configured = {p.name for p in pools}
    if shards:
        for i, p in enumerate(pools):
            if p.name and p.name not in serving:
                errors.append(f"pools[{i}].name: pool {_quote(p.name)} is in no [[shards]] entry")
    if shard is None:
        if shards:
            errors.append("server.shard: is required when [[shards]] is configured (or --shard)")
    elif not shards:
        errors.append(
            f"server.shard: is set but no [[shards]] is configured (got {_quote(shard)}, from "
            "the file, --shard or CRONOQ_SHARD)"
        )
    elif shard not in by_name:
        errors.append(f"server.shard: must name one of the [[shards]] (got {_quote(shard)})")
    else:
        for i, own in enumerate(shards):
            if own.name == shard:
                for pool in own.pools:
                    if pool not in configured:
                        errors.append(
                            f"shards[{i}].pools: pool {_quote(pool)} of this server's shard "
                            "is not configured in [[pools]]"
                        )
    return tuple(shards)


def _resources(
    tables: list[_Table] | None, shards: Sequence[ShardSettings]
) -> tuple[ResourceSettings, ...]:
    shard_names = {s.name for s in shards}
    resources: list[ResourceSettings] = []
    first: dict[str, str] = {}
    for t in tables or []:
        t.require("kind")
        kind = t.string("kind", None, choices=RESOURCE_KINDS)
        if kind is None:
            continue  # the other keys depend on the kind: report only the kind
        t.require("name")
        name = t.string("name", "")
        if name in first:
            t.fail("name", f"duplicate resource name {_quote(name)} (see {first[name]})")
        first.setdefault(name, t.path)
        # docs/configuration.md, "[[resources]]": each shard counts its resources separately,
        # so with [[shards]] every resource names the one shard that counts it
        shard = t.string("shard", None)
        if shards and shard is None and "shard" not in t.bad:
            t.fail(
                "shard", "is required with [[shards]]: each shard counts its resources separately"
            )
        elif not shards and shard is not None:
            t.fail("shard", f"is set but no [[shards]] is configured (got {_quote(shard)})")
        elif shard is not None and shard not in shard_names:
            t.fail("shard", f"must name one of the [[shards]] (got {_quote(shard)})")
        resource: ResourceSettings
        if kind == "semaphore":
            t.require("permits")
            resource = SemaphoreSettings(name, t.integer("permits", 1), shard)
            _library_rules(
                t,
                lambda permits=1: Resource.semaphore("_", permits),
                {"permits": resource.permits},
            )
        else:
            t.require("rate", "burst")
            resource = TokenBucketSettings(
                name, t.number("rate", 1.0), t.integer("burst", 1), shard
            )
            _library_rules(
                t,
                lambda rate=1.0, burst=1: Resource.token_bucket("_", rate, burst),
                {"rate": resource.rate, "burst": resource.burst},
            )
        resources.append(resource)
        t.close()
    return tuple(resources)


# --- [auth] ------------------------------------------------------------------------------------


def _auth(
    t: _Table, env: Mapping[str, str], known_pools: set[str], server: ServerSettings
) -> AuthSettings:
    tokens: list[TokenSettings] = []
    first: dict[bytes, str] = {}
    for tt in t.tables("tokens") or []:
        token = _token(tt, env)
        grant = _grant(tt, known_pools)
        if token is not None:
            key, digest = token
            if digest in first:
                tt.fail(key, f"the same token as {first[digest]}")
            first.setdefault(digest, tt.path)
            tokens.append(TokenSettings(digest, grant))
        tt.close()

    certs: list[CertSettings] = []
    names: dict[str, str] = {}
    for ct in t.tables("certs") or []:
        key, dns = _cert_name(ct)
        if dns and dns in names:
            ct.fail(key, f"the same name as {names[dns]}")
        names.setdefault(dns, ct.path)
        certs.append(CertSettings(dns, _grant(ct, known_pools)))
        ct.close()
    if certs and (server.tls is None or server.tls.client_ca is None):
        t.fail("certs", "client certificates are only asked for with server.tls.client_ca set")
    t.close()
    return AuthSettings(tuple(tokens), tuple(certs))


def _cert_name(t: _Table) -> tuple[str, str]:
    """The key that names the certificate's DNS SAN (`dns_name`, or its alias `dns`) and the
    name ("" when missing or wrong, already reported)."""
    given = [key for key in ("dns_name", "dns") if t.has(key)]
    names = {key: t.string(key, "") for key in ("dns_name", "dns")}
    if not given:
        t.fail("dns_name", "is required")
        return "dns_name", ""
    if len(given) == 2:
        t.error("give either dns_name or dns (its alias), not both")
        return "dns_name", ""
    return given[0], names[given[0]]


def _token(t: _Table, env: Mapping[str, str]) -> tuple[str, bytes] | None:
    """The key the secret came from and its SHA-256 digest; the secret itself goes no further."""
    token = t.string("token", None)
    var = t.string("token_env", None)
    if t.has("token") == t.has("token_env"):
        t.error("give exactly one of token and token_env")
        return None
    secret: str | None = token
    key, whose = "token", ""
    if var is not None:
        key, whose = "token_env", f" (the value of {var})"
        secret = env.get(var)
        if secret is None:
            t.fail(key, f"environment variable {_quote(var)} is not set")
    if secret is None:  # missing, or a wrong type already reported
        return None
    if len(secret) < MIN_TOKEN_LEN:
        t.fail(key, f"must be at least {MIN_TOKEN_LEN} characters{whose}")
        return None
    if len(secret) < SHORT_TOKEN_LEN:
        _log.warning(
            "%s: a token shorter than %d characters is easier to guess",
            t.path_of(key),
            SHORT_TOKEN_LEN,
        )
    return key, hashlib.sha256(secret.encode()).digest()


def _grant(t: _Table, known_pools: set[str]) -> Grant:
    t.require("role")
    role = t.string("role", "", choices=ROLES)
    pools = t.strings("pools")  # [] allows no pool at all; leaving it out allows every pool
    for pool in pools or ():
        if pool not in known_pools:
            t.fail("pools", f"unknown pool {_quote(pool)}")
    labels = None
    texts = t.strings("labels")
    if texts is not None:
        pairs = []
        for i, text in enumerate(texts):
            name, sep, value = text.partition("=")
            if not (sep and name):  # the value may be empty: "gpu=" allows gpu=""
                t.fail(f"labels[{i}]", f'must be "name=value" (got {_quote(text)})')
            pairs.append((name, value))
        labels = tuple(pairs)
    return Grant(role, pools, labels, t.string("tenant", None))
