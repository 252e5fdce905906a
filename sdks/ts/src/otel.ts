/**
 * OpenTelemetry tracing, when the application has `@opentelemetry/api` (an optional peer
 * dependency): the client's `cronoq.submit` spans and the worker's `cronoq.run` spans, and the
 * W3C trace context that tasks carry in their `traceparent` and `tracestate` tags. The API is
 * loaded on first use with a dynamic import, which works from both builds; without it, or
 * without an SDK registered, no span is recorded and no tag added. Nothing of its types shows
 * in the package's public ones, so they hold without it.
 */
import type * as Api from "@opentelemetry/api";
import type { WireWorkerMessage } from "./proto.js";
import type { Priority } from "./types.js";

/** The tag that carries a task's W3C traceparent. */
export const TRACEPARENT = "traceparent";
/** The tag that carries a task's W3C tracestate. */
export const TRACESTATE = "tracestate";
/** The instrumentation scope of the spans. */
const tracerName = "@synaptiai/cronoq";

type OTel = typeof Api;

/** The API once loaded: null when the application does not have it. */
let api: OTel | null | undefined;
let loading: Promise<OTel | null> | undefined;

/** Loads `@opentelemetry/api` once; null when it cannot be loaded. */
export function loadOpenTelemetry(): Promise<OTel | null> {
  loading ??= import("@opentelemetry/api").then(
    (m: OTel) => (api = typeof m.trace === "object" && typeof m.SpanKind === "object" ? m : null),
    () => (api = null),
  );
  return loading;
}

/** A task id as an attribute: a number, or its decimal string beyond 2^53. */
function idAttribute(id: bigint): number | string {
  return id <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(id) : String(id);
}

function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** What the client says about a task that matters here. */
export interface TracedTask {
  pool?: string;
  kind?: string;
  tags?: Record<string, string>;
  traceparent?: string;
  tracestate?: string;
}

/**
 * The tags to send: the caller's own `traceparent` tag wins, then the task's `traceparent` and
 * `tracestate` options, then the trace context of `ctx` as the global propagator injects it.
 */
function traceTags(task: TracedTask, inject?: () => Record<string, string>): Record<string, string> {
  const tags = task.tags ?? {};
  if (Object.hasOwn(tags, TRACEPARENT)) return tags;
  let traceparent = task.traceparent;
  let tracestate = task.tracestate;
  if (!traceparent && inject) {
    const carrier = inject();
    traceparent = carrier[TRACEPARENT];
    tracestate = carrier[TRACESTATE];
  }
  if (!traceparent) return tags;
  // A copy: the caller's object may be shared between tasks.
  const out: Record<string, string> = { ...tags, [TRACEPARENT]: traceparent };
  if (tracestate) out[TRACESTATE] = tracestate;
  else delete out[TRACESTATE];
  return out;
}

/**
 * Submits through `send`, given the tags to send, inside a `cronoq.submit` span (kind
 * PRODUCER) when the API is there; the span's context is the task's trace context.
 */
export async function tracedSubmit<R extends { id: bigint }>(
  task: TracedTask,
  send: (tags: Record<string, string>) => Promise<R>,
): Promise<R> {
  const otel = await loadOpenTelemetry();
  if (!otel) return send(traceTags(task));
  const span = otel.trace.getTracer(tracerName).startSpan("cronoq.submit", {
    kind: otel.SpanKind.PRODUCER,
    attributes: { "cronoq.pool": task.pool ?? "", "cronoq.task.kind": task.kind ?? "" },
  });
  const ctx = otel.trace.setSpan(otel.context.active(), span);
  try {
    const tags = traceTags(task, () => {
      const carrier: Record<string, string> = {};
      otel.propagation.inject(ctx, carrier);
      return carrier;
    });
    const r = await otel.context.with(ctx, () => send(tags));
    span.setAttribute("cronoq.task.id", idAttribute(r.id));
    return r;
  } catch (err) {
    if (err instanceof Error) span.recordException(err);
    span.setStatus({ code: otel.SpanStatusCode.ERROR, message: errorMessage(err) });
    throw err;
  } finally {
    span.end();
  }
}

/** What the worker says about a lease that matters here. */
export interface TracedLease {
  taskId: bigint;
  kind: string;
  pool: string;
  attempt: number;
  priority: Priority | undefined;
  traceparent: string | undefined;
  tracestate: string | undefined;
}

/** The `cronoq.run` span of one attempt. */
export interface RunSpan {
  /** Runs fn with the span active, so that spans fn starts are its children. */
  with<T>(fn: () => T): T;
  /**
   * Sets `cronoq.outcome` from the message that reports the attempt (undefined when it was
   * given up and nothing is reported, `cause` saying why) and ends the span, status ERROR
   * for a failure.
   */
  end(message: WireWorkerMessage | undefined, err: unknown, cause: unknown): void;
}

/**
 * Starts the `cronoq.run` span (kind CONSUMER) of an attempt, a child of the task's trace
 * context; undefined when the API is not there. runWorker has loaded it already.
 */
export function startRun(lease: TracedLease): RunSpan | undefined {
  const otel = api;
  if (!otel) return undefined;
  let parent = otel.ROOT_CONTEXT;
  if (lease.traceparent) {
    const carrier: Record<string, string> = { [TRACEPARENT]: lease.traceparent };
    if (lease.tracestate) carrier[TRACESTATE] = lease.tracestate;
    parent = otel.propagation.extract(parent, carrier);
  }
  const attributes: Api.Attributes = {
    "cronoq.task.id": idAttribute(lease.taskId),
    "cronoq.task.kind": lease.kind,
    "cronoq.pool": lease.pool,
    "cronoq.attempt": lease.attempt,
  };
  if (lease.priority !== undefined) attributes["cronoq.priority"] = lease.priority;
  const span = otel.trace
    .getTracer(tracerName)
    .startSpan("cronoq.run", { kind: otel.SpanKind.CONSUMER, attributes }, parent);
  const ctx = otel.trace.setSpan(parent, span);
  return {
    with: (fn) => otel.context.with(ctx, fn),
    end(message, err, cause) {
      const [outcome, failed] = outcomeOf(message);
      span.setAttribute("cronoq.outcome", outcome);
      if (failed) {
        const reported = message && "fail" in message ? message.fail.message : "attempt given up";
        const why = (message ? err : cause) ?? reported;
        if (message && err instanceof Error) span.recordException(err);
        span.setStatus({ code: otel.SpanStatusCode.ERROR, message: errorMessage(why) });
      }
      span.end();
    },
  };
}

/**
 * The `cronoq.outcome` of the message that reports an attempt: succeeded, failed
 * (retryable), failed_permanent, cancelled (CancelTask), rejected (Reject), or aborted for
 * none; and whether the attempt failed.
 */
function outcomeOf(m: WireWorkerMessage | undefined): [string, boolean] {
  if (!m) return ["aborted", true];
  if ("complete" in m) return ["succeeded", false];
  if ("fail" in m) return m.fail.permanent ? ["failed_permanent", true] : ["failed", true];
  if ("cancelled" in m) return ["cancelled", false];
  if ("nack" in m) return ["rejected", false];
  return ["aborted", true];
}
