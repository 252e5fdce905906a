"""The HTTP listener as a drop-in for the published cronoq-server 0.2.1 (docs/http.md): its
routes, the task object, the answers field by field, the error body and every status the
listener produces, the query rules, the Host check, health and readiness, the metrics listener.

Most tests share one real `cronoq-server` process (module fixture), each in pools and keys of
its own, with raw gRPC workers (helpers.workers) running the tasks. What needs a server in a
given state (a standby, a stopping leader, credentials, tiny limits) runs one in process with
`wiring.build`, over real sockets too. Every answer any test here gets is also checked
against the OpenAPI document the server serves (`Http.call`): its status must be documented for
the route and its body must validate against the documented schema.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import sqlite3
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import jsonschema
import pytest

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from cronoq.server.app import ServerApp
from cronoq.server.config import load_config
from cronoq.server.fronts.http_api import ROUTES, openapi_document
from cronoq.server.services import tasks as tasks_module
from cronoq.server.wiring import build
from helpers.auth import AUTH, HOW, token
from helpers.auth import POOLS as AUTH_POOLS
from helpers.facts import TOTALS_KEYS
from helpers.servers import PORT0, Serving, serving_process
from helpers.workers import Worker

MAX_BATCH = 3
MAX_KEY = 40
POOLS = [
    "default",
    "body",
    "b64",
    "shape",
    "info",
    "fail",
    "result",
    "cancel",
    "batch",
    "la",
    "lb",
    "page",
    "deps",
    "workers",
    "snap",
    "keys",
]
CONFIG = (
    PORT0
    + 'metrics_addr = "127.0.0.1:0"\n'
    + f"[limits]\nmax_tasks_per_batch = {MAX_BATCH}\nmax_key_len = {MAX_KEY}\n"
    + "".join(f'[[pools]]\nname = "{name}"\n' for name in POOLS)
    + '[[pools]]\nname = "full"\nmax_pending = 1\noverflow = "reject"\n'
    + '[[pools]]\nname = "fixed"\nmax = 1\n'
    + '[[resources]]\nkind = "semaphore"\nname = "gpu"\npermits = 2\n'
)
PORTS0 = '[server]\ngrpc_addr = "127.0.0.1:0"\nhttp_addr = "127.0.0.1:0"\nshutdown_grace_s = 0.1\n'
DIGITS = re.compile(r"[0-9]+")
TEXT = "text/plain; charset=utf-8"
JSON_BODY = {"Content-Type": "application/json"}


# --- the OpenAPI document, as the check of every answer --------------------------------------

DOC = openapi_document()
_VALIDATOR = jsonschema.Draft202012Validator


def _template(path: str) -> str | None:
    """The documented path that `path` (no query) is an instance of: literal paths first, then
    the one with the most literal characters."""
    if path in DOC["paths"]:
        return path
    found = []
    for template in DOC["paths"]:
        pattern = re.sub(r"\\\{[a-z]+\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, path):
            found.append((len(re.sub(r"\{[a-z]+\}", "", template)), template))
    return max(found)[1] if found else None


def _schema(ref: dict[str, Any]) -> Any:
    """A schema of the document, resolvable on its own (its $refs point into the document)."""
    return {**ref, "components": DOC["components"]}


def check_documented(verb: str, path: str, answer: Answer) -> None:
    """The answer's status is one the document lists for the route, and its body validates
    against the schema documented for that status and content type. 404 and 405 of paths and
    methods no route serves are the document's general rule."""
    template = _template(path.split("?")[0])
    op = DOC["paths"].get(template or "", {}).get(verb.lower())
    if op is None:
        assert answer.status in (404, 405), (verb, path, answer.status)
        if verb != "HEAD":
            _VALIDATOR(_schema({"$ref": "#/components/schemas/Error"})).validate(answer.json)
        return
    responses = op["responses"]
    assert str(answer.status) in responses, (verb, template, answer.status, answer.body[:200])
    response = responses[str(answer.status)]
    if "$ref" in response:
        response = DOC["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    content = response.get("content")
    if content is None or verb == "HEAD":
        assert answer.body == b"", (verb, path)
        return
    media = answer.headers["Content-Type"]
    assert media in content, (verb, template, media, list(content))
    schema = content[media]["schema"]
    value = answer.json if media == "application/json" else answer.body.decode()
    _VALIDATOR(_schema(schema)).validate(value)


# --- clients ---------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: Any  # CIMultiDictProxy
    body: bytes

    @property
    def json(self) -> Any:
        assert self.headers.get("Content-Type") == "application/json", self.headers
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


class Http:
    """Requests to one HTTP listener; every answer checked against the OpenAPI document."""

    def __init__(self, session: aiohttp.ClientSession, base: str, *, check: bool = True) -> None:
        self.session = session
        self.base = base
        self.check = check

    async def call(self, verb: str, path: str, body: Any = None, **kw: Any) -> Answer:
        if body is not None:
            kw["json"] = body
        async with self.session.request(verb, self.base + path, **kw) as r:
            answer = Answer(r.status, r.headers, await r.read())
        if self.check:
            check_documented(verb, path, answer)
        return answer

    async def ok(self, verb: str, path: str, body: Any = None, **kw: Any) -> Any:
        """The JSON body of a 200 answer."""
        answer = await self.call(verb, path, body, **kw)
        assert answer.status == 200, (verb, path, answer.status, answer.body[:300])
        return answer.json

    async def get(self, path: str, **kw: Any) -> Any:
        return await self.ok("GET", path, **kw)

    async def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        return await self.ok("POST", path, body, **kw)


def assert_error(answer: Answer, status: int, code: str, text: str | None = None) -> str:
    """The flat error body, `application/json` without parameters, `WWW-Authenticate` on a
    401 and only there; returns the error text."""
    assert answer.status == status, (answer.status, answer.body[:300])
    assert answer.headers["Content-Type"] == "application/json"
    body = answer.json
    assert set(body) == {"error", "code"} and body["code"] == code, body
    assert isinstance(body["error"], str) and body["error"], body
    if text is not None:
        assert body["error"] == text, body
    if status == 401:
        assert answer.headers.getall("WWW-Authenticate") == ["Bearer"]
    else:
        assert "WWW-Authenticate" not in answer.headers
    return str(body["error"])


@dataclass
class Target:
    serving: Serving
    http: str
    metrics: str


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    with serving_process(tmp_path_factory.mktemp("http-api"), CONFIG) as serving:
        lines = "\n".join(serving.server.lines)
        match = re.search(r"event=listening metrics=(\S+)", lines)
        assert match, lines
        yield Target(serving, serving.http_address, match.group(1))


@contextlib.asynccontextmanager
async def client(target: Target, *, check: bool = True) -> AsyncIterator[Http]:
    async with aiohttp.ClientSession() as session:
        yield Http(session, f"http://{target.http}", check=check)


@contextlib.asynccontextmanager
async def worker(target: Target, pool: str, slots: int = 1, **labels: str) -> AsyncIterator[Worker]:
    async with grpc.aio.insecure_channel(target.serving.address) as channel:
        w = Worker(channel)
        await w.register(pool, slots, **labels)
        try:
            yield w
        finally:
            w.close()


@contextlib.asynccontextmanager
async def running(config: str, *, ready: bool = True) -> AsyncIterator[tuple[ServerApp, Http]]:
    """An in-process server built as the command builds it, on ports 0."""
    app = build(load_config(config))
    stop = asyncio.Event()
    serving = asyncio.create_task(app.serve(stop))
    while app.http_address is None or (ready and not app.ready):
        assert not serving.done(), serving.exception()
        await asyncio.sleep(0.01)  # polls the app's state; nothing to await for it
    try:
        async with aiohttp.ClientSession() as session:
            yield app, Http(session, f"http://{app.http_address}")
    finally:
        stop.set()
        await serving


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# --- submitting: the task object, field by field -----------------------------------------------


async def test_a_task_object_reaches_the_worker_field_by_field(target: Target) -> None:
    task = {
        "payload": {"to": "ada", "n": [1, 2.5, None], "s": "é"},
        "kind": "mail",
        "pool": "body",
        "priority": "high",
        "key": "body-1",
        "deadline_unix_ns": 4_102_444_800_000_000_000,
        "timeout_s": 7.5,
        "duration_hint_s": 2,
        "retry": {"max_attempts": 4},
        "resources": {"gpu": 1},
        "tags": {"team": "core"},
        "labels": {"zone": "eu"},
        "tenant": "acme",
    }
    async with client(target) as h:
        submitted = await h.post("/v1/tasks", task)
        assert set(submitted) == {"id", "duplicate"} and submitted["duplicate"] is False
        assert DIGITS.fullmatch(submitted["id"])
        info = await h.get(f"/v1/tasks/{submitted['id']}")
        async with worker(target, "body", zone="eu") as w:
            lease = await w.lease()
    assert lease.task_id == int(submitted["id"])
    assert lease.payload == '{"to":"ada","n":[1,2.5,null],"s":"é"}'.encode()
    assert lease.content_type == "application/json"
    assert (lease.kind, lease.key, lease.pool) == ("mail", "body-1", "body")
    assert lease.priority == pb.PRIORITY_HIGH
    assert lease.deadline_unix_ns == 4_102_444_800_000_000_000
    assert lease.timeout_s == 7.5
    assert lease.tags["team"] == "core"
    assert (info["max_attempts"], info["tenant"], info["priority"]) == (4, "acme", "high")


@pytest.mark.parametrize(
    ("task", "payload", "content_type"),
    [
        ({"payload_b64": b64(b"\x00raw\xff")}, b"\x00raw\xff", "application/octet-stream"),
        ({"payload": "text"}, b'"text"', "application/json"),
        ({"payload": 12}, b"12", "application/json"),
        ({"payload": [], "content_type": "application/x-list"}, b"[]", "application/x-list"),
        ({"payload_b64": "", "content_type": "text/csv"}, b"", "text/csv"),
        ({}, b"", ""),
        ({"payload": None}, b"", ""),  # null is an absent field
        ({"json": {"a": 1}}, b'{"a":1}', "application/json"),  # ours: `json` = payload
        ({"contentType": "x/y", "payload_b64": "eA=="}, b"x", "x/y"),  # ours: camelCase names
    ],
)
async def test_payload_forms(
    target: Target, task: dict[str, Any], payload: bytes, content_type: str
) -> None:
    async with client(target) as h, worker(target, "b64") as w:
        submitted = await h.post("/v1/tasks", {**task, "pool": "b64"})
        lease = await w.lease()
        w.send(complete=pb.Complete(lease=lease.lease))
        await h.get(f"/v1/tasks/{submitted['id']}/result")
    assert (lease.payload, lease.content_type) == (payload, content_type)


@pytest.mark.parametrize(
    ("task", "text"),
    [
        (
            {"payload": 1, "payload_b64": "eA=="},
            "payload_b64: give only one of payload and payload_b64",
        ),
        ({"payload_b64": "not base64!"}, "payload_b64: not valid standard base64"),
        ({"payload_b64": "eA"}, "payload_b64: not valid standard base64"),  # padding
        ({"nonsense": 1}, "nonsense: unknown field"),
        ({"retry": {"initial_backoff_s": 1}}, "retry.max_attempts: required"),
        ({"retry": {"max_attempts": 2, "tries": 1}}, "retry.tries: unknown field"),
        ({"priority": "urgent"}, None),
        ({"on_miss": "later"}, None),
        ({"deadline_in_s": 1, "deadline_unix_ns": 1}, None),
        ({"start_in_s": 1, "start_unix_ns": 1}, None),
        ({"tolerance_s": 1}, "task.tolerance_s: tolerance_s requires a start time"),
        ({"after": [True]}, None),
        ({"after": [{"key": "k"}]}, None),
        ({"deps": [{"id": 1, "key": "k"}]}, "deps[0]: give exactly one of id and key"),
        ({"deps": [{"cond": "on_success"}]}, "deps[0]: give exactly one of id and key"),
        ({"deps": [{"key": "k", "when": 1}]}, "deps[0].when: unknown field"),
        ({"deps": [{"key": "k", "cond": "sometimes"}]}, None),
        ({"tags": {"cronoq.x": "y"}}, None),
        ({"tags": {"a": 1}}, "tags['a']: must be a string, not a number"),
        ({"kind": 5}, "kind: must be a string, not a number"),
        ({"timeout_s": "5"}, "timeout_s: must be a number, not a string"),
        ({"resources": {"gpu": -1}}, None),
        ({"key": "k@2025-06-01T09:30:00Z"}, None),
        ({"wait": "yes"}, "wait: must be true or false, not a string"),
    ],
)
async def test_task_object_refusals_are_400(
    target: Target, task: dict[str, Any], text: str | None
) -> None:
    async with client(target) as h:
        answer = await h.call("POST", "/v1/tasks", {"pool": "body", **task})
    message = assert_error(answer, 400, "bad_request")
    assert text is None or message == text, message


async def test_submit_refusals_by_status(target: Target) -> None:
    async with client(target) as h:
        for task, text in [
            ({"pool": "nope"}, "unknown pool 'nope'"),
            ({"pool": "body", "resources": {"cpu": 1}}, "unknown resource 'cpu'"),
        ]:
            assert_error(await h.call("POST", "/v1/tasks", task), 404, "not_found", text)
        # a full pool with overflow = "reject": 429 at once
        first = await h.post("/v1/tasks", {"pool": "full"})
        assert_error(await h.call("POST", "/v1/tasks", {"pool": "full"}), 429, "too_many_requests")
        assert (await h.ok("DELETE", f"/v1/tasks/{first['id']}")) == {"cancelled": True}
        # two fixed starts overlapping in a pool of one slot: a reservation conflict
        fixed = {"pool": "fixed", "start_in_s": 3600, "duration_hint_s": 60}
        first = await h.post("/v1/tasks", fixed)
        assert_error(await h.call("POST", "/v1/tasks", fixed), 409, "conflict")
        await h.ok("DELETE", f"/v1/tasks/{first['id']}")
        answer = await h.call("POST", "/v1/tasks", data=b"{not json", headers=JSON_BODY)
        assert_error(answer, 400, "bad_request").startswith("the body is not JSON")
        answer = await h.call(
            "POST", "/v1/tasks", data=b'{"deadline_in_s": NaN}', headers=JSON_BODY
        )
        assert_error(answer, 400, "bad_request").startswith("the body is not JSON")
        assert_error(await h.call("POST", "/v1/tasks", [1]), 400, "bad_request")


async def test_submit_answers_and_duplicates(target: Target) -> None:
    async with client(target) as h:
        first = await h.post("/v1/tasks", {"pool": "shape", "key": "dup-1"})
        again = await h.post("/v1/tasks", {"pool": "shape", "key": "dup-1", "payload": 1})
        assert again == {"id": first["id"], "duplicate": True}
        async with worker(target, "shape", slots=2) as w:
            waiting = asyncio.ensure_future(
                h.post("/v1/tasks", {"pool": "shape", "payload": {"x": 1}, "wait": True})
            )
            leases = [await w.lease(), await w.lease()]  # dup-1 first, then the waited one
            for lease in leases:
                w.send(complete=pb.Complete(lease=lease.lease, output=b'{"y": [true]}'))
            waited = await waiting
    assert set(waited) == {"id", "duplicate", "result"} and waited["duplicate"] is False
    assert waited["result"] == {
        "id": waited["id"],
        "status": "succeeded",
        "output_available": True,
        "output_b64": b64(b'{"y": [true]}'),
        "output": {"y": [True]},
    }
    assert int(waited["id"]) == leases[1].task_id


# --- reading: task info, results, cancelling ----------------------------------------------------


async def test_task_info_omits_what_is_empty_and_carries_times_as_strings(target: Target) -> None:
    async with client(target) as h:
        submitted = await h.post("/v1/tasks", {"pool": "info"})
        info = await h.get(f"/v1/tasks/{submitted['id']}")
        assert set(info) == {
            "id",
            "status",
            "pool",
            "attempt",
            "output_available",
            "kind",
            "max_attempts",
            "created_unix_ns",
            "priority",
        }
        assert (info["id"], info["status"], info["pool"], info["kind"]) == (
            submitted["id"],
            "ready",
            "info",
            "default",
        )
        assert (info["attempt"], info["output_available"], info["priority"]) == (0, False, "normal")
        assert info["max_attempts"] == 3 and DIGITS.fullmatch(info["created_unix_ns"])

        keyed = await h.post(
            "/v1/tasks",
            {"pool": "fail", "key": "fail-1", "tenant": "t", "retry": {"max_attempts": 1}},
        )
        async with worker(target, "fail") as w:
            lease = await w.lease()
            w.send(fail=pb.Fail(lease=lease.lease, message="boom", permanent=True))
            result = await h.get(f"/v1/tasks/{keyed['id']}/result")
        assert result == {
            "id": keyed["id"],
            "status": "failed",
            "output_available": False,
            "message": "boom",
        }
        failed = await h.get("/v1/tasks/by-key/fail-1")
    assert failed["key"] == "fail-1" and failed["tenant"] == "t" and failed["message"] == "boom"
    assert (failed["attempt"], failed["max_attempts"], failed["status"]) == (1, 1, "failed")
    created, started, finished = (
        int(failed[f"{t}_unix_ns"]) for t in ("created", "started", "finished")
    )
    assert created <= started <= finished


async def test_results_carry_output_b64_and_output_when_it_is_json(target: Target) -> None:
    async with client(target) as h, worker(target, "result", slots=3) as w:
        ids = [(await h.post("/v1/tasks", {"pool": "result"}))["id"] for _ in range(3)]
        outputs = [b'{"x": 1}', b"\xffnot json", b""]
        for output in outputs:
            lease = await w.lease()
            w.send(complete=pb.Complete(lease=lease.lease, output=output))
        results = [await h.get(f"/v1/tasks/{i}/result") for i in ids]
        aliases = [await h.get(f"/v1/tasks/{i}/wait") for i in ids]  # ours: the older path
    assert results[0] == {
        "id": ids[0],
        "status": "succeeded",
        "output_available": True,
        "output_b64": "eyJ4IjogMX0=",
        "output": {"x": 1},
    }
    assert results[1] == {
        "id": ids[1],
        "status": "succeeded",
        "output_available": True,
        "output_b64": b64(b"\xffnot json"),
    }
    assert results[2] == {
        "id": ids[2],
        "status": "succeeded",
        "output_available": True,
        "output_b64": "",
    }
    assert aliases == results


async def test_a_wait_that_runs_out_is_504_and_leaves_the_task(target: Target) -> None:
    async with client(target) as h:
        submitted = await h.post("/v1/tasks", {"pool": "result", "key": "slow-1"})
        for path in (f"/v1/tasks/{submitted['id']}", "/v1/tasks/by-key/slow-1"):
            answer = await h.call("GET", path + "/result?timeout_s=0.05")
            assert_error(answer, 504, "gateway_timeout")
        for query in ("timeout_s=-1", "timeout_s=abc", "timeout_s=inf", "timeout=1"):
            answer = await h.call("GET", f"/v1/tasks/{submitted['id']}/result?{query}")
            assert_error(answer, 400, "bad_request")
        answer = await h.call("GET", f"/v1/tasks/{submitted['id']}/result?timeout_s=1&timeout_s=2")
        assert_error(answer, 400, "bad_request")
        assert (await h.get(f"/v1/tasks/{submitted['id']}"))["status"] == "ready"
        assert await h.ok("DELETE", "/v1/tasks/by-key/slow-1") == {"cancelled": True}
        cancelled = await h.get(f"/v1/tasks/{submitted['id']}/result")
    assert set(cancelled) <= {"id", "status", "output_available", "message"}
    assert (cancelled["status"], cancelled["output_available"]) == ("cancelled", False)


async def test_waits_default_to_and_are_capped_by_max_wait_s() -> None:
    """Without `timeout_s`, and with one far past it, a wait ends at `limits.max_wait_s`: 504
    (a wait not capped would run into the test's own time limit)."""
    config = PORTS0 + "[limits]\nmax_wait_s = 0.2\n"
    async with running(config) as (_, h):
        submitted = await h.post("/v1/tasks", {})
        for query in ("", "?timeout_s=100000"):
            answer = await h.call("GET", f"/v1/tasks/{submitted['id']}/result{query}")
            assert_error(answer, 504, "gateway_timeout")
        answer = await h.call("POST", "/v1/tasks", {"wait": True, "wait_timeout_s": 100000})
        assert_error(answer, 504, "gateway_timeout")


async def test_cancel_is_delete_and_unknown_tasks_are_not_cancelled(target: Target) -> None:
    async with client(target) as h:
        a = await h.post("/v1/tasks", {"pool": "cancel"})
        await h.post("/v1/tasks", {"pool": "cancel", "key": "cancel-b"})
        c = await h.post("/v1/tasks", {"pool": "cancel", "key": "cancel-c"})
        assert await h.ok("DELETE", f"/v1/tasks/{a['id']}") == {"cancelled": True}
        assert await h.ok("DELETE", f"/v1/tasks/{a['id']}") == {"cancelled": False}
        assert await h.ok("DELETE", "/v1/tasks/by-key/cancel-b") == {"cancelled": True}
        assert await h.ok("DELETE", "/v1/tasks/987654321") == {"cancelled": False}
        assert await h.ok("DELETE", "/v1/tasks/by-key/nobody-here") == {"cancelled": False}
        # ours: the older POST routes, with the same answers
        assert await h.post(f"/v1/tasks/{c['id']}/cancel") == {"cancelled": True}
        assert await h.post("/v1/tasks/by-key/cancel-c/cancel") == {"cancelled": False}
        assert await h.post("/v1/tasks/987654321/cancel") == {"cancelled": False}
        assert (await h.get(f"/v1/tasks/{a['id']}"))["status"] == "cancelled"


async def test_task_ids_and_keys_in_paths(target: Target) -> None:
    async with client(target) as h:
        for bad in ("abc", "-1", "18446744073709551616", "1e3"):
            for verb, path in (
                ("GET", f"/v1/tasks/{bad}"),
                ("DELETE", f"/v1/tasks/{bad}"),
                ("GET", f"/v1/tasks/{bad}/result"),
            ):
                text = assert_error(await h.call(verb, path), 400, "bad_request")
                assert "/v1/tasks/by-key/{key}" in text, text
        assert_error(await h.call("GET", "/v1/tasks/18446744073709551615"), 404, "not_found")
        assert_error(await h.call("GET", "/v1/tasks/424242"), 404, "not_found", "unknown task")
        # a key with a space and a slash, percent-encoded in the path
        submitted = await h.post("/v1/tasks", {"pool": "keys", "key": "a/b c%"})
        info = await h.get("/v1/tasks/by-key/a%2Fb%20c%25")
        assert (info["id"], info["key"]) == (submitted["id"], "a/b c%")
        assert_error(await h.call("GET", "/v1/tasks/by-key/nobody"), 404, "not_found")
        too_long = "k" * (MAX_KEY + 1)
        assert_error(await h.call("GET", f"/v1/tasks/by-key/{too_long}"), 400, "bad_request")
        assert_error(await h.call("GET", "/v1/tasks/by-key/a%00b"), 400, "bad_request")
        assert await h.ok("DELETE", "/v1/tasks/by-key/a%2Fb%20c%25") == {"cancelled": True}


# --- batches ----------------------------------------------------------------------------------


async def test_batches(target: Target) -> None:
    async with client(target) as h:
        first = await h.post("/v1/tasks", {"pool": "batch", "key": "batch-1"})
        answer = await h.post(
            "/v1/tasks:batch",
            {
                "tasks": [
                    {"pool": "batch", "key": "batch-2", "payload": {"n": 1}},
                    {"pool": "batch", "payload_b64": b64(b"two"), "after": ["batch-2"]},
                    {"pool": "batch", "key": "batch-1"},  # an existing key: a duplicate
                ]
            },
        )
        assert [set(t) for t in answer["tasks"]] == [{"id", "duplicate"}] * 3
        one, two, dup = answer["tasks"]
        assert [one["duplicate"], two["duplicate"]] == [False, False]
        assert dup == {"id": first["id"], "duplicate": True}
        assert (await h.get(f"/v1/tasks/{two['id']}"))["status"] == "blocked"
        assert await h.post("/v1/tasks:batch", {"tasks": []}) == {"tasks": []}
        # ours: the older path, the same answer
        alias = await h.post("/v1/tasks/batch", {"tasks": [{"pool": "batch", "key": "batch-2"}]})
        assert alias == {"tasks": [{"id": one["id"], "duplicate": True}]}

        too_many = {"tasks": [{"pool": "batch"}] * (MAX_BATCH + 1)}
        text = f"at most {MAX_BATCH} tasks per batch"
        assert_error(await h.call("POST", "/v1/tasks:batch", too_many), 400, "bad_request", text)
        for body in (
            {"tasks": [{"pool": "batch", "wait": True}]},
            {"tasks": [{"pool": "batch"}], "wait": True},
            {"tasks": [{"pool": "batch", "bogus": 1}]},
            {"tasks": {"pool": "batch"}},
            [{"pool": "batch"}],
            {},
        ):
            assert_error(await h.call("POST", "/v1/tasks:batch", body), 400, "bad_request")
        answer = await h.call(
            "POST", "/v1/tasks:batch", {"tasks": [{"pool": "batch"}, {"pool": "x"}]}
        )
        assert_error(answer, 404, "not_found", "unknown pool 'x'")
        assert_error(await h.call("GET", "/v1/tasks:batch"), 405, "method_not_allowed")


async def test_after_and_deps_name_tasks_by_key_and_id(target: Target) -> None:
    async with client(target) as h, worker(target, "deps", slots=4) as w:
        parent = await h.post("/v1/tasks", {"pool": "deps", "key": "parent"})
        pid = parent["id"]
        children = [
            await h.post("/v1/tasks", {"pool": "deps", "after": after})
            for after in (["parent"], [int(pid)], [{"id": pid}], [{"id": int(pid)}])
        ]
        on_failure = await h.post(
            "/v1/tasks", {"pool": "deps", "deps": [{"key": "parent", "cond": "on_failure"}]}
        )
        on_complete = await h.post(
            "/v1/tasks", {"pool": "deps", "deps": [{"id": pid, "cond": "ON_COMPLETE"}]}
        )
        for child in (*children, on_failure, on_complete):
            assert (await h.get(f"/v1/tasks/{child['id']}"))["status"] == "blocked"
        lease = await w.lease()
        assert lease.task_id == int(pid)
        w.send(complete=pb.Complete(lease=lease.lease))
        await h.get(f"/v1/tasks/{pid}/result")
        ran = set()
        for _ in range(5):  # the four `after` children and on_complete
            lease = await w.lease()
            ran.add(lease.task_id)
            w.send(complete=pb.Complete(lease=lease.lease))
        skipped = await h.get(f"/v1/tasks/{on_failure['id']}/result")
    assert ran == {int(c["id"]) for c in (*children, on_complete)}
    assert skipped["status"] == "skipped"


# --- listing ----------------------------------------------------------------------------------


async def test_list_query_rules(target: Target) -> None:
    async with client(target) as h:
        a1 = (await h.post("/v1/tasks", {"pool": "la"}))["id"]
        b1 = (await h.post("/v1/tasks", {"pool": "lb"}))["id"]
        a2 = (await h.post("/v1/tasks", {"pool": "la"}))["id"]
        await h.ok("DELETE", f"/v1/tasks/{a2}")
        page = await h.get("/v1/tasks?pool=la,%20lb,,")
        assert page == {"tasks": page["tasks"]}  # one page: no next_after, no shards
        assert [t["id"] for t in page["tasks"]] == [a1, b1, a2]
        page = await h.get("/v1/tasks?pool=la,lb&status=ready,cancelled")
        assert [t["id"] for t in page["tasks"]] == [a1, b1, a2]
        page = await h.get("/v1/tasks?pool=la&status=cancelled")
        assert [t["id"] for t in page["tasks"]] == [a2]
        page = await h.get("/v1/tasks?pool=lb&status=READY")  # ours: upper-case names too
        assert [t["id"] for t in page["tasks"]] == [b1]
        page = await h.get(f"/v1/tasks?pool=la,lb&after={a1}&limit=0")
        assert [t["id"] for t in page["tasks"]] == [b1, a2]
        page = await h.get("/v1/tasks?pool=la,lb&after=")
        assert len(page["tasks"]) == 3

        for query, code in [
            ("pool=la&pool=lb", 400),
            ("status=ready&status=running", 400),
            ("pool=la&timeout=1", 400),
            ("status=sleeping", 400),
            ("status=ready,bogus", 400),
            ("limit=-1", 400),
            ("limit=x", 400),
            ("after=-5", 400),
            ("after=18446744073709551616", 400),
            ("pool=nope", 404),
            ("pool=la,nope", 404),
        ]:
            answer = await h.call("GET", f"/v1/tasks?{query}")
            assert_error(answer, code, {400: "bad_request", 404: "not_found"}[code])
        answer = await h.call("GET", "/v1/tasks?pool=la,nope")
        assert_error(answer, 404, "not_found", "unknown pool 'nope'")


async def test_pages_carry_next_after_only_while_more_may_follow(target: Target) -> None:
    async with client(target) as h:
        ids = [(await h.post("/v1/tasks", {"pool": "page"}))["id"] for _ in range(3)]
        seen, after, pages = [], "", 0
        while True:  # the loop a script writes: `while next_after`
            page = await h.get(f"/v1/tasks?pool=page&limit=2&after={after}")
            seen += [t["id"] for t in page["tasks"]]
            pages += 1
            if "next_after" not in page:
                break
            assert page["next_after"] == page["tasks"][-1]["id"] != "0"
            after = page["next_after"]
    assert seen == ids and pages == 2


# --- admin reads: workers, recurring, snapshot ---------------------------------------------------


async def test_workers_have_all_seven_fields(target: Target) -> None:
    async with client(target) as h, worker(target, "workers", slots=3, gpu="a100") as w:
        lease_task = await h.post("/v1/tasks", {"pool": "workers"})
        lease = await w.lease()
        listing = await h.get("/v1/workers")
        w.send(complete=pb.Complete(lease=lease.lease))
        await h.get(f"/v1/tasks/{lease_task['id']}/result")
    assert set(listing) == {"workers"}
    [mine] = [x for x in listing["workers"] if x["pool"] == "workers"]
    assert set(mine) == {"id", "name", "pool", "labels", "slots", "busy", "connected_unix_ns"}
    assert DIGITS.fullmatch(mine["id"]) and DIGITS.fullmatch(mine["connected_unix_ns"])
    assert (mine["name"], mine["labels"], mine["slots"], mine["busy"]) == (
        "w",
        {"gpu": "a100"},
        3,
        1,
    )


async def test_recurring_schedules() -> None:
    async with running(PORTS0) as (_, h):
        template = {"payload": {"report": True}, "kind": "report", "priority": "low"}
        plain = {"name": "plain", "cron": "0 3 * * *", "template": template}
        zoned = {**plain, "name": "zoned", "tz": "Europe/Paris", "overlap": "queue"}
        assert await h.post("/v1/recurring", plain) == {}  # ours: recurring writes
        assert await h.post("/v1/recurring", zoned) == {}
        listing = await h.get("/v1/recurring")
        assert set(listing) == {"schedules"}
        one, two = listing["schedules"]
        assert set(one) == {"name", "cron", "pool", "kind", "overlap", "next_unix_ns"}
        assert (one["name"], one["pool"], one["kind"], one["overlap"]) == (
            "plain",
            "default",
            "report",
            "skip",
        )
        assert DIGITS.fullmatch(one["next_unix_ns"])
        assert (two["tz"], two["overlap"]) == ("Europe/Paris", "queue")
        for bad in ({**plain, "cron": "not a cron"}, {**plain, "template": {"payload_b64": "!"}}):
            assert_error(await h.call("POST", "/v1/recurring", bad), 400, "bad_request")
        assert await h.ok("DELETE", "/v1/recurring/plain") == {"removed": True}
        assert await h.ok("DELETE", "/v1/recurring/plain") == {"removed": False}


async def test_snapshot(target: Target) -> None:
    async with client(target) as h:
        for priority in ("critical", "high", "high", None):
            await h.post("/v1/tasks", {"pool": "snap", "priority": priority})
        snap = await h.get("/v1/snapshot")
    assert set(snap) == {
        "pools",
        "live_tasks",
        "running",
        "pending",
        "workers_connected",
        "unavailable_shards",
        "totals",
    }
    assert snap["unavailable_shards"] == []
    [pool] = [p for p in snap["pools"] if p["name"] == "snap"]
    assert pool["pending_by_class"] == [1, 2, 1, 0] and pool["pending"] == 4
    assert pool["groups"] == [{"labels": {}, "capacity": 0, "busy": 0}]
    assert all(p["pending"] == sum(p["pending_by_class"]) for p in snap["pools"])
    # the library's totals but for its recurring counters, which the published API has not
    assert set(snap["totals"]) == TOTALS_KEYS - {"recurring_conflicts", "recurring_invalid"}


# --- routes, methods and the order of checks -----------------------------------------------------


async def test_unknown_paths_and_methods(target: Target) -> None:
    async with client(target) as h:
        for path in ("/nope", "/healthz/", "/v1/tasks/", "/v1/tasks/1/", "/v1/snapshot/"):
            assert_error(await h.call("GET", path), 404, "not_found", "no such route")
        for verb, path, allowed in [
            ("PUT", "/v1/tasks", {"GET", "POST"}),
            ("POST", "/v1/tasks/1", {"GET", "DELETE"}),
            ("POST", "/healthz", {"GET", "HEAD"}),
            ("HEAD", "/metrics", {"GET"}),
        ]:
            answer = await h.call(verb, path)
            if verb != "HEAD":
                assert_error(answer, 405, "method_not_allowed", "method not allowed")
            assert answer.status == 405
            assert {m.strip() for m in answer.headers["Allow"].split(",")} == allowed


AUTH_CONFIG = PORTS0 + AUTH_POOLS + AUTH
WITH_METRICS = PORTS0 + 'metrics_addr = "127.0.0.1:0"\n' + AUTH_POOLS + AUTH


async def test_404_and_405_come_before_authentication() -> None:
    config = AUTH_CONFIG + "[limits]\nmax_http_body_bytes = 4096\n"
    async with running(config) as (_, h):
        assert_error(await h.call("GET", "/nope"), 404, "not_found")
        assert_error(await h.call("PUT", "/v1/tasks"), 405, "method_not_allowed")
        answer = await h.call("GET", "/v1/tasks")
        missing = f"missing credentials (bearer token or client certificate); {HOW}"
        assert_error(answer, 401, "unauthorized", missing)
        bad = {"Authorization": "Bearer wrong-token"}
        invalid = f"invalid token: the server knows no such token; {HOW}"
        assert_error(await h.call("GET", "/v1/tasks", headers=bad), 401, "unauthorized", invalid)
        client_token = {"Authorization": f"Bearer {token('client')}"}
        answer = await h.call("GET", "/metrics", headers=client_token)
        denied = (
            'credentials lack the required role: this call needs role "metrics" or "admin", '
            f'these credentials have role "client"; {HOW}'
        )
        assert_error(answer, 403, "forbidden", denied)
        metrics_token = {"Authorization": f"Bearer {token('metrics')}"}
        answer = await h.call("POST", "/v1/tasks", {}, headers=metrics_token)
        assert_error(answer, 403, "forbidden")
        # the body is read only after authentication: an oversized one is 401 first
        answer = await h.call("POST", "/v1/tasks", data=b"x" * 8192)
        assert_error(answer, 401, "unauthorized")
        assert (await h.call("GET", "/healthz")).text == "ok"
        assert (await h.ok("GET", "/v1/tasks", headers=client_token)) == {"tasks": []}


async def test_other_statuses_of_the_table() -> None:
    """413, 415, 408 (the body limit, its type and its time), 500 (a bug) and 501 (no
    service)."""
    config = PORTS0 + "[limits]\nmax_http_body_bytes = 4096\nrequest_timeout_s = 0.5\n"
    async with running(config) as (app, h):
        answer = await h.call("POST", "/v1/tasks", data=b" " * 4097)
        assert_error(
            answer,
            413,
            "payload_too_large",
            "the body exceeds limits.max_http_body_bytes (4096 bytes)",
        )

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b" " * 1000

        answer = await h.call("POST", "/v1/tasks", data=chunks(), headers=JSON_BODY)
        assert_error(answer, 413, "payload_too_large")
        answer = await h.call(
            "POST", "/v1/tasks", data=b"{}", headers={"Content-Type": "text/plain"}
        )
        assert_error(
            answer,
            415,
            "unsupported_media_type",
            "a request body must be sent as Content-Type: application/json",
        )
        reader, writer = await asyncio.open_connection(app.http_address.host, app.http_address.port)
        head = (
            "POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            "Content-Length: 10\r\n\r\n"
        )
        writer.write(head.encode())  # and no body: 408 once request_timeout_s is over
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line.startswith(b"HTTP/1.1 408")
        assert b"Content-Type: application/json\r\n" in rest
        assert json.loads(rest.split(b"\r\n\r\n", 1)[1])["code"] == "request_timeout"

    original = tasks_module.TasksService.Get

    async def broken(self: Any, request: Any, context: Any) -> Any:
        raise RuntimeError("a bug")

    tasks_module.TasksService.Get = tasks_module.rpc_errors(broken)  # type: ignore[method-assign]
    try:
        async with running(PORTS0) as (app, h):  # the services bind Get as they register
            answer = await h.call("GET", "/v1/tasks/1")
    finally:
        tasks_module.TasksService.Get = original  # type: ignore[method-assign]
    assert_error(answer, 500, "internal_server_error", "internal error: RuntimeError")

    bare = ServerApp(load_config(PORTS0))  # no services registered
    stop = asyncio.Event()
    serving = asyncio.create_task(bare.serve(stop))
    try:
        while not bare.ready:
            await asyncio.sleep(0.01)  # polls the app's state
        async with aiohttp.ClientSession() as session:
            h = Http(session, f"http://{bare.http_address}")
            assert_error(await h.call("GET", "/v1/tasks/1"), 501, "not_implemented")
    finally:
        stop.set()
        await serving


# --- the Host check -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    ["localhost", "LocalHost:7071", "localhost.", "app.localhost", "a.b.localhost:80", "127.0.0.1",
     "127.0.0.2:9", "127.255.255.254.", "[::1]", "[::1]:7071", "::1"],
)  # fmt: skip
async def test_loopback_hosts_pass_the_host_check(target: Target, host: str) -> None:
    async with client(target) as h:
        await h.get("/v1/workers", headers={"Host": host})


