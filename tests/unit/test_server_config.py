"""cronoq.server.config: reading, overriding and validating the server's TOML
(docs/configuration.md, docs/reference/limits.md) and the conversion to the engine's pool and
resource types."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from cronoq import Pool
from cronoq.core.autoscale import AutoscaleSettings
from cronoq.core.engine import Engine
from cronoq.core.resources import ResourceConfig
from cronoq.errors import SchedulerError
from cronoq.server.config import (
    ConfigError,
    Grant,
    LimitsSettings,
    SemaphoreSettings,
    ServerConfig,
    SocketAddress,
    TokenBucketSettings,
    apply_overrides,
    core_pools,
    core_resources,
    library_pools,
    library_resources,
    load_config,
    read_config,
    validate,
)

CLIENT = "client-token-0123456789abcdefghij"  # 33 characters
WORKER = "worker-token-0123456789abcdefghij"
ADMIN = "admin-token-0123456789abcdefghijk"
ENV = {"CRONOQ_CLIENT_TOKEN": CLIENT, "CRONOQ_WORKER_TOKEN": WORKER}


def errors_of(text: str, env: Mapping[str, str] | None = None, **overrides: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(text, env=ENV if env is None else env, **overrides)
    assert str(info.value) == "\n".join(info.value.errors)
    return list(info.value.errors)


def leaves(value: object) -> Iterator[object]:
    """Every leaf value of a config object: dataclass fields, tuples and mappings opened."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from leaves(getattr(value, f.name))
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from leaves(item)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield key
            yield from leaves(item)
    else:
        yield value


@pytest.fixture
def pem(tmp_path: Path) -> Path:
    """A directory holding cert.pem, key.pem and ca.pem (validation checks only that they exist)."""
    for name in ("cert.pem", "key.pem", "ca.pem"):
        (tmp_path / name).write_text("-----BEGIN PLACEHOLDER-----\n")
    return tmp_path


# --- the embedded default (docs/configuration.md, "The embedded default") -------------------------


def test_no_file_gives_the_embedded_default() -> None:
    cfg = load_config(None, env={})
    assert cfg == load_config("", env={}) == ServerConfig()
    assert str(cfg.server.grpc_addr) == "127.0.0.1:7070"
    assert str(cfg.server.http_addr) == "127.0.0.1:7071"
    assert cfg.server.metrics_addr is None and cfg.server.tls is None
    assert cfg.server.shutdown_grace_s == 10.0 and cfg.server.log_level == "info"
    assert cfg.server.grpc_web is None and not cfg.server.insecure_no_auth
    assert cfg.store.kind == "memory"
    assert not cfg.auth.enabled
    (pool,) = cfg.pools
    # the published server's pool defaults (docs/configuration.md, "[[pools]]")
    assert (pool.name, pool.min, pool.max, pool.lease_ttl_s, pool.autoscale) == (
        "default",
        0,
        10,
        30.0,
        True,
    )
    assert pool.max_pending == 100_000 and pool.overflow == "reject"
    assert pool.scaler.kind == "external" and pool.await_unknown_dependencies_s is None
    assert (pool.default_duration_s, pool.reservable_fraction) == (1.0, 0.5)
    assert (pool.target_utilization, pool.drain_time_s, pool.cooldown_s) == (0.75, 30.0, 30.0)
    assert (pool.cost_per_worker_second, pool.max_slots_per_worker) == (0.0, None)
    assert not pool.fair_share and pool.tenant_weights == {}
    retry = pool.retry
    assert (
        retry.max_attempts,
        retry.initial_backoff_s,
        retry.multiplier,
        retry.max_backoff_s,
        retry.jitter,
    ) == (3, 1.0, 2.0, 60.0, True)
    assert cfg.resources == () and cfg.shards == ()


def test_limits_and_outputs_defaults() -> None:
    cfg = load_config(None, env={})
    assert dataclasses.asdict(cfg.limits) == {
        "max_tasks_per_batch": 1000,
        "max_pending_total": 1_000_000,
        "max_pending_per_pool": 100_000,
        "max_message_bytes": 16_777_216,
        "max_http_body_bytes": 16_777_216,
        "max_key_len": 256,
        "max_kind_len": 128,
        "max_tags": 32,
        "max_tag_len": 1024,
        "max_deps": 256,
        "max_resources": 16,
        "max_wait_s": 300.0,
        "request_timeout_s": 30.0,
        "max_concurrent_requests": 4096,
        "max_concurrent_streams": 1024,
        "max_unsent_bytes_per_connection": 67_108_864,
        "max_slots_per_worker": 1024,
        "keepalive_interval_s": 20.0,
        "keepalive_timeout_s": 20.0,
        "key_retention_s": 3600.0,
        "key_retention_max": 1_000_000,
        "max_list": 1000,
    }
    assert dataclasses.asdict(cfg.outputs) == {
        "cache_entries": 10_000,
        "cache_bytes": 67_108_864,
        "info_entries": 100_000,
    }


def test_the_store_defaults() -> None:
    sqlite = load_config('[store]\nkind = "sqlite"\npath = "s.db"\n', env={}).store
    assert (sqlite.kind, sqlite.keep_finished_s) == ("sqlite", 604_800.0)
    pg = '[store]\nkind = "postgres"\n'
    postgres = load_config(pg, env={"DATABASE_URL": "postgres://h/db"}).store
    assert (postgres.url_env, postgres.keep_finished_s, postgres.schema) == (
        "DATABASE_URL",
        604_800.0,
        "public",
    )


def test_limits_keys_are_read_and_the_pool_bound_follows_them() -> None:
    cfg = load_config(
        "[limits]\nmax_list = 50\nmax_wait_s = 60\nmax_pending_per_pool = 7\n", env={}
    )
    assert (cfg.limits.max_list, cfg.limits.max_wait_s) == (50, 60.0)
    assert cfg.limits.max_tags == LimitsSettings().max_tags
    assert cfg.pools[0].max_pending == 7


# --- a full configuration ----------------------------------------------------------------------

FULL = """
[server]
grpc_addr = "0.0.0.0:7070"
http_addr = "[::]:7071"
metrics_addr = "10.0.0.5:9090"
shutdown_grace_s = 0.5
insecure_peer_http = true
shard = "cpu"
log_level = "debug"

[server.tls]
cert = "@DIR@/cert.pem"
key = "@DIR@/key.pem"
client_ca = "@DIR@/ca.pem"

[server.grpc_web]
allowed_origins = ["https://dash.example.com", "http://localhost:3000"]

[server.peer_tls]
ca = "@DIR@/ca.pem"
cert = "@DIR@/cert.pem"
key = "@DIR@/key.pem"

[[auth.tokens]]
token_env = "CRONOQ_CLIENT_TOKEN"
role = "client"
tenant = "acme"

[[auth.tokens]]
token_env = "CRONOQ_WORKER_TOKEN"
role = "worker"
pools = ["llm"]
labels = ["gpu=a100", "zone=eu"]

[[auth.tokens]]
token = "@ADMIN@"
role = "admin"

[[auth.certs]]
dns_name = "worker-1.internal"
role = "worker"
pools = ["default"]

[store]
kind = "sqlite"
path = "/var/lib/cronoq/state.db"
keep_finished_s = 3600

[limits]
max_tasks_per_batch = 500
request_timeout_s = 10

[[pools]]
name = "llm"
min = 1
max = 16
autoscale = true
scaler = { kind = "webhook", url = "https://scaler.example.com/hook", token_env = "HOOK" }
lease_ttl_s = 10
max_pending = 1000
overflow = "shed_lowest"
default_duration_s = 2.5
reservable_fraction = 0.25
await_unknown_dependencies_s = 60
target_utilization = 0.5
drain_time_s = 10
cooldown_s = 5
cost_per_worker_second = 0.002
max_slots_per_worker = 4
fair_share = true
tenant_weights = { acme = 3, other = 1.5 }
[pools.retry]
max_attempts = 5
initial_backoff_s = 0.5
multiplier = 3
max_backoff_s = 20
jitter = false

[[pools]]
name = "default"
max = 8

[[resources]]
kind = "semaphore"
name = "db"
permits = 4
shard = "cpu"

[[resources]]
kind = "token_bucket"
name = "api"
rate = 2.5
burst = 10
shard = "gpu"

[outputs]
cache_entries = 0
cache_bytes = 1048576
info_entries = 5000

[[shards]]
name = "cpu"
number = 1
pools = ["default"]
endpoint = "http://127.0.0.1:7070"

[[shards]]
name = "gpu"
number = 2
pools = ["llm"]
endpoint = "https://gpu.internal:7070"
"""


def full_text(pem: Path) -> str:
    return FULL.replace("@DIR@", str(pem)).replace("@ADMIN@", ADMIN)


