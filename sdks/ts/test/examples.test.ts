/**
 * The README's two programs are examples/worker.ts and examples/client.ts, word for word, and
 * they work: the worker and the client run as their own Node processes against the real
 * server, importing the package by its name.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { clientToken, packageRoot, startServer, workerToken, type PyServer } from "./harness.js";

let server: PyServer;

before(async () => {
  server = await startServer();
});

after(async () => {
  await server.kill();
});

const examples = ["worker", "client"];

test("the README shows each example program in full", () => {
  const readme = readFileSync(join(packageRoot, "README.md"), "utf8");
  for (const name of examples) {
    const source = readFileSync(join(packageRoot, "examples", `${name}.ts`), "utf8");
    assert.ok(readme.includes("```ts\n" + source + "```\n"), `README.md lacks examples/${name}.ts as a ts block`);
  }
});

interface Program {
  /** Resolves with the exit code and the output once the process ended. */
  exited: Promise<{ code: number | null; signal: string | null; stdout: string; stderr: string }>;
  stop(): void;
}

/** Runs the compiled example with the server's address and a token in its environment. */
function program(name: string, token: string): Program {
  const child = spawn(process.execPath, [join(packageRoot, "dist", "esm", "examples", `${name}.js`)], {
    env: { ...process.env, CRONOQ_TARGET: `http://${server.addr}`, CRONOQ_TOKEN: token },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout.setEncoding("utf8").on("data", (s: string) => (stdout += s));
  child.stderr.setEncoding("utf8").on("data", (s: string) => (stderr += s));
  const exited = new Promise<Awaited<Program["exited"]>>((resolve) =>
    child.once("close", (code, signal) => resolve({ code, signal, stdout, stderr })),
  );
  return { exited, stop: () => child.kill("SIGTERM") };
}

test("the worker runs the client's task, and stops on SIGTERM", async () => {
  const worker = program("worker", workerToken);
  try {
    // The client waits for the task, so it ends once the worker has run it.
    const client = await program("client", clientToken).exited;
    assert.equal(client.code, 0, client.stderr);
    assert.match(client.stdout, /^task \d+\n\{"greeting":"Hello, Ada!"\}\n$/);

    // Run again, the key finds the finished task and its output.
    const again = await program("client", clientToken).exited;
    assert.equal(again.code, 0, again.stderr);
    assert.equal(again.stdout, client.stdout.replace("\n", " (submitted before)\n"));
  } finally {
    worker.stop();
  }
  const stopped = await worker.exited;
  assert.deepEqual([stopped.code, stopped.signal], [0, null], stopped.stderr);
  assert.equal(stopped.stdout, "worker stopped\n");
});
