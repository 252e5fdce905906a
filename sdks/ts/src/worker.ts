/**
 * runWorker: serves one pool over the Workers/Work stream (worker protocol v3), with slot
 * enforcement, heartbeats, aborts, reconnects, shard redirects and a graceful drain.
 */
import { isIP } from "node:net";
import { hostname } from "node:os";
import * as grpc from "@grpc/grpc-js";
import { CancelTask, CronoqError, Permanent, Reject, Retryable } from "./errors.js";
import { authMetadata, isSecure, newServiceClient, type TlsOptions } from "./connection.js";
import { loadOpenTelemetry, startRun, TRACEPARENT, TRACESTATE } from "./otel.js";
import { loadCronoq, type WireLease, type WireServerMessage, type WireWorkerMessage } from "./proto.js";
import { dateFromNs, encodeBody, priorityFromWire, type Priority } from "./types.js";

/**
 * How many shard redirects runWorker follows in a row before giving up; more means the shards
 * disagree about who serves the pool.
 */
export const MAX_REDIRECTS = 3;

const protocolVersion = 3;
/** Room for the rest of a Complete message when checking an output against the server limit. */
const messageOverhead = 1024;
/** The metadata key of a shard refusal naming the pool's shard. */
const endpointKey = "cronoq-shard-endpoint";
/** Keeps a tiny lease TTL from turning into a busy loop (ms). */
const minHeartbeatMs = 10;
/** How long a handler aborted by the drain timeout may still report its outcome (ms). */
const outcomeGraceMs = 5000;
/** Bound on the wait for the server to end the stream after the worker half-closed (ms). */
const closeWaitMs = 5000;

/** Why a lease's signal was aborted; it is the signal's `reason`. */
export class LeaseAborted extends Error {
  /**
   * "aborted": the server gave the attempt up (timeout, cancellation, lease expiry);
   * "disconnected": the stream ended, the server retries the attempt;
   * "drain timeout": the worker was stopping and drainTimeout passed.
   * Only after "drain timeout" is an outcome still reported.
   */
  readonly why: "aborted" | "disconnected" | "drain timeout";

  constructor(why: LeaseAborted["why"], detail = "") {
    super(`cronoq: lease ${why}${detail ? `: ${detail}` : ""}`);
    this.name = "LeaseAborted";
    this.why = why;
  }
}

/** One attempt of one task given to this worker. */
export interface Lease {
  /** Names the lease in the protocol; it changes with every attempt. */
  readonly id: bigint;
  /**
   * With `attempt`, a fencing token: attempt numbers never repeat for a task, also across
   * failovers, so storing the pair with a side effect lets only the newest attempt write.
   */
  readonly taskId: bigint;
  readonly attempt: number;
  readonly payload: Buffer;
  readonly contentType: string;
  readonly kind: string;
  readonly key: string;
  readonly pool: string;
  /** undefined when the server did not say. */
  readonly priority: Priority | undefined;
  readonly tags: Readonly<Record<string, string>>;
  /** The task's W3C trace context: its `traceparent` tag, undefined without one. */
  readonly traceparent: string | undefined;
  /** Its `tracestate` tag, undefined without one. */
  readonly tracestate: string | undefined;
  /** Per-attempt timeout in seconds (the server aborts the attempt then); undefined if none. */
  readonly timeout: number | undefined;
  /** The task's soft deadline, if any. */
  readonly deadline: Date | undefined;
  /** Aborted when the attempt must stop; its `reason` is a {@link LeaseAborted}. */
  readonly signal: AbortSignal;
  /** The payload parsed as JSON. */
  json<T = unknown>(): T;
  /** The payload as UTF-8 text. */
  text(): string;
}

/**
 * Runs one lease. With `@opentelemetry/api` installed and an SDK registered, it runs inside the
 * attempt's `cronoq.run` span, a child of the task's trace context, which is then the active
 * context: spans the handler starts are its children. Its result is the output: bytes as they
 * are, a string as UTF-8, undefined as empty, anything else as JSON. Throw Permanent, Retryable, Reject or CancelTask to choose
 * another outcome; any other error is a retryable failure.
 */
export type Handler = (lease: Lease) => unknown;

/** Where runWorker reports connection events; `console` fits. */
export interface Logger {
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
}

