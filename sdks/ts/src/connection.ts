/** Turning a cronoq target and credentials into a grpc-js channel. */
import * as grpc from "@grpc/grpc-js";

/** TLS material; every field is optional and the system roots apply without `rootCerts`. */
export interface TlsOptions {
  /** PEM root certificates to trust instead of the system roots. */
  rootCerts?: Buffer;
  /** PEM client certificate chain and key, for mutual TLS. */
  certChain?: Buffer;
  privateKey?: Buffer;
  /**
   * The name to verify the server's certificate against, when it differs from the target's
   * host. A worker does not use it for shard redirect endpoints, since it names the target.
   */
  serverName?: string;
}

export interface ConnectionOptions {
  /** Sent as `authorization: Bearer <token>` on every call; none when empty. */
  token?: string;
  /**
   * Forces TLS for a target without `https://` (true or TLS material). An `https://` target
   * always uses TLS.
   */
  tls?: boolean | TlsOptions;
  /** Passed to the grpc-js channel, e.g. `grpc.max_receive_message_length`. */
  channelOptions?: grpc.ChannelOptions;
}

/**
 * Strips an http://, https:// or grpc:// scheme and trailing slashes, so the URL users know
 * from the HTTP API works as a gRPC target; https:// asks for TLS.
 */
export function parseTarget(target: string): { address: string; https: boolean } {
  for (const scheme of ["http://", "https://", "grpc://"]) {
    if (target.startsWith(scheme)) {
      return { address: target.slice(scheme.length).replace(/\/+$/, ""), https: scheme === "https://" };
    }
  }
  return { address: target, https: false };
}

/** Whether calls to this target use TLS. */
export function isSecure(target: string, tls: ConnectionOptions["tls"]): boolean {
  return parseTarget(target).https || tls === true || typeof tls === "object";
}

/**
 * A client of one cronoq.v1 service. The token rides in call metadata rather than call
 * credentials because grpc-js refuses call credentials on plain-text channels, and plain http
 * to a local server is a normal setup; the worker's redirect rules keep the token from
 * leaking to other hosts.
 */
export function newServiceClient(
  service: grpc.ServiceClientConstructor,
  target: string,
  options: ConnectionOptions,
  useServerName = true,
): grpc.Client {
  const { address } = parseTarget(target);
  if (address === "") throw new TypeError("cronoq: empty target");
  const tls = typeof options.tls === "object" ? options.tls : {};
  const channelOptions: grpc.ChannelOptions = { ...options.channelOptions };
  let creds = grpc.credentials.createInsecure();
  if (isSecure(target, options.tls)) {
    creds = grpc.credentials.createSsl(tls.rootCerts ?? null, tls.privateKey ?? null, tls.certChain ?? null);
    if (tls.serverName && useServerName) channelOptions["grpc.ssl_target_name_override"] = tls.serverName;
  }
  return new service(address, creds, channelOptions);
}

/** The per-call metadata carrying the token. */
export function authMetadata(token: string | undefined): grpc.Metadata {
  const md = new grpc.Metadata();
  if (token) md.set("authorization", `Bearer ${token}`);
  return md;
}
