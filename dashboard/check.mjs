// Compiles into a temporary directory and fails if the output differs from the committed files.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const out = mkdtempSync(join(tmpdir(), "cronoq-ui-"));
try {
  execFileSync(process.execPath, ["node_modules/typescript/bin/tsc", "-p", ".", "--outDir", out], { stdio: "inherit" });
  const committed = "../src/cronoq/server/ui";
  let bad = 0;
  for (const name of readdirSync(out)) {
    let old = null;
    try { old = readFileSync(join(committed, name), "utf8"); } catch { old = null; }
    if (old !== readFileSync(join(out, name), "utf8")) { console.error(`differs from the build: ${name}`); bad++; }
  }
  if (bad) { console.error("run `npm run build` and commit the output"); process.exit(1); }
  console.log("build output up to date");
} finally {
  rmSync(out, { recursive: true, force: true });
}
