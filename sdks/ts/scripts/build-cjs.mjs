// Builds the CommonJS copy of the package (dist/cjs) from the same sources as the ES module
// build (dist/esm), which `tsc -p tsconfig.json` has already type-checked. Each file is
// transpiled on its own (tsconfig.json sets isolatedModules, so that is safe) and the ES
// build's declarations are reused: they describe the same exports. The one thing CommonJS
// lacks is import.meta.url, which becomes the equivalent file URL of __filename.
import { copyFileSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const src = join(root, "src");
const esm = join(root, "dist", "esm", "src");
const out = join(root, "dist", "cjs", "src");

/** import.meta.url → require("node:url").pathToFileURL(__filename).href; other import.meta uses fail the build. */
function importMetaUrl(context) {
  const f = context.factory;
  const visit = (node) => {
    if (ts.isMetaProperty(node) && node.keywordToken === ts.SyntaxKind.ImportKeyword) {
      throw new Error("build-cjs: only import.meta.url has a CommonJS equivalent here");
    }
    if (
      ts.isPropertyAccessExpression(node) &&
      ts.isMetaProperty(node.expression) &&
      node.expression.keywordToken === ts.SyntaxKind.ImportKeyword &&
      node.name.text === "url"
    ) {
      const url = f.createCallExpression(f.createIdentifier("require"), undefined, [f.createStringLiteral("node:url")]);
      const fileUrl = f.createCallExpression(f.createPropertyAccessExpression(url, "pathToFileURL"), undefined, [
        f.createIdentifier("__filename"),
      ]);
      return f.createPropertyAccessExpression(fileUrl, "href");
    }
    return ts.visitEachChild(node, visit, context);
  };
  return (file) => ts.visitNode(file, visit);
}

mkdirSync(out, { recursive: true });
// dist/cjs is CommonJS whatever the package's "type" says, for Node and for TypeScript.
writeFileSync(join(root, "dist", "cjs", "package.json"), `${JSON.stringify({ type: "commonjs" }, null, 2)}\n`);
for (const name of readdirSync(src).filter((n) => n.endsWith(".ts"))) {
  const base = name.slice(0, -".ts".length);
  const { outputText, diagnostics } = ts.transpileModule(readFileSync(join(src, name), "utf8"), {
    fileName: name,
    reportDiagnostics: true,
    compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2022, esModuleInterop: true },
    transformers: { before: [importMetaUrl] },
  });
  if (diagnostics?.length) {
    throw new Error(ts.formatDiagnostics(diagnostics, ts.createCompilerHost({})));
  }
  writeFileSync(join(out, `${base}.js`), outputText);
  copyFileSync(join(esm, `${base}.d.ts`), join(out, `${base}.d.ts`));
}