export interface WorkerOptions {
  /** The server: `http://host:port`, `https://host:port` or `host:port`. */
  target: string;
  /** The pool to serve. */
  pool: string;
  /** Leases that may run at once (default 1); the server may grant fewer. */
  slots?: number;
  /** The worker token, sent as a bearer token. */
  token?: string;
  /** Aborting it drains the worker; runWorker then resolves. */
  signal?: AbortSignal;
  /** Seconds running handlers may take to finish once `signal` aborted (default 30). */
  drainTimeout?: number;
  /** Identifies the worker in listings; default: the host name. */
  name?: string;
  /** Matched against the labels tasks require. */
  labels?: Record<string, string>;
  /**
   * Allows following a shard redirect to plain http:// on a non-loopback host although that
   * sends the token in clear text.
   */
  insecureRedirectHttp?: boolean;
  /** Forces TLS for a target without https:// (true or TLS material). */
  tls?: boolean | TlsOptions;
  /** Passed to each grpc-js channel. */
  channelOptions?: grpc.ChannelOptions;
  /**
   * Bounds of the reconnect delay in seconds, which doubles after each failed session
   * (defaults 0.2 and 10).
   */
  minBackoff?: number;
  maxBackoff?: number;
  /** Connection events; default: warnings to the console, nothing else. */
  logger?: Logger;
}

type Settings = Required<Omit<WorkerOptions, "token" | "signal" | "tls" | "channelOptions">> &
  Pick<WorkerOptions, "token" | "signal" | "tls" | "channelOptions">;

/** How one stream ended. */
interface SessionEnd {
  /** The stream's failure; undefined for a normal end. */
  error?: grpc.ServiceError;
  /** The redirect endpoint from the initial metadata or the trailers, if any. */
  redirect?: string;
  notLeader: boolean;
  registered: boolean;
}

const fatalCodes = new Set<grpc.status>([
  grpc.status.UNAUTHENTICATED,
  grpc.status.PERMISSION_DENIED,
  grpc.status.NOT_FOUND,
  grpc.status.INVALID_ARGUMENT,
  grpc.status.UNIMPLEMENTED,
  grpc.status.FAILED_PRECONDITION,
]);

const defaultLogger: Logger = {
  info: () => undefined,
  warn: (message, fields) => console.warn(message, fields ?? ""),
};

/**
 * Serves the pool until `signal` aborts, then drains: no new leases, running handlers get up to
 * drainTimeout, the rest are aborted, and the promise resolves. The stream is re-established
 * with backoff whenever it drops (at once on a leadership change). It rejects with a
 * CronoqError only for failures retrying cannot fix: a rejected token, an unknown pool, an
 * invalid registration, an unsafe or endless shard redirect.
 */
export async function runWorker(options: WorkerOptions, handler: Handler): Promise<void> {
  if (!options.target || !options.pool || typeof handler !== "function") {
    throw new TypeError("cronoq: runWorker needs a target, a pool and a handler");
  }
  const slots = options.slots ?? 1;
  if (!Number.isInteger(slots) || slots < 1) throw new RangeError("cronoq: slots must be a positive integer");
  const minBackoff = options.minBackoff && options.minBackoff > 0 ? options.minBackoff : 0.2;
  const settings: Settings = {
    ...options,
    slots,
    drainTimeout: options.drainTimeout && options.drainTimeout > 0 ? options.drainTimeout : 30,
    name: options.name || hostname(),
    labels: options.labels ?? {},
    insecureRedirectHttp: options.insecureRedirectHttp ?? false,
    minBackoff,
    maxBackoff: options.maxBackoff && options.maxBackoff >= minBackoff ? options.maxBackoff : Math.max(10, minBackoff),
    logger: options.logger ?? defaultLogger,
  };
  // Tracing needs the API at hand when a lease arrives.
  await loadOpenTelemetry();
  return new Worker(settings, handler).run();
}

class Worker {
  constructor(
    readonly s: Settings,
    readonly handler: Handler,
  ) {}

