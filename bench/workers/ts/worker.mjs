// The TypeScript side of bench/workers.py: a worker of one pool that completes every lease at
// once, through the SDK's runWorker (--mode sdk) or straight on grpc-js with the loaded
// schema (--mode raw, the baseline that shows what the SDK adds). Run after the SDK's
// `npm ci && npm run build` in sdks/ts, whose node_modules it borrows.
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const sdk = join(repo, "sdks", "ts");
const { values } = parseArgs({
  options: {
    mode: { type: "string", default: "raw" },
    target: { type: "string" },
    pool: { type: "string", default: "default" },
    slots: { type: "string", default: "64" },
  },
});
const slots = Number(values.slots);
const stop = new AbortController();
process.on("SIGTERM", () => stop.abort());

if (values.mode === "sdk") {
  const { runWorker } = await import(pathToFileURL(join(sdk, "dist", "esm", "src", "node.js")).href);
  await runWorker(
    { target: values.target, pool: values.pool, slots, name: "bench-ts-sdk", signal: stop.signal },
    () => undefined,
  );
} else {
  const require = createRequire(join(sdk, "package.json"));
  const grpc = require("@grpc/grpc-js");
  const loader = require("@grpc/proto-loader");
  const def = loader.loadSync(join(repo, "src", "cronoq", "proto", "cronoq", "v1", "cronoq.proto"), {
    keepCase: true,
    longs: String,
    enums: Number,
    defaults: false,
    oneofs: true,
  });
  const { Workers } = grpc.loadPackageDefinition(def).cronoq.v1;
  const client = new Workers(values.target, grpc.credentials.createInsecure());
  const call = client.Work();
  stop.signal.addEventListener("abort", () => call.cancel());
  call.write({ register: { pool: values.pool, slots, worker_name: "bench-ts-raw", protocol_version: 3 } });
  call.on("data", (m) => {
    if (m.lease) call.write({ complete: { lease: m.lease.lease } });
    else if (m.registered) console.log(`registered slots=${m.registered.slots}`);
    else if (m.shutdown) call.end();
  });
  await new Promise((resolve) => {
    call.on("error", resolve);
    call.on("end", resolve);
  });
  client.close();
}
