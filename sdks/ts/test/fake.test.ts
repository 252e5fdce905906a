/**
 * runWorker against a scripted Workers server: redirects and their safety rules, reconnect
 * timing, heartbeats, the granted slots and each outcome's wire form.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, test } from "node:test";
import * as grpc from "@grpc/grpc-js";
import {
  CancelTask,
  CronoqError,
  Permanent,
  Reject,
  LeaseAborted,
  Retryable,
  runWorker,
  type Handler,
  type WorkerOptions,
} from "../src/node.js";
import { checkRedirect, type Logger } from "../src/worker.js";
import { eventually, quiet } from "./harness.js";
import { FakeServer, type FakeStream, type Received } from "./fake.js";

const token = "fake-worker-token";

/** Workers still running, so that a failed test cannot leave one behind. */
const running = new Set<() => Promise<void>>();

afterEach(async () => {
  for (const stop of running) await stop().catch(() => undefined);
  running.clear();
  FakeServer.stopAll();
});

/** Runs a worker until stop(); stop resolves or rejects as runWorker does. */
function start(options: Partial<WorkerOptions> & { target: string }, handler: Handler = () => "ok"): {
  stop: () => Promise<void>;
  done: Promise<void>;
} {
  const controller = new AbortController();
  const done = runWorker({ pool: "p", token, logger: quiet, signal: controller.signal, ...options }, handler);
  done.catch(() => undefined);
  const stop = (): Promise<void> => {
    controller.abort();
    return done;
  };
  running.add(stop);
  return { done, stop };
}

const isCode = (code: grpc.status, pattern?: RegExp) => (err: unknown) =>
  err instanceof CronoqError && err.code === code && (!pattern || pattern.test(err.message));

/** Accepts the registration, runs one lease and expects it completed. */
async function serveOne(s: FakeStream): Promise<void> {
  await s.next("register");
  s.registered(1);
  s.lease(1, "hello");
}

test("a shard redirect is followed, from initial metadata or trailers", async () => {
  const shard = await FakeServer.start(serveOne);
  const middle = await FakeServer.start((s) =>
    s.fail(grpc.status.FAILED_PRECONDITION, "pool p lives on shard b", { "cronoq-shard-endpoint": shard.target + "/" }),
  );
  const first = await FakeServer.start((s) =>
    s.fail(grpc.status.FAILED_PRECONDITION, "pool p lives on shard m", {}, { "cronoq-shard-endpoint": middle.target }),
  );
  const w = start({ target: first.target });
  try {
    await eventually(() => shard.streams.length > 0, 5000, "the shard");
    const done = await shard.streams[0]!.next("complete");
    assert.equal(done.complete?.output.toString(), "ok");
    const reg = shard.streams[0]!.received[0]!;
    assert.equal(reg.register?.pool, "p");
    assert.equal(reg.register?.protocol_version, 3);
    await w.stop();
  } finally {
    for (const f of [first, middle, shard]) f.stop();
  }
});

test("unsafe redirects reject the promise", async () => {
  for (const [endpoint, options, why] of [
    ["http://user:pw@127.0.0.1:1", {}, /plain host and port/],
    ["http://127.0.0.1:1/path", {}, /plain host and port/],
    ["ftp://127.0.0.1:1", {}, /http/],
    ["http://192.0.2.1:7070", {}, /token over plain http/],
  ] as const) {
    const f = await FakeServer.start((s) =>
      s.fail(grpc.status.FAILED_PRECONDITION, "elsewhere", { "cronoq-shard-endpoint": endpoint }),
    );
    await assert.rejects(start({ target: f.target, ...options }).done, isCode(grpc.status.FAILED_PRECONDITION, why), endpoint);
    f.stop();
  }
});

test("the redirect rules", () => {
  const warned: string[] = [];
  const logger: Logger = { info: () => undefined, warn: (m) => warned.push(m) };
  const check = (current: string, target: string, opts: Parameters<typeof checkRedirect>[0] = { token, logger }) =>
    checkRedirect(opts, current, target, 0, "cause");
  // Never from TLS down to plain text, whether TLS came from https:// or the tls option.
  assert.throws(() => check("https://a:1", "http://127.0.0.1:2"), /from TLS to plain http/);
  assert.throws(() => check("a:1", "http://127.0.0.1:2", { token, logger, tls: true }), /from TLS/);
  check("https://a:1", "https://b:2");
  check("http://a:1", "https://b:2");
  // The token goes over plain text only to loopback, unless explicitly allowed.
  check("http://a:1", "http://localhost:2");
  check("http://a:1", "http://[::1]:2");
  check("http://a:1", "http://127.3.2.1:2");
  assert.throws(() => check("http://a:1", "http://10.0.0.1:2"), /token over plain http/);
  check("http://a:1", "http://10.0.0.1:2", { logger });
  assert.deepEqual(warned, []);
  check("http://a:1", "http://10.0.0.1:2", { token, logger, insecureRedirectHttp: true });
  assert.equal(warned.length, 1);
  assert.throws(() => check("http://a:1", "http://b:2?x=1"), /plain host/);
  assert.throws(() => check("http://a:1", "http://b:2#f"), /plain host/);
  assert.throws(() => check("http://a:1", "b:2"), /http/);
  assert.throws(() => checkRedirect({ logger }, "http://a:1", "http://b:2", 3, "c"), /4 redirects in a row/);
});