  async run(): Promise<void> {
    const { signal, target, logger } = this.s;
    let endpoint = target;
    let redirects = 0;
    let delay = this.s.minBackoff;
    while (!signal?.aborted) {
      const end = await new Session(this, endpoint).run();
      const code = end.error?.code;
      if (end.redirect !== undefined) {
        if (signal?.aborted) return;
        checkRedirect(this.s, endpoint, end.redirect, redirects, end.error?.details ?? "");
        redirects++;
        logger.info("cronoq worker redirected", { endpoint: end.redirect });
        endpoint = end.redirect;
        continue;
      }
      redirects = 0;
      if (end.error && code !== undefined && fatalCodes.has(code)) {
        throw new CronoqError(code, end.error.details, { cause: end.error });
      }
      if (signal?.aborted) return;
      // A shard we were sent to is gone: the target knows where the pool lives now.
      if (code === grpc.status.UNAVAILABLE) endpoint = target;
      if (end.registered || end.notLeader) delay = this.s.minBackoff;
      const wait = end.notLeader ? 0 : delay;
      logger.info("cronoq worker reconnecting", { after: wait, error: end.error?.message });
      await sleep(wait * 1000, signal);
      if (!end.notLeader) delay = Math.min(2 * delay, this.s.maxBackoff);
    }
  }

}

/**
 * The safety rules for a shard redirect from `current` to `target`: only http(s) URLs naming
 * a bare host and port, never from TLS down to plain text, the token over plain text only to
 * loopback unless allowed, and no endless chains. Throws the FAILED_PRECONDITION CronoqError
 * runWorker rejects with.
 */
export function checkRedirect(
  s: Pick<WorkerOptions, "token" | "tls" | "insecureRedirectHttp"> & { logger: Logger },
  current: string,
  target: string,
  redirects: number,
  cause: string,
): void {
  const refuse = (why: string): CronoqError =>
    new CronoqError(grpc.status.FAILED_PRECONDITION, `refusing shard redirect to ${JSON.stringify(target)}: ${why} (${cause})`);
  if (redirects >= MAX_REDIRECTS) throw refuse(`${redirects + 1} redirects in a row`);
  let url: URL;
  try {
    url = new URL(target);
  } catch {
    throw refuse("not an http:// or https:// endpoint");
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw refuse("not an http:// or https:// endpoint");
  if (url.username || url.password || !url.host || url.pathname.replace(/\//g, "") || url.search || url.hash) {
    throw refuse("not a plain host and port");
  }
  if (url.protocol === "http:") {
    if (isSecure(current, s.tls)) throw refuse("would move from TLS to plain http");
    if (s.token && !isLoopback(url.hostname)) {
      if (!s.insecureRedirectHttp) throw refuse("would send the token over plain http to another host");
      s.logger.warn("cronoq worker sends its token over plain http", { endpoint: target });
    }
  }
}

function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, "").toLowerCase();
  if (h === "localhost") return true;
  if (isIP(h) === 4) return h.startsWith("127.");
  if (isIP(h) === 6) return h === "::1" || /^::ffff:127\./.test(h) || /^(0+:){7}0*1$/.test(h);
  return false;
}

/** Resolves after ms, or at once when signal aborts. */
function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** One lease being handled. */
interface Run {
  lease: Lease;
  controller: AbortController;
  heartbeat: NodeJS.Timeout | undefined;
}

interface WorkStub extends grpc.Client {
  Work(metadata: grpc.Metadata): grpc.ClientDuplexStream<WireWorkerMessage, WireServerMessage>;
}

/** The state of one Work stream. */
class Session {
  readonly runs = new Map<string, Run>();
  granted: number;
  /** Lease TTL in seconds from the registration, undefined when the pool has none. */
  ttl: number | undefined;
  maxMessage = 0;
  registered = false;
  draining = false;
  /** Outcomes are no longer reported. */
  closed = false;
  /** The stream has ended. */
  over = false;
  halfClosed = false;
  notLeader = false;
  header: grpc.Metadata | undefined;
  /** Called when the server sends shutdown. */
  onShutdown: () => void = () => undefined;
  /** Called whenever runs shrink or the stream ends, to wake the drain. */
  changed: (() => void)[] = [];
  call!: grpc.ClientDuplexStream<WireWorkerMessage, WireServerMessage>;

  constructor(
    readonly w: Worker,
    readonly endpoint: string,
  ) {
    this.granted = w.s.slots;
  }

