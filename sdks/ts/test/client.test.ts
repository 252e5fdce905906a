/** Client calls and errors against the real cronoq-server. */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { status, type ServiceError } from "@grpc/grpc-js";
import { Client, CronoqError, connect, isDone } from "../src/index.js";
import { clientToken, startServer, workerToken, type PyServer } from "./harness.js";

let server: PyServer;
let client: Client;

before(async () => {
  server = await startServer();
  client = connect(`http://${server.addr}`, { token: clientToken });
});

after(async () => {
  client.close();
  await server.kill();
});

async function rejection(p: Promise<unknown>): Promise<CronoqError> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof CronoqError, `not a CronoqError: ${String(err)}`);
    return err;
  }
  assert.fail("the call succeeded");
}

test("submit, get, wait with a timeout, cancel, duplicate keys", async () => {
  const sub = await client.submit({ payload: { to: "ada" }, key: "ts-welcome-ada", kind: "mail", priority: "high", tags: { a: "b" } });
  assert.equal(typeof sub.id, "bigint");
  assert.equal(sub.duplicate, false);
  const again = await client.submit({ key: "ts-welcome-ada" });
  assert.deepEqual(again, { id: sub.id, duplicate: true });

  const info = await client.get(sub.id);
  assert.equal(info.id, sub.id);
  assert.equal(info.status, "ready");
  assert.equal(info.kind, "mail");
  assert.equal(info.key, "ts-welcome-ada");
  assert.equal(info.priority, "high");
  assert.ok(info.created instanceof Date);
  assert.equal((await client.get({ key: "ts-welcome-ada" })).id, sub.id);

  const start = Date.now();
  const timedOut = await rejection(client.wait(sub.id, 0.3));
  assert.ok(timedOut.timeout, timedOut.message);
  assert.match(timedOut.message, /still running after 0.3 s/);
  assert.ok(Date.now() - start < 4000);

  assert.equal(await client.cancel({ key: "ts-welcome-ada" }), true);
  assert.equal(await client.cancel(sub.id), false);
  const res = await client.wait(sub.id, 5);
  assert.equal(res.status, "cancelled");
  assert.equal(res.output, undefined);
  assert.ok(isDone(res.status));
});

test("errors carry the gRPC code", async () => {
  const notFound = await rejection(client.get(987654321n));
  assert.equal(notFound.code, status.NOT_FOUND);
  assert.ok(notFound.notFound && !notFound.retryable && !notFound.timeout);

  const badPool = await rejection(client.submit({ pool: "no-such-pool" }));
  assert.ok(badPool.notFound, badPool.message);

  const wrong = connect(server.addr, { token: "wrong-token-for-the-ts-sdk-tests-0000" });
  assert.equal((await rejection(wrong.get(1))).code, status.UNAUTHENTICATED);
  wrong.close();
  const worker = connect(server.addr, { token: workerToken });
  assert.equal((await rejection(worker.get(1))).code, status.PERMISSION_DENIED);
  worker.close();

  await client.submit({ pool: "full" });
  const full = await rejection(client.submit({ pool: "full" }));
  assert.equal(full.code, status.RESOURCE_EXHAUSTED);
  assert.ok(full.retryable);

  await assert.rejects(client.get(2 ** 60), TypeError);
});

test("a CronoqError keeps the grpc-js error as its cause", async () => {
  const err = await rejection(client.get(987654322n));
  const cause = err.cause as ServiceError;
  assert.ok(cause instanceof Error && !(cause instanceof CronoqError), String(cause));
  assert.equal(cause.code, status.NOT_FOUND);
  assert.equal(cause.details, err.details);

  // A wait that timed out is reported with its own message; the server's error is the cause.
  const { id } = await client.submit({ pool: "idle" });
  const timedOut = await rejection(client.wait(id, { timeout: 0.2 }));
  assert.ok(timedOut.timeout);
  assert.ok(timedOut.cause instanceof CronoqError && timedOut.cause.timeout, String(timedOut.cause));
  assert.equal((timedOut.cause.cause as ServiceError).code, status.DEADLINE_EXCEEDED);
});

/** What p rejected with, whatever it is. */
async function rejectionOf(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (err) {
    return err;
  }
  assert.fail("the call succeeded");
}

