/**
 * runWorker against real sharded cronoq-server processes (docs/worker.md, "Shard redirects";
 * docs/sharding.md, "Workers"): shards a (number 1, pool "pa") and b (number 2, pool "pb"),
 * each a server with a memory store. A worker started at the shard that does not serve its
 * pool is refused with the pool's endpoint and must end up registered at the right shard.
 *
 * "Another host" is http://0.0.0.0:<b's port>: not loopback for the worker (nor for the
 * server, which forwards there only with insecure_peer_http), yet on Linux it reaches b's
 * loopback listener, so a redirect that is followed really registers, and one that is refused
 * cannot pass for a connection that merely failed.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, afterEach, before, describe, test } from "node:test";
import * as grpc from "@grpc/grpc-js";
import { connect } from "../src/index.js";
import { CronoqError, MAX_REDIRECTS, runWorker, type Logger } from "../src/node.js";
import { loadCronoq } from "../src/proto.js";
import { adminToken, clientToken, python, workerToken } from "./harness.js";

/** One [[shards]] entry and the loopback ports of its server, chosen before any starts. */
interface Shard {
  name: string;
  number: number;
  pools: string[];
  /** The endpoint's host; the server listens on 127.0.0.1 whatever it is. */
  host: string;
  grpcPort: number;
  httpPort: number;
}

const endpoint = (s: Shard): string => `http://${s.host}:${s.grpcPort}`;
const address = (s: Shard): string => `127.0.0.1:${s.grpcPort}`;

/** A loopback TCP port nobody listens on now. */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address() as { port: number };
      srv.close(() => resolve(port));
    });
  });
}

async function shard(name: string, number: number, pool: string, host = "127.0.0.1"): Promise<Shard> {
  return { name, number, pools: [pool], host, grpcPort: await freePort(), httpPort: await freePort() };
}

const auth = [
  [workerToken, "worker"],
  [clientToken, "client"],
  [adminToken, "admin"],
]
  .map(([token, role]) => `[[auth.tokens]]\ntoken = "${token}"\nrole = "${role}"\n`)
  .join("");

/** Shards a and b served by server processes; `auth` says whether they ask for tokens. */
interface Plan {
  shards: Record<"a" | "b", Shard>;
  auth: boolean;
  /** Starts shard `name`'s server (again, on the same ports) and resolves once it is ready. */
  start(name: "a" | "b"): Promise<void>;
  /** Kills shard `name`'s server and resolves once it has exited. */
  stop(name: "a" | "b"): Promise<void>;
  /** Kills every server. */
  kill(): Promise<void>;
}

/** Starts cronoq-server with the config file and resolves once it logged event=ready. */
function startServer(file: string): Promise<() => Promise<void>> {
  const child = spawn(python(), ["-m", "cronoq.server.cli", "-c", file], { stdio: ["ignore", "ignore", "pipe"] });
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const kill = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await exited;
  };
  return new Promise((resolve, reject) => {
    let buffered = "";
    let ready = false;
    // A safety net for a hung server.
    const timer = setTimeout(() => {
      void kill();
      reject(new Error(`cronoq-server ${file} not ready after 15 s:\n${buffered}`));
    }, 15_000);
    child.stderr!.setEncoding("utf8");
    child.stderr!.on("data", (chunk: string) => {
      if (ready) return;
      buffered += chunk;
      if (/event=ready/.test(buffered)) {
        ready = true;
        clearTimeout(timer);
        resolve(kill);
      }
    });
    child.once("exit", () => {
      if (ready) return;
      clearTimeout(timer);
      reject(new Error(`cronoq-server ${file} exited before it was ready:\n${buffered}`));
    });
  });
}

/**
 * Starts a server for each of a and b (at once); `server` holds more keys of [server]. Each
 * server reads the plan [a, b], or its own in `views` (holding its own shard under its name).
 */