def test_full_configuration(pem: Path) -> None:
    cfg = load_config(full_text(pem), env={**ENV, "HOOK": "hook-secret"})
    server = cfg.server
    assert server.grpc_addr == SocketAddress("0.0.0.0", 7070)
    assert str(server.http_addr) == "[::]:7071"
    assert server.metrics_addr == SocketAddress("10.0.0.5", 9090)
    assert server.shutdown_grace_s == 0.5 and server.insecure_peer_http
    assert (server.shard, server.log_level) == ("cpu", "debug")
    assert server.tls is not None and server.tls.client_ca == f"{pem}/ca.pem"
    assert server.grpc_web is not None
    assert server.grpc_web.allowed_origins == ("https://dash.example.com", "http://localhost:3000")
    assert server.peer_tls is not None and server.peer_tls.key == f"{pem}/key.pem"

    client, worker, admin = cfg.auth.tokens
    assert client.grant == Grant("client", tenant="acme")
    assert worker.grant == Grant("worker", ("llm",), (("gpu", "a100"), ("zone", "eu")))
    assert admin.digest == hashlib.sha256(ADMIN.encode()).digest()
    (cert,) = cfg.auth.certs
    assert (cert.dns_name, cert.grant) == ("worker-1.internal", Grant("worker", ("default",)))

    assert (cfg.store.kind, cfg.store.path, cfg.store.keep_finished_s) == (
        "sqlite",
        "/var/lib/cronoq/state.db",
        3600.0,
    )
    assert cfg.limits.max_tasks_per_batch == 500 and cfg.limits.request_timeout_s == 10.0

    llm, default = cfg.pools
    assert (llm.min, llm.max, llm.autoscale, llm.lease_ttl_s) == (1, 16, True, 10.0)
    assert (llm.scaler.kind, llm.scaler.url, llm.scaler.token) == (
        "webhook",
        "https://scaler.example.com/hook",
        "hook-secret",
    )
    assert (llm.max_pending, llm.overflow) == (1000, "shed_lowest")
    assert (llm.retry.max_attempts, llm.retry.multiplier, llm.retry.jitter) == (5, 3.0, False)
    assert (llm.default_duration_s, llm.reservable_fraction) == (2.5, 0.25)
    assert llm.await_unknown_dependencies_s == 60.0
    assert (llm.target_utilization, llm.drain_time_s, llm.cooldown_s) == (0.5, 10.0, 5.0)
    assert (llm.cost_per_worker_second, llm.max_slots_per_worker) == (0.002, 4)
    assert llm.fair_share and llm.tenant_weights == {"acme": 3.0, "other": 1.5}
    assert (default.max, default.max_pending) == (8, 100_000)

    assert cfg.resources == (
        SemaphoreSettings("db", 4, "cpu"),
        TokenBucketSettings("api", 2.5, 10, "gpu"),
    )
    assert (cfg.outputs.cache_entries, cfg.outputs.cache_bytes) == (0, 1_048_576)
    assert [(s.name, s.number, s.pools, s.endpoint) for s in cfg.shards] == [
        ("cpu", 1, ("default",), "http://127.0.0.1:7070"),
        ("gpu", 2, ("llm",), "https://gpu.internal:7070"),
    ]
    assert "hook-secret" not in repr(cfg)


def test_spec_minimal_example_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.toml"
    path.write_text(
        """
[server]
grpc_addr = "0.0.0.0:7070"
http_addr = "0.0.0.0:7071"
shutdown_grace_s = 30

[[auth.tokens]]
token_env = "CRONOQ_CLIENT_TOKEN"
role = "client"

[[auth.tokens]]
token_env = "CRONOQ_WORKER_TOKEN"
role = "worker"
pools = ["llm"]
labels = ["gpu=a100"]

[store]
kind = "sqlite"
path = "/var/lib/cronoq/state.db"

[[pools]]
name = "llm"
max = 16
lease_ttl_s = 10
retry = { max_attempts = 5, initial_backoff_s = 0.5, jitter = true }
"""
    )
    cfg = load_config(path, env=ENV)
    assert [t.grant.role for t in cfg.auth.tokens] == ["client", "worker"]
    assert cfg.store.keep_finished_s == 604_800.0
    assert cfg.pools[0].retry.max_backoff_s == 60.0  # engine default for the keys left out


# --- secrets -----------------------------------------------------------------------------------


def test_only_token_digests_are_kept(pem: Path) -> None:
    cfg = load_config(full_text(pem), env={**ENV, "HOOK": "hook-secret"})
    values = list(leaves(cfg))
    strings = [v for v in values if isinstance(v, str)]
    for token in (CLIENT, WORKER, ADMIN):
        assert token not in repr(cfg)
        assert not [s for s in strings if token in s], "a plain token is stored"
        assert hashlib.sha256(token.encode()).digest() in values


def test_token_env_present_and_missing() -> None:
    text = '[[auth.tokens]]\ntoken_env = "CRONOQ_CLIENT_TOKEN"\nrole = "client"\n'
    (token,) = load_config(text, env=ENV).auth.tokens
    assert token.digest == hashlib.sha256(CLIENT.encode()).digest()
    assert errors_of(text, env={}) == [
        'auth.tokens[0].token_env: environment variable "CRONOQ_CLIENT_TOKEN" is not set'
    ]


def test_token_from_the_environment_must_be_long_enough() -> None:
    text = '[[auth.tokens]]\ntoken_env = "SHORT"\nrole = "client"\n'
    assert errors_of(text, env={"SHORT": "abc"}) == [
        "auth.tokens[0].token_env: must be at least 16 characters (the value of SHORT)"
    ]


def test_duplicate_tokens_are_rejected_whatever_their_source() -> None:
    text = (
        f'[[auth.tokens]]\ntoken = "{CLIENT}"\nrole = "client"\n'
        '[[auth.tokens]]\ntoken_env = "CRONOQ_CLIENT_TOKEN"\nrole = "admin"\n'
    )
    assert errors_of(text) == ["auth.tokens[1].token_env: the same token as auth.tokens[0]"]


def test_a_short_token_logs_a_warning_without_the_token(caplog: pytest.LogCaptureFixture) -> None:
    token = "sixteen-chars-ok"
    with caplog.at_level(logging.WARNING, logger="cronoq.server.config"):
        load_config(f'[[auth.tokens]]\ntoken = "{token}"\nrole = "client"\n', env={})
    (record,) = caplog.records
    assert record.getMessage().startswith("auth.tokens[0].token: a token shorter than 32")
    assert token not in caplog.text


def test_webhook_over_plain_http_to_another_host_warns(caplog: pytest.LogCaptureFixture) -> None:
    text = (
        '[[pools]]\nname = "p"\n'
        'scaler = { kind = "webhook", url = "http://scaler.example.com/x", token_env = "T" }\n'
    )
    with caplog.at_level(logging.WARNING, logger="cronoq.server.config"):
        cfg = load_config(text, env={"T": "webhook-token"})
    assert [r.getMessage() for r in caplog.records] == [
        "pools[0].scaler.url: plain http to another host; prefer https",
        "pools[0].scaler: the webhook token would cross the network in clear text",
    ]
    assert "webhook-token" not in repr(cfg)


PG_SECRET = "pg-pass-w0rd"


@pytest.mark.parametrize(
    ("store", "env", "warnings"),
    [
        # inline and local: only the url_env advice
        (
            f'url = "postgres://u:{PG_SECRET}@127.0.0.1:5432/db"',
            {},
            ["store.url: prefer url_env: a URL written in the file may hold a password"],
        ),
        # inline, another host, no verified TLS: both warnings
        (
            f'url = "postgresql://u:{PG_SECRET}@db.example.com/db?sslmode=require"',
            {},
            [
                "store.url: prefer url_env: a URL written in the file may hold a password",
                "store.url: reaches a database that is not local without sslmode=verify-full "
                "or sslmode=verify-ca: the server's certificate is not verified",
            ],
        ),
        # inline, another host, verified TLS
        (
            f'url = "postgres://u:{PG_SECRET}@db.example.com/db?sslmode=verify-full"',
            {},
            ["store.url: prefer url_env: a URL written in the file may hold a password"],
        ),
        # from the environment: local forms (loopback names, Unix sockets) warn of nothing
        ("", {"DATABASE_URL": f"postgres://u:{PG_SECRET}@localhost/db"}, []),
        ("", {"DATABASE_URL": f"postgres://u:{PG_SECRET}@[::1]:5432/db"}, []),
        ("", {"DATABASE_URL": "postgres://u@/db?host=/run/postgresql"}, []),
        ('url_env = "PG"', {"PG": f"postgres://u:{PG_SECRET}@db/x?sslmode=verify-ca"}, []),
        # from the environment, another host without verified TLS
        (
            'url_env = "PG"',
            {"PG": f"postgres://u:{PG_SECRET}@10.0.0.5/db"},
            [
                "store.url_env: the value of PG reaches a database that is not local without "
                "sslmode=verify-full or sslmode=verify-ca: the server's certificate is not "
                "verified"
            ],
        ),
    ],
)
def test_postgres_url_warnings_never_show_the_url(
    caplog: pytest.LogCaptureFixture, store: str, env: dict[str, str], warnings: list[str]
) -> None:
    """docs/configuration.md, "[store]": an inline URL is accepted with a warning; a URL to a
    database that is not local and does not verify the server's certificate warns too. The
    URL may hold a password, so no warning shows it."""
    text = f'[store]\nkind = "postgres"\n{store}\n'
    with caplog.at_level(logging.WARNING, logger="cronoq.server.config"):
        cfg = load_config(text, env=env)
    assert [r.getMessage() for r in caplog.records] == warnings
    assert PG_SECRET not in caplog.text and "@" not in caplog.text
    assert cfg.store.url is not None and PG_SECRET not in repr(cfg)


def test_an_invalid_postgres_store_warns_of_nothing(caplog: pytest.LogCaptureFixture) -> None:
    text = '[store]\nkind = "postgres"\nurl = "postgres://u@db/x"\nurl_env = "PG"\n'
    with caplog.at_level(logging.WARNING, logger="cronoq.server.config"):
        assert errors_of(text, env={"PG": "postgres://u@db/x"}) == [
            "store: give either url or url_env, not both"
        ]
    assert caplog.records == []


# --- listeners without credentials (docs/configuration.md, "Listeners and credentials") -----------

PUBLIC = '[server]\ngrpc_addr = "0.0.0.0:0"\nhttp_addr = "127.0.0.1:0"\n'


