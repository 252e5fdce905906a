"""The TOML reader: `read_config`, `apply_overrides` and `validate`, one function per step of
docs/configuration.md, "Loading order and errors", and a reader per table that records each
complaint as `<key path>: <rule>` and carries on with the key's default."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import ipaddress
import logging
import os
import re
import socket
import tomllib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from cronoq._options import AutoscaleConfig, Pool, Resource
from cronoq.core.model import RetryPolicy
from cronoq.server.hosts import loopback_name

from .library import remote_executor
from .settings import (
    LEADER_LEASE_S,
    LOG_FORMAT_ENV,
    LOG_FORMATS,
    LOG_LEVELS,
    MAX_ENDPOINT_LEN,
    MAX_MULTIPLIER,
    MAX_ORIGINS,
    MIN_DRAIN_TIME_S,
    MIN_KEEP_FINISHED_S,
    MIN_LEADER_LEASE_S,
    MIN_TIMEOUT_S,
    MIN_TOKEN_LEN,
    NOT_BUILT,
    RESOURCE_KINDS,
    ROLES,
    SCALER_KINDS,
    SHARD_MARK,
    SHORT_TOKEN_LEN,
    STORE_KINDS,
    TRANSPORT_ENV,
    TRANSPORTS,
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
from .tables import Table, library_rules, quote

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_NAME_RULE = "must be 1-64 characters of A-Z, a-z, 0-9, '_', '.', ':' and '-'"
_SHARD_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
_SHARD_NAME_RULE = "must be 1-32 characters of a-z, 0-9 and '_', starting with a letter"
_SQL_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_T = TypeVar("_T")
_Settings = TypeVar("_Settings", bound="DataclassInstance")


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
    top = Table(errors, "", raw)
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
    tracing = _tracing(top.table("tracing"))
    top.close()
    _check_listeners(errors, server, auth)
    _check_peer_identity(errors, server, auth)
    if errors:
        raise ConfigError(errors)
    return ServerConfig(server, auth, store, limits, pools, resources, outputs, shards, tracing)


# --- [server] ----------------------------------------------------------------------------------


def _socket_address(text: str) -> SocketAddress:
    """ "host:port" or "[v6 host]:port" with a port 0-65535 and an IP literal host, or a host
    name that resolves (`localhost:7070`): a ValueError says why not."""
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit() and len(port) <= 5) or int(port) > 65535:
        raise ValueError(f"not a socket address ({quote(text)})")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if bracketed or not host:
            raise ValueError(f"not a socket address ({quote(text)})") from None
        return SocketAddress(_resolve(text, host), int(port))
    if (ip.version == 6) != bracketed:
        raise ValueError(f"not a socket address ({quote(text)})")
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
            f"not a socket address ({quote(text)}): the host name {quote(name)} does not "
            "resolve; give an IP address, such as 127.0.0.1:7070"
        )
    return next((ip for ip in ips if ":" not in ip), ips[0])


def _address(t: Table, key: str, default: _T) -> SocketAddress | _T:
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
        return f"must not contain whitespace or control characters (got {quote(text)})"
    problem = _url_problem(text, bare=True)
    if problem is None and (_endpoint_key(text)[2] == 0 or urlsplit(text).netloc.endswith(":")):
        problem = "must have a port from 1 to 65535, or none"
    return None if problem is None else f"{problem} (got {quote(text)})"


def _endpoint_key(text: str) -> tuple[str, str, int]:
    """What an endpoint reaches, to find two shards at one endpoint however each is spelled:
    the scheme, the host (in lower case) and the port (the scheme's default when absent)."""
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    default = 443 if scheme == "https" else 80
    return scheme, (parts.hostname or "").lower(), default if parts.port is None else parts.port


def _file(t: Table, key: str) -> str | None:
    """A path to a PEM file; checked here so that --check catches a missing certificate."""
    path = t.string(key, None)
    if path is not None and not os.path.isfile(path):
        t.fail(key, f"no such file ({quote(path)})")
    return path


def _server(t: Table, env: Mapping[str, str]) -> ServerSettings:
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
                sub.fail(f"allowed_origins[{i}]", f"{problem} (got {quote(origin)})")
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
        log_format=_log_format(t, env),
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


def _transport(t: Table, env: Mapping[str, str], grpc_web: bool) -> str:
    """`server.transport`, else CRONOQ_TRANSPORT, else "auto" (docs/server.md, "Transports")."""
    if t.has("transport"):
        transport = t.string("transport", "auto", choices=TRANSPORTS)
    else:
        transport = env.get(TRANSPORT_ENV) or "auto"
        if transport not in TRANSPORTS:
            listed = ", ".join(quote(c) for c in TRANSPORTS)
            t.fail("transport", f"{TRANSPORT_ENV} must be one of {listed} (got {quote(transport)})")
            return "auto"
    if transport == "native" and not native_built():
        t.fail("transport", f'"native": {NOT_BUILT}; use "auto" or "grpcio"')
    elif transport == "native" and grpc_web:
        t.fail(
            "transport",
            '"native" does not serve gRPC-Web ([server.grpc_web]): use "auto" or "grpcio"',
        )
    return transport


def _log_format(t: Table, env: Mapping[str, str]) -> str:
    """`server.log_format`, else CRONOQ_LOG_FORMAT, else "logfmt" (docs/server.md, "Logs")."""
    if t.has("log_format"):
        return t.string("log_format", "logfmt", choices=LOG_FORMATS)
    value = env.get(LOG_FORMAT_ENV) or "logfmt"
    if value == "text":  # `cronoq worker`'s name for its human lines: one variable serves both
        value = "logfmt"
    if value not in LOG_FORMATS:
        listed = ", ".join(quote(c) for c in LOG_FORMATS)
        t.fail("log_format", f"{LOG_FORMAT_ENV} must be one of {listed} (got {quote(value)})")
        return "logfmt"
    return value


def log_format_of(raw: Mapping[str, Any], *, env: Mapping[str, str] = os.environ) -> str:
    """The log format the raw tables ask for, before they are validated: "json" only when
    `server.log_format` is "json", or is absent and CRONOQ_LOG_FORMAT is "json"; else "logfmt".
    The command line writes the warnings found while validating in it; when it is not "json",
    validation either finds "logfmt" too or refuses the value."""
    server = raw.get("server")
    if isinstance(server, Mapping) and "log_format" in server:
        value = server["log_format"]
    else:
        value = env.get(LOG_FORMAT_ENV)
    return "json" if value == "json" else "logfmt"


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


def _store(t: Table, env: Mapping[str, str], *, sharded: bool, shard: str | None) -> StoreSettings:
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
            t.fail("path", f"{rule} (got {quote(path)})")
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


def _schema(t: Table, sharded: bool, shard: str | None) -> str:
    """`store.schema`, with `{shard}` replaced (docs/configuration.md, "The store of a shard"):
    each shard has a schema of its own, so with [[shards]] the name must contain `{shard}`."""
    schema = t.string("schema", f"cronoq_{SHARD_MARK}" if sharded else "public")
    if "schema" in t.bad:
        return schema
    if not sharded:
        if SHARD_MARK in schema:
            rule = f"contains {SHARD_MARK} but no [[shards]] is configured"
            t.fail("schema", f"{rule} (got {quote(schema)})")
        elif not _SQL_IDENTIFIER.fullmatch(schema):
            rule = "must be a plain SQL identifier of 1-63 characters"
            t.fail("schema", f"{rule} (got {quote(schema)})")
        return schema
    if SHARD_MARK not in schema:
        t.fail(
            "schema",
            f"must contain {SHARD_MARK} with [[shards]], so that each shard has a schema of its "
            f"own (got {quote(schema)})",
        )
        return schema
    # an unknown shard is reported elsewhere: the shortest shard name stands in for it
    named = schema.replace(SHARD_MARK, shard or "s")
    if not _SQL_IDENTIFIER.fullmatch(named):
        rule = f"must be a plain SQL identifier of 1-63 characters once {SHARD_MARK} is replaced"
        giving = "" if shard is None else f", giving {quote(named)}"
        t.fail("schema", f"{rule} (got {quote(schema)}{giving})")
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


def _closed(t: Table, value: _T) -> _T:
    t.close()
    return value


def _counts(t: Table, cls: type[_Settings]) -> _Settings:
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


def _outputs(t: Table) -> OutputsSettings:
    outputs = _counts(t, OutputsSettings)
    if outputs.cache_entries > 0 and outputs.cache_bytes == 0 and "cache_entries" not in t.bad:
        t.fail(
            "cache_bytes",
            "must be > 0 while cache_entries > 0 (set cache_entries = 0 to cache no outputs)",
        )
    return outputs


def _tracing(t: Table) -> TracingSettings:
    flag = t.boolean("enabled", False)
    enabled = flag if t.has("enabled") else None  # (absent: the variables decide)
    endpoint = t.string("endpoint", None)
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        t.fail("endpoint", f"must be an http:// or https:// URL (got {quote(endpoint)})")
    ratio = t.number("sample_ratio", None)
    if ratio is not None and not 0.0 <= ratio <= 1.0:
        t.fail("sample_ratio", f"must be from 0 to 1 (got {ratio:g})")
    settings = TracingSettings(enabled, endpoint, t.string("service_name", None), ratio)
    t.close()
    return settings


# --- [[pools]] ---------------------------------------------------------------------------------


def _pools(top: Table, limits: LimitsSettings, env: Mapping[str, str]) -> tuple[PoolSettings, ...]:
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
                t.fail("name", f"duplicate pool name {quote(pool.name)} (see {first[pool.name]})")
            first.setdefault(pool.name, t.path)
        pools.append(pool)
    return tuple(pools)


def _pool(t: Table, limits: LimitsSettings, env: Mapping[str, str]) -> PoolSettings:
    d = PoolSettings("", max_pending=limits.max_pending_per_pool)
    t.require("name")
    name = t.string("name", "")
    if name and not _NAME.fullmatch(name):
        t.fail("name", f"{_NAME_RULE} (got {quote(name)})")
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
    library_rules(
        t,
        lambda **kw: Pool("_", remote_executor, autoscale=False, **kw),
        {
            **bounds,
            "max_pending": pool.max_pending,
            "overflow": pool.overflow,
            "reservable_fraction": pool.reservable_fraction,
            "tenant_weights": pool.tenant_weights,
        },
    )
    library_rules(
        t,
        AutoscaleConfig,
        {
            "target_utilization": pool.target_utilization,
            "cost_per_worker_second": pool.cost_per_worker_second,
        },
    )
    t.close()
    return pool


def _retry(t: Table | None) -> RetrySettings:
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
    library_rules(
        t, RetryPolicy, {"max_attempts": retry.max_attempts, "multiplier": retry.multiplier}
    )
    t.close()
    return retry


def _tenant_weights(pool: Table) -> dict[str, float]:
    t = pool.table("tenant_weights")
    weights = {tenant: t.number(tenant, 1.0) for tenant in t.data}
    if t.bad:
        pool.bad.add("tenant_weights")
    return weights


def _scaler(t: Table, env: Mapping[str, str]) -> ScalerSettings:
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
            t.fail("token_env", f"environment variable {quote(token_env)} is not set")
    problem = _url_problem(url) if url else None
    if problem is not None:
        t.fail("url", f"{problem} (got {quote(url)})")
    elif url and urlsplit(url).scheme == "http" and not loopback_name(urlsplit(url).hostname or ""):
        # accepted, but said out loud (docs/configuration.md, "[[pools]]")
        _log.warning("%s: plain http to another host; prefer https", t.path_of("url"))
        if token_env is not None:
            _log.warning("%s: the webhook token would cross the network in clear text", t.path)
    return _closed(t, ScalerSettings(kind, url, token_env, token))


# --- [[shards]] and [[resources]] --------------------------------------------------------------


def _shards(
    tables: list[Table] | None,
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
            t.fail("name", f"{_SHARD_NAME_RULE} (got {quote(name)})")
        elif name in by_name:
            t.fail("name", f"duplicate shard name {quote(name)} (see {by_name[name]})")
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
                t.fail("pools", f"lists pool {quote(pool)} twice")
            elif pool in serving:
                t.fail("pools", f"pool {quote(pool)} is already served by {serving[pool]}")
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
                    f"{quote(endpoint)} is already the endpoint of {by_endpoint[key]}",
                )
            by_endpoint.setdefault(key, t.path)
        shards.append(ShardSettings(name, 0 if number is None else number, served, endpoint))
        t.close()

    configured = {p.name for p in pools}
    if shards:
        for i, p in enumerate(pools):
            if p.name and p.name not in serving:
                errors.append(f"pools[{i}].name: pool {quote(p.name)} is in no [[shards]] entry")
    if shard is None:
        if shards:
            errors.append("server.shard: is required when [[shards]] is configured (or --shard)")
    elif not shards:
        errors.append(
            f"server.shard: is set but no [[shards]] is configured (got {quote(shard)}, from "
            "the file, --shard or CRONOQ_SHARD)"
        )
    elif shard not in by_name:
        errors.append(f"server.shard: must name one of the [[shards]] (got {quote(shard)})")
    else:
        for i, own in enumerate(shards):
            if own.name == shard:
                for pool in own.pools:
                    if pool not in configured:
                        errors.append(
                            f"shards[{i}].pools: pool {quote(pool)} of this server's shard "
                            "is not configured in [[pools]]"
                        )
    return tuple(shards)


def _resources(
    tables: list[Table] | None, shards: Sequence[ShardSettings]
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
            t.fail("name", f"duplicate resource name {quote(name)} (see {first[name]})")
        first.setdefault(name, t.path)
        # docs/configuration.md, "[[resources]]": each shard counts its resources separately,
        # so with [[shards]] every resource names the one shard that counts it
        shard = t.string("shard", None)
        if shards and shard is None and "shard" not in t.bad:
            t.fail(
                "shard", "is required with [[shards]]: each shard counts its resources separately"
            )
        elif not shards and shard is not None:
            t.fail("shard", f"is set but no [[shards]] is configured (got {quote(shard)})")
        elif shard is not None and shard not in shard_names:
            t.fail("shard", f"must name one of the [[shards]] (got {quote(shard)})")
        resource: ResourceSettings
        if kind == "semaphore":
            t.require("permits")
            resource = SemaphoreSettings(name, t.integer("permits", 1), shard)
            library_rules(
                t,
                lambda permits=1: Resource.semaphore("_", permits),
                {"permits": resource.permits},
            )
        else:
            t.require("rate", "burst")
            resource = TokenBucketSettings(
                name, t.number("rate", 1.0), t.integer("burst", 1), shard
            )
            library_rules(
                t,
                lambda rate=1.0, burst=1: Resource.token_bucket("_", rate, burst),
                {"rate": resource.rate, "burst": resource.burst},
            )
        resources.append(resource)
        t.close()
    return tuple(resources)


# --- [auth] ------------------------------------------------------------------------------------


def _auth(
    t: Table, env: Mapping[str, str], known_pools: set[str], server: ServerSettings
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


def _cert_name(t: Table) -> tuple[str, str]:
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


def _token(t: Table, env: Mapping[str, str]) -> tuple[str, bytes] | None:
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
            t.fail(key, f"environment variable {quote(var)} is not set")
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


def _grant(t: Table, known_pools: set[str]) -> Grant:
    t.require("role")
    role = t.string("role", "", choices=ROLES)
    pools = t.strings("pools")  # [] allows no pool at all; leaving it out allows every pool
    for pool in pools or ():
        if pool not in known_pools:
            t.fail("pools", f"unknown pool {quote(pool)}")
    labels = None
    texts = t.strings("labels")
    if texts is not None:
        pairs = []
        for i, text in enumerate(texts):
            name, sep, value = text.partition("=")
            if not (sep and name):  # the value may be empty: "gpu=" allows gpu=""
                t.fail(f"labels[{i}]", f'must be "name=value" (got {quote(text)})')
            pairs.append((name, value))
        labels = tuple(pairs)
    return Grant(role, pools, labels, t.string("tenant", None))
