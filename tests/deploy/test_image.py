"""The root Dockerfile, built and run without a container registry or engine daemon: buildah
builds it (`--isolation=chroot`) on a base image made here from Debian's packages, and runs
the server from the image on the host's loopback; a client and a worker on the host submit and
complete a task through it.

* **Base.** Each image the Dockerfile starts `FROM` is used from local storage when it is
  there. Otherwise it is made: `mmdebstrap --variant=minbase bookworm` (Debian's own packages,
  as debian:bookworm-slim is) into build/image-cache (git-ignored), then `podman import`ed
  under the Dockerfile's name. Nothing is pulled.
* **Build.** The fast path of the Dockerfile: the `wheels` stage is given as a named build
  context, a wheelhouse with this checkout's wheel (tests/helpers/wheel.py, cached by the
  sources' digest) and its dependencies' wheels (downloaded on the host), so the image is
  built offline apart from Debian's packages; the Rust build stage is skipped. `--layers`
  keeps every step cached for the next run.
* **Checks.** The image's metadata (user, entry point, ports, volume, healthcheck, labels); its
  default configuration refused without the tokens and valid with them; the wheel inside is
  this checkout's; the server from the image (the default configuration with loopback ports
  of this host) becomes ready, serves /metrics, refuses a call without a token, and runs a
  task to completion for a `cronoq.client.Worker` on the host; the image's HEALTHCHECK command
  passes while it serves and fails once it is gone; SIGTERM stops it with exit status 0 and
  the SQLite file in the volume belongs to the image's user.

The test skips only where buildah, podman or mmdebstrap is missing or cannot run here
(scripts/test.sh installs them with apt-get).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from cronoq.client import Client, ClientError, Lease, Worker
from helpers.ports import free_port
from helpers.wheel import REPO, cached_wheelhouse

pytestmark = pytest.mark.realtime

DOCKERFILE = REPO / "Dockerfile"
IMAGE_CONFIG = REPO / "deploy" / "image" / "server.toml"
CACHE = REPO / "build" / "image-cache"
IMAGE = "localhost/cronoq:test"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
# The Debian suite each base image is made from when local storage lacks it.
BASES = {"docker.io/library/debian:bookworm-slim": "bookworm"}
# Marks a base made by this test, so that it is never mistaken for the published one.
LOCAL_BASE_LABEL = "io.cronoq.test.local-base"
TOKENS = {
    "CRONOQ_CLIENT_TOKEN": "image-test-client-token-0123456789abcdef",
    "CRONOQ_WORKER_TOKEN": "image-test-worker-token-0123456789abcdef",
    "CRONOQ_ADMIN_TOKEN": "image-test-admin-token-0123456789abcdefg",
}
# Generous bounds on waits for conditions (a loaded machine), never expectations of speed.
READY_WITHIN = 120.0
STOP_WITHIN = 90.0


def run(args: Sequence[str], *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


def ok(args: Sequence[str], *, timeout: float = 120) -> str:
    done = run(args, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


def qualified(name: str) -> str:
    """An image reference as the container tools resolve a short name: docker.io/library/..."""
    first = name.split("/", 1)[0]
    if "/" not in name:
        return f"docker.io/library/{name}"
    if "." not in first and ":" not in first and first != "localhost":
        return f"docker.io/{name}"
    return name


def base_images(dockerfile: str) -> set[str]:
    """The images the Dockerfile's stages start from: every FROM but scratch and its stages."""
    stages: set[str] = set()
    bases: set[str] = set()
    for m in re.finditer(
        r"^FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?\s*$", dockerfile, re.M | re.I
    ):
        image, stage = m.group(1), m.group(2)
        if image != "scratch" and image not in stages:
            bases.add(qualified(image))
        if stage:
            stages.add(stage)
    return bases


@pytest.fixture(scope="module")
def tools() -> None:
    for tool in ("buildah", "podman", "mmdebstrap"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/test.sh installs it with apt-get)")
    info = run(["buildah", "info"])
    if info.returncode != 0:
        pytest.skip(f"buildah cannot run here: {info.stderr.strip()[-500:]}")