def test_non_loopback_listener_needs_a_credential() -> None:
    assert errors_of(PUBLIC, env={}) == [
        "server.grpc_addr: 0.0.0.0:0 is not a loopback address, so it needs a credential "
        "([[auth.tokens]] or [[auth.certs]]) or --insecure-no-auth"
    ]


def test_insecure_no_auth_allows_an_open_listener() -> None:
    assert load_config(PUBLIC, env={}, insecure_no_auth=True).server.insecure_no_auth
    assert load_config(PUBLIC + "insecure_no_auth = true\n", env={}).server.grpc_addr.port == 0


def test_a_token_allows_a_non_loopback_listener() -> None:
    text = PUBLIC + f'[[auth.tokens]]\ntoken = "{ADMIN}"\nrole = "admin"\n'
    assert load_config(text, env={}).auth.enabled


def test_the_metrics_listener_needs_no_credential() -> None:
    cfg = load_config('[server]\nmetrics_addr = "0.0.0.0:9090"\n', env={})
    assert cfg.server.metrics_addr is not None and not cfg.server.metrics_addr.is_loopback


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.1:0", SocketAddress("127.0.0.1", 0)),
        ("[::1]:7070", SocketAddress("::1", 7070)),
        ("10.1.2.3:65535", SocketAddress("10.1.2.3", 65535)),
    ],
)
def test_socket_addresses(text: str, address: SocketAddress) -> None:
    cfg = load_config(f'[server]\ngrpc_addr = "{text}"\n', env={}, insecure_no_auth=True)
    assert cfg.server.grpc_addr == address and str(address) == text


@pytest.mark.parametrize(
    "text",
    ["x", "127.0.0.1", "::1:7070", "[127.0.0.1]:1", "1.2.3.4:65536", "[localhost]:1", ":1"],
)
def test_not_socket_addresses(text: str) -> None:
    assert errors_of(f'[server]\ngrpc_addr = "{text}"\n') == [
        f'server.grpc_addr: not a socket address ("{text}")'
    ]


def test_a_host_name_is_resolved_to_its_ip() -> None:
    """`localhost` is 127.0.0.1 (the first IPv4 address), so the listener is loopback and
    needs no credential."""
    text = '[server]\ngrpc_addr = "localhost:7070"\nmetrics_addr = "LocalHost:0"\n'
    cfg = load_config(text, env={})
    assert cfg.server.grpc_addr == SocketAddress("127.0.0.1", 7070)
    assert cfg.server.metrics_addr == SocketAddress("127.0.0.1", 0)
    assert cfg.server.grpc_addr.is_loopback


def test_a_host_name_that_does_not_resolve_asks_for_an_ip() -> None:
    assert errors_of('[server]\nhttp_addr = "no-such-host.invalid:7071"\n', env={}) == [
        'server.http_addr: not a socket address ("no-such-host.invalid:7071"): the host name '
        '"no-such-host.invalid" does not resolve; give an IP address, such as 127.0.0.1:7070'
    ]


# --- each rule and its message -----------------------------------------------------------------

POOL = '[[pools]]\nname = "p"\n'


@pytest.mark.parametrize(
    ("text", "error"),
    [
        # types: bool is no integer, a float is no integer, ints are fine as floats (below)
        (POOL + "max = true", "pools[0].max: must be an integer (got a boolean)"),
        (POOL + "max = 8.0", "pools[0].max: must be an integer (got a float)"),
        (
            POOL + 'lease_ttl_s = "5"',
            "pools[0].lease_ttl_s: must be a number of seconds (got a string)",
        ),
        ("server = 1", "server: must be a table (got an integer)"),
        ("pools = [1]", "pools[0]: must be a table (got an integer)"),
        ('pools = "p"', "pools: must be an array of tables (got a string)"),
        ("pools = []", "pools: must list at least one pool (leave it out for the default pool)"),
        # durations
        (
            POOL + "lease_ttl_s = 0",
            "pools[0].lease_ttl_s: must be >= 0.1 and at most one year (got 0)",
        ),
        (
            POOL + "lease_ttl_s = -1.5",
            "pools[0].lease_ttl_s: must be >= 0.1 and at most one year (got -1.5)",
        ),
        (
            POOL + "lease_ttl_s = 31536001",
            "pools[0].lease_ttl_s: must be >= 0.1 and at most one year (got 31536001)",
        ),
        (
            POOL + "lease_ttl_s = nan",
            "pools[0].lease_ttl_s: must be >= 0.1 and at most one year (got nan)",
        ),
        (
            POOL + "lease_ttl_s = inf",
            "pools[0].lease_ttl_s: must be >= 0.1 and at most one year (got inf)",
        ),
        (
            "[limits]\nrequest_timeout_s = -1",
            "limits.request_timeout_s: must be >= 0.1 and at most one year (got -1)",
        ),
        (
            "[server]\nshutdown_grace_s = -1",
            "server.shutdown_grace_s: must be >= 0 and at most one year (got -1)",
        ),
        (
            POOL + "retry = { max_attempts = 3, max_backoff_s = -1 }",
            "pools[0].retry.max_backoff_s: must be >= 0 and at most one year (got -1)",
        ),
        (
            "[limits]\nmax_wait_s = -1",
            "limits.max_wait_s: must be >= 0 and at most one year (got -1)",
        ),
        (
            '[store]\nkind = "sqlite"\npath = "s.db"\nkeep_finished_s = 0',
            "store.keep_finished_s: must be >= 60 and at most one year (got 0)",
        ),
        (
            '[store]\nkind = "sqlite"\npath = "s.db"\nleader_lease_s = 0.5',
            "store.leader_lease_s: must be >= 1 and at most one year (got 0.5)",
        ),
        (
            '[store]\nkind = "sqlite"\npath = "s.db"\nleader_lease_s = 31536001',
            "store.leader_lease_s: must be >= 1 and at most one year (got 31536001)",
        ),
        (
            '[store]\nkind = "sqlite"\npath = "s.db"\nleader_lease_s = "10s"',
            "store.leader_lease_s: must be a number of seconds (got a string)",
        ),
        # [server]
        (
            '[server]\nlog_level = "verbose"',
            'server.log_level: must be one of "debug", "info", "warning", "error" (got "verbose")',
        ),
        (
            '[server]\nhttp_addr = "127.0.0.1:7070"',
            "server.http_addr: same address as server.grpc_addr (127.0.0.1:7070)",
        ),
        ('[server]\nshard = ""', "server.shard: must not be empty"),
        (
            '[server.tls]\ncert = "/nonexistent/cert.pem"\nkey = "/nonexistent/key.pem"',
            'server.tls.cert: no such file ("/nonexistent/cert.pem")\n'
            'server.tls.key: no such file ("/nonexistent/key.pem")',
        ),
        ("[server.tls]", "server.tls.cert: is required\nserver.tls.key: is required"),
        (
            '[server.grpc_web]\nallowed_origins = ["https://a.example/app"]',
            'server.grpc_web.allowed_origins[0]: must not have a path, query or fragment (got "https://a.example/app")',
        ),
        (
            '[server.grpc_web]\nallowed_origins = ["a.example"]',
            "server.grpc_web.allowed_origins[0]: "
            'must be an http:// or https:// URL (got "a.example")',
        ),
        (
            "[server.grpc_web]\nallowed_origins = [1]",
            "server.grpc_web.allowed_origins[0]: must be a string (got an integer)",
        ),
        # [[pools]] (the library's own rules and the server's)
        (
            '[[pools]]\nname = "bad name!"',
            "pools[0].name: must be 1-64 characters of A-Z, a-z, 0-9, '_', '.', ':' and '-' "
            '(got "bad name!")',
        ),
        ("[[pools]]\nmax = 4", "pools[0].name: is required"),
        (POOL + POOL, 'pools[1].name: duplicate pool name "p" (see pools[0])'),
        (POOL + "min = 5\nmax = 2", "pools[0].min: must be <= max"),
        (POOL + "max = 0", "pools[0].max: must be >= 1"),
        (POOL + "min = -1", "pools[0].min: must not be negative (got -1)"),
        (POOL + "max_pending = -1", "pools[0].max_pending: must be >= 1 (got -1)"),
        (
            POOL + 'overflow = "drop"',
            "pools[0].overflow: must be wait, reject, shed_lowest or shed_oldest",
        ),
        (
            POOL + "reservable_fraction = 1.5",
            "pools[0].reservable_fraction: must be in (0, 1] (got 1.5)",
        ),
        (POOL + "target_utilization = 0", "pools[0].target_utilization: must be in (0, 1] (got 0)"),
        (
            POOL + "cost_per_worker_second = -1",
            "pools[0].cost_per_worker_second: must be a finite number >= 0 (got -1)",
        ),
        (
            POOL + "cost_per_worker_second = inf",
            "pools[0].cost_per_worker_second: must be a finite number (got inf)",
        ),
        (POOL + "tenant_weights = { a = 0 }", "pools[0].tenant_weights: must be finite and > 0"),
        (
            POOL + 'tenant_weights = { a = "x" }',
            "pools[0].tenant_weights.a: must be a number (got a string)",
        ),
        (POOL + "max_slots_per_worker = 0", "pools[0].max_slots_per_worker: must be >= 1 (got 0)"),
        (POOL + "retry = { max_attempts = 0 }", "pools[0].retry.max_attempts: must be >= 1"),
        (
            POOL + "retry = { max_attempts = 3, multiplier = 0.5 }",
            "pools[0].retry.multiplier: must be a finite number >= 1 (got 0.5)",
        ),
        (
            POOL + 'scaler = { kind = "keda" }',
            'pools[0].scaler.kind: must be one of "external", "webhook" (got "keda")',
        ),
        (POOL + 'scaler = { kind = "webhook" }', "pools[0].scaler.url: is required"),
        (
            POOL + 'scaler = { kind = "webhook", url = "ftp://x" }',
            'pools[0].scaler.url: must be an http:// or https:// URL (got "ftp://x")',
        ),
        (
            POOL + 'scaler = { kind = "webhook", url = "https://h/x", token_env = "HOOK" }',
            'pools[0].scaler.token_env: environment variable "HOOK" is not set',
        ),
        # [[resources]]
        (
            '[[resources]]\nkind = "semaphore"\nname = "r"\npermits = 0',
            "resources[0].permits: must be >= 1",
        ),
        ('[[resources]]\nkind = "semaphore"\nname = "r"', "resources[0].permits: is required"),
        (
            '[[resources]]\nkind = "token_bucket"\nname = "r"\nrate = 0\nburst = 1',
            "resources[0].rate: must be a finite number > 0 (got 0)",
        ),
        (
            '[[resources]]\nkind = "token_bucket"\nname = "r"\nrate = 1\nburst = 0',
            "resources[0].burst: must be >= 1",
        ),
        (
            '[[resources]]\nkind = "mutex"\nname = "r"',
            'resources[0].kind: must be one of "semaphore", "token_bucket" (got "mutex")',
        ),
        ('[[resources]]\nname = "r"', "resources[0].kind: is required"),
        (
            '[[resources]]\nkind = "semaphore"\nname = "r"\npermits = 1\n'
            '[[resources]]\nkind = "semaphore"\nname = "r"\npermits = 2',
            'resources[1].name: duplicate resource name "r" (see resources[0])',
        ),
        # [store]
        (
            '[store]\nkind = "redis"\nurl = "x"',
            'store.kind: must be one of "memory", "sqlite", "postgres" (got "redis")',
        ),
        ('[store]\nkind = "sqlite"', "store.path: is required"),
        (
            '[store]\nkind = "postgres"',
            "store.url_env: environment variable DATABASE_URL (store URL) is not set",
        ),
        (
            '[store]\nkind = "postgres"\nurl = "postgres://h/db"\nurl_env = "PG"',
            "store: give either url or url_env, not both",
        ),
        (
            '[store]\nkind = "postgres"\nurl = "mysql://u:secret@h/db"',
            "store.url: must be a postgres:// or postgresql:// URL",
        ),
        (
            '[store]\nkind = "postgres"\nurl = "postgres://h/db"\nschema = "a; drop"',
            'store.schema: must be a plain SQL identifier of 1-63 characters (got "a; drop")',
        ),
        # [limits], [outputs]
        ("[limits]\nmax_tasks_per_batch = 0", "limits.max_tasks_per_batch: must be >= 1 (got 0)"),
        (
            "[limits]\nmax_message_bytes = 4095",
            "limits.max_message_bytes: must be >= 4096 (got 4095)",
        ),
        ("[outputs]\ncache_entries = -1", "outputs.cache_entries: must be >= 0 (got -1)"),
        ("[tracing]\nsample_ratio = 1.5", "tracing.sample_ratio: must be from 0 to 1 (got 1.5)"),
        (
            '[tracing]\nendpoint = "collector:4318"',
            'tracing.endpoint: must be an http:// or https:// URL (got "collector:4318")',
        ),
        ("[tracing]\nenable = true", 'tracing.enable: unknown key; did you mean "enabled"?'),
        # [auth]
        (
            '[[auth.tokens]]\ntoken = "short-token"\nrole = "client"',
            "auth.tokens[0].token: must be at least 16 characters",
        ),
        (
            f'[[auth.tokens]]\ntoken = "{ADMIN}"\ntoken_env = "X"\nrole = "admin"',
            "auth.tokens[0]: give exactly one of token and token_env",
        ),
        (
            '[[auth.tokens]]\nrole = "admin"',
            "auth.tokens[0]: give exactly one of token and token_env",
        ),
        (f'[[auth.tokens]]\ntoken = "{ADMIN}"', "auth.tokens[0].role: is required"),
        (
            f'[[auth.tokens]]\ntoken = "{ADMIN}"\nrole = "root"',
            "auth.tokens[0].role: "
            'must be one of "client", "worker", "metrics", "admin" (got "root")',
        ),
        (
            f'[[auth.tokens]]\ntoken = "{ADMIN}"\nrole = "client"\npools = ["gpu"]',
            'auth.tokens[0].pools: unknown pool "gpu"',
        ),
        (
            f'[[auth.tokens]]\ntoken = "{ADMIN}"\nrole = "worker"\nlabels = ["gpu"]',
            'auth.tokens[0].labels[0]: must be "name=value" (got "gpu")',
        ),
        (
            f'[[auth.tokens]]\ntoken = "{ADMIN}"\nrole = "client"\ntenant = 3',
            "auth.tokens[0].tenant: must be a string (got an integer)",
        ),
        (
            '[[auth.certs]]\ndns_name = "w.internal"\nrole = "worker"',
            "auth.certs: client certificates are only asked for with server.tls.client_ca set",
        ),
        (
            '[[auth.certs]]\nrole = "worker"',
            "auth.certs[0].dns_name: is required\n"
            "auth.certs: client certificates are only asked for with server.tls.client_ca set",
        ),
    ],
)
def test_rule_messages(text: str, error: str) -> None:
    assert errors_of(text, env={}) == error.split("\n")


