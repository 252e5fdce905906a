/**
 * The package as users get it: `npm pack`, installed into a new project, then loaded with
 * `import` and with `require`, both entry points, and type-checked from an ES module and from
 * a CommonJS file. Run after `npm run build`, which makes what is packed.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { after, before, test } from "node:test";
import { packageRoot } from "./harness.js";

const run = promisify(execFile);
/** npm and tsc are slow on a busy machine; this bounds a stuck one, it is no expectation. */
const timeout = 300_000;

let dir: string;
let project: string;
let packed: string[];

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "cronoq-ts-pack-"));
  project = join(dir, "project");
  mkdirSync(project);
  const { stdout } = await run("npm", ["pack", "--json", "--pack-destination", dir], { cwd: packageRoot });
  const [info] = JSON.parse(stdout) as { filename: string; files: { path: string }[] }[];
  packed = info!.files.map((f) => f.path);
  writeFileSync(join(project, "package.json"), JSON.stringify({ name: "consumer", private: true }));
  // The dependencies come from npm's cache when `npm ci` has filled it, else from the registry.
  await run(
    "npm",
    ["install", join(dir, info!.filename), "--prefer-offline", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
    { cwd: project },
  );
}, { timeout });

after(() => rmSync(dir, { recursive: true, force: true }));

test("the tarball holds both builds, their types and the schema, but no tests", { timeout }, () => {
  for (const path of [
    "dist/esm/src/index.js",
    "dist/esm/src/index.d.ts",
    "dist/esm/src/node.js",
    "dist/cjs/package.json",
    "dist/cjs/src/index.js",
    "dist/cjs/src/index.d.ts",
    "dist/cjs/src/node.js",
    "proto/cronoq.proto",
  ]) {
    assert.ok(packed.includes(path), `${path} is not packed`);
  }
  assert.deepEqual(packed.filter((p) => /^(src|test|examples|scripts)\/|\/test\//.test(p)), []);
});

/**
 * What a consumer sees of the package: the named exports, one CronoqError class for both
 * entry points, and a failing call (nothing listens on port 1; constructing the client reads
 * the packed cronoq.proto) rejecting with that class and the grpc-js error as cause.
 */
const probe = `
  const main = load("@synaptiai/cronoq");
  const node = load("@synaptiai/cronoq/node");
  const client = new main.Client("127.0.0.1:1");
  let failure;
  let submitFailure;
  try {
    await client.get(1);
  } catch (err) {
    failure = err;
  }
  // Without @opentelemetry/api (an optional peer dependency, not installed here) a submit
  // works as before: it fails only for want of a server.
  try {
    await client.submit({ pool: "p" });
  } catch (err) {
    submitFailure = err;
  } finally {
    client.close();
  }
  let otelApi = true;
  try {
    resolve("@opentelemetry/api");
  } catch {
    otelApi = false;
  }
  return {
    resolved: resolve("@synaptiai/cronoq"),
    client: typeof main.Client,
    connect: typeof main.connect,
    cronoqError: typeof main.CronoqError,
    isDone: typeof main.isDone,
    runWorker: typeof node.runWorker,
    sameErrorClass: node.CronoqError === main.CronoqError && node.Permanent === main.Permanent,
    failureIsCronoqError: failure instanceof main.CronoqError,
    failureCode: failure?.code,
    failureHasCause: failure?.cause instanceof Error,
    submitFailureCode: submitFailure?.code,
    otelApi,
  };
`;

async function node(file: string, code: string): Promise<Record<string, unknown>> {
  writeFileSync(join(project, file), code);
  const { stdout } = await run(process.execPath, [file], { cwd: project });
  return JSON.parse(stdout) as Record<string, unknown>;
}

const expected = {
  client: "function",
  connect: "function",
  cronoqError: "function",
  isDone: "function",
  runWorker: "function",
  sameErrorClass: true,
  failureIsCronoqError: true,
  failureCode: 14, // UNAVAILABLE
  failureHasCause: true,
  submitFailureCode: 14,
  otelApi: false,
};

test("import loads the ES module build", { timeout }, async () => {
  const got = await node(
    "esm.mjs",
    `import { createRequire } from "node:module";
    import * as mainNs from "@synaptiai/cronoq";
    import * as nodeNs from "@synaptiai/cronoq/node";
    const namespaces = { "@synaptiai/cronoq": mainNs, "@synaptiai/cronoq/node": nodeNs };
    const load = (name) => namespaces[name];
    const resolve = (name) => import.meta.resolve(name);
    const result = await (async () => { ${probe} })();
    // The dual-package hazard, as documented: require() in the same process gets other classes.
    result.otherFormatShares = createRequire(import.meta.url)("@synaptiai/cronoq").CronoqError === mainNs.CronoqError;
    console.log(JSON.stringify(result));`,
  );
  const { resolved, otherFormatShares, ...rest } = got;
  assert.match(String(resolved), /node_modules\/@synaptiai\/cronoq\/dist\/esm\/src\/index\.js$/);
  assert.deepEqual(rest, expected);
  assert.equal(otherFormatShares, false);
});

test("require loads the CommonJS build", { timeout }, async () => {
  const got = await node(
    "cjs.cjs",
    `const load = (name) => require(name);
    const resolve = (name) => require.resolve(name);
    (async () => { ${probe} })().then((result) => console.log(JSON.stringify(result)));`,
  );
  const { resolved, ...rest } = got;
  assert.match(String(resolved), /node_modules\/@synaptiai\/cronoq\/dist\/cjs\/src\/index\.js$/);
  assert.deepEqual(rest, expected);
});

test("TypeScript finds the types of each format", { timeout }, async () => {
  const usage = `
    import { Client, CronoqError, connect, type WaitOptions } from "@synaptiai/cronoq";
    import { Permanent, runWorker, type Lease } from "@synaptiai/cronoq/node";
    const client: Client = connect("127.0.0.1:1");
    const options: WaitOptions = { timeout: 1 };
    export const waited = client.wait(1n, options);
    export const error: CronoqError = new CronoqError(14, "down", { cause: new Error("x") });
    export const handler = (lease: Lease): string => {
      if (lease.attempt > 3) throw new Permanent("too many");
      return lease.text();
    };
    export const worker: typeof runWorker = runWorker;
  `;
  writeFileSync(join(project, "usage.mts"), usage);
  writeFileSync(join(project, "usage.cts"), usage);
  const tsc = join(packageRoot, "node_modules", "typescript", "bin", "tsc");
  const types = join(packageRoot, "node_modules", "@types");
  const { stdout } = await run(
    process.execPath,
    [tsc, "--noEmit", "--listFiles", "--strict", "--skipLibCheck", "--module", "nodenext", "--target", "es2022",
      "--typeRoots", types, "--types", "node", "usage.mts", "usage.cts"],
    { cwd: project },
  ).catch((err: { stdout?: string }) => assert.fail(`tsc failed:\n${err.stdout}`));
  for (const format of ["esm", "cjs"]) {
    for (const entry of ["index", "node"]) {
      const file = `node_modules/@synaptiai/cronoq/dist/${format}/src/${entry}.d.ts`;
      assert.ok(stdout.split("\n").some((line) => line.endsWith(file)), `${file} not used:\n${stdout}`);
    }
  }
});
