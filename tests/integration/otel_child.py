"""A Python program traced with the OpenTelemetry SDK, for test_tracing_server.py: its spans go
over OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT, as a user's program set up that way would send
them. `client TARGET PAYLOAD`: submit one task inside a "client-call" span, wait for its
result and print it. `worker TARGET POOL`: serve POOL with a cronoq.client.Worker until
SIGTERM; its handler fails the first attempt of a payload {"fail_once": true}."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from cronoq.client import Client, Lease, Worker


async def client(target: str, payload: str) -> None:
    tracer = trace.get_tracer("child")
    async with Client(target) as c:
        with tracer.start_as_current_span("client-call"):
            done = await c.submit(json.loads(payload), wait=True, wait_timeout=60)
    print(json.dumps(done.result.json() if done.result else None), flush=True)


async def worker(target: str, pool: str) -> None:
    async def handle(lease: Lease) -> Any:
        with trace.get_tracer("child").start_as_current_span("handler-work"):
            data = lease.json()
            if isinstance(data, dict) and data.get("fail_once") and lease.attempt == 1:
                raise RuntimeError("first attempt fails")
            return data

    w = Worker(target, pool, handle, slots=4)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: loop.create_task(w.stop()))
    print("ready", flush=True)
    await w.run()


def main() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    mode, *args = sys.argv[1:]
    asyncio.run(client(*args) if mode == "client" else worker(*args))
    provider.shutdown()


if __name__ == "__main__":
    main()
