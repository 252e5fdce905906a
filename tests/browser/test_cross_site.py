"""A page of another origin in headless Chromium tries to change things on a server without
credentials (docs/http.md, "Cross-site requests"): the "simple" requests a browser sends to any
origin without asking it first (`mode: "no-cors"`, text/plain and form bodies, body-less POSTs)
create, cancel and schedule nothing. The same page calls gRPC-Web, whose configured allowed
origins it is in, and that still works.

The page is served by a second local HTTP server, on another port (and, in one case, under
another host name: another site).
"""

from __future__ import annotations

import base64
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from dash_support import Api, http_error
from playwright.sync_api import Page

from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb
from helpers.servers import PORT0, serving_process

PAGE = b"<!doctype html><title>elsewhere</title><p>another site"


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[int]:
    """The port of the other server, which serves a plain page at any path."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, elsewhere: int) -> Iterator[tuple[Api, str]]:
    """A server without credentials (the default), gRPC-Web allowing the other page's origin
    under both its names; its HTTP API and its gRPC address."""
    origins = ", ".join(f'"http://{host}:{elsewhere}"' for host in ("127.0.0.1", "localhost"))
    config = PORT0 + f"[server.grpc_web]\nallowed_origins = [{origins}]\n"
    with serving_process(Path(tmp_path_factory.mktemp("cross-site")), config) as s:
        yield Api(s.http_address), s.address


FORGE = """async ([base, id, key]) => {
  const tries = [
    ["/v1/tasks", '{"key": "forged-text"}', "text/plain"],
    ["/v1/tasks", '{"key": "forged-form"}', "application/x-www-form-urlencoded"],
    ["/v1/tasks", null, null],
    ["/v1/tasks:batch", '{"tasks": [{"key": "forged-batch"}]}', "text/plain"],
    ["/v1/tasks/batch", '{"tasks": [{"key": "forged-batch2"}]}', "text/plain"],
    ["/v1/recurring", '{"name": "forged", "cron": "* * * * *"}', "text/plain"],
    [`/v1/tasks/${id}/cancel`, null, null],
    [`/v1/tasks/by-key/${key}/cancel`, null, null],
    [`/v1/tasks/${id}/cancel`, "{}", "text/plain"],
  ];
  const sent = [];
  for (const [path, body, type] of tries) {
    const init = { method: "POST", mode: "no-cors" };
    if (body !== null) { init.body = body; init.headers = { "Content-Type": type }; }
    const answer = await fetch(base + path, init);  // opaque, but only once it is answered
    sent.push(answer.type);
  }
  return sent;
}"""

GRPC_WEB = """async ([url, body]) => {
  const answer = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/grpc-web-text", "X-Grpc-Web": "1" },
    body,
  });
  return [answer.status, answer.headers.get("grpc-status"), await answer.text()];
}"""


def _frame(message: bytes) -> str:
    return base64.b64encode(struct.pack(">BI", 0, len(message)) + message).decode()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])  # same site, then another site
def test_a_page_of_another_origin_changes_nothing(
    served: tuple[Api, str], elsewhere: int, page: Page, host: str
) -> None:
    api, grpc_address = served
    victim = api("POST", "/v1/tasks", {"key": f"victim-{host}"})
    page.goto(f"http://{host}:{elsewhere}/")
    base = f"http://{api.address}"
    sent = page.evaluate(FORGE, [base, victim["id"], f"victim-{host}"])
    assert sent == ["opaque"] * 9  # each reached the server and was answered

    assert api("GET", f"/v1/tasks/{victim['id']}")["status"] == "ready"
    keys = {t.get("key") for t in api("GET", "/v1/tasks?limit=1000")["tasks"]}
    assert not {k for k in keys if k and k.startswith("forged")}
    assert len(keys) == len(api("GET", "/v1/tasks?limit=1000")["tasks"])  # no key-less task
    assert api("GET", "/v1/recurring")["schedules"] == []

    # gRPC-Web from an allowed origin: preflighted by the browser, and served
    request = pb.SubmitRequest(task=pb.TaskSpec(key=f"by-grpc-web-{host}"))
    url = f"http://{grpc_address}/cronoq.v1.Tasks/Submit"
    status, grpc_status, text = page.evaluate(GRPC_WEB, [url, _frame(request.SerializeToString())])
    assert (status, grpc_status) == (200, None) and text
    assert api("GET", f"/v1/tasks/by-key/by-grpc-web-{host}")["status"] == "ready"
    api("DELETE", f"/v1/tasks/{victim['id']}")
    assert http_error(lambda: api("POST", "/v1/tasks", [])) == 400  # the API itself still works
