/**
 * The hand-written wire types of src/proto.ts against cronoq.proto, the counterpart of the Go
 * SDK's stubs check: each `Wire<Name>` interface or type alias must match message
 * `cronoq.v1.<Name>` in every field it declares (name, type, repeated or map, presence), so a
 * field renamed, retyped or removed on either side fails here instead of decoding as
 * undefined at run time. Field numbers need no check: proto-loader encodes with the .proto
 * itself, and the TypeScript types name fields only.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import protobuf from "protobufjs";
import ts from "typescript";
import { protoPath } from "../src/proto.js";
import { packageRoot } from "./harness.js";

/** The TypeScript spelling of each scalar, under the decoding options of loadCronoq. */
const scalars: Record<string, string> = {
  double: "number",
  float: "number",
  int32: "number",
  uint32: "number",
  sint32: "number",
  fixed32: "number",
  sfixed32: "number",
  int64: "Long",
  uint64: "Long",
  sint64: "Long",
  fixed64: "Long",
  sfixed64: "Long",
  bool: "boolean",
  string: "string",
  bytes: "Buffer | Uint8Array",
};

/** A message's name without protobufjs's leading dot. */
const full = (t: protobuf.ReflectionObject): string => t.fullName.replace(/^\./, "");

/** Every mismatch between the Wire types in `source` and the messages of `root`. */
function mismatches(source: string, root: protobuf.Root): { checked: string[]; problems: string[] } {
  const file = ts.createSourceFile("proto.ts", source, ts.ScriptTarget.ES2022, true);
  const checked: string[] = [];
  const problems: string[] = [];
  const text = (node: ts.Node): string => node.getText(file);

  const checkMembers = (path: string, members: ts.NodeArray<ts.TypeElement>, message: protobuf.Type): void => {
    for (const member of members) {
      if (!ts.isPropertySignature(member) || !member.type) {
        problems.push(`${path}: ${text(member)} is not a field`);
        continue;
      }
      const name = member.name.getText(file);
      const where = `${path}.${name}`;
      const field = message.fields[name];
      const oneof = message.oneofs?.[name];
      if (!field && oneof) {
        // proto-loader's `oneofs: true` names the member that is set in a virtual field.
        const literals = ts.isUnionTypeNode(member.type) ? member.type.types : [member.type];
        const names = literals.map((t) => (ts.isLiteralTypeNode(t) && ts.isStringLiteral(t.literal) ? t.literal.text : text(t)));
        if (names.sort().join() !== [...oneof.oneof].sort().join()) {
          problems.push(`${where}: oneof ${oneof.name} of ${full(message)} has ${oneof.oneof.join(", ")}, declared ${names.join(" | ")}`);
        }
        continue;
      }
      if (!field) {
        problems.push(`${where}: ${full(message)} has no field ${name}`);
        continue;
      }
      field.resolve();
      const isMessage = field.resolvedType instanceof protobuf.Type && !field.map;
      // A scalar decodes as undefined only when it has presence (proto3 optional or a oneof).
      if (!isMessage && !field.repeated && !field.map && (field.partOf !== null) !== (member.questionToken !== undefined)) {
        problems.push(
          `${where}: field ${field.id} is ${field.partOf ? "optional" : "always present"} in ${full(message)}, ` +
            `declared ${member.questionToken ? "optional" : "required"}`,
        );
      }
      checkType(where, member.type, field);
    }
  };

  const checkType = (where: string, node: ts.TypeNode, field: protobuf.Field): void => {
    if (field instanceof protobuf.MapField) {
      const args = ts.isTypeReferenceNode(node) && text(node.typeName) === "Record" ? node.typeArguments ?? [] : [];
      if (args.length !== 2 || scalars[field.keyType] !== text(args[0]!)) {
        problems.push(`${where}: map<${field.keyType}, ${field.type}> declared ${text(node)}`);
        return;
      }
      checkElement(where, args[1]!, field);
    } else if (field.repeated) {
      if (!ts.isArrayTypeNode(node)) problems.push(`${where}: repeated ${field.type} declared ${text(node)}`);
      else checkElement(where, node.elementType, field);
    } else {
      checkElement(where, node, field);
    }
  };

  const checkElement = (where: string, node: ts.TypeNode, field: protobuf.Field): void => {
    const resolved = field.resolvedType;
    if (resolved instanceof protobuf.Enum) {
      // Enums decode as numbers (`enums: Number`).
      if (text(node) !== "number") problems.push(`${where}: enum ${resolved.name} declared ${text(node)}`);
    } else if (resolved instanceof protobuf.Type) {
      if (ts.isTypeLiteralNode(node)) return checkMembers(where, node.members, resolved);
      const named = text(node).replace(/^Partial<(.*)>$/, "$1");
      // A named Wire type is checked on its own; it must stand for this field's message.
      if (named !== `Wire${resolved.name}`) problems.push(`${where}: message ${full(resolved)} declared ${text(node)}`);
    } else {
      const expected = scalars[field.type];
      if (!expected?.split(" | ").includes(text(node))) {
        problems.push(`${where}: ${field.type} (declared as ${expected}) declared ${text(node)}`);
      }
    }
  };

  for (const statement of file.statements) {
    if (!ts.isInterfaceDeclaration(statement) && !ts.isTypeAliasDeclaration(statement)) continue;
    const name = statement.name.text;
    if (!name.startsWith("Wire")) continue;
    checked.push(name);
    const message = root.lookup(`cronoq.v1.${name.slice("Wire".length)}`);
    if (!(message instanceof protobuf.Type)) {
      problems.push(`${name}: cronoq.proto has no message cronoq.v1.${name.slice("Wire".length)}`);
      continue;
    }
    if (ts.isInterfaceDeclaration(statement)) {
      checkMembers(name, statement.members, message);
      continue;
    }
    // A type alias is an object type or, for a oneof with one member set, a union of them.
    const arms = ts.isUnionTypeNode(statement.type) ? statement.type.types : [statement.type];
    for (const arm of arms) {
      if (ts.isTypeLiteralNode(arm)) checkMembers(name, arm.members, message);
      else problems.push(`${name}: ${text(arm)} is not an object type`);
    }
  }
  return { checked, problems };
}

