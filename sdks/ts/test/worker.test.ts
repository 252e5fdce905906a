/** runWorker against the real cronoq-server: outcomes, slots, aborts, drain, fatal, restart. */
import assert from "node:assert/strict";
import { after, afterEach, before, test } from "node:test";
import * as grpc from "@grpc/grpc-js";
import { Client, connect } from "../src/index.js";
import {
  CancelTask,
  CronoqError,
  LeaseAborted,
  Permanent,
  Reject,
  Retryable,
  runWorker,
  type Handler,
  type Lease,
  type WorkerOptions,
} from "../src/node.js";
import { loadCronoq } from "../src/proto.js";
import { adminToken, clientToken, delay, eventually, quiet, startServer, workerToken, type PyServer } from "./harness.js";

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

/** Workers still running, so that a failed test cannot leave one behind. */
const running = new Set<() => Promise<void>>();

afterEach(async () => {
  for (const stop of running) await stop().catch(() => undefined);
  running.clear();
});

/** Runs a worker until the returned stop() aborts it; stop resolves with runWorker's end. */
function startWorker(options: Partial<WorkerOptions> & { pool: string }, handler: Handler): () => Promise<void> {
  const controller = new AbortController();
  const done = runWorker(
    { target: `http://${server.addr}`, token: workerToken, logger: quiet, signal: controller.signal, ...options },
    handler,
  );
  // Reported when stop() is awaited; this keeps an early failure from going unhandled.
  done.catch(() => undefined);
  const stop = (): Promise<void> => {
    controller.abort();
    return done;
  };
  running.add(stop);
  return stop;
}

type SnapshotStub = grpc.Client & {
  Snapshot(
    req: object,
    md: grpc.Metadata,
    cb: (err: grpc.ServiceError | null, res?: { totals: { stale_completions: string } }) => void,
  ): void;
};

/** The server's count of outcomes for leases a worker no longer held. */
async function staleCompletions(): Promise<string> {
  const admin = new (loadCronoq().Admin)(server.addr, grpc.credentials.createInsecure()) as unknown as SnapshotStub;
  const md = new grpc.Metadata();
  md.set("authorization", `Bearer ${adminToken}`);
  try {
    return await new Promise((resolve, reject) =>
      admin.Snapshot({}, md, (err, res) => (err || !res ? reject(err) : resolve(res.totals.stale_completions))),
    );
  } finally {
    admin.close();
  }
}

