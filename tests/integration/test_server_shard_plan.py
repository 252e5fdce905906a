"""The shard plan as the real `cronoq-server` process reads it (docs/configuration.md,
"[[shards]]"): each invalid plan is refused by `--check` with the key it breaks and fails a real
start before the server listens; a valid two-shard plan passes `--check` for either shard, and
a server started with it opens its own shard's store."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.servers import PORT0, Server, server_command, write

VALID = "configuration is valid\n"  # what --check prints

# Two shards, numbered 0 and 200, each with a pool, a resource and a store of its own; the same
# file serves both (--shard picks one).
POOLS = '[[pools]]\nname = "default"\n[[pools]]\nname = "llm"\n'
CPU = """
[[shards]]
name = "cpu"
number = 0
pools = ["default"]
endpoint = "http://127.0.0.1:7070"
"""
GPU = """
[[shards]]
name = "gpu"
number = 200
pools = ["llm"]
endpoint = "https://gpu.internal"
"""
RESOURCES = """
[[resources]]
kind = "semaphore"
name = "db"
permits = 2
shard = "cpu"
[[resources]]
kind = "token_bucket"
name = "gpu_api"
rate = 5
burst = 10
shard = "gpu"
"""
PLAN = POOLS + CPU + GPU + RESOURCES


def test_a_valid_two_shard_plan_passes_check(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("-----BEGIN PLACEHOLDER-----\n")
    text = (
        PORT0
        + f'[server.peer_tls]\nca = "{tmp_path}/ca.pem"\n'
        + f'[store]\nkind = "sqlite"\npath = "{tmp_path}/q-{{shard}}.db"\n'
        + PLAN
    )
    config = write(tmp_path, text)
    for shard in ("cpu", "gpu"):
        r = server_command("--check", "-c", config, "--shard", shard)
        assert (r.returncode, r.stdout) == (0, VALID), r.stderr
    r = server_command("--check", "-c", config, env={"CRONOQ_SHARD": "gpu"})
    assert (r.returncode, r.stdout) == (0, VALID), r.stderr


def pem_files(directory: Path) -> str:
    for name in ("cert.pem", "key.pem"):
        (directory / name).write_text("-----BEGIN PLACEHOLDER-----\n")
    return str(directory)


# Each invalid plan (as the file's text, given the test's directory), the shard it is checked
# for (None: no --shard), and the error line --check must print.
INVALID = {
    "number out of range": (
        lambda d: POOLS + CPU + GPU.replace("number = 200", "number = 256") + RESOURCES,
        "cpu",
        "Error: shards[1].number: must be from 0 to 255 (got 256)",
    ),
    "number twice": (
        lambda d: POOLS + CPU + GPU.replace("number = 200", "number = 0") + RESOURCES,
        "cpu",
        "Error: shards[1].number: 0 is already the number of shards[0]",
    ),
    "name not plain": (
        lambda d: POOLS + CPU.replace('name = "cpu"', 'name = "CPU"') + GPU,
        "gpu",
        "Error: shards[0].name: must be 1-32 characters of a-z, 0-9 and '_', starting with a "
        'letter (got "CPU")',
    ),
    "endpoint with a path": (
        lambda d: PLAN.replace('"https://gpu.internal"', '"https://gpu.internal/v1"'),
        "cpu",
        "Error: shards[1].endpoint: must not have a path, query or fragment "
        '(got "https://gpu.internal/v1")',
    ),
    "endpoint with a space": (
        lambda d: PLAN.replace('"https://gpu.internal"', '"https://gpu. internal"'),
        "cpu",
        "Error: shards[1].endpoint: must not contain whitespace or control characters "
        '(got "https://gpu. internal")',
    ),
    "endpoint twice": (
        lambda d: PLAN.replace('"https://gpu.internal"', '"http://127.0.0.1:7070"'),
        "cpu",
        'Error: shards[1].endpoint: "http://127.0.0.1:7070" is already the endpoint of shards[0]',
    ),
    "pool in two shards": (
        lambda d: PLAN.replace('pools = ["llm"]', 'pools = ["llm", "default"]'),
        "cpu",
        'Error: shards[1].pools: pool "default" is already served by shards[0]',
    ),
    "pool in no shard": (
        lambda d: POOLS + '[[pools]]\nname = "spare"\n' + CPU + GPU + RESOURCES,
        "cpu",
        'Error: pools[2].name: pool "spare" is in no [[shards]] entry',
    ),
    "own pool not configured": (
        lambda d: POOLS.replace('name = "llm"', 'name = "batch"') + CPU + GPU + RESOURCES,
        "gpu",
        'Error: shards[1].pools: pool "llm" of this server\'s shard is not configured in [[pools]]',
    ),
    "no server.shard": (
        lambda d: PLAN,
        None,
        "Error: server.shard: is required when [[shards]] is configured (or --shard)",
    ),
    "server.shard without shards": (
        lambda d: PORT0 + 'shard = "cpu"\n',
        None,
        'Error: server.shard: is set but no [[shards]] is configured (got "cpu", from the file, '
        "--shard or CRONOQ_SHARD)",
    ),
    "resource of no shard": (
        lambda d: PLAN.replace('shard = "gpu"\n', ""),
        "cpu",
        "Error: resources[1].shard: is required with [[shards]]: each shard counts its "
        "resources separately",
    ),
    "resource shard without shards": (
        lambda d: POOLS + RESOURCES.replace('shard = "gpu"\n', ""),
        None,
        'Error: resources[0].shard: is set but no [[shards]] is configured (got "cpu")',
    ),
    "peer cert without key": (
        lambda d: (
            PORT0
            + f'[server.peer_tls]\ncert = "{pem_files(d)}/cert.pem"\n'
            + '[[auth.tokens]]\ntoken_env = "T"\nrole = "admin"\n'
            + PLAN
        ),
        "cpu",
        "Error: server.peer_tls.key: is required with cert: the two are this server's client "
        "identity for mTLS with other shards",
    ),
    "peer cert without credentials": (
        lambda d: (
            PORT0
            + f'[server.peer_tls]\ncert = "{pem_files(d)}/cert.pem"\nkey = "{d}/key.pem"\n'
            + PLAN
        ),
        "cpu",
        "Error: server.peer_tls.cert: needs credentials on this server ([[auth.tokens]] or "
        "[[auth.certs]]): a forwarded call must never act with the server's own certificate",
    ),
    "postgres schema of no shard": (
        lambda d: '[store]\nkind = "postgres"\nurl_env = "PG_URL"\nschema = "cronoq"\n' + PLAN,
        "cpu",
        "Error: store.schema: must contain {shard} with [[shards]], so that each shard has a "
        'schema of its own (got "cronoq")',
    ),
    "sqlite path {shard} without shards": (
        lambda d: f'[store]\nkind = "sqlite"\npath = "{d}/q-{{shard}}.db"\n',
        None,
        "Error: store.path: contains {shard} but no [[shards]] is configured "
        '(got "@DIR@/q-{shard}.db")',
    ),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_check_refuses_an_invalid_plan_naming_the_key(tmp_path: Path, case: str) -> None:
    text, shard, error = INVALID[case]
    config = write(tmp_path, text(tmp_path))
    flags = [] if shard is None else ["--shard", shard]
    env = {"T": "admin-token-0123456789abcdefghijk", "PG_URL": "postgres://u@localhost/db"}
    r = server_command("--check", "-c", config, *flags, env=env)
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert error.replace("@DIR@", str(tmp_path)) in r.stderr.splitlines(), r.stderr
    assert "Traceback" not in r.stderr


def test_a_shard_set_by_the_environment_without_shards_is_refused(tmp_path: Path) -> None:
    r = server_command("--check", "-c", write(tmp_path, PORT0), env={"CRONOQ_SHARD": "cpu"})
    assert r.returncode == 1
    assert r.stderr.startswith("Error: server.shard: is set but no [[shards]] is configured")


def test_an_invalid_plan_fails_the_start_before_the_server_listens(tmp_path: Path) -> None:
    """Not only --check: the server itself refuses the plan, exits 1 and never serves."""
    text = PORT0 + PLAN.replace('shard = "gpu"\n', "")
    r = server_command("-c", write(tmp_path, text), "--shard", "cpu")
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines() == [
        "Error: resources[1].shard: is required with [[shards]]: each shard counts its "
        "resources separately"
    ]
    assert "event=listening" not in r.stderr and "event=ready" not in r.stderr


def test_a_valid_plan_starts_on_its_own_shards_store(tmp_path: Path) -> None:
    """{shard} in the SQLite path is this server's shard: the cpu server opens q-cpu.db."""
    store = f'[store]\nkind = "sqlite"\npath = "{tmp_path}/q-{{shard}}.db"\n'
    server = Server(write(tmp_path, PORT0 + 'shard = "cpu"\n' + store + PLAN))
    try:
        opened = server.wait_for(r"event=awaiting_leadership store=(\S+)").group(1)
        server.wait_for("event=ready")
        assert opened == f"{tmp_path}/q-cpu.db"
        assert server.terminate(timeout=30) == 0
    finally:
        server.kill()
    assert (tmp_path / "q-cpu.db").exists() and not (tmp_path / "q-gpu.db").exists()
