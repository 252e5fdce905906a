/** Client calls and errors against the real cronoq-server. */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { status } from "@grpc/grpc-js";
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

  const aborted = new AbortController();
  const pending = client.wait({ key: "never-submitted-but-waited" }, 10, { signal: aborted.signal });
  aborted.abort();
  const cancelled = await rejection(pending);
  assert.ok(cancelled.code === status.CANCELLED || cancelled.notFound, cancelled.message);

  await assert.rejects(client.get(2 ** 60), TypeError);
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

test("watch yields events as an async iterator and stops on abort", async () => {
  const stop = new AbortController();
  const events = client.watch({ keys: ["ts-watched"], signal: stop.signal });
  const first = events.next();
  // The stream opens with the first next(); give it a moment to reach the server.
  await new Promise((r) => setTimeout(r, 200));
  const sub = await client.submit({ key: "ts-watched" });
  await client.cancel(sub.id);
  const ev = await first;
  assert.equal(ev.done, false);
  assert.equal(ev.value?.id, sub.id);
  assert.equal(ev.value?.status, "cancelled");
  assert.ok(ev.value?.at instanceof Date);
  const second = events.next();
  stop.abort();
  assert.deepEqual(await second, { done: true, value: undefined });

  // Leaving a for-await loop closes the stream too.
  const loop = (async () => {
    for await (const e of client.watch({ keys: ["ts-watched-2"], allTransitions: true })) return e;
    return undefined;
  })();
  await new Promise((r) => setTimeout(r, 200));
  const watched = await client.submit({ key: "ts-watched-2" });
  // With allTransitions the first event is the task's first status, before it ends.
  const e = await loop;
  assert.equal(e?.id, watched.id);
  assert.ok(e && !isDone(e.status), e?.status);
});
