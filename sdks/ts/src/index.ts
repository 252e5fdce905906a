/**
 * @synaptiai/cronoq: a client for cronoq-server's cronoq.v1 gRPC API. Workers live in
 * `@synaptiai/cronoq/node`.
 */
export { Client, connect } from "./client.js";
export type {
  CallOptions,
  Cond,
  Dep,
  Event,
  ListOptions,
  Result,
  Submitted,
  Task,
  TaskInfo,
  TaskPage,
  WaitOptions,
  WatchOptions,
} from "./client.js";
export type { ConnectionOptions, TlsOptions } from "./connection.js";
export { CancelTask, CronoqError, Permanent, Reject, Retryable } from "./errors.js";
export type { RetryableOptions } from "./errors.js";
export { isDone } from "./types.js";
export type { Priority, Status, TaskRef } from "./types.js";