def test_integers_are_accepted_where_floats_are() -> None:
    pool = load_config(POOL + "lease_ttl_s = 5\nreservable_fraction = 1\n", env={}).pools[0]
    assert (pool.lease_ttl_s, pool.reservable_fraction) == (5.0, 1.0)
    assert isinstance(pool.lease_ttl_s, float)


def test_the_sqlite_leader_lease_defaults_to_10_s_and_may_be_set() -> None:
    sqlite = '[store]\nkind = "sqlite"\npath = "s.db"\n'
    assert load_config(sqlite, env={}).store.leader_lease_s == 10.0
    assert load_config(sqlite + "leader_lease_s = 1", env={}).store.leader_lease_s == 1.0
    assert load_config(sqlite + "leader_lease_s = 90.5", env={}).store.leader_lease_s == 90.5
    assert load_config("", env={}).store.leader_lease_s is None  # the memory store has none


def test_one_year_is_the_longest_duration() -> None:
    assert load_config(POOL + "lease_ttl_s = 31536000", env={}).pools[0].lease_ttl_s == 31_536_000


def test_certs_with_mutual_tls(pem: Path) -> None:
    tls = (
        f'[server.tls]\ncert = "{pem}/cert.pem"\nkey = "{pem}/key.pem"\n'
        f'client_ca = "{pem}/ca.pem"\n'
    )
    cert = '[[auth.certs]]\ndns_name = "w.internal"\nrole = "worker"\n'
    cfg = load_config(tls + cert, env={})
    assert cfg.auth.enabled and cfg.auth.certs[0].grant.role == "worker"
    assert cfg.auth.certs[0].dns_name == "w.internal"
    assert errors_of(tls + cert + cert, env={}) == [
        "auth.certs[1].dns_name: the same name as auth.certs[0]"
    ]
    # `dns` is an alias of dns_name: the same setting, the same rules
    alias = '[[auth.certs]]\ndns = "w.internal"\nrole = "worker"\n'
    assert load_config(tls + alias, env={}).auth == cfg.auth
    assert errors_of(tls + cert + alias, env={}) == [
        "auth.certs[1].dns: the same name as auth.certs[0]"
    ]
    both = '[[auth.certs]]\ndns_name = "a.internal"\ndns = "b.internal"\nrole = "worker"\n'
    assert errors_of(tls + both, env={}) == [
        "auth.certs[0]: give either dns_name or dns (its alias), not both"
    ]
    assert errors_of(tls + '[[auth.certs]]\ndns_name = ""\nrole = "worker"\n', env={}) == [
        "auth.certs[0].dns_name: must not be empty"
    ]


# --- what the published server 0.2.1 accepts (docs/configuration.md) -----------------------------


def test_zeros_the_published_server_starts_with() -> None:
    text = (
        "[limits]\nmax_wait_s = 0\nkey_retention_s = 0\nkey_retention_max = 0\n"
        "max_tags = 0\nmax_deps = 0\nmax_resources = 0\n"
        + POOL
        + "await_unknown_dependencies_s = 0\n"
    )
    cfg = load_config(text, env={})
    limits = cfg.limits
    assert (limits.max_wait_s, limits.key_retention_s, limits.key_retention_max) == (0, 0, 0)
    assert (limits.max_tags, limits.max_deps, limits.max_resources) == (0, 0, 0)
    assert cfg.pools[0].await_unknown_dependencies_s == 0.0
    # an unknown dependency is awaited, for no time at all, rather than refused
    (pool,) = core_pools(cfg)
    assert (pool.unknown_dependency, pool.await_timeout) == ("await", 0.0)
    # the scheduler takes the retention of no key at all
    (library,) = library_pools(cfg)
    assert library.await_timeout == 0.0


@pytest.mark.parametrize(
    ("given", "kept"),
    [(2_147_483_647, 2_147_483_647), (2_147_483_648, 2_147_483_647), (2**40, 2_147_483_647)],
)
def test_a_huge_max_message_bytes_is_lowered_to_what_grpcio_takes(given: int, kept: int) -> None:
    assert load_config(f"[limits]\nmax_message_bytes = {given}\n", env={}).limits == (
        LimitsSettings(max_message_bytes=kept)
    )


