// A worker for the "default" pool: it greets whoever a task names, until SIGTERM or Ctrl-C.
import { Permanent, runWorker } from "@synaptiai/cronoq/node";

const stop = new AbortController();
process.once("SIGTERM", () => stop.abort());
process.once("SIGINT", () => stop.abort());

await runWorker(
  {
    target: process.env.CRONOQ_TARGET ?? "http://127.0.0.1:7070",
    token: process.env.CRONOQ_TOKEN,
    pool: "default",
    slots: 4,
    signal: stop.signal,
  },
  async (lease) => {
    const { name } = lease.json<{ name?: string }>();
    // Retrying would not help a task without a name: fail it for good.
    if (!name) throw new Permanent("the payload names nobody");
    return { greeting: `Hello, ${name}!` };
  },
);
// runWorker resolves once the handlers running at the signal have finished.
console.log("worker stopped");