@pytest.fixture(scope="module")
def bases(tools: None) -> set[str]:
    """The Dockerfile's base images in local storage, made from Debian's packages if absent."""
    wanted = base_images(DOCKERFILE.read_text())
    assert wanted, "the Dockerfile names no base image"
    assert wanted <= set(BASES), f"no recipe for the base images {sorted(wanted - set(BASES))}"
    for name in sorted(wanted):
        if run(["podman", "image", "exists", name]).returncode == 0:
            continue
        suite = BASES[name]
        tar = CACHE / f"{suite}-minbase.tar"
        if not tar.exists():
            CACHE.mkdir(parents=True, exist_ok=True)
            partial = tar.with_name(f".partial-{tar.name}")
            made = run(
                ["mmdebstrap", "--variant=minbase", "--format=tar", "--quiet", suite, str(partial)],
                timeout=900,
            )
            if made.returncode != 0:
                partial.unlink(missing_ok=True)
                pytest.skip(f"mmdebstrap cannot build a {suite} rootfs: {made.stderr[-800:]}")
            os.replace(partial, tar)
        ok(
            [
                "podman",
                "import",
                "--change",
                f"LABEL {LOCAL_BASE_LABEL}=mmdebstrap-{suite}-minbase",
                "--change",
                'CMD ["bash"]',
                str(tar),
                name,
            ],
            timeout=300,
        )
    return wanted


