// Copies the shared cronoq.proto into the package (proto/cronoq.proto), so a packed or
// published package carries the schema it was built against. Inside the repository the SDK
// can also read the shared file directly; see src/proto.ts.
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const source = join(root, "..", "..", "src", "cronoq", "proto", "cronoq", "v1", "cronoq.proto");
mkdirSync(join(root, "proto"), { recursive: true });
copyFileSync(source, join(root, "proto", "cronoq.proto"));