@pytest.mark.parametrize(
    "host",
    ["evil.example", "evil.example:7071", "localhost.evil.example", "127.0.0.1.nip.io",
     "localhostx", "128.0.0.1", "[::2]", "0.0.0.0", "localhost:x", "[::1"],
)  # fmt: skip
async def test_other_hosts_are_403_on_gated_routes_only(target: Target, host: str) -> None:
    text = "without auth the API only answers requests for a loopback host"
    async with client(target) as h:
        headers = {"Host": host}
        for path in ("/v1/workers", "/metrics", "/v1/tasks/1", "/v1/openapi.json"):
            assert_error(await h.call("GET", path, headers=headers), 403, "forbidden", text)
        assert_error(await h.call("POST", "/v1/tasks", {}, headers=headers), 403, "forbidden")
        # exempt: the probes and the fallbacks
        assert (await h.call("GET", "/healthz", headers=headers)).text == "ok"
        assert (await h.call("HEAD", "/readyz", headers=headers)).status == 200
        assert_error(await h.call("GET", "/nope", headers=headers), 404, "not_found")
        assert_error(await h.call("PUT", "/v1/tasks", headers=headers), 405, "method_not_allowed")


async def test_a_request_without_host_is_403(target: Target) -> None:
    host, port = target.http.rsplit(":", 1)

    async def raw(path: str) -> bytes:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET {path} HTTP/1.0\r\n\r\n".encode())  # HTTP/1.0: no Host header
        try:
            return await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()

    assert (await raw("/v1/workers")).split(b"\r\n")[0].endswith(b" 403 Forbidden")
    answer = await raw("/healthz")
    assert answer.split(b"\r\n")[0].endswith(b" 200 OK") and answer.endswith(b"\r\n\r\nok")


