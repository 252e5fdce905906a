"""The server's configuration: TOML in, validated frozen dataclasses out (docs/configuration.md).
`settings` holds the types, `tables` and `reader` the TOML reader, `library` the conversion to
the library's types; this package's names are the public face of all four.

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

from .library import core_pools, core_resources, library_pools, library_resources
from .reader import (
    apply_overrides,
    load_config,
    log_format_of,
    native_built,
    read_config,
    transport_of,
    validate,
)
from .settings import (
    AuthSettings,
    CertSettings,
    ConfigError,
    Grant,
    GrpcWebSettings,
    LimitsSettings,
    OutputsSettings,
    PeerTlsSettings,
    PoolSettings,
    ResourceSettings,
    RetrySettings,
    ScalerSettings,
    SemaphoreSettings,
    ServerConfig,
    ServerSettings,
    ShardSettings,
    SocketAddress,
    StoreSettings,
    TlsSettings,
    TokenBucketSettings,
    TokenSettings,
    TracingSettings,
)

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
    "TracingSettings",
    "apply_overrides",
    "core_pools",
    "core_resources",
    "library_pools",
    "library_resources",
    "load_config",
    "log_format_of",
    "native_built",
    "read_config",
    "transport_of",
    "validate",
]
