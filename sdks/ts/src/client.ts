/** The Tasks client: submit, inspect, wait for, cancel, list and watch tasks. */
import * as grpc from "@grpc/grpc-js";
import { CronoqError, toCronoqError } from "./errors.js";
import { tracedSubmit } from "./otel.js";
import {
  authMetadata,
  newServiceClient,
  type ConnectionOptions,
} from "./connection.js";
import {
  loadCronoq,
  type WireCancelRequest,
  type WireCancelResponse,
  type WireGetRequest,
  type WireListTasksRequest,
  type WireListTasksResponse,
  type WireStatusEvent,
  type WireSubmitRequest,
  type WireSubmitResponse,
  type WireTaskInfo,
  type WireTaskResult,
  type WireTaskSpec,
  type WireWaitRequest,
  type WireWatchRequest,
} from "./proto.js";
import {
  dateFromNs,
  encodeBody,
  idToWire,
  priorityFromWire,
  priorityToWire,
  refToString,
  refToWire,
  statusFromWire,
  statusToWire,
  type Priority,
  type Status,
  type TaskRef,
} from "./types.js";

/**
 * Added to a wait's timeout for the call's own deadline, so that the server's answer
 * (DEADLINE_EXCEEDED with its message) normally arrives before the client gives up.
 */
const waitMargin = 5;

/** When a dependency lets its dependent run. */
export type Cond = "on_success" | "on_complete" | "on_failure";

const conds: readonly Cond[] = ["on_success", "on_complete", "on_failure"];

export interface Dep {
  task: TaskRef;
  /** Default "on_success". */
  cond?: Cond;
}

/**
 * Everything a client says about a task. Omitted fields mean "not given": the server's or the
 * pool's default applies. Durations are in seconds, as on the wire.
 */
export interface Task {
  /**
   * Handed to the worker unchanged: bytes as they are, a string as UTF-8, any other value as
   * JSON (and contentType then defaults to application/json).
   */
  payload?: unknown;
  contentType?: string;
  /** Free-form task type, for workers and listings. */
  kind?: string;
  /** Target pool; the server's default pool when omitted. */
  pool?: string;
  /** Idempotency key: a live or retained key returns the existing task (`duplicate`). */
  key?: string;
  /** Fair-share tenant. */
  tenant?: string;
  /** Default "normal", sent explicitly. */
  priority?: Priority;
  /** Bound on each attempt. */
  timeout?: number;
  /** Soft deadline relative to submission; urgency rises as it nears. */
  deadline?: number;
  /** Delays the start by this much. */
  startIn?: number;
  /** Tasks this one depends on. */
  after?: Dep[];
  /** Amount needed of each named resource. */
  resources?: Record<string, number>;
  /** User metadata handed to the worker. */
  tags?: Record<string, string>;
  /**
   * The task's W3C trace context, set explicitly: the tags `traceparent` and `tracestate`
   * unless `tags` has a `traceparent` of its own. Omitted: the active OpenTelemetry context's,
   * when `@opentelemetry/api` is installed (see `Client.submit`).
   */
  traceparent?: string;
  tracestate?: string;
  /** Worker labels the task needs: it runs only on workers that have them all. */
  labels?: Record<string, string>;
  /** Replaces the pool's retry policy with this many attempts and the server's backoff. */
  maxAttempts?: number;
}

export interface Submitted {
  id: bigint;
  /** The key named an existing task; `id` is that task's. */
  duplicate: boolean;
}

export interface TaskInfo {
  id: bigint;
  status: Status;
  pool: string;
  key: string;
  kind: string;
  tenant: string;
  /** undefined when the server does not know it. */
  priority: Priority | undefined;
  /** The latest attempt's number, 0 before the first. */
  attempt: number;
  /** 0 when unknown. */
  maxAttempts: number;
  created: Date | undefined;
  started: Date | undefined;
  finished: Date | undefined;
  /** The last error or status message. */
  message: string;
  /** The output is still held and `wait` can return it. */
  outputAvailable: boolean;
}

export interface Result {
  id: bigint;
  status: Status;
  /**
   * undefined unless the task succeeded and its output is still held; an empty output is an
   * empty Buffer.
   */
  output: Buffer | undefined;
  message: string;
  outputAvailable: boolean;
}

export interface ListOptions extends CallOptions {
  pools?: string[];
  statuses?: Status[];
  /** The previous page's `nextAfter`; omit for the first page. */
  after?: bigint;
  /** Page size; the server's default when omitted. */
  limit?: number;
}

export interface TaskPage {
  tasks: TaskInfo[];
  /** Cursor for the next page; 0n on the last page. */
  nextAfter: bigint;
  /** Shards that did not answer; their tasks are missing from the page. */
  unavailableShards: string[];
}

export interface WatchOptions {
  pools?: string[];
  ids?: (bigint | number)[];
  keys?: string[];
  /** Every status change, not only the terminal ones. */
  allTransitions?: boolean;
  /** Ends the watch quietly when aborted. */
  signal?: AbortSignal;
}