def test_a_token_for_no_pool_and_labels_with_empty_values() -> None:
    text = (
        f'[[auth.tokens]]\ntoken = "{CLIENT}"\nrole = "client"\npools = []\n'
        f'[[auth.tokens]]\ntoken = "{WORKER}"\nrole = "worker"\nlabels = ["gpu=", "zone=eu"]\n'
    )
    none, labelled = load_config(text, env={}).auth.tokens
    assert none.grant == Grant("client", pools=())  # no pool at all, unlike pools=None
    assert labelled.grant == Grant("worker", labels=(("gpu", ""), ("zone", "eu")))
    for label in ("=x", "gpu", ""):
        text = f'[[auth.tokens]]\ntoken = "{WORKER}"\nrole = "worker"\nlabels = ["{label}"]\n'
        (error,) = errors_of(text, env={})
        assert error.startswith("auth.tokens[0].labels[0]: must "), error


# The ranges of docs/configuration.md: each value just outside them (refused), and each bound
# (accepted).
RANGES = [
    (POOL + "lease_ttl_s = 0.09", "pools[0].lease_ttl_s: must be >= 0.1 and at most one year"),
    (POOL + "max_pending = 0", "pools[0].max_pending: must be >= 1"),
    (POOL + "reservable_fraction = 0", "pools[0].reservable_fraction: must be in (0, 1]"),
    (POOL + "drain_time_s = 0", "pools[0].drain_time_s: must be >= 0.001 and at most one year"),
    (
        POOL + "drain_time_s = 31536001",
        "pools[0].drain_time_s: must be >= 0.001 and at most one year",
    ),
    (
        POOL + "retry = { max_attempts = 3, multiplier = 1000.5 }",
        "pools[0].retry.multiplier: must be at most 1000",
    ),
    (
        POOL + "retry = { max_attempts = 3, multiplier = 0.99 }",
        "pools[0].retry.multiplier: must be a finite number >= 1",
    ),
    (POOL + "retry = { initial_backoff_s = 1 }", "pools[0].retry.max_attempts: is required"),
    (POOL + "[pools.retry]\njitter = false", "pools[0].retry.max_attempts: is required"),
    *(
        (f"[limits]\n{key} = 0.09", f"limits.{key}: must be >= 0.1 and at most one year")
        for key in ("request_timeout_s", "keepalive_interval_s", "keepalive_timeout_s")
    ),
    ("[limits]\nmax_message_bytes = 4095", "limits.max_message_bytes: must be >= 4096"),
    ("[limits]\nmax_http_body_bytes = 4095", "limits.max_http_body_bytes: must be >= 4096"),
    (
        "[limits]\nmax_unsent_bytes_per_connection = 4095",
        "limits.max_unsent_bytes_per_connection: must be >= 4096",
    ),
    ("[limits]\nmax_list = 0", "limits.max_list: must be from 1 to 100000"),
    ("[limits]\nmax_list = 100001", "limits.max_list: must be from 1 to 100000"),
    ("[limits]\nmax_wait_s = -0.5", "limits.max_wait_s: must be >= 0 and at most one year"),
    ("[limits]\nkey_retention_max = -1", "limits.key_retention_max: must be >= 0"),
    ("[limits]\nmax_deps = -1", "limits.max_deps: must be >= 0"),
    (
        '[store]\nkind = "sqlite"\npath = "s.db"\nkeep_finished_s = 59.9',
        "store.keep_finished_s: must be >= 60 and at most one year",
    ),
    (
        '[store]\nkind = "postgres"\nurl = "postgres://h/db"\nkeep_finished_s = 31536001',
        "store.keep_finished_s: must be >= 60 and at most one year",
    ),
    (
        "[outputs]\ncache_bytes = 0",
        "outputs.cache_bytes: must be > 0 while cache_entries > 0 "
        "(set cache_entries = 0 to cache no outputs)",
    ),
    (
        "[server.grpc_web]\nallowed_origins = []",
        "server.grpc_web.allowed_origins: must list 1 to 64 origins (got 0)",
    ),
    (
        "[server.grpc_web]\nallowed_origins = ["
        + ", ".join(f'"https://o{i}.example"' for i in range(65))
        + "]",
        "server.grpc_web.allowed_origins: must list 1 to 64 origins (got 65)",
    ),
    (POOL + "await_unknown_dependencies_s = -1", "pools[0].await_unknown_dependencies_s: must be"),
]


@pytest.mark.parametrize(("text", "error"), RANGES)
def test_values_outside_the_published_ranges_are_refused(text: str, error: str) -> None:
    (line,) = errors_of(text, env={})
    assert line.startswith(error), line


@pytest.mark.parametrize(
    "text",
    [
        POOL + "lease_ttl_s = 0.1\nmax_pending = 1\nreservable_fraction = 1e-9\n",
        POOL + "reservable_fraction = 1\ndrain_time_s = 0.001\n",
        POOL + "drain_time_s = 31536000\nretry = { max_attempts = 1, multiplier = 1000 }\n",
        POOL + "retry = { max_attempts = 2, multiplier = 1 }\n",
        "[limits]\nrequest_timeout_s = 0.1\nkeepalive_interval_s = 0.1\n",
        "[limits]\nkeepalive_interval_s = 0.5\nkeepalive_timeout_s = 0.5\n",  # as a test uses
        "[limits]\nmax_message_bytes = 4096\nmax_http_body_bytes = 4096\nmax_list = 100000\n",
        "[limits]\nmax_list = 1\n",
        '[store]\nkind = "sqlite"\npath = "s.db"\nkeep_finished_s = 60\n',
        '[store]\nkind = "sqlite"\npath = "s.db"\nkeep_finished_s = 31536000\n',
        "[outputs]\ncache_entries = 0\ncache_bytes = 0\n",
        "[server.grpc_web]\nallowed_origins = ["
        + ", ".join(f'"https://o{i}.example"' for i in range(64))
        + "]\n",
    ],
)
def test_the_bounds_of_the_published_ranges_are_accepted(text: str) -> None:
    load_config(text, env={})


def test_several_errors_are_collected_in_one_exception() -> None:
    text = """
[server]
grpc_addr = "nowhere"
[limits]
max_list = 0
[[pools]]
name = "a"
min = 9
max = 3
overflow = "drop"
retry = { max_attempts = 0, multiplier = 0 }
[[pools]]
name = "b"
lease_ttl_s = 0
[[auth.tokens]]
token = "short"
role = "client"
"""
    assert errors_of(text, env={}) == [
        'server.grpc_addr: not a socket address ("nowhere")',
        "limits.max_list: must be from 1 to 100000 (got 0)",
        "pools[0].retry.max_attempts: must be >= 1",
        "pools[0].retry.multiplier: must be a finite number >= 1 (got 0.0)",
        "pools[0].min: must be <= max",
        "pools[0].overflow: must be wait, reject, shed_lowest or shed_oldest",
        "pools[1].lease_ttl_s: must be >= 0.1 and at most one year (got 0)",
        "auth.tokens[0].token: must be at least 16 characters",
    ]


def test_a_wrong_bound_is_not_compared_with_the_other() -> None:
    # max is wrong; comparing min = 100 with some default max would report a second,
    # made-up problem
    assert errors_of(POOL + 'min = 100\nmax = "8"', env={}) == [
        "pools[0].max: must be an integer (got a string)"
    ]


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("foo = 1", "foo"),
        ("[server]\nfoo = 1", "server.foo"),
        (
            '[server.grpc_web]\nallowed_origins = ["https://a.example"]\nfoo = 1',
            "server.grpc_web.foo",
        ),
        ("[server.peer_tls]\nfoo = 1", "server.peer_tls.foo"),
        ("[auth]\nfoo = 1", "auth.foo"),
        (f'[[auth.tokens]]\ntoken = "{ADMIN}"\nrole = "admin"\nfoo = 1', "auth.tokens[0].foo"),
        ('[store]\npath = "x.db"', "store.path"),  # a memory store has no path
        ('[store]\nkind = "sqlite"\npath = "x.db"\nschema = "s"', "store.schema"),
        ("[store]\nleader_lease_s = 5", "store.leader_lease_s"),  # only sqlite has a lease
        ("[limits]\nfoo = 1", "limits.foo"),
        (POOL + "foo = 1", "pools[0].foo"),
        (POOL + "retry = { max_attempts = 3, foo = 1 }", "pools[0].retry.foo"),
        (POOL + 'scaler = { kind = "external", url = "https://h" }', "pools[0].scaler.url"),
        (
            '[[resources]]\nkind = "semaphore"\nname = "r"\npermits = 1\nrate = 1',
            "resources[0].rate",
        ),
        ("[outputs]\nfoo = 1", "outputs.foo"),
    ],
)
def test_unknown_keys_are_rejected_at_every_level(text: str, path: str) -> None:
    assert errors_of(text, env={}) == [f"{path}: unknown key"]


@pytest.mark.parametrize(
    ("text", "path", "known"),
    [
        ("[limts]\nmax_tags = 4", "limts", "limits"),
        ('[server]\ngrpc_adr = "127.0.0.1:0"', "server.grpc_adr", "grpc_addr"),
        (POOL + "mxa = 2", "pools[0].mxa", "max"),
        (POOL + "retry = { max_atempts = 3 }", "pools[0].retry.max_atempts", "max_attempts"),
        ('[store]\nkind = "sqlite"\npaht = "x.db"', "store.paht", "path"),
    ],
)
def test_a_misspelt_key_names_the_closest_known_one(text: str, path: str, known: str) -> None:
    assert f'{path}: unknown key; did you mean "{known}"?' in errors_of(text, env={})


