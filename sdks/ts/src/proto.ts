/**
 * Loading cronoq.v1 from the shared cronoq.proto at run time, and the shapes of the messages
 * this SDK reads and writes. Loading the .proto instead of committing generated code keeps one
 * source of truth for the schema; the interfaces below cover only the fields the SDK uses and
 * follow proto-loader's decoding options chosen in {@link loadCronoq}. Each `Wire<Name>` type
 * is message `cronoq.v1.<Name>`; test/wire.test.ts holds them to the .proto.
 */
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

/** From dist/esm/src/ or dist/cjs/src/. */
const packageRoot = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

/**
 * The repository's shared schema comes first so that a build inside the repository always
 * speaks the current protocol; the copy made by `npm run build` serves installed packages.
 */
const protoCandidates = [
  join(packageRoot, "..", "..", "src", "cronoq", "proto", "cronoq", "v1", "cronoq.proto"),
  join(packageRoot, "proto", "cronoq.proto"),
];

/** The cronoq.v1 services as grpc-js client constructors (each also carries `.service`). */
export interface CronoqServices {
  Tasks: grpc.ServiceClientConstructor;
  Workers: grpc.ServiceClientConstructor;
  Admin: grpc.ServiceClientConstructor;
}

let loaded: CronoqServices | undefined;

/** The cronoq.proto this SDK loads. */
export function protoPath(): string {
  const path = protoCandidates.find((p) => existsSync(p));
  if (!path) {
    throw new Error(`cronoq: cronoq.proto not found (looked at ${protoCandidates.join(", ")})`);
  }
  return path;
}

/**
 * Loads the services once per process. 64-bit integers decode as decimal strings (ids use all
 * 64 bits, beyond what a JS number holds exactly), enums as numbers, bytes as Buffers; proto3
 * `optional` fields stay absent when unset, so presence survives decoding.
 */
export function loadCronoq(): CronoqServices {
  if (loaded) return loaded;
  const definition = protoLoader.loadSync(protoPath(), {
    keepCase: true,
    longs: String,
    enums: Number,
    defaults: true,
    oneofs: true,
  });
  const root = grpc.loadPackageDefinition(definition) as unknown as {
    cronoq: { v1: CronoqServices };
  };
  loaded = root.cronoq.v1;
  return loaded;
}

/** A uint64 or int64 as proto-loader decodes it (string) or accepts it (string or number). */
export type Long = string;

export interface WireTaskRef {
  id?: Long;
  key?: string;
}

export interface WireTaskSpec {
  payload: Buffer;
  content_type: string;
  kind: string;
  pool: string;
  priority: number;
  key: string;
  deadline_in_s?: number;
  start_in_s?: number;
  timeout_s?: number;
  retry?: { max_attempts: number; jitter: boolean };
  deps: { target: WireTaskRef; cond: number }[];
  resources: Record<string, number>;
  tags: Record<string, string>;
  labels: Record<string, string>;
  tenant: string;
}

export interface WireSubmitRequest {
  task: Partial<WireTaskSpec>;
}

export interface WireSubmitResponse {
  id: Long;
  duplicate: boolean;
}

export interface WireGetRequest {
  task: WireTaskRef;
}

export interface WireCancelRequest {
  task: WireTaskRef;
}

export interface WireCancelResponse {
  cancelled: boolean;
}

export interface WireWaitRequest {
  task: WireTaskRef;
  timeout_s?: number;
}

export interface WireListTasksRequest {
  pools: string[];
  statuses: number[];
  after: Long;
  limit: number;
}

export interface WireListTasksResponse {
  tasks: WireTaskInfo[];
  next_after: Long;
  unavailable_shards: string[];
}

export interface WireWatchRequest {
  pools: string[];
  ids: Long[];
  keys: string[];
  all_transitions: boolean;
}

export interface WireTaskInfo {
  id: Long;
  status: number;
  pool: string;
  key: string;
  kind: string;
  attempt: number;
  max_attempts: number;
  created_unix_ns?: Long;
  started_unix_ns?: Long;
  finished_unix_ns?: Long;
  message: string;
  output_available: boolean;
  tenant: string;
  priority: number;
}

export interface WireTaskResult {
  id: Long;
  status: number;
  output?: Buffer;
  message: string;
  output_available: boolean;
}

export interface WireStatusEvent {
  id: Long;
  pool: string;
  key: string;
  status: number;
  attempt: number;
  at_unix_ns: Long;
  message: string;
}

export interface WireLease {
  lease: Long;
  task_id: Long;
  attempt: number;
  payload: Buffer;
  content_type: string;
  kind: string;
  key: string;
  tags: Record<string, string>;
  timeout_s?: number;
  deadline_unix_ns?: Long;
  pool: string;
  priority: number;
  lease_ttl_s?: number;
}

export interface WireRegistered {
  worker_id: Long;
  lease_ttl_s?: number;
  slots: number;
  protocol_version: number;
  max_message_bytes: Long;
}

/** Server to worker; `msg` names the member that is set. */
export interface WireServerMessage {
  msg?: "registered" | "lease" | "abort" | "shutdown";
  registered?: WireRegistered;
  lease?: WireLease;
  abort?: { lease: Long; reason: string };
  shutdown?: { reason: string; not_leader: boolean };
}

/** Worker to server: exactly one member set. */
export type WireWorkerMessage =
  | {
      register: {
        pool: string;
        slots: number;
        worker_name: string;
        protocol_version: number;
        labels: Record<string, string>;
      };
    }
  | { heartbeat: { lease: Long } }
  | { complete: { lease: Long; output: Uint8Array; content_type: string } }
  | { fail: { lease: Long; message: string; permanent: boolean; retry_after_s?: number } }
  | { set_slots: { slots: number } }
  | { nack: { lease: Long; reason: string } }
  | { cancelled: { lease: Long } };