test("an aborted call rejects with signal.reason, as fetch does", async () => {
  // A task nobody runs (the pool has no worker), so a wait for it is still pending when aborted.
  const { id } = await client.submit({ pool: "idle", key: "ts-abort-waited" });

  // A unary call aborted in flight, with a reason and without one.
  const custom = new Error("the user navigated away");
  const withReason = new AbortController();
  const get = client.get(id, { signal: withReason.signal });
  withReason.abort(custom);
  assert.equal(await rejectionOf(get), custom);
  const noReason = new AbortController();
  const got = client.get(id, { signal: noReason.signal });
  noReason.abort();
  const abortError = await rejectionOf(got);
  assert.equal(abortError, noReason.signal.reason);
  assert.ok(abortError instanceof DOMException && abortError.name === "AbortError", String(abortError));

  // A signal aborted before the call: it rejects with the reason and nothing reaches the server.
  const early = Symbol("aborted before the call");
  assert.equal(await rejectionOf(client.cancel(id, { signal: AbortSignal.abort(early) })), early);
  assert.equal((await client.get(id)).status, "ready");

  // wait, in both calling forms, aborted while the server holds it: a Get answered on the same
  // connection after the Wait was sent means the Wait reached the server first.
  const waitReason = new Error("stop waiting");
  const waiting = new AbortController();
  const pending = client.wait(id, { timeout: 30, signal: waiting.signal });
  await client.get(id);
  waiting.abort(waitReason);
  assert.equal(await rejectionOf(pending), waitReason);
  const positional = new AbortController();
  const pendingPositional = client.wait({ key: "ts-abort-waited" }, 30, { signal: positional.signal });
  await client.get(id);
  positional.abort();
  assert.equal(await rejectionOf(pendingPositional), positional.signal.reason);
  assert.ok(positional.signal.reason instanceof DOMException);
  // Cancelling the waits left the task alone.
  assert.equal((await client.get(id)).status, "ready");

  // list takes the signal in its options or, the earlier form, in a second object.
  const listReason = new Error("no page needed");
  assert.equal(await rejectionOf(client.list({ pools: ["idle"], signal: AbortSignal.abort(listReason) })), listReason);
  assert.equal(await rejectionOf(client.list({ pools: ["idle"] }, { signal: AbortSignal.abort(listReason) })), listReason);
});

test("wait takes its timeout in an options object or, the earlier form, positionally", async () => {
  const { id } = await client.submit({ pool: "idle" });
  for (const waited of [client.wait(id, { timeout: 0.2 }), client.wait(id, 0.2), client.wait(id, 0.2, {})]) {
    const err = await rejection(waited);
    assert.ok(err.timeout, err.message);
    assert.match(err.message, /still running after 0.2 s/);
  }
  await client.cancel(id);
  for (const res of [await client.wait(id), await client.wait(id, { timeout: 5 }), await client.wait(id, 5)]) {
    assert.equal(res.status, "cancelled");
  }
  const page = await client.list({ pools: ["idle"], limit: 1 });
  assert.deepEqual(await client.list({ pools: ["idle"], limit: 1 }, {}), page);
});

test("list pages through a pool", async () => {
  const ids: bigint[] = [];
  for (let i = 0; i < 5; i++) ids.push((await client.submit({ pool: "list", payload: `task ${i}` })).id);
  const seen: bigint[] = [];
  let after: bigint | undefined;
  for (let pages = 0; pages < 10; pages++) {
    const page = await client.list({ pools: ["list"], statuses: ["ready"], limit: 2, after });
    assert.ok(page.tasks.length <= 2);
    seen.push(...page.tasks.map((t) => t.id));
    assert.deepEqual(page.unavailableShards, []);
    if (page.nextAfter === 0n) break;
    after = page.nextAfter;
  }
  assert.deepEqual(seen, ids);
  assert.deepEqual((await client.list({ pools: ["list"], statuses: ["succeeded"] })).tasks, []);
});

/**
 * Submits tasks to pool "idle" (and cancels them, for terminal events) until `live()`: then a
 * watch of that pool that reported one of them is surely open at the server, with no guessing
 * how long it takes to get there.
 */
async function probeUntil(live: () => boolean): Promise<void> {
  while (!live()) await client.cancel((await client.submit({ pool: "idle" })).id);
}

test("watch yields events as an async iterator and stops on abort", async () => {
  const stop = new AbortController();
  const events = client.watch({ pools: ["idle"], signal: stop.signal });
  // The stream opens with the first next().
  let live = false;
  const first = events.next().then((r) => ((live = true), r));
  await probeUntil(() => live);
  assert.equal((await first).value?.key, "", "a probe");
  const sub = await client.submit({ pool: "idle", key: "ts-watched" });
  await client.cancel(sub.id);
  // Probes still on their way come first; only terminal events come at all.
  let ev = await events.next();
  while (!ev.done && ev.value.key !== "ts-watched") {
    assert.ok(isDone(ev.value.status), ev.value.status);
    ev = await events.next();
  }
  assert.equal(ev.done, false);
  assert.equal(ev.value?.id, sub.id);
  assert.equal(ev.value?.status, "cancelled");
  assert.equal(ev.value?.pool, "idle");
  assert.ok(ev.value?.at instanceof Date);
  const second = events.next();
  stop.abort();
  assert.deepEqual(await second, { done: true, value: undefined });

  // Leaving a for-await loop closes the stream too.
  let looping = false;
  const loop = (async () => {
    for await (const e of client.watch({ pools: ["idle"], allTransitions: true })) {
      looping = true;
      if (e.key === "ts-watched-2") return e;
    }
    return undefined;
  })();
  await probeUntil(() => looping);
  const watched = await client.submit({ pool: "idle", key: "ts-watched-2" });
  // With allTransitions the first event is the task's first status, before it ends.
  const e = await loop;
  assert.equal(e?.id, watched.id);
  assert.ok(e && !isDone(e.status), e?.status);
});
