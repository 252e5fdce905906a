/**
 * Runs the real cronoq-server (Python) as a subprocess for the integration tests, configured
 * from a temporary TOML file, on ephemeral ports.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import type { Logger } from "../src/worker.js";

export const clientToken = "client-token-for-the-sdk-tests-0000001";
export const workerToken = "worker-token-for-the-sdk-tests-0000001";
export const adminToken = "admin-token-for-the-sdk-tests-00000001";


/** The package root, from dist/esm/test/. */
export const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

/** The server configuration shared with the Go SDK's tests, with the gRPC address filled in. */
function config(grpcAddr: string): string {
  const template = readFileSync(join(packageRoot, "..", "testdata", "server.toml"), "utf8");
  return template.replaceAll("{grpc_addr}", grpcAddr);
}

export function python(): string {
  return process.env.CRONOQ_PYTHON || join(packageRoot, "..", "..", ".venv", "bin", "python");
}

export const quiet: Logger = { info: () => undefined, warn: () => undefined };

export interface PyServer {
  /** host:port of the gRPC listener. */
  addr: string;
  kill(): Promise<void>;
}

/** Starts cronoq-server and resolves once it logged its gRPC address and event=ready. */
export function startServer(grpcAddr = "127.0.0.1:0"): Promise<PyServer> {
  const py = python();
  if (!existsSync(py)) throw new Error(`no Python for cronoq-server at ${py} (set CRONOQ_PYTHON)`);
  const dir = mkdtempSync(join(tmpdir(), "cronoq-ts-"));
  const file = join(dir, "server.toml");
  writeFileSync(file, config(grpcAddr), { mode: 0o600 });
  const child: ChildProcess = spawn(py, ["-m", "cronoq.server.cli", "-c", file], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  const exited = new Promise<void>((res) =>
    child.once("exit", () => {
      rmSync(dir, { recursive: true, force: true });
      res();
    }),
  );
  const kill = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await exited;
  };
  return new Promise((res, rej) => {
    let addr = "";
    let ready = false;
    let buffered = "";
    const lines: string[] = [];
    const timer = setTimeout(() => {
      void kill();
      rej(new Error(`cronoq-server not ready after 15 s: ${lines.join("\n")}`));
    }, 15_000);
    child.stderr!.setEncoding("utf8");
    child.stderr!.on("data", (chunk: string) => {
      buffered += chunk;
      let nl: number;
      while ((nl = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        if (ready) continue;
        lines.push(line);
        const m = /event=listening grpc=(\S+)/.exec(line);
        if (m && !addr) addr = m[1]!;
        if (addr && /event=ready/.test(line)) {
          ready = true;
          clearTimeout(timer);
          res({ addr, kill });
        }
      }
    });
    child.once("exit", () => {
      if (!ready) {
        clearTimeout(timer);
        rej(new Error(`cronoq-server exited before it was ready: ${lines.join("\n")}`));
      }
    });
  });
}

export function delay(ms: number): Promise<void> {
  return new Promise((res) => setTimeout(res, ms));
}

/** Polls until check() is true, failing after ms. */
export async function eventually(check: () => boolean, ms = 5000, what = "condition"): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await delay(10);
  }
}