test("an insecure http redirect is followed when allowed", async () => {
  const warned: string[] = [];
  const logger: Logger = { info: () => undefined, warn: (m) => warned.push(m) };
  // 192.0.2.0/24 is reserved for documentation: nothing answers there.
  const f = await FakeServer.start((s) =>
    s.fail(grpc.status.FAILED_PRECONDITION, "elsewhere", { "cronoq-shard-endpoint": "http://192.0.2.1:7070" }),
  );
  const w = start({ target: f.target, insecureRedirectHttp: true, logger });
  await eventually(() => warned.length > 0, 5000, "the warning");
  await w.stop();
  f.stop();
});

test("at most 3 redirects in a row", async () => {
  const ring: FakeServer[] = [];
  for (let i = 0; i < 2; i++) {
    ring.push(
      await FakeServer.start((s) =>
        s.fail(grpc.status.FAILED_PRECONDITION, "not here", { "cronoq-shard-endpoint": ring[1 - i]!.target }),
      ),
    );
  }
  await assert.rejects(start({ target: ring[0]!.target }).done, isCode(grpc.status.FAILED_PRECONDITION, /4 redirects in a row/));
  assert.equal(ring[0]!.streams.length + ring[1]!.streams.length, 4);
  for (const f of ring) f.stop();
});

test("an unreachable shard sends the worker back to its target", async () => {
  const gone = await FakeServer.start(() => undefined);
  const deadEndpoint = gone.target;
  gone.stop();
  const target = await FakeServer.start(async (s, i) => {
    if (i === 0) s.fail(grpc.status.FAILED_PRECONDITION, "moved", { "cronoq-shard-endpoint": deadEndpoint });
    else await serveOne(s);
  });
  const w = start({ target: target.target, minBackoff: 0.05 });
  await eventually(() => target.streams.length === 2, 5000, "the return to the target");
  await target.streams[1]!.next("complete");
  await w.stop();
  target.stop();
});

test("FAILED_PRECONDITION without a redirect, and UNIMPLEMENTED, are fatal", async () => {
  for (const code of [grpc.status.FAILED_PRECONDITION, grpc.status.UNIMPLEMENTED, grpc.status.INVALID_ARGUMENT]) {
    const f = await FakeServer.start((s) => s.fail(code, "no"));
    await assert.rejects(start({ target: f.target }).done, isCode(code));
    f.stop();
  }
});

/** A logger recording the delay of each reconnect, as runWorker decided it (seconds). */
function reconnects(): { logger: Logger; delays: number[] } {
  const delays: number[] = [];
  const logger: Logger = {
    info: (message, fields) => {
      if (message === "cronoq worker reconnecting") delays.push(fields?.after as number);
    },
    warn: () => undefined,
  };
  return { logger, delays };
}

test("not_leader reconnects at once, other ends after the backoff", async () => {
  for (const notLeader of [true, false]) {
    const f = await FakeServer.start(async (s, i) => {
      await s.next("register");
      s.registered(1);
      if (i === 0) {
        s.send({ shutdown: { reason: "bye", not_leader: notLeader } });
        s.end();
      }
    });
    const { logger, delays } = reconnects();
    const w = start({ target: f.target, minBackoff: 0.5, logger });
    await eventually(() => f.streams.length === 2, 5000, "the reconnect");
    assert.deepEqual(delays, [notLeader ? 0 : 0.5]);
    // Timers never fire early, so the backoff shows as a lower bound on the gap.
    const gap = f.streams[1]!.openedAt - f.streams[0]!.received[0]!.at;
    if (!notLeader) assert.ok(gap >= 450, `reconnected ${gap} ms after a plain shutdown; minBackoff is 500 ms`);
    await w.stop();
    f.stop();
  }
});