def test_unknown_keys_in_server_tls_and_shards(pem: Path) -> None:
    tls = f'[server.tls]\ncert = "{pem}/cert.pem"\nkey = "{pem}/key.pem"\nfoo = 1\n'
    assert errors_of(tls, env={}) == ["server.tls.foo: unknown key"]
    shard = (
        '[server]\nshard = "a"\n'
        '[[shards]]\nname = "a"\nnumber = 1\npools = ["default"]\n'
        'endpoint = "http://127.0.0.1:7070"\nfoo = 1\n'
    )
    assert errors_of(shard, env={}) == ["shards[0].foo: unknown key"]


# --- shards (docs/configuration.md, "[[shards]]") -------------------------------------------------

SHARDS = """
[[pools]]
name = "default"
[[pools]]
name = "llm"
[[shards]]
name = "cpu"
number = 1
pools = ["default"]
endpoint = "http://cpu.internal:7070"
[[shards]]
name = "gpu"
number = 2
pools = ["llm"]
endpoint = "http://gpu.internal:7070"
"""


def test_shard_is_required_when_shards_are_configured() -> None:
    assert errors_of(SHARDS, env={}) == [
        "server.shard: is required when [[shards]] is configured (or --shard)"
    ]


def test_the_shard_option_overrides_the_file() -> None:
    cfg = load_config('[server]\nshard = "gpu"\n' + SHARDS, env={}, shard="cpu")
    assert cfg.server.shard == "cpu"
    assert [s.number for s in cfg.shards] == [1, 2]


def test_shard_must_name_a_shard() -> None:
    assert errors_of(SHARDS, env={}, shard="tpu") == [
        'server.shard: must name one of the [[shards]] (got "tpu")'
    ]


SHARD_WITHOUT_SHARDS = (
    'server.shard: is set but no [[shards]] is configured (got "cpu", from the file, --shard '
    "or CRONOQ_SHARD)"
)


def test_a_shard_without_shards_is_an_error() -> None:
    """Set in the file, or by --shard / CRONOQ_SHARD (written into [server] before validation):
    either way there is nothing to pick the shard from."""
    assert errors_of("", env={}, shard="cpu") == [SHARD_WITHOUT_SHARDS]
    assert errors_of('[server]\nshard = "cpu"\n', env={}) == [SHARD_WITHOUT_SHARDS]
    assert errors_of("shards = []\n", env={}, shard="cpu") == [SHARD_WITHOUT_SHARDS]


@pytest.mark.parametrize(
    ("edit", "errors"),
    [
        (("number = 2", "number = 1"), ["shards[1].number: 1 is already the number of shards[0]"]),
        (("number = 2", "number = 256"), ["shards[1].number: must be from 0 to 255 (got 256)"]),
        (("number = 2", "number = -1"), ["shards[1].number: must be from 0 to 255 (got -1)"]),
        (
            ("number = 2", 'number = "2"'),
            ["shards[1].number: must be an integer (got a string)"],
        ),
        (("number = 1", "number = 0"), []),  # 0 is a number like any other
        (("number = 2", "number = 255"), []),
        (
            ('name = "gpu"', 'name = "GPU"'),
            [
                "shards[1].name: must be 1-32 characters of a-z, 0-9 and '_', starting with a "
                'letter (got "GPU")'
            ],
        ),
        (
            ('name = "gpu"', 'name = "2gpu"'),
            [
                "shards[1].name: must be 1-32 characters of a-z, 0-9 and '_', starting with a "
                'letter (got "2gpu")'
            ],
        ),
        (
            ('name = "gpu"', 'name = "gpu-a"'),
            [
                "shards[1].name: must be 1-32 characters of a-z, 0-9 and '_', starting with a "
                'letter (got "gpu-a")'
            ],
        ),
        (
            ('name = "gpu"', f'name = "g{"x" * 32}"'),
            [
                "shards[1].name: must be 1-32 characters of a-z, 0-9 and '_', starting with a "
                f'letter (got "g{"x" * 32}")'
            ],
        ),
        (('name = "gpu"', f'name = "g{"_" * 30}9"'), []),  # 32 characters
        (('name = "gpu"', 'name = "g"'), []),
        (('name = "gpu"', ""), ["shards[1].name: is required"]),
        (
            ('name = "gpu"', 'name = "cpu"'),
            ['shards[1].name: duplicate shard name "cpu" (see shards[0])'],
        ),
        (
            ('pools = ["llm"]', 'pools = ["llm", "default"]'),
            ['shards[1].pools: pool "default" is already served by shards[0]'],
        ),
        (
            ('pools = ["llm"]', 'pools = ["llm", "llm"]'),
            ['shards[1].pools: lists pool "llm" twice'],
        ),
        (
            ('pools = ["llm"]', ""),
            ["shards[1].pools: is required", 'pools[1].name: pool "llm" is in no [[shards]] entry'],
        ),
        (
            ('pools = ["llm"]', "pools = []"),
            [
                "shards[1].pools: must not be empty",
                'pools[1].name: pool "llm" is in no [[shards]] entry',
            ],
        ),
        (
            ('pools = ["default"]', 'pools = ["default", "batch"]'),
            [
                'shards[0].pools: pool "batch" of this server\'s shard '
                "is not configured in [[pools]]"
            ],
        ),
        # a port is optional: 80 for http, 443 for https
        (("http://gpu.internal:7070", "http://gpu.internal"), []),
        (("http://gpu.internal:7070", "https://gpu.internal"), []),
        (("http://gpu.internal:7070", "https://10.0.0.2:8443"), []),
        (("http://gpu.internal:7070", "http://[fd00::2]:7070"), []),
        (
            ("http://gpu.internal:7070", "http://gpu.internal:0"),
            [
                "shards[1].endpoint: must have a port from 1 to 65535, or none "
                '(got "http://gpu.internal:0")'
            ],
        ),
        (
            ("http://gpu.internal:7070", "http://gpu.internal:"),
            [
                "shards[1].endpoint: must have a port from 1 to 65535, or none "
                '(got "http://gpu.internal:")'
            ],
        ),
        (
            ("http://gpu.internal:7070", "http://gpu.internal:70700"),
            ['shards[1].endpoint: not a valid URL (got "http://gpu.internal:70700")'],
        ),
        (
            ("http://gpu.internal:7070", "grpc://gpu.internal:7070"),
            [
                "shards[1].endpoint: must be an http:// or https:// URL "
                '(got "grpc://gpu.internal:7070")'
            ],
        ),
        (
            ("http://gpu.internal:7070", "gpu.internal:7070"),
            ['shards[1].endpoint: must be an http:// or https:// URL (got "gpu.internal:7070")'],
        ),
        (
            ("http://gpu.internal:7070", "http://:7070"),
            ['shards[1].endpoint: must name a host (got "http://:7070")'],
        ),
        (
            ("http://gpu.internal:7070", "http://gpu.internal:7070/"),
            [
                "shards[1].endpoint: must not have a path, query or fragment "
                '(got "http://gpu.internal:7070/")'
            ],
        ),
        (
            ("http://gpu.internal:7070", "http://gpu.internal:7070?a=1"),
            [
                "shards[1].endpoint: must not have a path, query or fragment "
                '(got "http://gpu.internal:7070?a=1")'
            ],
        ),
        (
            ("http://gpu.internal:7070", "http://gpu.internal:7070#top"),
            [
                "shards[1].endpoint: must not have a path, query or fragment "
                '(got "http://gpu.internal:7070#top")'
            ],
        ),
        (
            ("http://gpu.internal:7070", "http://u@gpu.internal:7070"),
            [
                "shards[1].endpoint: must not contain a user name or password "
                '(got "http://u@gpu.internal:7070")'
            ],
        ),
        (
            ("http://gpu.internal:7070", "http://gpu.inter nal:7070"),
            [
                "shards[1].endpoint: must not contain whitespace or control characters "
                '(got "http://gpu.inter nal:7070")'
            ],
        ),
        (
            # urlsplit would drop the tab and accept what is left
            ("http://gpu.internal:7070", "http://gpu.inter\\tnal:7070"),
            [
                "shards[1].endpoint: must not contain whitespace or control characters "
                '(got "http://gpu.inter\\tnal:7070")'
            ],
        ),
        (
            ("http://gpu.internal:7070", "http://gpu.internal:7070\\u0000"),
            [
                "shards[1].endpoint: must not contain whitespace or control characters "
                '(got "http://gpu.internal:7070\\u0000")'
            ],
        ),
        (
            ("http://gpu.internal:7070", f"http://{'g' * 235}.internal:7070"),  # 256 characters
            [],
        ),
        (
            ("http://gpu.internal:7070", f"http://{'g' * 236}.internal:7070"),
            ["shards[1].endpoint: must be at most 256 characters (got 257)"],
        ),
        (
            ("http://gpu.internal:7070", "http://cpu.internal:7070"),
            ['shards[1].endpoint: "http://cpu.internal:7070" is already the endpoint of shards[0]'],
        ),
        (
            ("http://gpu.internal:7070", "https://cpu.internal:7070"),
            [],  # another scheme: another endpoint
        ),
        (
            ("http://gpu.internal:7070", "http://gpu.internal:7070/v1"),
            [
                'shards[1].endpoint: must not have a path, query or fragment (got "http://gpu.internal:7070/v1")'
            ],
        ),
        (
            ("http://gpu.internal:7070", "https://u:p@gpu.internal:7070"),
            [
                'shards[1].endpoint: must not contain a user name or password (got "https://u:p@gpu.internal:7070")'
            ],
        ),
        (('endpoint = "http://gpu.internal:7070"', ""), ["shards[1].endpoint: is required"]),
    ],
)
def test_shard_rules(edit: tuple[str, str], errors: list[str]) -> None:
    """Each edit of a valid plan and its errors; none: the edited plan is valid too."""
    text = SHARDS.replace(*edit)
    if errors:
        assert errors_of(text, env={}, shard="cpu") == errors
    else:
        assert load_config(text, env={}, shard="cpu").own_shard is not None


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("http://cpu.internal:7070", "http://CPU.Internal:7070"),  # host names ignore case
        ("http://cpu.internal", "http://cpu.internal:80"),  # the default ports
        ("https://cpu.internal:443", "https://cpu.internal"),
    ],
)
def test_two_shards_at_one_endpoint_however_spelled(first: str, second: str) -> None:
    text = SHARDS.replace("http://cpu.internal:7070", first)
    text = text.replace("http://gpu.internal:7070", second)
    assert errors_of(text, env={}, shard="cpu") == [
        f'shards[1].endpoint: "{second}" is already the endpoint of shards[0]'
    ]