async function startShards(
  a: Shard,
  b: Shard,
  withAuth: boolean,
  server = "",
  views: Record<"a" | "b", Shard[]> = { a: [a, b], b: [a, b] },
): Promise<Plan> {
  const py = python();
  if (!existsSync(py)) throw new Error(`no Python for cronoq-server at ${py} (set CRONOQ_PYTHON)`);
  const dir = mkdtempSync(join(tmpdir(), "cronoq-ts-shards-"));
  const files: Record<string, string> = {};
  for (const own of [a, b]) {
    const view = views[own.name as "a" | "b"];
    const tables =
      view.flatMap((s) => s.pools.map((pool) => `[[pools]]\nname = "${pool}"\nmax = 64\n`)).join("") +
      view
        .map(
          (s) =>
            `[[shards]]\nname = "${s.name}"\nnumber = ${s.number}\npools = ${JSON.stringify(s.pools)}\n` +
            `endpoint = "${endpoint(s)}"\n`,
        )
        .join("");
    files[own.name] = join(dir, `${own.name}.toml`);
    const text =
      `[server]\ngrpc_addr = "${address(own)}"\nhttp_addr = "127.0.0.1:${own.httpPort}"\nshard = "${own.name}"\n` +
      `shutdown_grace_s = 0.5\n${server}\n${withAuth ? auth : ""}\n${tables}`;
    writeFileSync(files[own.name]!, text, { mode: 0o600 });
  }
  const kills = new Map<string, () => Promise<void>>();
  const plan: Plan = {
    shards: { a, b },
    auth: withAuth,
    start: async (name) => {
      kills.set(name, await startServer(files[name]!));
    },
    stop: async (name) => {
      const kill = kills.get(name);
      kills.delete(name);
      await kill?.();
    },
    kill: async () => {
      await Promise.all([...kills.values()].map((k) => k()));
      kills.clear();
      rmSync(dir, { recursive: true, force: true });
    },
  };
  const failed = (await Promise.allSettled([plan.start("a"), plan.start("b")])).find((r) => r.status === "rejected");
  if (failed) {
    await plan.kill();
    throw failed.reason;
  }
  return plan;
}

type ListWorkersStub = grpc.Client & {
  ListWorkers(
    req: object,
    md: grpc.Metadata,
    cb: (err: grpc.ServiceError | null, res?: { workers: { name: string; pool: string }[] }) => void,
  ): void;
};

/**
 * "name/pool" of the workers connected to shard `name` itself: a forwarded call is answered
 * by the own shard alone, without the other shard's workers merged in.
 */
async function workersAt(plan: Plan, name: "a" | "b"): Promise<string[]> {
  const admin = new (loadCronoq().Admin)(address(plan.shards[name]), grpc.credentials.createInsecure()) as unknown as ListWorkersStub;
  const md = new grpc.Metadata();
  md.set("cronoq-forwarded", "1");
  if (plan.auth) md.set("authorization", `Bearer ${adminToken}`);
  try {
    const res = await new Promise<{ workers: { name: string; pool: string }[] }>((resolve, reject) =>
      admin.ListWorkers({}, md, (err, r) => (err || !r ? reject(err) : resolve(r))),
    );
    return res.workers.map((w) => `${w.name}/${w.pool}`);
  } finally {
    admin.close();
  }
}

/** A Logger that records what it is told, and lets a test wait for a message. */
class Recorder implements Logger {
  readonly entries: { level: "info" | "warn"; message: string; fields: Record<string, unknown> }[] = [];
  #waiters: (() => void)[] = [];

  info(message: string, fields: Record<string, unknown> = {}): void {
    this.#add("info", message, fields);
  }

  warn(message: string, fields: Record<string, unknown> = {}): void {
    this.#add("warn", message, fields);
  }

