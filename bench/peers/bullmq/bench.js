// bench/peers.py's BullMQ side: one queue on the Redis server at --port.
//
//   node bench.js worker --port P [--concurrency 64] [--every 100]
//     one Worker with a no-op processor; prints "ready" once connected, "completed=K at=T"
//     each time its count of completed jobs reaches a multiple of --every, and on SIGTERM
//     (after closing the worker) "starts=S:E ..." for every job that carried a submit time.
//   node bench.js bulk --port P --n N [--batch 1000]
//     prints "start=T", adds N jobs with Queue.addBulk in batches, prints "added=N at=T".
//   node bench.js rate --port P --rate R --seconds S
//     adds R*S jobs one at a time at fixed times (each add not awaited before the next is
//     due), each job's data {t: its submit time}; prints "submitted=N seconds=S".
//
// Every time T, S and E is process.hrtime (CLOCK_MONOTONIC, one clock for every process of
// the machine) in seconds, so that the worker's start times and the producer's submit times
// can be subtracted.
import { Queue, Worker } from "bullmq";

const QUEUE = "bench";

function args() {
  const [mode, ...rest] = process.argv.slice(2);
  const opts = { concurrency: 64, every: 100, batch: 1000 };
  for (let i = 0; i < rest.length; i += 2) {
    opts[rest[i].replace(/^--/, "")] = Number(rest[i + 1]);
  }
  return { mode, opts };
}

const now = () => Number(process.hrtime.bigint()) / 1e9;

async function worker({ port, concurrency, every }) {
  const starts = [];
  let completed = 0;
  const w = new Worker(
    QUEUE,
    async (job) => {
      if (job.data.t) starts.push([job.data.t, now()]);
    },
    { connection: { host: "127.0.0.1", port }, concurrency },
  );
  w.on("completed", () => {
    completed += 1;
    if (completed % every === 0) console.log(`completed=${completed} at=${now().toFixed(6)}`);
  });
  w.on("error", (e) => console.error(e));
  await w.waitUntilReady();
  console.log("ready");
  process.on("SIGTERM", async () => {
    await w.close();
    console.log("starts=" + starts.map(([s, e]) => `${s.toFixed(6)}:${e.toFixed(6)}`).join(" "));
    process.exit(0);
  });
}

async function bulk({ port, n, batch }) {
  const q = new Queue(QUEUE, { connection: { host: "127.0.0.1", port } });
  await q.waitUntilReady();
  const jobs = Array.from({ length: batch }, () => ({ name: "noop", data: {} }));
  console.log(`start=${now().toFixed(6)}`);
  for (let i = 0; i < n; i += batch) {
    await q.addBulk(jobs.slice(0, Math.min(batch, n - i)));
  }
  console.log(`added=${n} at=${now().toFixed(6)}`);
  await q.close();
}

async function rate({ port, rate, seconds }) {
  const q = new Queue(QUEUE, { connection: { host: "127.0.0.1", port } });
  await q.waitUntilReady();
  const n = Math.floor(rate * seconds + 0.5);
  const pending = [];
  const t0 = now();
  for (let i = 0; i < n; i++) {
    const wait = t0 + i / rate - now();
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait * 1000));
    pending.push(q.add("noop", { t: now() }));
  }
  await Promise.all(pending);
  console.log(`submitted=${n} seconds=${(now() - t0).toFixed(6)}`);
  await q.close();
}

const { mode, opts } = args();
const modes = { worker, bulk, rate };
if (!modes[mode]) {
  console.error("usage: node bench.js worker|bulk|rate --port P ...");
  process.exit(2);
}
await modes[mode](opts);