@pytest.mark.parametrize(
    "config",
    [
        PORTS0.replace("[server]\n", "[server]\ninsecure_no_auth = true\n"),
        AUTH_CONFIG,
    ],
    ids=["insecure_no_auth", "credentials"],
)
async def test_no_host_check_with_credentials_or_insecure_no_auth(config: str) -> None:
    async with running(config) as (_, h):
        headers = {"Host": "evil.example", "Authorization": f"Bearer {token('admin')}"}
        assert (await h.get("/v1/snapshot", headers=headers))["unavailable_shards"] == []


# --- health, readiness, standby, stopping, the metrics listener ---------------------------------


async def test_probes_are_plain_text_and_answer_head(target: Target) -> None:
    async with client(target) as h:
        for path, text in (("/healthz", "ok"), ("/readyz", "ready")):
            answer = await h.call("GET", path)
            assert (answer.status, answer.body, answer.headers["Content-Type"]) == (
                200,
                text.encode(),
                TEXT,
            )
            head = await h.call("HEAD", path)
            assert (head.status, head.body) == (200, b"")
        answer = await h.call("GET", "/healthz?probe=1")  # the probes take any query
        assert answer.text == "ok"


async def test_the_metrics_listener(target: Target) -> None:
    async with aiohttp.ClientSession() as session:
        m = Http(session, f"http://{target.metrics}", check=False)
        for path, text in (("/healthz", "ok"), ("/readyz", "ready")):
            answer = await m.call("GET", path)
            assert (answer.status, answer.text, answer.headers["Content-Type"]) == (200, text, TEXT)
            assert (await m.call("HEAD", path)).body == b""
        answer = await m.call("GET", "/metrics", headers={"Host": "evil.example"})
        assert answer.status == 200 and "cronoq_pool_pending" in answer.text
        for path in ("/nope", "/v1/snapshot", "/v1/tasks", "/metrics/"):
            answer = await m.call("GET", path)
            assert (answer.status, answer.body) == (404, b"")