def test_a_shard_plan_and_this_servers_own_shard() -> None:
    cfg = load_config(SHARDS.replace("number = 1", "number = 0"), env={}, shard="gpu")
    assert [(s.name, s.number, s.pools) for s in cfg.shards] == [
        ("cpu", 0, ("default",)),
        ("gpu", 2, ("llm",)),
    ]
    assert cfg.own_shard is cfg.shards[1]
    assert load_config(None, env={}).own_shard is None


def test_a_pool_of_another_shard_need_not_be_configured_here() -> None:
    text = SHARDS.replace('[[pools]]\nname = "llm"\n', "")
    token = f'[[auth.tokens]]\ntoken = "{WORKER}"\nrole = "worker"\npools = ["llm"]\n'
    cfg = load_config(text + token, env={}, shard="cpu")
    assert [p.name for p in cfg.pools] == ["default"]
    assert cfg.auth.tokens[0].grant.pools == ("llm",)


def test_a_resource_belongs_to_a_known_shard() -> None:
    resource = '[[resources]]\nkind = "semaphore"\nname = "r"\npermits = 1\nshard = "tpu"\n'
    assert errors_of(SHARDS + resource, env={}, shard="cpu") == [
        'resources[0].shard: must name one of the [[shards]] (got "tpu")'
    ]


def semaphore(name: str, shard: str | None = None) -> str:
    pinned = "" if shard is None else f'shard = "{shard}"\n'
    return f'[[resources]]\nkind = "semaphore"\nname = "{name}"\npermits = 1\n{pinned}'


def test_with_shards_every_resource_names_its_shard() -> None:
    text = SHARDS + semaphore("db", "cpu") + semaphore("api")
    assert errors_of(text, env={}, shard="cpu") == [
        "resources[1].shard: is required with [[shards]]: each shard counts its resources "
        "separately"
    ]
    bucket = '[[resources]]\nkind = "token_bucket"\nname = "t"\nrate = 1\nburst = 1\n'
    assert errors_of(SHARDS + bucket, env={}, shard="cpu") == [
        "resources[0].shard: is required with [[shards]]: each shard counts its resources "
        "separately"
    ]
    # a shard of the wrong type is reported as that, not as missing too
    wrong = semaphore("db") + "shard = 1\n"
    assert errors_of(SHARDS + wrong, env={}, shard="cpu") == [
        "resources[0].shard: must be a string (got an integer)"
    ]


def test_without_shards_a_resource_names_no_shard() -> None:
    assert errors_of(semaphore("db", "cpu"), env={}) == [
        'resources[0].shard: is set but no [[shards]] is configured (got "cpu")'
    ]
    assert load_config(semaphore("db"), env={}).resources == (SemaphoreSettings("db", 1),)


SHARDED = SHARDS + semaphore("db", "cpu") + semaphore("gpu_mem", "gpu")


def test_the_engine_gets_only_its_own_shards_pools_and_resources() -> None:
    """Both shards' pools are configured (the same file serves both), but each server's
    engine holds only its own shard's pools and resources."""
    cpu = load_config(SHARDED, env={}, shard="cpu")
    assert [p.name for p in cpu.pools] == ["default", "llm"]  # the whole plan is kept
    assert [p.name for p in library_pools(cpu)] == ["default"]
    assert [p.name for p in core_pools(cpu)] == ["default"]
    assert [r.name for r in library_resources(cpu)] == ["db"]
    assert [r.name for r in core_resources(cpu)] == ["db"]
    gpu = load_config(SHARDED, env={}, shard="gpu")
    assert [p.name for p in library_pools(gpu)] == ["llm"]
    assert [(p.name, p.max) for p in core_pools(gpu)] == [("llm", 10)]
    assert [r.name for r in library_resources(gpu)] == ["gpu_mem"]
    # without shards, every pool and resource
    plain = load_config(CONVERT, env={})
    assert plain.own_shard is None
    assert [p.name for p in library_pools(plain)] == ["llm", "batch"]
    assert [r.name for r in library_resources(plain)] == ["db", "api"]


def test_an_own_shard_in_file_order_with_another_shards_pools_between() -> None:
    text = (
        '[[pools]]\nname = "a"\n[[pools]]\nname = "x"\n[[pools]]\nname = "b"\n'
        '[[shards]]\nname = "one"\nnumber = 0\npools = ["b", "a"]\nendpoint = "http://one"\n'
        '[[shards]]\nname = "two"\nnumber = 1\npools = ["x"]\nendpoint = "http://two"\n'
    )
    cfg = load_config(text, env={}, shard="one")
    assert [p.name for p in library_pools(cfg)] == ["a", "b"]  # [[pools]] order
    assert [p.name for p in core_pools(cfg)] == ["a", "b"]


# --- [server.peer_tls] and insecure_peer_http (docs/configuration.md, "[server]") ----------------

TOKEN = f'[[auth.tokens]]\ntoken = "{ADMIN}"\nrole = "admin"\n'


def peer_tls(pem: Path, *keys: str) -> str:
    files = {"ca": "ca.pem", "cert": "cert.pem", "key": "key.pem"}
    return "[server.peer_tls]\n" + "".join(f'{k} = "{pem}/{files[k]}"\n' for k in keys)


def test_peer_tls_cert_and_key_go_together(pem: Path) -> None:
    rule = "the two are this server's client identity for mTLS with other shards"
    assert errors_of(peer_tls(pem, "cert") + TOKEN, env={}) == [
        f"server.peer_tls.key: is required with cert: {rule}"
    ]
    assert errors_of(peer_tls(pem, "ca", "key") + TOKEN, env={}) == [
        f"server.peer_tls.cert: is required with key: {rule}"
    ]
    both = load_config(peer_tls(pem, "cert", "key") + TOKEN, env={}).server.peer_tls
    assert both is not None and (both.ca, both.cert, both.key) == (
        None,
        f"{pem}/cert.pem",
        f"{pem}/key.pem",
    )


PEER_CERT_NEEDS_CREDENTIALS = (
    "server.peer_tls.cert: needs credentials on this server ([[auth.tokens]] or [[auth.certs]]): "
    "a forwarded call must never act with the server's own certificate"
)


def test_a_peer_certificate_needs_credentials_on_this_server(pem: Path) -> None:
    assert errors_of(peer_tls(pem, "cert", "key"), env={}) == [PEER_CERT_NEEDS_CREDENTIALS]
    # a token that is itself wrong leaves the server without credentials: both are said
    short = '[[auth.tokens]]\ntoken = "short"\nrole = "admin"\n'
    assert errors_of(peer_tls(pem, "cert", "key") + short, env={}) == [
        "auth.tokens[0].token: must be at least 16 characters",
        PEER_CERT_NEEDS_CREDENTIALS,
    ]
    # client certificates are credentials too
    mtls = (
        f'[server.tls]\ncert = "{pem}/cert.pem"\nkey = "{pem}/key.pem"\n'
        f'client_ca = "{pem}/ca.pem"\n'
    )
    certs = '[[auth.certs]]\ndns_name = "ops.internal"\nrole = "admin"\n'
    cfg = load_config(mtls + peer_tls(pem, "cert", "key") + certs, env={})
    assert cfg.server.peer_tls is not None and cfg.auth.enabled


def test_peer_tls_without_a_client_identity_needs_no_credentials(pem: Path) -> None:
    """Only `ca` (or nothing: the system roots verify the peers) identifies nobody."""
    assert load_config(peer_tls(pem, "ca"), env={}).server.peer_tls is not None
    empty = load_config("[server.peer_tls]\n", env={}).server.peer_tls
    assert empty is not None and (empty.ca, empty.cert, empty.key) == (None, None, None)
    assert errors_of('[server.peer_tls]\nca = "/nonexistent/ca.pem"\n', env={}) == [
        'server.peer_tls.ca: no such file ("/nonexistent/ca.pem")'
    ]


def test_insecure_peer_http() -> None:
    assert not load_config(None, env={}).server.insecure_peer_http
    assert load_config("[server]\ninsecure_peer_http = true\n", env={}).server.insecure_peer_http
    assert errors_of('[server]\ninsecure_peer_http = "yes"\n', env={}) == [
        "server.insecure_peer_http: must be a boolean (got a string)"
    ]


# --- the store of a shard (docs/configuration.md, "[store]") -------------------------------------

PG = '[store]\nkind = "postgres"\nurl_env = "PG_URL"\n'
PG_ENV = {"PG_URL": "postgres://u@localhost/db"}


def test_a_sharded_postgres_schema_defaults_to_one_per_shard() -> None:
    assert load_config(SHARDS + PG, env=PG_ENV, shard="cpu").store.schema == "cronoq_cpu"
    assert load_config(SHARDS + PG, env=PG_ENV, shard="gpu").store.schema == "cronoq_gpu"
    assert load_config(PG, env=PG_ENV).store.schema == "public"  # unsharded