export interface Event {
  id: bigint;
  pool: string;
  key: string;
  status: Status;
  attempt: number;
  at: Date;
  message: string;
}

/** Per-call options. */
export interface CallOptions {
  /**
   * Cancels the call; it then rejects with `signal.reason`, as `fetch` does: the reason given to
   * `abort(reason)`, or the "AbortError" DOMException when none was given.
   */
  signal?: AbortSignal;
}

export interface WaitOptions extends CallOptions {
  /**
   * Seconds to wait at most; when they pass first, `wait` rejects with a CronoqError whose
   * `timeout` is true, and the task goes on. Without it the server's maximum wait applies.
   */
  timeout?: number;
}

type Unary<Req, Res> = (
  request: Req,
  metadata: grpc.Metadata,
  options: grpc.CallOptions,
  callback: (err: grpc.ServiceError | null, response?: Res) => void,
) => grpc.ClientUnaryCall;

/** The generated-at-run-time Tasks methods this client calls. */
interface TasksStub extends grpc.Client {
  Submit: Unary<WireSubmitRequest, WireSubmitResponse>;
  Get: Unary<WireGetRequest, WireTaskInfo>;
  Cancel: Unary<WireCancelRequest, WireCancelResponse>;
  Wait: Unary<WireWaitRequest, WireTaskResult>;
  ListTasks: Unary<WireListTasksRequest, WireListTasksResponse>;
  Watch: (request: WireWatchRequest, metadata: grpc.Metadata) => grpc.ClientReadableStream<WireStatusEvent>;
}

/**
 * Calls the Tasks service of one cronoq server; safe to share. Nothing is dialled until the
 * first call.
 */
export class Client {
  readonly #stub: TasksStub;
  readonly #token: string | undefined;

  /**
   * `target` is `http://host:port` (plain text), `https://host:port` (TLS) or a gRPC target
   * such as `host:port`.
   */
  constructor(target: string, options: ConnectionOptions = {}) {
    this.#stub = newServiceClient(loadCronoq().Tasks, target, options) as TasksStub;
    this.#token = options.token;
  }

  /** Closes the channel; calls in flight fail with CANCELLED. */
  close(): void {
    this.#stub.close();
  }

  /**
   * Submits one task. It carries a W3C trace context in its tags `traceparent` and
   * `tracestate`: the caller's own `traceparent` tag wins, then the task's `traceparent` and
   * `tracestate` options, then the active OpenTelemetry context. With `@opentelemetry/api`
   * installed and an SDK registered, the call runs in a `cronoq.submit` span (kind PRODUCER;
   * attributes `cronoq.pool`, `cronoq.task.kind`, `cronoq.task.id`) and the task's trace
   * context is that span's. Otherwise no span is recorded and no tag added.
   */
  async submit(task: Task, options: CallOptions = {}): Promise<Submitted> {
    return tracedSubmit(task, async (tags) => {
      const r = await this.#unary(this.#stub.Submit, { task: { ...taskToWire(task), tags } }, options);
      return { id: BigInt(r.id), duplicate: r.duplicate };
    });
  }