async def test_the_metrics_listener_needs_no_credentials() -> None:
    async with running(WITH_METRICS) as (app, h):
        assert_error(await h.call("GET", "/metrics"), 401, "unauthorized")
        m = Http(h.session, f"http://{app.metrics_address}", check=False)
        assert (await m.call("GET", "/metrics")).status == 200


async def test_a_standby(tmp_path: Path) -> None:
    store = f'[store]\nkind = "sqlite"\npath = "{tmp_path}/q.db"\n'
    config = WITH_METRICS + store
    admin = {"Authorization": f"Bearer {token('admin')}"}
    text = "not the leader (standby or shutting down)"
    async with running(config) as (leader, lh), running(config, ready=False) as (standby, sh):
        assert leader.ready and not standby.ready
        m = Http(sh.session, f"http://{standby.metrics_address}", check=False)
        for probe in (sh, m):
            health = await probe.call("GET", "/healthz")
            assert (health.status, health.text) == (200, "ok")
            ready = await probe.call("GET", "/readyz")
            assert (ready.status, ready.text, ready.headers["Content-Type"]) == (
                503,
                "standby",
                TEXT,
            )
            head = await probe.call("HEAD", "/readyz")
            assert (head.status, head.body) == (503, b"")
        for verb, path in (("GET", "/metrics"), ("GET", "/v1/snapshot"), ("POST", "/v1/tasks")):
            answer = await sh.call(verb, path, {}, headers=admin)
            assert_error(answer, 503, "service_unavailable", text)
            assert_error(await sh.call(verb, path, {}), 401, "unauthorized")  # auth first
        assert_error(await m.call("GET", "/metrics"), 503, "service_unavailable", text)
        lm = Http(lh.session, f"http://{leader.metrics_address}", check=False)
        assert (await lm.call("GET", "/metrics")).status == 200


