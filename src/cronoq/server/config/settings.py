"""The validated configuration: frozen dataclasses, one per table of docs/configuration.md,
and the limits its rules use. Secrets are left out of every repr."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cronoq.core.autoscale import AutoscaleSettings
from cronoq.core.model import DEFAULT_RETRY, PoolConfig
from cronoq.errors import SchedulerError

if TYPE_CHECKING:
    pass

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
LOG_FORMATS = ("logfmt", "json")  # server.log_format
LOG_FORMAT_ENV = "CRONOQ_LOG_FORMAT"
STORE_KINDS = ("memory", "sqlite", "postgres")
SCALER_KINDS = ("external", "webhook")
RESOURCE_KINDS = ("semaphore", "token_bucket")
# Pool names travel in metrics labels and gRPC metadata: keep them plain.
# Shard names are plainer still: they also go into schema names and file paths ({shard}).
MAX_ENDPOINT_LEN = 256  # shards[].endpoint
SHARD_MARK = "{shard}"  # replaced by this server's shard name in store.schema and store.path
# The schema name is put into SQL statements, so only a plain identifier will do.


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
    # "logfmt" or "json": how log records are written (docs/server.md, "Logs")
    log_format: str = "logfmt"
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
class TracingSettings:
    """`[tracing]`: spans over OTLP/HTTP (docs/observability.md, "Traces"). `enabled` None:
    on when the standard OTEL_* variables name an endpoint; `endpoint` the full traces URL
    (else OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT); `sample_ratio` None: OTEL_TRACES_SAMPLER(_ARG),
    else 1; `service_name` None: OTEL_SERVICE_NAME, else "cronoq-server"."""

    enabled: bool | None = None
    endpoint: str | None = None
    service_name: str | None = None
    sample_ratio: float | None = None


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
    tracing: TracingSettings = TracingSettings()

    @property
    def own_shard(self) -> ShardSettings | None:
        """The `[[shards]]` entry this server serves (named by `server.shard`); None without
        shards."""
        return next((s for s in self.shards if s.name == self.server.shard), None)