@pytest.mark.parametrize(
    ("schema", "shard", "result"),
    [
        ("q_{shard}", "cpu", "q_cpu"),
        ("{shard}", "gpu", "gpu"),
        ("{shard}_{shard}", "cpu", "cpu_cpu"),
        ("Tasks_{shard}_V2", "gpu", "Tasks_gpu_V2"),
    ],
)
def test_shard_in_the_postgres_schema_is_replaced(schema: str, shard: str, result: str) -> None:
    text = SHARDS + PG + f'schema = "{schema}"\n'
    assert load_config(text, env=PG_ENV, shard=shard).store.schema == result


def test_a_sharded_postgres_schema_must_contain_shard() -> None:
    text = SHARDS + PG + 'schema = "cronoq"\n'
    assert errors_of(text, env=PG_ENV, shard="cpu") == [
        "store.schema: must contain {shard} with [[shards]], so that each shard has a schema of "
        'its own (got "cronoq")'
    ]


def test_a_sharded_schema_must_stay_a_plain_identifier() -> None:
    rule = (
        "store.schema: must be a plain SQL identifier of 1-63 characters once {shard} is replaced"
    )
    text = SHARDS + PG + 'schema = "q-{shard}"\n'
    assert errors_of(text, env=PG_ENV, shard="cpu") == [
        f'{rule} (got "q-{{shard}}", giving "q-cpu")'
    ]
    # 31 characters and a 32-character shard name: 63 characters are fine, 64 are not
    long_shard = "s" * 32
    plan = SHARDS.replace('name = "gpu"', f'name = "{long_shard}"')
    ok = plan + PG + f'schema = "{"q" * 31}{{shard}}"\n'
    assert load_config(ok, env=PG_ENV, shard=long_shard).store.schema == "q" * 31 + long_shard
    too_long = plan + PG + f'schema = "{"q" * 32}{{shard}}"\n'
    (error,) = errors_of(too_long, env=PG_ENV, shard=long_shard)
    assert error.startswith(f'{rule} (got "{"q" * 32}{{shard}}", giving "')


def test_an_unknown_shard_is_reported_once_not_again_by_the_store() -> None:
    text = SHARDS + PG + 'schema = "q_{shard}"\n'
    assert errors_of(text, env=PG_ENV) == [
        "server.shard: is required when [[shards]] is configured (or --shard)"
    ]
    assert errors_of(text, env=PG_ENV, shard="TPU") == [
        'server.shard: must name one of the [[shards]] (got "TPU")'
    ]
    # but a schema that no shard name could make valid is said at once
    bad = SHARDS + PG + 'schema = "9{shard}"\n'
    assert errors_of(bad, env=PG_ENV) == [
        "store.schema: must be a plain SQL identifier of 1-63 characters once {shard} is "
        'replaced (got "9{shard}")',
        "server.shard: is required when [[shards]] is configured (or --shard)",
    ]


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_shard_in_the_store_without_shards_is_an_error(kind: str) -> None:
    key, store = (
        ("schema", PG + 'schema = "q_{shard}"\n')
        if kind == "postgres"
        else ("path", '[store]\nkind = "sqlite"\npath = "/var/lib/q-{shard}.db"\n')
    )
    value = "q_{shard}" if kind == "postgres" else "/var/lib/q-{shard}.db"
    assert errors_of(store, env=PG_ENV) == [
        f'store.{key}: contains {{shard}} but no [[shards]] is configured (got "{value}")'
    ]


def test_shard_in_the_sqlite_path_is_replaced() -> None:
    store = '[store]\nkind = "sqlite"\npath = "/var/lib/cronoq/{shard}/q-{shard}.db"\n'
    cfg = load_config(SHARDS + store, env={}, shard="gpu")
    assert cfg.store.path == "/var/lib/cronoq/gpu/q-gpu.db"
    # {shard} is not required in a path: each shard's servers may be given a file of their own
    plain = '[store]\nkind = "sqlite"\npath = "/var/lib/cronoq/q.db"\n'
    assert load_config(SHARDS + plain, env={}, shard="gpu").store.path == "/var/lib/cronoq/q.db"


# --- reading and overriding (docs/configuration.md, "Loading order and errors") -------------------


def test_read_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError, match=r"missing\.toml: cannot read the file"):
        read_config(missing)
    broken = tmp_path / "broken.toml"
    broken.write_text("[server\n")
    with pytest.raises(ConfigError, match=r"broken\.toml: not valid TOML \(.*line 1"):
        read_config(broken)


def test_overrides_are_applied_before_validation_and_copy_the_input() -> None:
    raw = read_config('[server]\nshard = "gpu"\n')
    out = apply_overrides(raw, insecure_no_auth=True, shard="cpu")
    assert out["server"] == {"shard": "cpu", "insecure_no_auth": True}
    assert raw == {"server": {"shard": "gpu"}}
    assert apply_overrides({}, shard="cpu") == {"server": {"shard": "cpu"}}
    # a wrong [server] is left for validation to report
    with pytest.raises(ConfigError, match=r"^server: must be a table \(got an integer\)$"):
        validate(apply_overrides({"server": 1}, shard="cpu"), env={})


def test_config_error_is_a_scheduler_error_and_pickles() -> None:
    error = ConfigError(["a: must be x", "b: must be y"])
    assert isinstance(error, SchedulerError)
    copy = pickle.loads(pickle.dumps(error))
    assert (
        copy.errors == ("a: must be x", "b: must be y")
        and str(copy) == "a: must be x\nb: must be y"
    )


# --- conversion to the engine's types ----------------------------------------------------------

CONVERT = """
[limits]
max_pending_per_pool = 500
[[pools]]
name = "llm"
min = 2
max = 16
autoscale = true
lease_ttl_s = 10
overflow = "reject"
target_utilization = 0.5
drain_time_s = 10
cooldown_s = 5
cost_per_worker_second = 0.25
await_unknown_dependencies_s = 60
tenant_weights = { acme = 3 }
[pools.retry]
max_attempts = 5
initial_backoff_s = 0.5
multiplier = 3
max_backoff_s = 20
jitter = false
[[pools]]
name = "batch"
min = 1
max = 8
autoscale = false
cost_per_worker_second = 0.1
[[resources]]
kind = "semaphore"
name = "db"
permits = 4
[[resources]]
kind = "token_bucket"
name = "api"
rate = 2.5
burst = 10
"""


def test_core_pools() -> None:
    llm, batch = core_pools(load_config(CONVERT, env={}))
    assert (llm.name, llm.capacity, llm.min, llm.max) == ("llm", 0, 2, 16)
    assert (llm.lease_ttl, llm.max_pending, llm.overflow) == (10.0, 500, "reject")
    retry = llm.retry
    assert (
        retry.max_attempts,
        retry.initial_backoff,
        retry.multiplier,
        retry.max_backoff,
        retry.jitter,
    ) == (5, 0.5, 3.0, 20.0, False)
    assert llm.autoscale == AutoscaleSettings(
        target_utilization=0.5, drain_time=10.0, cooldown=5.0, cost_per_worker_second=0.25
    )
    assert llm.cost_per_worker_second == 0.25
    assert (llm.unknown_dependency, llm.await_timeout) == ("await", 60.0)
    assert llm.fair_share and llm.tenant_weights == {"acme": 3.0}  # weights switch it on

    # no autoscaling: min and max remain the bounds, capacity still comes from the workers
    assert (batch.capacity, batch.min, batch.max, batch.autoscale) == (0, 1, 8, None)
    assert batch.cost_per_worker_second == 0.1
    assert (batch.unknown_dependency, batch.await_timeout) == ("reject", None)
    assert batch.retry.max_attempts == 3 and batch.lease_ttl == 30.0


def test_library_pools_and_resources() -> None:
    cfg = load_config(CONVERT, env={})
    llm, batch = library_pools(cfg)
    assert (llm.name, llm.max, llm.lease_ttl, batch.name, batch.max) == (
        "llm",
        16,
        10.0,
        "batch",
        8,
    )
    db, api = library_resources(cfg)
    assert (db.name, db.permits, api.name, api.rate, api.burst) == ("db", 4, "api", 2.5, 10)


def test_the_cost_rate_reaches_the_scheduler_with_or_without_autoscaling() -> None:
    """The server's Scheduler takes library_pools: each one's engine view prices its worker
    seconds, autoscaled (llm) or not (batch); a library Pool without autoscaling still has
    no cost rate of its own."""
    llm, batch = library_pools(load_config(CONVERT, env={}))
    assert llm.autoscale is not None and batch.autoscale is None
    assert [p.core_config().cost_per_worker_second for p in (llm, batch)] == [0.25, 0.1]
    assert Pool("x", lambda: None, autoscale=False).core_config().cost_per_worker_second == 0.0
    engine = Engine([p.core_config() for p in (llm, batch)], 0.0)
    engine.set_capacity("batch", 4, 0.0)
    assert {p.name: p.cost for p in engine.snapshot(10.0).pools}["batch"] == 4 * 10 * 0.1


def test_core_resources_and_an_engine_built_from_them() -> None:
    cfg = load_config(CONVERT, env={})
    resources = core_resources(cfg)
    assert resources == [
        ResourceConfig("db", "semaphore", permits=4),
        ResourceConfig("api", "token_bucket", rate=2.5, burst=10),
    ]
    # the engine takes them as they are: both pools start with no slots until workers connect
    engine = Engine(core_pools(cfg), 0.0, resources=resources)
    assert [(p.name, p.capacity) for p in engine.snapshot(0.0).pools] == [("llm", 0), ("batch", 0)]
