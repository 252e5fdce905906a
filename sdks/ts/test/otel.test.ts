/**
 * W3C trace context and OpenTelemetry spans, against the real cronoq-server: the tags a
 * submit sets (explicitly, from the active context, or none), the cronoq.submit and cronoq.run
 * spans and their parents, and the lease's accessors. The first tests run with the API loaded
 * but no SDK registered; test/package.test.ts runs the package without the API at all.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { context, propagation, SpanKind, SpanStatusCode, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
  type ReadableSpan,
} from "@opentelemetry/sdk-trace-base";
import { connect, type Client, type Task } from "../src/index.js";
import { Permanent, runWorker, type Lease } from "../src/node.js";
import { clientToken, delay, eventually, quiet, startServer, workerToken, type PyServer } from "./harness.js";

const remoteTraceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const remoteTracestate = "vendor=abc,other=1";

let server: PyServer;
let client: Client;
const worker = new AbortController();
let working: Promise<void>;
/** The first lease of each task the worker ran, by task id. */
const leases = new Map<bigint, Lease>();
const exporter = new InMemorySpanExporter();

before(async () => {
  server = await startServer();
  client = connect(`http://${server.addr}`, { token: clientToken });
  working = runWorker(
    { target: `http://${server.addr}`, token: workerToken, pool: "trace", slots: 4, logger: quiet, signal: worker.signal },
    async (lease) => {
      if (!leases.has(lease.taskId)) leases.set(lease.taskId, lease);
      await delay(1);
      // After an await, still in the run span's context.
      trace.getTracer("test").startSpan("handler work").end();
      if (lease.text() === "fail") throw new Permanent("bad input");
      return lease.payload;
    },
  );
});

after(async () => {
  worker.abort();
  await working;
  client.close();
  await server.kill();
});

/** Submits to the worker's pool and returns the task's first lease once it ran. */
async function run(task: Task): Promise<{ id: bigint; lease: Lease }> {
  const { id } = await client.submit({ pool: "trace", kind: "k", ...task });
  await client.wait(id, { timeout: 30 });
  await eventually(() => leases.has(id), 5000, `the lease of task ${id}`);
  return { id, lease: leases.get(id)! };
}

function spans(name: string): ReadableSpan[] {
  return exporter.getFinishedSpans().filter((s) => s.name === name);
}

function traceparentOf(s: ReadableSpan): string {
  const sc = s.spanContext();
  return `00-${sc.traceId}-${sc.spanId}-0${sc.traceFlags}`;
}

test("without an OpenTelemetry SDK a submit adds no trace tags", async () => {
  const tags = { a: "b" };
  const { lease } = await run({ tags });
  assert.deepEqual(lease.tags, { a: "b" });
  assert.equal(lease.traceparent, undefined);
  assert.equal(lease.tracestate, undefined);
  assert.deepEqual(tags, { a: "b" });
});

test("explicit traceparent and tracestate become the task's tags", async () => {
  const tags = { a: "b" };
  const { lease } = await run({ tags, traceparent: remoteTraceparent, tracestate: remoteTracestate });
  assert.deepEqual(lease.tags, { a: "b", traceparent: remoteTraceparent, tracestate: remoteTracestate });
  assert.equal(lease.traceparent, remoteTraceparent);
  assert.equal(lease.tracestate, remoteTracestate);
  assert.deepEqual(tags, { a: "b" }, "the caller's tags were changed");
});

test("with an SDK: the submit and run spans, the task hanging below the submit span", async () => {
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  assert.ok(trace.setGlobalTracerProvider(provider));
  assert.ok(propagation.setGlobalPropagator(new W3CTraceContextPropagator()));
  assert.ok(context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable()));

  const caller = trace.getTracer("test").startSpan("caller");
  const { id, lease } = await context.with(trace.setSpan(context.active(), caller), () =>
    run({ tags: { a: "b" }, kind: "resize" }),
  );
  caller.end();

  const [submit] = spans("cronoq.submit");
  assert.ok(submit);
  assert.equal(submit.kind, SpanKind.PRODUCER);
  assert.equal(submit.parentSpanContext?.spanId, caller.spanContext().spanId);
  assert.equal(submit.spanContext().traceId, caller.spanContext().traceId);
  assert.deepEqual(submit.attributes, { "cronoq.pool": "trace", "cronoq.task.kind": "resize", "cronoq.task.id": Number(id) });
  assert.equal(lease.traceparent, traceparentOf(submit));
  assert.deepEqual(lease.tags, { a: "b", traceparent: traceparentOf(submit) });

  await eventually(() => spans("cronoq.run").length === 1, 5000, "the run span");
  const [runSpan] = spans("cronoq.run");
  assert.equal(runSpan!.kind, SpanKind.CONSUMER);
  assert.equal(runSpan!.parentSpanContext?.spanId, submit.spanContext().spanId);
  assert.equal(runSpan!.parentSpanContext?.isRemote, true);
  assert.equal(runSpan!.spanContext().traceId, caller.spanContext().traceId);
  assert.deepEqual(runSpan!.attributes, {
    "cronoq.task.id": Number(id),
    "cronoq.task.kind": "resize",
    "cronoq.pool": "trace",
    "cronoq.attempt": 1,
    "cronoq.priority": "normal",
    "cronoq.outcome": "succeeded",
  });
  assert.notEqual(runSpan!.status.code, SpanStatusCode.ERROR);
  const [work] = spans("handler work");
  assert.equal(work?.parentSpanContext?.spanId, runSpan!.spanContext().spanId);
});

test("the caller's own traceparent tag wins, then the explicit option", async () => {
  const own = "00-11111111111111111111111111111111-2222222222222222-01";
  const first = await run({ tags: { traceparent: own }, traceparent: remoteTraceparent, tracestate: remoteTracestate });
  assert.deepEqual(first.lease.tags, { traceparent: own });
  const second = await run({ traceparent: remoteTraceparent, tracestate: remoteTracestate });
  assert.deepEqual(second.lease.tags, { traceparent: remoteTraceparent, tracestate: remoteTracestate });
  // The run span continues the explicit context, tracestate included.
  await eventually(() => spans("cronoq.run").some((s) => s.attributes["cronoq.task.id"] === Number(second.id)));
  const run2 = spans("cronoq.run").find((s) => s.attributes["cronoq.task.id"] === Number(second.id))!;
  assert.equal(run2.parentSpanContext?.spanId, "b7ad6b7169203331");
  assert.equal(run2.spanContext().traceId, "0af7651916cd43dd8448eb211c80319c");
  assert.equal(run2.spanContext().traceState?.get("vendor"), "abc");
});

test("a failed attempt's span has status ERROR and its outcome", async () => {
  const { id } = await run({ payload: "fail" });
  await eventually(() => spans("cronoq.run").some((s) => s.attributes["cronoq.task.id"] === Number(id)));
  const span = spans("cronoq.run").find((s) => s.attributes["cronoq.task.id"] === Number(id))!;
  assert.equal(span.status.code, SpanStatusCode.ERROR);
  assert.equal(span.status.message, "bad input");
  assert.equal(span.attributes["cronoq.outcome"], "failed_permanent");
});

test("a failed submit's span has status ERROR", async () => {
  const unreachable = connect("127.0.0.1:1");
  try {
    await assert.rejects(unreachable.submit({ pool: "nowhere" }));
  } finally {
    unreachable.close();
  }
  const span = spans("cronoq.submit").find((s) => s.attributes["cronoq.pool"] === "nowhere");
  assert.equal(span?.status.code, SpanStatusCode.ERROR);
  assert.equal(span?.attributes["cronoq.task.id"], undefined);
});
