/** Task-level types shared by the client and the worker, and their wire conversions. */
import type { Long, WireTaskRef } from "./proto.js";

/** Priority classes, most urgent first. */
export type Priority = "critical" | "high" | "normal" | "low";

const priorities: readonly Priority[] = ["critical", "high", "normal", "low"];

/** The wire enum: PRIORITY_CRITICAL is 1; an omitted priority is sent as normal explicitly. */
export function priorityToWire(p: Priority | undefined): number {
  return priorities.indexOf(p ?? "normal") + 1;
}

/** undefined for PRIORITY_UNSPECIFIED (0), which the server sends when it does not know. */
export function priorityFromWire(n: number): Priority | undefined {
  return priorities[n - 1];
}

/** Where a task is in its life cycle; "succeeded" and everything after it are terminal. */
export type Status =
  | "blocked"
  | "scheduled"
  | "ready"
  | "running"
  | "retrying"
  | "succeeded"
  | "failed"
  | "dead_lettered"
  | "cancelled"
  | "skipped"
  | "missed"
  | "shed";

const statuses: readonly Status[] = [
  "blocked",
  "scheduled",
  "ready",
  "running",
  "retrying",
  "succeeded",
  "failed",
  "dead_lettered",
  "cancelled",
  "skipped",
  "missed",
  "shed",
];

/** True for the terminal statuses: the task will not change any more. */
export function isDone(s: Status): boolean {
  return statuses.indexOf(s) >= statuses.indexOf("succeeded");
}

export function statusToWire(s: Status): number {
  const i = statuses.indexOf(s);
  if (i < 0) throw new TypeError(`cronoq: unknown status ${JSON.stringify(s)}`);
  return i + 1;
}

/**
 * A status number from a newer server than this SDK knows stays visible as its number instead
 * of failing the call.
 */
export function statusFromWire(n: number): Status {
  return statuses[n - 1] ?? (`status_${n}` as Status);
}

/**
 * Names a task: its id (a bigint, since ids use all 64 bits; a safe-integer number is accepted
 * too) or `{ key }`, its idempotency key.
 */
export type TaskRef = bigint | number | { key: string };

export function refToWire(ref: TaskRef): WireTaskRef {
  if (typeof ref === "object") return { key: ref.key };
  return { id: idToWire(ref) };
}

export function refToString(ref: TaskRef): string {
  return typeof ref === "object" ? JSON.stringify(ref.key) : String(ref);
}

/** Ids go out as decimal strings, the form proto-loader accepts for 64-bit fields. */
export function idToWire(id: bigint | number): Long {
  if (typeof id === "number" && !Number.isSafeInteger(id)) {
    throw new TypeError(`cronoq: task id ${id} is not a safe integer; pass a bigint`);
  }
  if (id < 0) throw new RangeError(`cronoq: task id ${id} is negative`);
  return String(id);
}

/** Nanosecond timestamps lose their sub-millisecond part in a Date. */
export function dateFromNs(ns: Long | undefined): Date | undefined {
  return ns === undefined || ns === null ? undefined : new Date(Number(BigInt(ns) / 1_000_000n));
}

export interface EncodedBody {
  bytes: Uint8Array;
  /** The content type implied by the value: JSON for structured values, none otherwise. */
  contentType: string;
}

/**
 * Bytes pass unchanged, a string goes out as UTF-8, undefined as empty, and anything else as
 * JSON, which is what a handler's `lease.json()` on the other side expects.
 */
export function encodeBody(value: unknown): EncodedBody {
  if (value === undefined) return { bytes: new Uint8Array(0), contentType: "" };
  if (value instanceof Uint8Array) return { bytes: value, contentType: "" };
  if (typeof value === "string") return { bytes: Buffer.from(value, "utf8"), contentType: "" };
  return { bytes: Buffer.from(JSON.stringify(value), "utf8"), contentType: "application/json" };
}