  async run(): Promise<SessionEnd> {
    const { s } = this.w;
    let stub: WorkStub;
    try {
      stub = newServiceClient(loadCronoq().Workers, this.endpoint, s, this.endpoint === s.target) as WorkStub;
    } catch (err) {
      const error = Object.assign(new Error(String(err)), {
        code: grpc.status.INVALID_ARGUMENT,
        details: err instanceof Error ? err.message : String(err),
        metadata: new grpc.Metadata(),
      });
      return { error, notLeader: false, registered: false };
    }
    try {
      this.call = stub.Work(authMetadata(s.token));
      const ended = new Promise<grpc.StatusObject>((resolve) => {
        this.call.on("status", resolve);
      });
      // Failures arrive through "status" too; without a listener "error" would throw.
      this.call.on("error", () => undefined);
      this.call.on("metadata", (md: grpc.Metadata) => (this.header = md));
      this.call.on("data", (m: WireServerMessage) => this.receive(m));
      this.send({
        register: {
          pool: s.pool,
          slots: s.slots,
          worker_name: s.name,
          protocol_version: protocolVersion,
          labels: s.labels,
        },
      });
      let draining: Promise<void> | undefined;
      const onAbort = (): void => {
        draining = this.drain();
      };
      if (s.signal?.aborted) onAbort();
      else s.signal?.addEventListener("abort", onAbort, { once: true });
      // A shutdown ends the session at once, without waiting for the server to close.
      const shutdown = new Promise<undefined>((resolve) => (this.onShutdown = () => resolve(undefined)));
      const stream = await Promise.race([ended, shutdown]);
      s.signal?.removeEventListener("abort", onAbort);
      this.over = true;
      this.abandon(new LeaseAborted("disconnected"));
      this.wake();
      await draining;
      return this.end(stream);
    } finally {
      this.call?.cancel();
      stub.close();
    }
  }

  end(stream: grpc.StatusObject | undefined): SessionEnd {
    const end: SessionEnd = { notLeader: this.notLeader, registered: this.registered };
    if (stream && stream.code !== grpc.status.OK) {
      end.error = Object.assign(new Error(`${grpc.status[stream.code]}: ${stream.details}`), {
        code: stream.code,
        details: stream.details,
        metadata: stream.metadata,
      });
      if (stream.code === grpc.status.FAILED_PRECONDITION) {
        const value = this.header?.get(endpointKey)[0] ?? stream.metadata.get(endpointKey)[0];
        if (value !== undefined) end.redirect = String(value);
      }
    }
    return end;
  }

  send(m: WireWorkerMessage): void {
    if (this.over || this.halfClosed) return;
    this.call.write(m);
  }

  receive(m: WireServerMessage): void {
    if (m.registered) {
      const r = m.registered;
      this.registered = true;
      if (r.slots > 0) this.granted = r.slots;
      this.ttl = r.lease_ttl_s ?? undefined;
      this.maxMessage = Number(r.max_message_bytes);
      this.w.s.logger.info("cronoq worker registered", { workerId: r.worker_id, slots: this.granted });
      // The drain began before the registration; stop the leases now that it can be asked.
      if (this.draining) this.send({ set_slots: { slots: 0 } });
    } else if (m.lease) {
      this.admit(m.lease);
    } else if (m.abort) {
      const r = this.runs.get(m.abort.lease);
      if (r) {
        // The server already freed the slot; so does the worker, at once.
        this.remove(m.abort.lease);
        r.controller.abort(new LeaseAborted("aborted", m.abort.reason));
      }
    } else if (m.shutdown) {
      this.w.s.logger.info("cronoq worker told to shut down", { ...m.shutdown });
      this.notLeader = m.shutdown.not_leader;
      this.onShutdown();
    }
  }

  /** Starts a lease, or hands it back when stopping or beyond the granted slots. */
  admit(m: WireLease): void {
    if (this.draining || this.closed) {
      this.send({ nack: { lease: m.lease, reason: "worker is stopping" } });
      return;
    }
    if (this.runs.size >= this.granted) {
      this.send({ nack: { lease: m.lease, reason: "worker has no free slot" } });
      return;
    }
    const controller = new AbortController();
    const payload = m.payload;
    const lease: Lease = {
      id: BigInt(m.lease),
      taskId: BigInt(m.task_id),
      attempt: m.attempt,
      payload,
      contentType: m.content_type,
      kind: m.kind,
      key: m.key,
      pool: m.pool,
      priority: priorityFromWire(m.priority),
      tags: m.tags,
      traceparent: m.tags[TRACEPARENT],
      tracestate: m.tags[TRACESTATE],
      timeout: m.timeout_s ?? undefined,
      deadline: dateFromNs(m.deadline_unix_ns),
      signal: controller.signal,
      json: <T>() => JSON.parse(payload.toString("utf8")) as T,
      text: () => payload.toString("utf8"),
    };
    const ttl = m.lease_ttl_s ?? this.ttl;
    const r: Run = { lease, controller, heartbeat: undefined };
    if (ttl !== undefined && ttl > 0) {
      r.heartbeat = setInterval(
        () => this.send({ heartbeat: { lease: m.lease } }),
        Math.max((ttl * 1000) / 3, minHeartbeatMs),
      );
    }
    this.runs.set(m.lease, r);
    void this.handle(m.lease, r);
  }

