"""Configuration files written for the published cronoq-server 0.2.1 (published_configs/*.toml),
run unchanged by the real `cronoq-server` process: `--check` accepts each one and the server
starts and serves with it (docs/configuration.md, docs/server.md, "Command line").

Deploying a file here changes only what a deployment would: every listener moves to a free port
on loopback, and the TLS files and the database move into the test's directory (`deployed`).
The tokens come from the environment, as the files say. Then each file's particular settings
are tried once: `[[auth.certs]] dns_name` over mutual TLS, a token allowed no pool, labels with
an empty value, the zero limits, a `max_message_bytes` above what grpcio takes, a webhook scaler.
"""

from __future__ import annotations

import contextlib
import os
import re
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from helpers.auth import Stubs, code_of, over_mtls, ref, token
from helpers.servers import COMMAND, Serving, serving_process

Code = grpc.StatusCode

CONFIGS = Path(__file__).parent / "published_configs"
FILES = sorted(p.name for p in CONFIGS.glob("*.toml"))
# Every variable the files name, as a deployment would set them.
ENV = {
    "CRONOQ_CLIENT_TOKEN": token("client"),
    "CRONOQ_WORKER_TOKEN": token("worker"),
    "CRONOQ_ADMIN_TOKEN": token("admin"),
    "CRONOQ_PROMETHEUS_TOKEN": token("metrics"),
    "CRONOQ_PARKED_TOKEN": token("parked"),
    "CRONOQ_SCALER_TOKEN": token("scaler"),
}
LISTENER = re.compile(r'^(grpc_addr|http_addr|metrics_addr) = "[^"]*"$', re.M)


def md(name: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token(name)}")]


def deployed(name: str, directory: Path) -> str:
    """The file `name` as deployed in `directory`: its listeners on free loopback ports, its
    TLS files (those of the `pki` fixture) and its database in `directory`."""
    text = (CONFIGS / name).read_text()
    moved = LISTENER.sub(r'\1 = "127.0.0.1:0"', text)
    assert moved != text, f"{name} names no listener"
    moved = moved.replace("/etc/cronoq/tls/", f"{directory}/")
    moved = moved.replace("/var/lib/cronoq/", f"{directory}/")
    path = directory / f"deployed-{name}"
    path.write_text(moved)
    return str(path)


@pytest.fixture
def directory(tmp_path: Path, pki: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The certificates of helpers.auth.make_pki (ca.pem, server.pem for localhost, ops.pem,
    robot.pem, stranger.pem) and the files' variables, which server processes inherit."""
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    return pki


@contextlib.contextmanager
def started(name: str, directory: Path) -> Iterator[Serving]:
    config = deployed(name, directory)
    with serving_process(directory, Path(config).read_text()) as serving:
        yield serving


# --- every file ---------------------------------------------------------------------------------


def readyz(serving: Serving, directory: Path, tls: bool) -> int:
    port = serving.http_address.rsplit(":", 1)[1]
    if not tls:
        url, context = f"http://{serving.http_address}/readyz", None
    else:
        url = f"https://localhost:{port}/readyz"
        context = ssl.create_default_context(cafile=str(directory / "ca.pem"))
        # with client_ca, the HTTP listener asks for a client certificate too
        context.load_cert_chain(directory / "ops.pem", directory / "ops.key")
    with urllib.request.urlopen(url, context=context, timeout=10) as r:
        return int(r.status)


@pytest.mark.parametrize("name", FILES)
def test_check_says_valid_and_the_server_serves(name: str, directory: Path) -> None:
    config = deployed(name, directory)
    r = subprocess.run(
        [*COMMAND, "--check", "-c", config],
        capture_output=True,
        text=True,
        timeout=20,
        env={k: v for k, v in os.environ.items() if k not in ("CRONOQ_CONFIG", "CRONOQ_SHARD")},
    )
    assert (r.returncode, r.stdout, r.stderr) == (0, "configuration is valid\n", "")
    with started(name, directory) as serving:
        assert readyz(serving, directory, tls="[server.tls]" in Path(config).read_text()) == 200
        assert serving.server.proc.poll() is None


# --- mutual TLS: dns_name, a token for no pool, labels with an empty value -----------------------


@pytest.fixture
def mtls(directory: Path) -> Iterator[Serving]:
    with started("mtls.toml", directory) as serving:
        yield serving


def over_tls(
    serving: Serving, directory: Path, client: str
) -> contextlib.AbstractAsyncContextManager[Stubs]:
    return over_mtls(directory, client, serving.address.rsplit(":", 1)[1])


async def test_mtls_certificates_map_by_dns_name(mtls: Serving, directory: Path) -> None:
    async with (
        over_tls(mtls, directory, "ops") as ops,  # DNS:OPS.example, matched case-insensitively
        over_tls(mtls, directory, "robot") as robot,
        over_tls(mtls, directory, "stranger") as stranger,
    ):
        snapshot = await ops.admin.Snapshot(pb.Empty())  # the admin entry
        assert sorted(p.name for p in snapshot.pools) == ["default", "gpu"]
        mine = (await ops.tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="gpu")))).id

        # the worker entry: pool gpu only, labels from its list (gpu with the empty value)
        work = robot.workers.Work()
        register = pb.Register(
            pool="gpu",
            slots=8,
            worker_name="robot",
            protocol_version=3,
            labels={"gpu": "", "zone": "eu-west-1"},
        )
        await work.write(pb.WorkerMessage(register=register))
        registered = (await work.read()).registered
        assert registered.slots == 2  # the pool's max_slots_per_worker
        lease = (await work.read()).lease
        assert lease.task_id == mine
        await work.done_writing()
        elsewhere = robot.workers.Work()
        await elsewhere.write(
            pb.WorkerMessage(
                register=pb.Register(pool="default", slots=1, worker_name="r", protocol_version=3)
            )
        )
        assert await code_of(elsewhere) is Code.PERMISSION_DENIED

        assert await code_of(stranger.tasks.ListTasks(pb.ListTasksRequest())) is (
            Code.UNAUTHENTICATED
        )