  #add(level: "info" | "warn", message: string, fields: Record<string, unknown>): void {
    this.entries.push({ level, message, fields });
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const w of waiters) w();
  }

  find(message: string): { level: string; fields: Record<string, unknown> }[] {
    return this.entries.filter((e) => e.message === message);
  }

  /** Resolves once `message` has been logged `n` times; rejects if `done` settles first. */
  async waitFor(message: string, done: Promise<void>, n = 1): Promise<void> {
    let ended = false;
    const end = done.then(
      () => (ended = true),
      () => (ended = true),
    );
    while (this.find(message).length < n) {
      if (ended) {
        await done; // its error, if it failed
        throw new Error(`runWorker resolved before "${message}" was logged ${n} times`);
      }
      await Promise.race([new Promise<void>((resolve) => this.#waiters.push(resolve)), end]);
    }
  }
}

/** Workers still running, stopped after each test so that a failed one leaves none behind. */
const running = new Set<() => Promise<void>>();

afterEach(async () => {
  for (const stop of running) await stop().catch(() => undefined);
  running.clear();
});

/** runWorker at shard `entry`, its logger, its promise, and a stop() that drains it. */
function startWorker(
  plan: Plan,
  entry: "a" | "b",
  pool: string,
  name: string,
  insecureRedirectHttp = false,
): { log: Recorder; done: Promise<void>; stop: () => Promise<void> } {
  const log = new Recorder();
  const controller = new AbortController();
  const done = runWorker(
    {
      target: `http://${address(plan.shards[entry])}`,
      pool,
      name,
      token: plan.auth ? workerToken : undefined,
      insecureRedirectHttp,
      logger: log,
      signal: controller.signal,
      minBackoff: 0.02,
      maxBackoff: 0.2,
      drainTimeout: 1,
    },
    (lease) => Buffer.from(lease.payload).reverse(),
  );
  // Reported where the test awaits it; this keeps an early failure from going unhandled.
  done.catch(() => undefined);
  const stop = (): Promise<void> => {
    controller.abort();
    return done;
  };
  running.add(stop);
  return { log, done, stop };
}

/**
 * A worker for `pool` started at shard `entry` is redirected once, to `home`'s endpoint,
 * registers there, and runs a task submitted through `entry`.
 */
async function servesAtTheRightShard(
  plan: Plan,
  entry: "a" | "b",
  home: "a" | "b",
  pool: string,
  name: string,
  insecureRedirectHttp = false,
): Promise<Recorder> {
  const { log, done, stop } = startWorker(plan, entry, pool, name, insecureRedirectHttp);
  await log.waitFor("cronoq worker registered", done);
  assert.deepEqual(
    log.find("cronoq worker redirected").map((e) => e.fields.endpoint),
    [endpoint(plan.shards[home])],
  );
  assert.ok((await workersAt(plan, home)).includes(`${name}/${pool}`), `shard ${home} does not list ${name}`);
  assert.ok(!(await workersAt(plan, entry)).some((w) => w.startsWith(`${name}/`)), `shard ${entry} lists ${name}`);
  await runsTask(plan, entry, pool);
  await stop();
  return log;
}

/** A task submitted to `pool` through shard `entry` succeeds with the worker's output. */
async function runsTask(plan: Plan, entry: "a" | "b", pool: string): Promise<void> {
  const client = connect(`http://${address(plan.shards[entry])}`, { token: plan.auth ? clientToken : undefined });
  try {
    const { id } = await client.submit({ pool, payload: Buffer.from(`via ${entry}`) });
    const res = await client.wait(id, 10);
    assert.equal(res.status, "succeeded", res.message);
    assert.deepEqual(res.output, Buffer.from(`via ${entry}`).reverse());
  } finally {
    client.close();
  }
}

describe("no credentials", () => {
  let plan: Plan;
  before(async () => {
    plan = await startShards(await shard("a", 1, "pa"), await shard("b", 2, "pb"), false);
  });
  after(() => plan?.kill());

  test("a worker for pb started at a serves pb at b", async () => {
    await servesAtTheRightShard(plan, "a", "b", "pb", "ts-a-to-b");
  });
  test("a worker for pa started at b serves pa at a", async () => {
    await servesAtTheRightShard(plan, "b", "a", "pa", "ts-b-to-a");
  });
});

describe("a worker token and loopback endpoints", () => {
  let plan: Plan;
  before(async () => {
    plan = await startShards(await shard("a", 1, "pa"), await shard("b", 2, "pb"), true);
  });
  after(() => plan?.kill());

  test("the token follows a redirect to a loopback http endpoint", async () => {
    await servesAtTheRightShard(plan, "a", "b", "pb", "ts-token");
  });
});

describe("a worker token and shard b on another host", () => {
  let plan: Plan;
  before(async () => {
    plan = await startShards(await shard("a", 1, "pa"), await shard("b", 2, "pb", "0.0.0.0"), true, "insecure_peer_http = true\n");
  });
  after(() => plan?.kill());

  test("the redirect to plain http is refused", async () => {
    const { log, done } = startWorker(plan, "a", "pb", "ts-refused");
    const b = endpoint(plan.shards.b);
    await assert.rejects(done, (err: unknown) => {
      assert.ok(err instanceof CronoqError, String(err));
      assert.equal(err.code, grpc.status.FAILED_PRECONDITION);
      assert.match(err.details, /would send the token over plain http to another host/);
      assert.ok(err.details.includes(`pool 'pb' is served by shard 'b' at ${b}`), err.details);
      return true;
    });
    assert.deepEqual(log.find("cronoq worker redirected"), []);
    assert.ok(!(await workersAt(plan, "b")).includes("ts-refused/pb"));
  });

  test("insecureRedirectHttp follows it, with a warning", async () => {
    const log = await servesAtTheRightShard(plan, "a", "b", "pb", "ts-insecure", true);
    assert.deepEqual(
      log.find("cronoq worker sends its token over plain http").map((e) => [e.level, e.fields.endpoint]),
      [["warn", endpoint(plan.shards.b)]],
    );
  });
});

describe("the shard a worker was sent to goes away", () => {
  let plan: Plan;
  before(async () => {
    plan = await startShards(await shard("a", 1, "pa"), await shard("b", 2, "pb"), false);
  });
  after(() => plan?.kill());

  test("the worker asks its target again, which sends it back once the shard serves", async () => {
    const { log, done, stop } = startWorker(plan, "a", "pb", "ts-back");
    await log.waitFor("cronoq worker registered", done);
    await plan.stop("b");
    // b unreachable: the worker goes back to a, which sends it to b again, and so on.
    await log.waitFor("cronoq worker redirected", done, 2);
    await plan.start("b"); // on the same port
    await log.waitFor("cronoq worker registered", done, 2);
    assert.ok((await workersAt(plan, "b")).includes("ts-back/pb"));
    await runsTask(plan, "a", "pb");
    await stop();
  });
});

describe("shards that disagree about a pool", () => {
  // a's plan says b serves pb, b's plan says a does (and gives b another pool), as during a
  // plan change rolled out halfway.
  let plan: Plan;
  before(async () => {
    const a = await shard("a", 1, "pa");
    const b = await shard("b", 2, "pb");
    plan = await startShards(a, b, false, "", {
      a: [a, b],
      b: [
        { ...a, pools: ["pa", "pb"] },
        { ...b, pools: ["pc"] },
      ],
    });
  });
  after(() => plan?.kill());

  test("runWorker gives up after MAX_REDIRECTS redirects in a row", async () => {
    const { log, done } = startWorker(plan, "a", "pb", "ts-loop");
    await assert.rejects(done, (err: unknown) => {
      assert.ok(err instanceof CronoqError, String(err));
      assert.equal(err.code, grpc.status.FAILED_PRECONDITION);
      assert.match(err.details, /4 redirects in a row/);
      assert.ok(err.details.includes(`pool 'pb' is served by shard 'a' at ${endpoint(plan.shards.a)}`), err.details);
      return true;
    });
    assert.equal(log.find("cronoq worker redirected").length, MAX_REDIRECTS);
  });
});