  async handle(id: string, r: Run): Promise<void> {
    let message: WireWorkerMessage;
    let error: unknown;
    const span = startRun(r.lease);
    try {
      // Through a promise, so that a handler throwing synchronously is caught the same way.
      const call = (): Promise<unknown> => Promise.resolve().then(() => this.w.handler(r.lease));
      const output = await (span ? span.with(call) : call());
      message = this.complete(id, output);
    } catch (err) {
      error = err;
      message = failure(id, err);
    }
    clearInterval(r.heartbeat);
    // Aborted or abandoned: the server has given the attempt up, nothing to report.
    if (this.closed || this.runs.get(id) !== r) {
      span?.end(undefined, error, r.lease.signal.reason);
      return;
    }
    span?.end(message, error, undefined);
    this.remove(id);
    this.send(message);
  }

  /**
   * An output too large for the server's message limit becomes a permanent failure: the server
   * would refuse the message and the attempt would only time out, and a retry would produce
   * the same output.
   */
  complete(id: string, output: unknown): WireWorkerMessage {
    const body = encodeBody(output);
    if (this.maxMessage > 0 && body.bytes.length + messageOverhead > this.maxMessage) {
      return {
        fail: {
          lease: id,
          message: `output of ${body.bytes.length} bytes exceeds the server's message limit of ${this.maxMessage} bytes`,
          permanent: true,
        },
      };
    }
    return { complete: { lease: id, output: body.bytes, content_type: body.contentType } };
  }

  remove(id: string): void {
    const r = this.runs.get(id);
    if (!r) return;
    clearInterval(r.heartbeat);
    this.runs.delete(id);
    this.wake();
  }

  wake(): void {
    const waiters = this.changed;
    this.changed = [];
    for (const f of waiters) f();
  }

  /** Stops reporting and aborts every running handler; the server retries those attempts. */
  abandon(reason: LeaseAborted): void {
    this.closed = true;
    for (const [id, r] of this.runs) {
      clearInterval(r.heartbeat);
      this.runs.delete(id);
      r.controller.abort(reason);
    }
  }

  /**
   * Stops taking leases, waits for the running ones up to drainTimeout, aborts the rest and
   * gives them outcomeGrace to report, then half-closes and waits for the server to end the
   * stream (cancelling it after closeWait).
   */
  async drain(): Promise<void> {
    this.draining = true;
    if (this.registered) this.send({ set_slots: { slots: 0 } });
    if (!(await this.waitEmpty(this.w.s.drainTimeout * 1000))) {
      for (const r of this.runs.values()) r.controller.abort(new LeaseAborted("drain timeout"));
      await this.waitEmpty(outcomeGraceMs);
    }
    this.abandon(new LeaseAborted("drain timeout"));
    if (!this.over) {
      this.halfClosed = true;
      this.call.end();
      if (!(await this.waitOver(closeWaitMs))) this.call.cancel();
    }
  }

  /** Waits until no lease runs, the stream ends or ms pass; true when none runs. */
  async waitEmpty(ms: number): Promise<boolean> {
    const deadline = Date.now() + ms;
    while (this.runs.size > 0) {
      if (this.over || Date.now() >= deadline) return false;
      await this.nextChange(deadline - Date.now());
    }
    return true;
  }

  async waitOver(ms: number): Promise<boolean> {
    const deadline = Date.now() + ms;
    while (!this.over && Date.now() < deadline) await this.nextChange(deadline - Date.now());
    return this.over;
  }

  nextChange(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      this.changed.push(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }
}

/** The outcome a thrown error asks for. */
function failure(id: string, err: unknown): WireWorkerMessage {
  const message = err instanceof Error ? err.message : String(err);
  if (err instanceof Reject) return { nack: { lease: id, reason: err.reason } };
  if (err instanceof CancelTask) return { cancelled: { lease: id } };
  if (err instanceof Permanent) return { fail: { lease: id, message, permanent: true } };
  if (err instanceof Retryable && err.retryAfter !== undefined) {
    return { fail: { lease: id, message, permanent: false, retry_after_s: err.retryAfter } };
  }
  return { fail: { lease: id, message, permanent: false } };
}
