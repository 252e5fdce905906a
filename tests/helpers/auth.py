"""Credentials and stubs for the authentication tests: tokens of every role, the methods and
the role each needs, mTLS certificates, and small call helpers."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.proto.cronoq.v1 import cronoq_pb2_grpc

Code = grpc.StatusCode
PORT0 = '[server]\ngrpc_addr = "127.0.0.1:0"\nhttp_addr = "127.0.0.1:0"\nshutdown_grace_s = 0\n'
POOLS = '[[pools]]\nname = "a"\n[[pools]]\nname = "b"\n'


def token(name: str) -> str:
    return f"{name}-token-0123456789abcdef0123"


# name: the token's table keys besides `token`
TOKENS = {
    "admin": 'role = "admin"',
    "client": 'role = "client"',
    "worker": 'role = "worker"',
    "metrics": 'role = "metrics"',
    "client_a": 'role = "client"\npools = ["a"]',
    "worker_a": 'role = "worker"\npools = ["a"]\nlabels = ["gpu=a100"]',
    "metrics_a": 'role = "metrics"\npools = ["a"]',
    "admin_a": 'role = "admin"\npools = ["a"]',
    "tenant": 'role = "client"\ntenant = "t1"',
}
AUTH = "".join(f'[[auth.tokens]]\ntoken = "{token(n)}"\n{keys}\n' for n, keys in TOKENS.items())
CONFIG = PORT0 + POOLS + AUTH
# What every authentication refusal adds to the published words (docs/server.md,
# "Authentication").
HOW = (
    "pass a token with --token or CRONOQ_TOKEN (cronoq), token= (cronoq.client) or an "
    '"authorization: Bearer <token>" header'
)


def md(who: str | None) -> list[tuple[str, str]]:
    return [] if who is None else [("authorization", f"Bearer {token(who)}")]


class Stubs:
    def __init__(self, ch: grpc.aio.Channel) -> None:
        self.channel = ch
        self.tasks = cronoq_pb2_grpc.TasksStub(ch)
        self.admin = cronoq_pb2_grpc.AdminStub(ch)
        self.workers = cronoq_pb2_grpc.WorkersStub(ch)

    async def submit(self, who: str, pool: str = "a", **fields: Any) -> int:
        task = pb.TaskSpec(payload=b"x", pool=pool, **fields)
        return (await self.tasks.Submit(pb.SubmitRequest(task=task), metadata=md(who))).id


@contextlib.asynccontextmanager
async def connect(address: object) -> AsyncIterator[Stubs]:
    """Stubs on a plain-text channel to `address` ("host:port" or a SocketAddress), closed at
    the end of the block."""
    async with grpc.aio.insecure_channel(str(address)) as ch:
        yield Stubs(ch)


async def code_of(call: Any) -> Code:
    """The status a call ends with, for unary and streaming calls alike."""
    code: Code = await call.code()
    return code


async def details_of(call: Any) -> str:
    await call.code()
    details: str = await call.details()
    return details


def ref(target: int | str) -> pb.TaskRef:
    return pb.TaskRef(key=target) if isinstance(target, str) else pb.TaskRef(id=target)


# --- roles ------------------------------------------------------------------------------------

BAD = "\0"
# method: (service, request that passes the role check but not validation, or is harmless)
METHODS: dict[str, tuple[str, Any]] = {
    "Submit": ("tasks", pb.SubmitRequest(task=pb.TaskSpec(pool=BAD))),
    "SubmitBatch": ("tasks", pb.SubmitBatchRequest(tasks=[pb.TaskSpec(pool=BAD)])),
    "Cancel": ("tasks", pb.CancelRequest()),
    "Get": ("tasks", pb.GetRequest()),
    "ListTasks": ("tasks", pb.ListTasksRequest(pools=[BAD])),
    "Wait": ("tasks", pb.WaitRequest()),
    "Watch": ("tasks", pb.WatchRequest(pools=[BAD])),
    "Work": ("workers", [pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=1))]),
    "Snapshot": ("admin", pb.Empty()),
    "AddRecurring": ("admin", pb.RecurringRequest()),
    "RemoveRecurring": ("admin", pb.RemoveRecurringRequest(name="none")),
    "ListWorkers": ("admin", pb.Empty()),
    "ListRecurring": ("admin", pb.Empty()),
}
TASK_METHODS = ["Submit", "SubmitBatch", "Cancel", "Get", "ListTasks", "Wait", "Watch"]
ROLE_OF = {  # docs/server.md, "Authentication"; admin may call everything
    **dict.fromkeys(TASK_METHODS, "client"),
    "Work": "worker",
    **dict.fromkeys(["Snapshot", "ListWorkers", "ListRecurring"], "metrics"),
    **dict.fromkeys(["AddRecurring", "RemoveRecurring"], "admin"),
}  # fmt: skip


def make_pki(tmp_path: Path) -> Path:
    """A CA, a server certificate for localhost and client certificates with DNS (and IP)
    subject alternative names, in `tmp_path` (the `pki` fixture of tests/integration)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make certificates")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"]

    def make(name: str, san: str | None, *, ca: bool = False) -> None:
        command = ["openssl", "req", "-x509", *key, "-subj", f"/CN={name}"]
        if san is not None:
            command += ["-addext", f"subjectAltName={san}"]
        if not ca:  # a leaf (CA:FALSE): rustls, under the native transport, refuses CA leaves
            command += ["-CA", str(tmp_path / "ca.pem"), "-CAkey", str(tmp_path / "ca.key")]
            command += ["-addext", "basicConstraints=critical,CA:FALSE"]
        command += ["-keyout", str(tmp_path / f"{name}.key"), "-out", str(tmp_path / f"{name}.pem")]
        subprocess.run(command, check=True, capture_output=True)

    make("ca", None, ca=True)
    make("server", "DNS:localhost")
    make("ops", "DNS:OPS.example,DNS:other.example")
    make("robot", "DNS:robot.example")
    make("stranger", "DNS:stranger.example")
    make("ip", "IP:127.0.0.1")
    return tmp_path


@contextlib.asynccontextmanager
async def over_mtls(pki: Path, client: str, port: int | str) -> AsyncIterator[Stubs]:
    """Stubs on a TLS channel to localhost:`port` that trusts `make_pki`'s CA and presents its
    certificate `client`; localhost, as the server certificate is for that name."""
    creds = grpc.ssl_channel_credentials(
        (pki / "ca.pem").read_bytes(),
        (pki / f"{client}.key").read_bytes(),
        (pki / f"{client}.pem").read_bytes(),
    )
    async with grpc.aio.secure_channel(f"localhost:{port}", creds) as ch:
        yield Stubs(ch)


def mtls_config(pki: Path, store: str = "", transport: str = "auto") -> str:
    return (
        PORT0
        + f'transport = "{transport}"\n'
        + f'[server.tls]\ncert = "{pki}/server.pem"\nkey = "{pki}/server.key"\n'
        + f'client_ca = "{pki}/ca.pem"\n'
        + POOLS
        + store
        + '[[auth.certs]]\ndns_name = "ops.example"\nrole = "client"\npools = ["a"]\n'
        + '[[auth.certs]]\ndns_name = "robot.example"\nrole = "worker"\npools = ["a"]\n'
        + '[[auth.certs]]\ndns = "127.0.0.1"\nrole = "admin"\n'  # `dns`: dns_name's alias
        + f'[[auth.tokens]]\ntoken = "{token("admin")}"\nrole = "admin"\n'
    )