async def test_a_token_allowed_no_pool_reaches_none(mtls: Serving, directory: Path) -> None:
    async with over_tls(mtls, directory, "ops") as ops:
        task = pb.TaskSpec(pool="default", key="seen-by-admins")
        mine = (await ops.tasks.Submit(pb.SubmitRequest(task=task))).id
        parked = md("parked")
        denied = ops.tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec()), metadata=parked)
        assert await code_of(denied) is Code.PERMISSION_DENIED
        listed = await ops.tasks.ListTasks(pb.ListTasksRequest(), metadata=parked)
        assert list(listed.tasks) == []  # none at all, not every pool's
        got = ops.tasks.Get(pb.GetRequest(task=ref(mine)), metadata=parked)
        assert await code_of(got) is Code.NOT_FOUND
        assert (await ops.tasks.Get(pb.GetRequest(task=ref(mine)))).id == mine


# --- zero limits and a message limit above grpcio's ---------------------------------------------


@pytest.fixture
def zero(directory: Path) -> Iterator[Serving]:
    with started("zero_limits.toml", directory) as serving:
        yield serving


async def test_the_zero_limits_behave(zero: Serving) -> None:
    async with grpc.aio.insecure_channel(zero.address) as ch:
        s = Stubs(ch)
        # max_message_bytes = 4 GiB: accepted, lowered to grpcio's largest and told so
        work = s.workers.Work()
        register = pb.Register(pool="default", slots=1, worker_name="w", protocol_version=3)
        await work.write(pb.WorkerMessage(register=register))
        assert (await work.read()).registered.max_message_bytes == 2**31 - 1
        await work.write(pb.WorkerMessage(set_slots=pb.SetSlots(slots=0)))  # take no task
        # max_tags, max_deps, max_resources = 0: none allowed
        for spec in (
            pb.TaskSpec(tags={"a": "b"}),
            pb.TaskSpec(deps=[pb.Dep(target=pb.TaskRef(key="k"))]),
            pb.TaskSpec(resources={"db": 1}),
        ):
            call = s.tasks.Submit(pb.SubmitRequest(task=spec))
            assert await code_of(call) is Code.INVALID_ARGUMENT, spec
        # max_wait_s = 0: a wait returns at once (the deadline only fails a server that waits)
        first = pb.TaskSpec(payload=b"x", key="once")
        waited = s.tasks.Submit(pb.SubmitRequest(task=first, wait=True), timeout=5)
        assert await code_of(waited) is Code.DEADLINE_EXCEEDED
        live = await s.tasks.Get(pb.GetRequest(task=ref("once")))  # submitted all the same
        waited = s.tasks.Wait(pb.WaitRequest(task=ref(live.id), timeout_s=60), timeout=5)
        assert await code_of(waited) is Code.DEADLINE_EXCEEDED
        # key_retention_s = 0 (and key_retention_max = 0): an ended task's key is free again
        assert (await s.tasks.Cancel(pb.CancelRequest(task=ref(live.id)))).cancelled
        gone = s.tasks.Get(pb.GetRequest(task=ref("once")))
        assert await code_of(gone) is Code.NOT_FOUND
        again = await s.tasks.Submit(pb.SubmitRequest(task=first))
        assert not again.duplicate and again.id != live.id
        await work.done_writing()


# --- a webhook scaler, and pools with and without autoscaling ------------------------------------


@pytest.fixture
def webhook(directory: Path) -> Iterator[Serving]:
    with started("webhook.toml", directory) as serving:
        yield serving


async def test_the_webhook_file_autoscales_render_and_not_batch(webhook: Serving) -> None:
    """Its scaler posts to a host these tests do not have: that is retried in the background
    (docs/autoscaling.md, "Webhook scaler") and holds nothing up."""
    async with grpc.aio.insecure_channel(webhook.address) as ch:
        s = Stubs(ch)
        task = pb.TaskSpec(pool="batch", tenant="analytics", payload=b"report")
        await s.tasks.Submit(pb.SubmitRequest(task=task), metadata=md("client"))
        snapshot = await s.admin.Snapshot(pb.Empty(), metadata=md("admin"))
        by_name = {p.name: p for p in snapshot.pools}
        assert by_name["render"].desired >= 1  # autoscaled, min 1
        assert (by_name["batch"].desired, by_name["batch"].capacity) == (0, 0)  # fixed
        assert by_name["batch"].pending_by_class[2] == 1  # the normal class