const source = readFileSync(join(packageRoot, "src", "proto.ts"), "utf8");
const schema = readFileSync(protoPath(), "utf8");
function parse(proto: string): protobuf.Root {
  const { root } = protobuf.parse(proto, { keepCase: true });
  root.resolveAll();
  return root;
}

/** `source` with `from` replaced by `to` inside the declaration of `name`. */
function edit(name: string, from: string, to: string, text = source): string {
  const start = text.search(new RegExp(`export (interface|type) ${name}\\b`));
  const end = text.indexOf("\n}", start);
  assert.ok(start >= 0 && text.slice(start, end).includes(from), `${name} has no ${from}`);
  return text.slice(0, start) + text.slice(start, end).replace(from, to) + text.slice(end);
}

test("every Wire type of src/proto.ts matches its message in cronoq.proto", () => {
  const { checked, problems } = mismatches(source, parse(schema));
  assert.deepEqual(problems, []);
  for (const name of ["WireTaskSpec", "WireTaskInfo", "WireLease", "WireServerMessage", "WireWorkerMessage", "WireWatchRequest"]) {
    assert.ok(checked.includes(name), `${name} was not checked (checked: ${checked.join(", ")})`);
  }
});

test("the check catches renamed, retyped, missing and misdeclared fields", () => {
  const root = parse(schema);
  const cases: [string, string, RegExp][] = [
    [edit("WireTaskSpec", "content_type: string", "media_type: string"), "renamed", /WireTaskSpec\.media_type: cronoq\.v1\.TaskSpec has no field media_type/],
    [edit("WireStatusEvent", "attempt: number", "attempt: Long"), "retyped", /WireStatusEvent\.attempt: uint32/],
    [edit("WireLease", "timeout_s?: number", "timeout_s: number"), "presence", /WireLease\.timeout_s: field 9 is optional/],
    [edit("WireTaskInfo", "tenant: string", "tenant?: string"), "presence", /WireTaskInfo\.tenant: field 13 is always present/],
    [edit("WireListTasksResponse", "tasks: WireTaskInfo[]", "tasks: WireTaskInfo"), "repeated", /WireListTasksResponse\.tasks: repeated TaskInfo/],
    [edit("WireTaskSpec", "tags: Record<string, string>", "tags: Record<string, number>"), "map value", /WireTaskSpec\.tags: string/],
    [edit("WireWorkerMessage", "worker_name: string", "workerName: string"), "nested", /WireWorkerMessage\.register\.workerName: cronoq\.v1\.Register has no field/],
    [edit("WireServerMessage", '"shutdown"', '"shutdown" | "bye"'), "oneof", /WireServerMessage\.msg: oneof msg/],
    [edit("WireTaskSpec", "deps: { target: WireTaskRef", "deps: { target: WireTaskInfo"), "message", /WireTaskSpec\.deps\.target: message cronoq\.v1\.TaskRef/],
    [source.replace("export interface WireRegistered ", "export interface WireRegistration "), "message name", /WireRegistration: cronoq\.proto has no message/],
  ];
  for (const [edited, what, expected] of cases) {
    const { problems } = mismatches(edited, root);
    assert.ok(problems.some((p) => expected.test(p)), `${what}: ${problems.join("; ") || "no problem found"}`);
  }
  // And from the other side: a field renamed or removed in the .proto.
  const renamed = parse(schema.replace("string worker_name = 3;", "string name = 3;"));
  assert.ok(mismatches(source, renamed).problems.some((p) => /register\.worker_name: cronoq\.v1\.Register has no field/.test(p)));
  const retyped = parse(schema.replace("uint32 attempt = 6;", "uint64 attempt = 6;"));
  assert.ok(mismatches(source, retyped).problems.some((p) => /WireTaskInfo\.attempt: uint64/.test(p)));
});