test("failed sessions back off, doubling", async () => {
  const f = await FakeServer.start((s) => s.fail(grpc.status.UNAVAILABLE, "not yet"));
  const { logger, delays } = reconnects();
  const w = start({ target: f.target, minBackoff: 0.1, maxBackoff: 0.4, logger });
  await eventually(() => f.streams.length === 5, 5000, "five attempts");
  assert.deepEqual(delays.slice(0, 4), [0.1, 0.2, 0.4, 0.4]);
  const gaps = f.streams.slice(1).map((s, i) => s.openedAt - f.streams[i]!.openedAt);
  for (const [i, want] of [100, 200, 400, 400].entries()) {
    assert.ok(gaps[i]! >= want - 20, `gap ${i} is ${gaps[i]} ms, want at least ${want}`);
  }
  await w.stop();
  f.stop();
});

test("heartbeats every third of the lease TTL, and none after the outcome", async () => {
  const sentAt = new Map<string, number>();
  const lease = (s: FakeStream, id: number, ttl?: number): void => {
    sentAt.set(String(id), Date.now());
    s.lease(id, "", ttl);
  };
  const f = await FakeServer.start(async (s) => {
    await s.next("register");
    s.registered(3, 0.3);
    lease(s, 1);
    lease(s, 2, 0.6);
  });
  const received = (): Received[] => f.streams[0]?.received ?? [];
  const beats = (id: string): Received[] => received().filter((r) => r.heartbeat?.lease === id);
  const completed = (id: string): boolean => received().some((r) => r.complete?.lease === id);
  // Each handler keeps its lease until the server has seen three heartbeats for it.
  const w = start({ target: f.target, slots: 3 }, async (l) => {
    await eventually(() => beats(String(l.id)).length >= 3, 10_000, `three heartbeats of lease ${l.id}`);
    return "done";
  });
  await eventually(() => completed("1") && completed("2"), 15_000, "both outcomes");
  // Timers never fire early: the k-th heartbeat comes k periods after the lease at the soonest,
  // 100 ms for the registration's TTL of 0.3 s, 200 ms for the lease's own 0.6 s.
  for (const [id, period] of [["1", 100], ["2", 200]] as const) {
    beats(id).forEach((b, k) => {
      const after = b.at - sentAt.get(id)!;
      assert.ok(after >= (k + 1) * period - 5, `heartbeat ${k + 1} of lease ${id} after ${after} ms; period ${period} ms`);
    });
  }
  // A third lease, held for three of its heartbeats (300 ms at the soonest): a heartbeat timer of
  // the first two left running would fire before those.
  lease(f.streams[0]!, 3);
  await eventually(() => completed("3"), 15_000, "the third outcome");
  for (const id of ["1", "2"]) {
    const done = received().findIndex((r) => r.complete?.lease === id);
    assert.deepEqual(received().slice(done).filter((r) => r.heartbeat?.lease === id), [], `heartbeats of lease ${id} after its outcome`);
  }
  await w.stop();
  f.stop();
});

test("leases beyond the grant, and during the drain, are handed back", async () => {
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  const f = await FakeServer.start(async (s) => {
    await s.next("register");
    s.registered(1);
    s.lease(1, "first");
    s.lease(2, "beyond the grant");
  });
  const w = start({ target: f.target, slots: 4, drainTimeout: 5 }, async () => {
    await gate;
    return "first done";
  });
  const s = await (async () => {
    await eventually(() => f.streams.length === 1, 5000, "the stream");
    return f.streams[0]!;
  })();
  assert.equal((await s.next("register")).register?.slots, 4);
  const nack = await s.next("nack");
  assert.deepEqual([nack.nack?.lease, nack.nack?.reason], ["2", "worker has no free slot"]);
  const stopped = w.stop();
  assert.equal((await s.next("set_slots")).set_slots?.slots, 0);
  s.lease(3, "during the drain");
  await eventually(() => s.received.some((r) => r.nack?.lease === "3"), 5000, "the drain nack");
  assert.equal(s.received.find((r) => r.nack?.lease === "3")?.nack?.reason, "worker is stopping");
  release();
  assert.equal((await s.next("complete")).complete?.lease, "1");
  // The worker half-closes once drained; the fake then ends the stream.
  await s.closedByWorker();
  await stopped;
  f.stop();
});

test("a lease cut by the drain timeout is heartbeaten until its outcome", async () => {
  const f = await FakeServer.start(async (s) => {
    await s.next("register");
    s.registered(1, 0.3);
    s.lease(1, "slow");
  });
  const beatsSince = (at: number): number =>
    (f.streams[0]?.received ?? []).filter((r) => r.heartbeat?.lease === "1" && r.at >= at).length;
  let entered!: () => void;
  const running = new Promise<void>((r) => (entered = r));
  // Returns after the drain timeout aborted it, once the server has seen three more heartbeats:
  // the lease must stay alive until its outcome, within the grace.
  const w = start({ target: f.target, drainTimeout: 0.05 }, async (l) => {
    entered();
    await new Promise((r) => l.signal.addEventListener("abort", r, { once: true }));
    assert.equal((l.signal.reason as LeaseAborted).why, "drain timeout");
    const cut = Date.now();
    await eventually(() => beatsSince(cut) >= 3, 4000, "heartbeats after the drain timeout");
    return "late";
  });
  await running;
  const stopped = w.stop();
  const s = f.streams[0]!;
  const done = await s.next("complete", 10_000);
  assert.deepEqual([done.complete?.lease, done.complete?.output.toString()], ["1", "late"]);
  await stopped;
  f.stop();
});