test("each handler result becomes its outcome", async () => {
  let seen: Lease | undefined;
  /** When the retry-after task's attempts started (Date.now()). */
  const retryAfterAttempts: number[] = [];
  const stop = startWorker({ pool: "outcomes", slots: 8, name: "ts-test", labels: { lang: "ts" } }, async (lease) => {
    // A structured payload goes out as JSON with its content type.
    if (lease.contentType === "application/json") return { got: lease.json<{ n: number }>().n + 1 };
    switch (lease.text()) {
      case "ok":
        seen = lease;
        return "done";
      case "bytes":
        return new Uint8Array([1, 2, 3]);
      case "nothing":
        return undefined;
      case "permanent":
        throw new Permanent("bad input");
      case "retry-after":
        retryAfterAttempts.push(Date.now());
        if (lease.attempt === 1) throw new Retryable("rate limited", 0.7);
        return `attempt ${lease.attempt}`;
      case "cancel":
        throw new CancelTask("no longer needed");
      case "throw":
        if (lease.attempt === 1) throw new Error("boom");
        return "recovered";
      case "sync-throw":
        throw new TypeError("always broken");
      case "slow":
        // Longer than the pool's 1 s lease TTL: only heartbeats keep the lease.
        await delay(1500);
        return "slow";
      case "big":
        return Buffer.alloc(300_000);
      case "reject":
        throw new Reject("not for me");
      default:
        return lease.payload;
    }
  });
  const submit = async (payload: unknown, extra: object = {}): Promise<bigint> =>
    (await client.submit({ pool: "outcomes", payload, ...extra })).id;
  const ok = await submit("ok", { kind: "k", key: "ts-outcome-ok", tags: { t: "1" }, timeout: 30, deadline: 60, priority: "low" });
  const json = await submit({ n: 41 });
  const bytes = await submit("bytes");
  const nothing = await submit("nothing");
  const permanent = await submit("permanent");
  const retryAfter = await submit("retry-after");
  const cancel = await submit("cancel");
  const thrown = await submit("throw");
  const syncThrow = await submit("sync-throw");
  const slow = await submit("slow");
  const big = await submit("big");

  const expect = async (id: bigint, status: string, output?: string | Buffer, message?: RegExp): Promise<void> => {
    const res = await client.wait(id, 15);
    assert.equal(res.status, status, `task ${id}: ${res.message}`);
    if (output !== undefined) assert.deepEqual(res.output, Buffer.from(output));
    if (message) assert.match(res.message, message);
  };
  await expect(ok, "succeeded", "done");
  await expect(json, "succeeded", '{"got":42}');
  await expect(bytes, "succeeded", Buffer.from([1, 2, 3]));
  await expect(nothing, "succeeded", "");
  await expect(permanent, "failed", undefined, /bad input/);
  assert.equal((await client.get(permanent)).attempt, 1);
  await expect(retryAfter, "succeeded", "attempt 2");
  // The second attempt cannot start before 0.7 s after the first one failed.
  const [first, second] = retryAfterAttempts;
  assert.ok(second! - first! >= 690, `the retry came ${second! - first!} ms after the first attempt; retry_after is 0.7 s`);
  await expect(cancel, "cancelled");
  await expect(thrown, "succeeded", "recovered");
  await expect(syncThrow, "dead_lettered", undefined, /always broken/);
  await expect(slow, "succeeded", "slow");
  await expect(big, "failed", undefined, /exceeds the server's message limit/);

  assert.ok(seen);
  assert.equal(seen.taskId, ok);
  assert.equal(typeof seen.id, "bigint");
  assert.equal(seen.attempt, 1);
  assert.equal(seen.kind, "k");
  assert.equal(seen.key, "ts-outcome-ok");
  assert.equal(seen.pool, "outcomes");
  assert.equal(seen.priority, "low");
  assert.deepEqual({ ...seen.tags }, { t: "1" });
  assert.equal(seen.timeout, 30);
  assert.ok(seen.deadline && Math.abs(seen.deadline.getTime() - Date.now() - 60_000) < 30_000);
  assert.ok(Buffer.isBuffer(seen.payload));
  assert.equal(seen.signal.aborted, false);
  await stop();
});

test("a rejected lease goes back unrun and another worker takes it", async () => {
  // The pool retries a handed-back attempt every 50 ms (up to 1000 times), so the rejecting
  // worker keeps getting it until the serving worker is there to take it over.
  let rejected!: () => void;
  const firstReject = new Promise<void>((resolve) => (rejected = resolve));
  const stopRejecting = startWorker({ pool: "reject", name: "rejecting" }, () => {
    rejected();
    throw new Reject("not for me");
  });
  const id = (await client.submit({ pool: "reject", payload: "x" })).id;
  await firstReject;
  const stopServing = startWorker({ pool: "reject", name: "serving" }, () => "taken");
  const res = await client.wait(id, 15);
  assert.equal(res.status, "succeeded", res.message);
  assert.deepEqual(res.output, Buffer.from("taken"));
  await Promise.all([stopRejecting(), stopServing()]);
});

test("no more handlers run at once than the server granted", async () => {
  let running = 0;
  let peak = 0;
  // The pool allows 2 slots; the worker asks for 8.
  const stop = startWorker({ pool: "slots", slots: 8 }, async () => {
    running++;
    peak = Math.max(peak, running);
    await delay(100);
    running--;
  });
  const ids = await Promise.all(Array.from({ length: 6 }, () => client.submit({ pool: "slots" })));
  for (const { id } of ids) assert.equal((await client.wait(id, 15)).status, "succeeded");
  assert.equal(peak, 2);
  await stop();
});

test("cancelling a running task aborts lease.signal and reports nothing", async () => {
  let reason: unknown;
  let entered = false;
  let returned = false;
  const stop = startWorker({ pool: "abort" }, async (lease) => {
    entered = true;
    await new Promise((r) => lease.signal.addEventListener("abort", r));
    reason = lease.signal.reason;
    returned = true;
    return "too late";
  });
  const before = await staleCompletions();
  const { id } = await client.submit({ pool: "abort" });
  await eventually(() => entered, 10_000, "the handler");
  assert.equal(await client.cancel(id), true);
  await eventually(() => reason !== undefined, 5000, "the abort");
  assert.ok(reason instanceof LeaseAborted && reason.why === "aborted", String(reason));
  await eventually(() => returned, 5000, "the handler's return");
  // The server ends a stopping worker's stream after reading all it sent, so an outcome sent
  // for the aborted lease would have been counted as stale by the time stop() resolves.
  await stop();
  assert.equal(await staleCompletions(), before);
  assert.equal((await client.wait(id, 5)).status, "cancelled");
});

test("aborting signal drains running handlers, then aborts the rest", async () => {
  const entered: string[] = [];
  const stop = startWorker({ pool: "drain", slots: 2, drainTimeout: 0.7 }, async (lease) => {
    entered.push(lease.text());
    if (lease.text() === "quick") {
      await delay(300);
      return "finished";
    }
    // Runs until the drain timeout aborts it, then still reports in time.
    await new Promise((r) => lease.signal.addEventListener("abort", r));
    const reason = lease.signal.reason as LeaseAborted;
    if (reason.why !== "drain timeout") throw new Permanent(`reason ${reason.why}`);
    return "cut short";
  });
  const quick = (await client.submit({ pool: "drain", payload: "quick" })).id;
  const long = (await client.submit({ pool: "drain", payload: "long" })).id;
  await eventually(() => entered.length === 2, 10_000, "both handlers");
  const start = Date.now();
  await stop();
  const took = Date.now() - start;
  assert.ok(took >= 600 && took < 5000, `runWorker resolved ${took} ms after the abort; drainTimeout is 0.7 s`);
  assert.deepEqual((await client.wait(quick, 5)).output, Buffer.from("finished"));
  assert.deepEqual((await client.wait(long, 5)).output, Buffer.from("cut short"));
});

test("refusals no retry can fix reject the promise", async () => {
  const target = `http://${server.addr}`;
  const cases: [Partial<WorkerOptions>, grpc.status][] = [
    [{ pool: "no-such-pool", token: workerToken }, grpc.status.NOT_FOUND],
    [{ pool: "default", token: "wrong-token-for-the-ts-sdk-tests-0000" }, grpc.status.UNAUTHENTICATED],
    [{ pool: "default", token: clientToken }, grpc.status.PERMISSION_DENIED],
  ];
  for (const [options, code] of cases) {
    await assert.rejects(
      runWorker({ target, pool: "", logger: quiet, ...options }, () => undefined),
      (err: unknown) => err instanceof CronoqError && err.code === code && (err.cause as grpc.ServiceError).code === code,
      `pool ${options.pool}`,
    );
  }
  await assert.rejects(runWorker({ target, pool: "default", slots: 0 }, () => undefined), RangeError);
});

test("the worker reconnects after the server restarts on the same port", async () => {
  let srv = await startServer();
  const addr = srv.addr;
  const controller = new AbortController();
  const done = runWorker(
    { target: `http://${addr}`, pool: "restart", token: workerToken, logger: quiet, signal: controller.signal, minBackoff: 0.05 },
    (lease) => lease.payload,
  );
  running.add(() => {
    controller.abort();
    return done;
  });
  try {
    for (const payload of ["before", "after"]) {
      if (payload === "after") {
        await srv.kill();
        srv = await startServer(addr);
      }
      const c = connect(addr, { token: clientToken });
      const { id } = await c.submit({ pool: "restart", payload });
      const res = await c.wait(id, 15);
      c.close();
      assert.deepEqual(res.output, Buffer.from(payload), `${payload} the restart: ${res.message}`);
    }
  } finally {
    controller.abort();
    await done;
    await srv.kill();
  }
});