async def test_a_stopping_server() -> None:
    """From the moment stop() begins until the listeners close: `/readyz` 503 `standby`,
    `/healthz` still `ok`, the API and `/metrics` 503 on both listeners."""
    config = PORTS0 + 'metrics_addr = "127.0.0.1:0"\n'
    async with running(config) as (app, h):
        m = Http(h.session, f"http://{app.metrics_address}", check=False)
        assert (await m.call("GET", "/metrics")).status == 200
        release = asyncio.Event()

        async def hold() -> None:  # a stop hook: keeps the listeners open while it runs
            await release.wait()

        app.on_stop(hold)
        stopping = asyncio.create_task(app.stop())
        while not app.stopping:
            await asyncio.sleep(0)  # until stop() has begun
        try:
            for probe in (h, m):
                ready = await probe.call("GET", "/readyz")
                assert (ready.status, ready.text) == (503, "standby")
                assert (await probe.call("GET", "/healthz")).text == "ok"
                assert_error(await probe.call("GET", "/metrics"), 503, "service_unavailable")
            assert_error(await h.call("GET", "/v1/snapshot"), 503, "service_unavailable")
            assert_error(await h.call("POST", "/v1/tasks", {}), 503, "service_unavailable")
        finally:
            release.set()
            await stopping


# --- the OpenAPI document -----------------------------------------------------------------------