test("each outcome's wire form", async () => {
  const f = await FakeServer.start(async (s) => {
    await s.next("register");
    s.registered(8, undefined, 4096);
    ["json", "permanent", "retry", "retry-plain", "reject", "cancel", "error", "big", "retry-options"].forEach((p, i) =>
      s.lease(i + 1, p),
    );
  });
  const w = start({ target: f.target, slots: 8 }, (lease) => {
    switch (lease.text()) {
      case "json":
        return [1, "two"];
      case "permanent":
        throw new Permanent("bad");
      case "retry":
        throw new Retryable("later", 2.5);
      case "retry-plain":
        throw new Retryable("soon");
      case "retry-options":
        throw new Retryable("later too", { retryAfter: 1.5, cause: new Error("upstream") });
      case "reject":
        throw new Reject("busy");
      case "cancel":
        throw new CancelTask("pointless");
      case "error":
        throw "a string";
      default:
        return "x".repeat(4000);
    }
  });
  await eventually(() => (f.streams[0]?.received.length ?? 0) >= 10, 5000, "nine outcomes");
  const by = (lease: string) => f.streams[0]!.received.find((r) => Object.values(r).some((v) => typeof v === "object" && v !== null && "lease" in v && v.lease === lease))!;
  // Drops proto-loader's virtual "_field" members naming set optional fields.
  const plain = (o: object | undefined) => Object.fromEntries(Object.entries(o ?? {}).filter(([k]) => !k.startsWith("_")));
  const json = by("1").complete!;
  assert.deepEqual([json.output.toString(), json.content_type], ['[1,"two"]', "application/json"]);
  assert.deepEqual(plain(by("2").fail), { lease: "2", message: "bad", permanent: true });
  assert.deepEqual(plain(by("3").fail), { lease: "3", message: "later", permanent: false, retry_after_s: 2.5 });
  assert.deepEqual(plain(by("4").fail), { lease: "4", message: "soon", permanent: false });
  assert.deepEqual(plain(by("5").nack), { lease: "5", reason: "busy" });
  assert.deepEqual(plain(by("6").cancelled), { lease: "6" });
  assert.deepEqual(plain(by("7").fail), { lease: "7", message: "a string", permanent: false });
  assert.equal(by("8").fail?.permanent, true);
  assert.match(by("8").fail?.message ?? "", /exceeds the server's message limit of 4096 bytes/);
  assert.deepEqual(plain(by("9").fail), { lease: "9", message: "later too", permanent: false, retry_after_s: 1.5 });
  await w.stop();
  f.stop();
});

/** A self-signed certificate for the name cronoq.test, made with the openssl command line. */
function selfSigned(): { key: Buffer; cert: Buffer } | undefined {
  const dir = mkdtempSync(join(tmpdir(), "cronoq-ts-tls-"));
  try {
    execFileSync(
      "openssl",
      ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
        "-subj", "/CN=cronoq.test", "-addext", "subjectAltName=DNS:cronoq.test",
        "-keyout", join(dir, "key.pem"), "-out", join(dir, "cert.pem")],
      { stdio: "ignore" },
    );
    return { key: readFileSync(join(dir, "key.pem")), cert: readFileSync(join(dir, "cert.pem")) };
  } catch {
    return undefined;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test("TLS with own roots and server name, and no redirect from TLS to plain http", async (t) => {
  const pem = selfSigned();
  if (!pem) return t.skip("no openssl to make a certificate");
  const f = await FakeServer.start(serveOne, pem);
  const tls = { rootCerts: pem.cert, serverName: "cronoq.test" };
  const w = start({ target: f.target, tls });
  await eventually(() => f.streams.length === 1, 5000, "the TLS stream");
  assert.equal((await f.streams[0]!.next("complete")).complete?.output.toString(), "ok");
  await w.stop();

  const down = await FakeServer.start(
    (s) => s.fail(grpc.status.FAILED_PRECONDITION, "elsewhere", { "cronoq-shard-endpoint": "http://127.0.0.1:1" }),
    pem,
  );
  await assert.rejects(start({ target: down.target, tls }).done, isCode(grpc.status.FAILED_PRECONDITION, /from TLS/));
});
