/**
 * A scripted stand-in for the Workers service on 127.0.0.1:0, for what the real server cannot
 * be made to do on demand: shard redirects, leadership changes, chosen TTLs and grants.
 */
import * as grpc from "@grpc/grpc-js";
import { loadCronoq, type WireServerMessage } from "../src/proto.js";

/** A worker message as the fake receives it: `msg` names the member that is set. */
export interface Received {
  msg: "register" | "heartbeat" | "complete" | "fail" | "set_slots" | "nack" | "cancelled";
  register?: { pool: string; slots: number; worker_name: string; protocol_version: number; labels: Record<string, string> };
  heartbeat?: { lease: string };
  complete?: { lease: string; output: Buffer; content_type: string };
  fail?: { lease: string; message: string; permanent: boolean; retry_after_s?: number };
  set_slots?: { slots: number };
  nack?: { lease: string; reason: string };
  cancelled?: { lease: string };
  /** When it arrived (Date.now()). */
  at: number;
}

type Call = grpc.ServerDuplexStream<Received, WireServerMessage>;

/** One Work stream on the fake server. */
export class FakeStream {
  readonly received: Received[] = [];
  readonly openedAt = Date.now();
  closed = false;
  #waiters: (() => void)[] = [];

  constructor(readonly call: Call) {
    call.on("data", (m: Received) => {
      this.received.push({ ...m, at: Date.now() });
      this.#wake();
    });
    const close = (): void => {
      this.closed = true;
      this.#wake();
    };
    // Like the real server, answer the worker's half-close by ending the stream.
    call.on("end", () => {
      if (!this.closed) call.end();
      close();
    });
    call.on("cancelled", close);
    call.on("error", close);
  }

  #wake(): void {
    const w = this.#waiters;
    this.#waiters = [];
    for (const f of w) f();
  }

  /** The first message of this kind (after `from` messages), waiting up to ms for it. */
  async next(kind: Received["msg"], ms = 5000, from = 0): Promise<Received> {
    const deadline = Date.now() + ms;
    for (;;) {
      const m = this.received.slice(from).find((r) => r.msg === kind);
      if (m) return m;
      if (this.closed || Date.now() > deadline) throw new Error(`no ${kind} message (got ${this.kinds()})`);
      await new Promise<void>((res) => {
        const t = setTimeout(res, deadline - Date.now());
        this.#waiters.push(() => {
          clearTimeout(t);
          res();
        });
      });
    }
  }

  /** Waits until the worker ends the stream. */
  async closedByWorker(ms = 5000): Promise<void> {
    const deadline = Date.now() + ms;
    while (!this.closed) {
      if (Date.now() > deadline) throw new Error("the worker did not close the stream");
      await new Promise((r) => setTimeout(r, 10));
    }
  }

  kinds(): string {
    return this.received.map((r) => r.msg).join(",");
  }

  send(m: WireServerMessage): void {
    this.call.write(m);
  }

  registered(slots: number, ttl?: number, maxMessage = 0): void {
    this.send({
      registered: { worker_id: "7", slots, protocol_version: 3, max_message_bytes: String(maxMessage), lease_ttl_s: ttl },
    });
  }

  lease(id: number, payload = "", ttl?: number): void {
    this.send({
      lease: {
        lease: String(id),
        task_id: String(1000 + id),
        attempt: 1,
        payload: Buffer.from(payload),
        content_type: "",
        kind: "",
        key: "",
        tags: {},
        pool: "p",
        priority: 3,
        lease_ttl_s: ttl,
      },
    });
  }

  /** Ends the stream with a status; `header` goes out as initial metadata first. */
  fail(code: grpc.status, details: string, trailer: Record<string, string> = {}, header: Record<string, string> = {}): void {
    if (Object.keys(header).length > 0) this.call.sendMetadata(metadata(header));
    this.call.emit("error", { code, details, metadata: metadata(trailer) });
  }

  end(): void {
    if (!this.closed) this.call.end();
  }
}

function metadata(values: Record<string, string>): grpc.Metadata {
  const md = new grpc.Metadata();
  for (const [k, v] of Object.entries(values)) md.set(k, v);
  return md;
}

/** A Workers server whose every stream is handed to `script`. */
export class FakeServer {
  /** Servers not yet stopped, for stopAll. */
  static readonly #live = new Set<FakeServer>();
  readonly streams: FakeStream[] = [];

  private constructor(
    readonly server: grpc.Server,
    readonly port: number,
    readonly tls: boolean,
  ) {}

  get target(): string {
    return `${this.tls ? "https" : "http"}://127.0.0.1:${this.port}`;
  }

  /** tls: PEM key and certificate to serve https:// instead of plain http://. */
  static async start(
    script: (s: FakeStream, index: number) => void | Promise<void>,
    tls?: { key: Buffer; cert: Buffer },
  ): Promise<FakeServer> {
    const server = new grpc.Server();
    let fake: FakeServer | undefined;
    server.addService(loadCronoq().Workers.service, {
      Work: (call: Call) => {
        const s = new FakeStream(call);
        fake!.streams.push(s);
        void Promise.resolve(script(s, fake!.streams.length - 1)).catch((err: unknown) =>
          s.fail(grpc.status.INTERNAL, String(err)),
        );
      },
    });
    const port = await new Promise<number>((res, rej) =>
      server.bindAsync(
        "127.0.0.1:0",
        tls
          ? grpc.ServerCredentials.createSsl(null, [{ private_key: tls.key, cert_chain: tls.cert }])
          : grpc.ServerCredentials.createInsecure(),
        (err, p) => (err ? rej(err) : res(p)),
      ),
    );
    fake = new FakeServer(server, port, tls !== undefined);
    FakeServer.#live.add(fake);
    return fake;
  }

  stop(): void {
    FakeServer.#live.delete(this);
    this.server.forceShutdown();
  }

  /** Stops every server still running, after a test that failed before stopping its own. */
  static stopAll(): void {
    for (const f of FakeServer.#live) f.stop();
  }
}
