"""The server's store, built from `[store]` (cronoq.server.app): nothing connects until the
listeners are bound, the logs name it without its password, and a standby's /readyz reason
comes from it (docs/http.md, "Health and readiness")."""

from __future__ import annotations

from pathlib import Path

from cronoq.server.app import ServerApp
from cronoq.server.config import load_config
from cronoq.server.fronts.http_api import header_text
from cronoq.store import PostgresStore, SqliteStore

PORTS = '[server]\ngrpc_addr = "127.0.0.1:0"\nhttp_addr = "127.0.0.1:0"\n'


def test_a_postgres_store_is_built_from_the_configuration_without_connecting() -> None:
    # (10.255.255.1 is not routed: a connection attempt would hang, not fail)
    url = "postgresql://u:pw-secret@10.255.255.1:5432/db"
    text = (
        f'{PORTS}[store]\nkind = "postgres"\nurl = "{url}"\nschema = "tenant_a"\n'
        "keep_finished_s = 120\n[limits]\nkey_retention_s = 600\n"
    )
    app = ServerApp(load_config(text))
    store = app.store
    assert isinstance(store, PostgresStore)
    assert (store.schema, store.retention, store.reload_finished) == ("tenant_a", 120.0, 600.0)
    assert store.location == "postgresql://u@10.255.255.1:5432/db schema=tenant_a"
    assert "pw-secret" not in repr(store)
    assert not app.ready and app.standing_by
    assert app.standby_reason == "connecting to the store"  # ("not open" in the store's words)
    store.status = "database unreachable: OSError: [Errno 113] No route to host"
    assert app.standby_reason == store.status


def test_a_postgres_server_that_retains_no_finished_key_reloads_none() -> None:
    """limits.key_retention_s = 0 is valid: no finished task is reloaded at a takeover."""
    text = f'{PORTS}[store]\nkind = "postgres"\nurl = "postgresql://u@h/db"\n'
    app = ServerApp(load_config(text + "[limits]\nkey_retention_s = 0\n"))
    assert isinstance(app.store, PostgresStore)
    assert app.store.reload_finished == 0


def test_a_sqlite_store_says_where_it_is(tmp_path: Path) -> None:
    app = ServerApp(load_config(f'{PORTS}[store]\nkind = "sqlite"\npath = "{tmp_path}/q.db"\n'))
    assert isinstance(app.store, SqliteStore)
    assert app.store.location == f"{tmp_path}/q.db"
    assert app.standby_reason == "waiting for the leadership"


def test_a_reason_fits_a_header() -> None:
    assert header_text("lost:\tthe lock\r\nconnection é") == "lost: the lock  connection ?"
    assert len(header_text("x" * 1000)) == 256 and header_text("x" * 1000).endswith("...")