  /** The current state of a task. */
  async get(ref: TaskRef, options: CallOptions = {}): Promise<TaskInfo> {
    return taskInfo(await this.#unary(this.#stub.Get, { task: refToWire(ref) }, options));
  }

  /** Cancels a task; false when it had already ended. */
  async cancel(ref: TaskRef, options: CallOptions = {}): Promise<boolean> {
    return (await this.#unary(this.#stub.Cancel, { task: refToWire(ref) }, options)).cancelled;
  }

  /**
   * Waits until the task ends. With `timeout` (seconds) the wait is bounded: when it passes
   * first this rejects with a CronoqError whose `timeout` is true, and the task goes on.
   * Without it the server's maximum wait applies.
   */
  wait(ref: TaskRef, options?: WaitOptions): Promise<Result>;
  /** The earlier form, `timeout` positional; it keeps working. */
  wait(ref: TaskRef, timeout?: number, options?: CallOptions): Promise<Result>;
  async wait(ref: TaskRef, second?: number | WaitOptions, third: CallOptions = {}): Promise<Result> {
    const options = typeof second === "object" ? second : third;
    const timeout = typeof second === "object" ? second.timeout : second;
    const request: WireWaitRequest = { task: refToWire(ref) };
    let deadline: Date | undefined;
    if (timeout !== undefined && timeout > 0) {
      request.timeout_s = timeout;
      deadline = new Date(Date.now() + (timeout + waitMargin) * 1000);
    }
    try {
      const r = await this.#unary(this.#stub.Wait, request, options, deadline);
      return {
        id: BigInt(r.id),
        status: statusFromWire(r.status),
        output: r.output ?? undefined,
        message: r.message,
        outputAvailable: r.output_available,
      };
    } catch (err) {
      if (err instanceof CronoqError && err.timeout && err !== options.signal?.reason) {
        throw new CronoqError(err.code, `task ${refToString(ref)} is still running after ${timeout} s`, { cause: err });
      }
      throw err;
    }
  }

  /** One page of tasks, ordered by id; feed `nextAfter` back as `after` for the next. */
  list(options?: ListOptions): Promise<TaskPage>;
  /** The earlier form, `signal` in a second object; it keeps working. */
  list(options: ListOptions, call: CallOptions): Promise<TaskPage>;
  async list(options: ListOptions = {}, call: CallOptions = {}): Promise<TaskPage> {
    const r = await this.#unary(
      this.#stub.ListTasks,
      {
        pools: options.pools ?? [],
        statuses: (options.statuses ?? []).map(statusToWire),
        after: options.after === undefined ? "0" : idToWire(options.after),
        limit: options.limit ?? 0,
      },
      { signal: call.signal ?? options.signal },
    );
    return {
      tasks: r.tasks.map(taskInfo),
      nextAfter: BigInt(r.next_after),
      unavailableShards: r.unavailable_shards,
    };
  }

  /**
   * Status events as they happen (terminal ones unless `allTransitions`). The stream opens on
   * the first `next()` and closes when the loop ends. It ends quietly when `signal` aborts or
   * the server closes it normally; any other failure is thrown as a CronoqError (e.g.
   * `retryable` when the server shuts down, DATA_LOSS when the consumer fell too far behind).
   */
  async *watch(options: WatchOptions = {}): AsyncGenerator<Event, void, undefined> {
    const { signal } = options;
    if (signal?.aborted) return;
    const call = this.#stub.Watch(
      {
        pools: options.pools ?? [],
        ids: (options.ids ?? []).map(idToWire),
        keys: options.keys ?? [],
        all_transitions: options.allTransitions ?? false,
      },
      authMetadata(this.#token),
    );
    const onAbort = (): void => call.cancel();
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      for await (const ev of call as AsyncIterable<WireStatusEvent>) {
        yield {
          id: BigInt(ev.id),
          pool: ev.pool,
          key: ev.key,
          status: statusFromWire(ev.status),
          attempt: ev.attempt,
          at: dateFromNs(ev.at_unix_ns) ?? new Date(0),
          message: ev.message,
        };
      }
    } catch (err) {
      const e = toCronoqError(err);
      if (e.code === grpc.status.CANCELLED || signal?.aborted) return;
      throw e;
    } finally {
      signal?.removeEventListener("abort", onAbort);
      call.cancel();
    }
  }

  /** An aborted signal rejects at once with its reason and cancels the call on the wire. */
  #unary<Req, Res>(
    method: Unary<Req, Res>,
    request: Req,
    { signal }: CallOptions,
    deadline?: Date,
  ): Promise<Res> {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      const callOptions: grpc.CallOptions = deadline ? { deadline } : {};
      const call = method.call(this.#stub, request, authMetadata(this.#token), callOptions, (err, res) => {
        signal?.removeEventListener("abort", onAbort);
        if (err || res === undefined) reject(toCronoqError(err));
        else resolve(res);
      });
      const onAbort = (): void => {
        reject(signal?.reason);
        call.cancel();
      };
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }
}

/** Returns a Client for target; the same as `new Client(target, options)`. */
export function connect(target: string, options: ConnectionOptions = {}): Client {
  return new Client(target, options);
}

function taskToWire(t: Task): Partial<WireTaskSpec> {
  const body = encodeBody(t.payload);
  const spec: Partial<WireTaskSpec> = {
    payload: Buffer.from(body.bytes),
    content_type: t.contentType ?? body.contentType,
    kind: t.kind ?? "",
    pool: t.pool ?? "",
    key: t.key ?? "",
    tenant: t.tenant ?? "",
    priority: priorityToWire(t.priority),
    resources: t.resources ?? {},
    tags: t.tags ?? {},
    labels: t.labels ?? {},
    deps: (t.after ?? []).map((d) => ({
      target: refToWire(d.task),
      cond: conds.indexOf(d.cond ?? "on_success") + 1,
    })),
  };
  if (t.timeout !== undefined) spec.timeout_s = t.timeout;
  if (t.deadline !== undefined) spec.deadline_in_s = t.deadline;
  if (t.startIn !== undefined) spec.start_in_s = t.startIn;
  // Zero backoff fields ask for the server's defaults; jitter matches the default policy.
  if (t.maxAttempts !== undefined) spec.retry = { max_attempts: t.maxAttempts, jitter: true };
  return spec;
}

function taskInfo(m: WireTaskInfo): TaskInfo {
  return {
    id: BigInt(m.id),
    status: statusFromWire(m.status),
    pool: m.pool,
    key: m.key,
    kind: m.kind,
    tenant: m.tenant,
    priority: priorityFromWire(m.priority),
    attempt: m.attempt,
    maxAttempts: m.max_attempts,
    created: dateFromNs(m.created_unix_ns),
    started: dateFromNs(m.started_unix_ns),
    finished: dateFromNs(m.finished_unix_ns),
    message: m.message,
    outputAvailable: m.output_available,
  }
}