def test_the_document_lists_exactly_the_served_routes() -> None:
    listed = {(verb.upper(), path) for path, ops in DOC["paths"].items() for verb in ops}
    assert listed == {(r.verb, r.path) for r in ROUTES}
    for path, ops in DOC["paths"].items():
        for verb, op in ops.items():
            assert "200" in op["responses"], (verb, path)
            if verb == "post" and not path.endswith("/cancel"):
                assert "requestBody" in op, (verb, path)
    for schema in DOC["components"]["schemas"].values():
        _VALIDATOR.check_schema(schema)


async def test_every_documented_route_answers(target: Target) -> None:
    """One request per documented operation, each answered as documented (`Http.call`), and
    never 404 or 405: the document names no route the server lacks."""
    async with client(target) as h:
        task = await h.post("/v1/tasks", {"pool": "keys", "key": "doc-1"})
        values = {"id": task["id"], "key": "doc-1", "name": "none", "pool": "keys"}
        bodies = {
            "/v1/tasks": {"pool": "keys"},
            "/v1/tasks:batch": {"tasks": [{"pool": "keys"}]},
            "/v1/tasks/batch": {"tasks": []},
            "/v1/recurring": {"name": "doc", "cron": "0 0 * * *", "template": {"pool": "keys"}},
        }
        for path, ops in DOC["paths"].items():
            concrete = re.sub(r"\{([a-z]+)\}", lambda m: values[m.group(1)], path)
            for verb in ops:
                query = "?timeout_s=0" if path.endswith(("/result", "/wait")) else ""
                answer = await h.call(verb.upper(), concrete + query, bodies.get(path))
                assert answer.status not in (404, 405), (verb, path, answer.body[:200])
        assert (await h.get("/v1/openapi.json")) == DOC  # ours: the document itself


async def test_a_route_running_past_request_timeout_s_is_504(tmp_path: Path) -> None:
    """docs/http.md, "Timeouts": a cancel whose write cannot reach the file (the test holds the
    SQLite write lock) answers 504 `request timed out` after `request_timeout_s`. As with any
    timeout the caller does not learn the outcome: here the cancel was decided and is written
    once the file is free."""
    db = tmp_path / "q.db"
    store = f'[store]\nkind = "sqlite"\npath = "{db}"\n'
    async with running(PORTS0 + store + "[limits]\nrequest_timeout_s = 0.5\n") as (_, h):
        task_id = (await h.post("/v1/tasks", {"payload": 1}))["id"]
        lock = sqlite3.connect(db, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        try:
            answer = await h.call("DELETE", f"/v1/tasks/{task_id}")
            assert_error(answer, 504, "gateway_timeout", "request timed out")
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        assert (await h.get(f"/v1/tasks/{task_id}"))["status"] == "cancelled"
        assert await h.ok("DELETE", f"/v1/tasks/{task_id}") == {"cancelled": False}