@pytest.fixture(scope="module")
def image(bases: set[str]) -> str:
    """The image built from the root Dockerfile, its `wheels` stage given as the wheelhouse."""
    house = cached_wheelhouse()
    log = CACHE / "last-build.log"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        done = subprocess.run(
            [
                "buildah",
                "bud",
                "--isolation=chroot",
                "--pull=never",
                "--layers",
                "--force-rm",
                # HEALTHCHECK exists in the Docker image format only (OCI's has no such field).
                "--format=docker",
                "--build-context",
                f"wheels={house}",
                "-f",
                str(DOCKERFILE),
                "-t",
                IMAGE,
                str(REPO),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=1200,
        )
    assert done.returncode == 0, f"buildah bud failed:\n{log.read_text()[-6000:]}"
    return IMAGE


@pytest.fixture(scope="module")
def config(image: str) -> dict[str, Any]:
    """The image's configuration (Docker format): User, Env, Entrypoint, Healthcheck, ..."""
    inspected = json.loads(ok(["buildah", "inspect", "--type", "image", image]))
    cfg: dict[str, Any] = inspected["Docker"]["config"]
    return cfg


@pytest.fixture
def container(image: str) -> Iterator[str]:
    """A working container of the image (buildah from), removed afterwards."""
    name = ok(["buildah", "from", "--pull=never", image]).strip()
    try:
        yield name
    finally:
        run(["buildah", "rm", name])


def in_container(
    container: str,
    *command: str,
    env: dict[str, str] | None = None,
    volumes: Sequence[str] = (),
) -> list[str]:
    args = ["buildah", "run", "--isolation=chroot"]
    for k, v in (env or {}).items():
        args += ["-e", f"{k}={v}"]
    for v in volumes:
        args += ["-v", v]
    return [*args, container, "--", *command]


def test_image_metadata(config: dict[str, Any]) -> None:
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["cronoq-server"]
    assert set(config["ExposedPorts"]) == {"7070/tcp", "7071/tcp", "7072/tcp"}
    assert set(config["Volumes"]) == {"/var/lib/cronoq"}
    assert config["WorkingDir"] == "/var/lib/cronoq"
    assert config["StopSignal"] == "SIGTERM"
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["CRONOQ_CONFIG"] == "/etc/cronoq/server.toml"
    assert env["PATH"].split(":")[0] == "/opt/cronoq/bin"
    check = config["Healthcheck"]["Test"]
    assert check[:3] == ["CMD", "python", "-c"] and "/readyz" in check[3]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.title"] == "cronoq"
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert LOCAL_BASE_LABEL not in labels or labels[LOCAL_BASE_LABEL].startswith("mmdebstrap")


def test_default_config_demands_tokens(container: str) -> None:
    refused = run(in_container(container, "cronoq-server", "--check"))
    assert refused.returncode == 1
    for name in TOKENS:
        assert f'environment variable "{name}" is not set' in refused.stderr
    assert "0.0.0.0:7070 is not a loopback address" in refused.stderr

    accepted = run(in_container(container, "cronoq-server", "--check", env=TOKENS))
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.strip() == "configuration is valid"


def context_sources(dockerfile: str) -> set[str]:
    """What the Dockerfile copies from the build context (COPY without --from)."""
    sources: set[str] = set()
    for m in re.finditer(r"^COPY\s+(?!--from)(.+)$", dockerfile, re.M):
        *srcs, _dest = m.group(1).split()
        sources |= {src.rstrip("/") for src in srcs}
    return sources


def test_build_context(bases: set[str], tmp_path: Path) -> None:
    """The context as .dockerignore filters it: everything the Dockerfile copies from it (the
    fast path above skips the build stage's copies), no build output, venv or cache."""
    probe = tmp_path / "Dockerfile.probe"
    probe.write_text(
        "FROM debian:bookworm-slim\nCOPY . /context/\nRUN find /context -mindepth 1 | sort\n"
    )
    tag = "localhost/cronoq-context-probe:test"
    try:
        out = ok(
            [
                *("buildah", "bud", "--isolation=chroot", "--pull=never"),
                *("--no-cache", "--force-rm", "-f", str(probe), "-t", tag, str(REPO)),
            ],
            timeout=600,
        )
    finally:
        run(["buildah", "rmi", tag])
    listed = {
        line.removeprefix("/context/") for line in out.splitlines() if line.startswith("/context/")
    }
    for source in context_sources(DOCKERFILE.read_text()):
        assert source in listed, f"COPY {source}: not in the build context"
    assert "src/cronoq/server/ui/index.html" in listed
    assert "native/Cargo.lock" in listed
    tops = {entry.split("/", 1)[0] for entry in listed}
    metadata = {"pyproject.toml", "MANIFEST.in", "README.md", "LICENSE"}
    assert tops == metadata | {"src", "native", "deploy"}
    assert {e for e in listed if e.startswith("deploy/")} == {
        "deploy/image",
        "deploy/image/server.toml",
    }
    unwanted = [
        e
        for e in listed
        if e.startswith("native/target")
        or "__pycache__" in e
        or e.endswith((".pyc", ".so"))
        or ".egg-info" in e
    ]
    assert not unwanted, unwanted[:20]


def record_hash(record: str, member: str) -> str:
    for line in record.splitlines():
        path, digest, _ = line.rsplit(",", 2)
        if path == member:
            return digest
    raise AssertionError(f"{member} not in RECORD")


def test_holds_this_checkouts_wheel(container: str) -> None:
    """The venv's cronoq is the wheel of this checkout (a cached layer of an older one is not),
    with the native transport."""
    house = cached_wheelhouse()
    (wheel,) = house.glob("cronoq-*.whl")
    record_name = f"cronoq-{VERSION}.dist-info/RECORD"
    with zipfile.ZipFile(wheel) as z:
        expected = record_hash(z.read(record_name).decode(), "cronoq/_native.abi3.so")
    script = (
        "import importlib.metadata as m, cronoq._native as n; "
        "d = m.distribution('cronoq'); "
        "print(d.read_text('RECORD'), end=''); print('NATIVE=' + n.__file__)"
    )
    out = ok(in_container(container, "python", "-c", script))
    native = out.rsplit("NATIVE=", 1)[1].strip()
    assert native.startswith("/opt/cronoq/lib/python3.11/site-packages/cronoq/_native")
    assert record_hash(out, "cronoq/_native.abi3.so") == expected


def loopback_config(tmp_path: Path, grpc: int, http: int, metrics: int) -> Path:
    """The image's own configuration, its three listeners moved to loopback ports of the host
    (buildah run shares the host's network)."""
    text = IMAGE_CONFIG.read_text()
    for default, port in (("7070", grpc), ("7071", http), ("7072", metrics)):
        listener = f'"0.0.0.0:{default}"'
        assert text.count(listener) == 1
        text = text.replace(listener, f'"127.0.0.1:{port}"')
    path = tmp_path / "server.toml"
    path.write_text(text)
    return path


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    give_up = time.monotonic() + READY_WITHIN
    while True:
        assert proc.poll() is None, f"the server exited ({proc.returncode}):\n{log.read_text()}"
        try:
            if http_get(url) == (200, "ready"):
                return
        except OSError:
            pass  # not listening yet
        assert time.monotonic() < give_up, f"{url} not ready:\n{log.read_text()}"
        time.sleep(0.05)


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (by the parent ids in /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # gone meanwhile
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: list[int] = []
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        frontier += children
    return found


def server_pid(runner: subprocess.Popen[bytes]) -> int:
    """The cronoq-server process that `buildah run` started, as `docker stop` would signal it:
    chroot isolation shares the PID namespace. buildah's own processes between the two (the
    chroot runtime and its exec helper, which takes the command line too) are named
    memfd:buildah-*; the server's name is that of the script the kernel ran."""
    for pid in descendants(runner.pid):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if name == "cronoq-server":
            return pid
    raise AssertionError("no cronoq-server process under buildah run")


async def submit_and_complete(grpc_target: str) -> None:
    async def handle(lease: Lease) -> dict[str, int]:
        return {"n": lease.json()["n"] + 1}

    anonymous = Client(grpc_target)
    with pytest.raises(ClientError) as refused:
        await anonymous.submit({"n": 0}, pool="default")
    assert "unauthenticated" in refused.value.code.lower()
    await anonymous.close()

    worker = Worker(
        grpc_target, "default", handle, slots=2, token=TOKENS["CRONOQ_WORKER_TOKEN"], name="host"
    )
    serving = asyncio.create_task(worker.run())
    try:
        async with Client(grpc_target, token=TOKENS["CRONOQ_CLIENT_TOKEN"]) as client:
            sub = await client.submit({"n": 41}, pool="default")
            result = await client.wait(sub.id, timeout=READY_WITHIN)
            assert result.ok, result
            assert result.json() == {"n": 42}
            assert (await client.get(sub.id)).done
    finally:
        await worker.stop()
        await serving


def test_serves_from_the_image(container: str, config: dict[str, Any], tmp_path: Path) -> None:
    grpc, http, metrics = free_port(), free_port(), free_port()
    while len({grpc, http, metrics}) < 3:
        http, metrics = free_port(), free_port()
    cfg = loopback_config(tmp_path, grpc, http, metrics)
    log = tmp_path / "server.log"
    healthcheck = config["Healthcheck"]["Test"][1:]
    health_env = {"CRONOQ_HEALTHCHECK_URL": f"http://127.0.0.1:{metrics}/readyz"}
    with open(log, "wb") as out:
        runner = subprocess.Popen(
            in_container(
                container,
                "cronoq-server",
                env={**TOKENS, "CRONOQ_CONFIG": "/etc/cronoq/test.toml"},
                volumes=[f"{cfg}:/etc/cronoq/test.toml:ro"],
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(runner, f"http://127.0.0.1:{metrics}/readyz", log)
        assert "transport=native" in log.read_text()

        status, body = http_get(f"http://127.0.0.1:{metrics}/metrics")
        assert status == 200
        assert re.search(r"^cronoq_leader(\{[^}]*\})? 1(\.0)?$", body, re.M), body[:2000]
        assert 'cronoq_pool_desired_workers{pool="default"}' in body
        assert http_get(f"http://127.0.0.1:{http}/healthz") == (200, "ok")

        # The image's HEALTHCHECK, run in the container as the engine would run it.
        probe = run(in_container(container, *healthcheck, env=health_env))
        assert probe.returncode == 0, probe.stderr

        asyncio.run(submit_and_complete(f"127.0.0.1:{grpc}"))
        status, body = http_get(f"http://127.0.0.1:{metrics}/metrics")
        assert re.search(r'^cronoq_pool_succeeded(_total)?\{pool="default"\} [1-9]', body, re.M), [
            line for line in body.splitlines() if "succeeded" in line
        ]

        os.kill(server_pid(runner), signal.SIGTERM)
        assert runner.wait(timeout=STOP_WITHIN) == 0, log.read_text()
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    text = log.read_text()
    assert "event=stopped" in text, text
    assert "level=error" not in text, text

    down = run(in_container(container, *healthcheck, env=health_env))
    assert down.returncode != 0
    owner = ok(in_container(container, "stat", "-c", "%u:%g", "/var/lib/cronoq/cronoq.db"))
    assert owner.strip() == "10001:10001"
