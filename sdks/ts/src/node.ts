/**
 * @synaptiai/cronoq/node: runWorker, which needs Node's networking and timers, plus the
 * handler outcome errors so a worker module needs only this entry point.
 */
export { runWorker, LeaseAborted, MAX_REDIRECTS } from "./worker.js";
export type { Handler, Lease, Logger, WorkerOptions } from "./worker.js";
export { CancelTask, CronoqError, Permanent, Reject, Retryable } from "./errors.js";
export type { RetryableOptions } from "./errors.js";
export type { TlsOptions } from "./connection.js";
