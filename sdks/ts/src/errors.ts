/**
 * The error a failed call rejects with, and the error classes a worker handler throws to pick
 * the outcome reported for its lease.
 */
import { status as Status, type ServiceError } from "@grpc/grpc-js";

/**
 * A failed call: the gRPC status code and the server's message; `cause` holds the error it was
 * made from (usually grpc-js's), when there was one.
 */
export class CronoqError extends Error {
  /** The gRPC status code (`status` of `@grpc/grpc-js`). */
  readonly code: Status;
  /** The server's message, without the code prefix of `message`. */
  readonly details: string;

  constructor(code: Status, details: string, options?: ErrorOptions) {
    super(`cronoq: ${Status[code] ?? code}: ${details}`, options);
    this.name = "CronoqError";
    this.code = code;
    this.details = details;
  }

  /**
   * The call ran out of time. For `wait` it means the task is still running: waiting again is
   * the remedy, the task itself is unaffected.
   */
  get timeout(): boolean {
    return this.code === Status.DEADLINE_EXCEEDED;
  }

  /**
   * The same call may succeed later unchanged: no leader or shutting down (UNAVAILABLE), or a
   * full queue (RESOURCE_EXHAUSTED).
   */
  get retryable(): boolean {
    return this.code === Status.UNAVAILABLE || this.code === Status.RESOURCE_EXHAUSTED;
  }

  /**
   * The task, pool or dependency does not exist, or the token may not see it: the server
   * reports both the same way on purpose.
   */
  get notFound(): boolean {
    return this.code === Status.NOT_FOUND;
  }
}

/** Narrows grpc-js's call errors, which are plain Errors with a numeric `code`. */
function isServiceError(err: unknown): err is ServiceError {
  return err instanceof Error && typeof (err as Partial<ServiceError>).code === "number";
}

/** Turns whatever a grpc-js call rejected with into a CronoqError, so callers get one type. */
export function toCronoqError(err: unknown): CronoqError {
  if (err instanceof CronoqError) return err;
  if (isServiceError(err)) return new CronoqError(err.code, err.details, { cause: err });
  return new CronoqError(Status.UNKNOWN, err instanceof Error ? err.message : String(err), { cause: err });
}

/** Thrown by a handler: the task fails without using its remaining attempts. */
export class Permanent extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "Permanent";
  }
}

export interface RetryableOptions extends ErrorOptions {
  /** Seconds the next attempt waits at least. */
  retryAfter?: number;
}

/**
 * Thrown by a handler: a retryable failure whose next attempt starts no sooner than
 * `retryAfter` seconds (for example an upstream's Retry-After). A longer pool backoff still
 * wins.
 */
export class Retryable extends Error {
  readonly retryAfter: number | undefined;

  /** `new Retryable(message, { retryAfter, cause })`. */
  constructor(message: string, options?: RetryableOptions);
  /** The earlier form, `retryAfter` positional; it keeps working. */
  constructor(message: string, retryAfter?: number, options?: ErrorOptions);
  constructor(message: string, second?: number | RetryableOptions, third?: ErrorOptions) {
    const options = typeof second === "object" ? second : third;
    super(message, options);
    this.name = "Retryable";
    this.retryAfter = typeof second === "object" ? second.retryAfter : second;
  }
}

/**
 * Thrown by a handler: hands the lease back unrun so another worker of the pool gets the same
 * attempt (no attempt is used). When no other worker can take it, the server counts a
 * retryable failure.
 */
export class Reject extends Error {
  readonly reason: string;

  constructor(reason = "rejected by the handler") {
    super(`rejected: ${reason}`);
    this.name = "Reject";
    this.reason = reason;
  }
}

/**
 * Thrown by a handler: ends the task as cancelled, for work that became pointless rather than
 * failed. The reason stays local (logs); the protocol does not carry it.
 */
export class CancelTask extends Error {
  constructor(reason: string) {
    super(`task cancelled by the handler: ${reason}`);
    this.name = "CancelTask";
  }
}
