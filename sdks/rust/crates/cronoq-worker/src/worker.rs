//! Running a remote worker: [`run_worker`] and its [`WorkerOptions`].

mod endpoint;
mod session;
#[cfg(test)]
mod tests;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

use crate::{Lease, TaskError};
use endpoint::Target;
use session::SessionEnd;

/// How many shard redirects are followed in a row; more means the shards disagree about who
/// serves the pool.
pub const MAX_REDIRECTS: u32 = 3;

/// Worker settings: [`WorkerOptions::new`] and the builder methods, or the fields directly.
#[derive(Clone)]
pub struct WorkerOptions {
    /// The server's gRPC endpoint: `http://host:port` or `https://host:port`.
    pub endpoint: String,
    /// The pool to serve.
    pub pool: String,
    /// Leases run at once (default 1); the server may grant fewer.
    pub slots: u32,
    /// Bearer token of role `worker`.
    pub token: Option<String>,
    /// The worker's name in the server's listings.
    pub name: String,
    /// TLS settings; they need an `https://` endpoint, which without them verifies the server
    /// with the system's roots.
    pub tls: Option<WorkerTls>,
    /// Reconnect when the stream ends (default true); when false the first end is an error.
    pub reconnect: bool,
    /// First reconnect delay (200 ms); it doubles after every session that failed.
    pub initial_backoff: Duration,
    /// Longest reconnect delay (10 s).
    pub max_backoff: Duration,
    /// How long running handlers may finish once `shutdown` resolved (30 s).
    pub drain_timeout: Duration,
    /// Largest message accepted from the server (16 MiB, the server's default limit).
    pub max_message_bytes: usize,
    /// Labels of this worker: a task that requires labels runs only on workers with all of them.
    pub labels: Vec<(String, String)>,
    /// Follow a shard redirect to plain `http://` on another host although that sends the
    /// token in clear text; only for trusted networks.
    pub insecure_redirect_http: bool,
}

impl WorkerOptions {
    pub fn new(endpoint: impl Into<String>, pool: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            pool: pool.into(),
            slots: 1,
            token: None,
            name: String::new(),
            tls: None,
            reconnect: true,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(30),
            max_message_bytes: 16 << 20,
            labels: Vec::new(),
            insecure_redirect_http: false,
        }
    }

    pub fn slots(mut self, slots: u32) -> Self {
        self.slots = slots;
        self
    }

    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    pub fn tls(mut self, tls: WorkerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Adds one label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.push((key.into(), value.into()));
        self
    }

    pub fn reconnect(mut self, reconnect: bool) -> Self {
        self.reconnect = reconnect;
        self
    }

    pub fn initial_backoff(mut self, delay: Duration) -> Self {
        self.initial_backoff = delay;
        self
    }

    pub fn max_backoff(mut self, delay: Duration) -> Self {
        self.max_backoff = delay;
        self
    }

    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    pub fn max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message_bytes = bytes;
        self
    }

    pub fn insecure_redirect_http(mut self, allow: bool) -> Self {
        self.insecure_redirect_http = allow;
        self
    }
}

impl fmt::Debug for WorkerOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerOptions")
            .field("endpoint", &self.endpoint)
            .field("pool", &self.pool)
            .field("slots", &self.slots)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("name", &self.name)
            .field("tls", &self.tls)
            .field("reconnect", &self.reconnect)
            .field("initial_backoff", &self.initial_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("drain_timeout", &self.drain_timeout)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("labels", &self.labels)
            .field("insecure_redirect_http", &self.insecure_redirect_http)
            .finish()
    }
}

/// TLS settings of an `https://` endpoint.
#[derive(Clone, Default)]
pub struct WorkerTls {
    /// PEM CA that verifies the server, instead of the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate chain and key, for mTLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Name to verify the server's certificate against, instead of the endpoint's host. Not
    /// used for shard redirects, since it names the configured server.
    pub domain: Option<String>,
}

impl fmt::Debug for WorkerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerTls")
            .field("ca_pem", &self.ca_pem.as_ref().map(|_| "<pem>"))
            .field("identity", &self.identity.as_ref().map(|_| "<redacted>"))
            .field("domain", &self.domain)
            .finish()
    }
}

/// Why [`run_worker`] gave up: only what retrying cannot fix.
#[derive(Debug)]
#[non_exhaustive]
pub enum WorkerError {
    /// The options cannot work (an endpoint that is not `http(s)://host:port`, TLS settings
    /// with `http://`, no slots, a token that is no valid header value).
    Options(String),
    /// The server refused the worker: a rejected token (`UNAUTHENTICATED`), a credential that
    /// may not serve the pool (`PERMISSION_DENIED`), an unknown pool (`NOT_FOUND`), an invalid
    /// registration, or no worker service.
    Refused(Status),
    /// A shard redirect that the safety rules refuse, or one redirect too many.
    Redirect {
        endpoint: String,
        reason: String,
        status: Status,
    },
    /// The stream ended and [`WorkerOptions::reconnect`] is off; `None` for a normal end.
    Disconnected(Option<Status>),
}

impl WorkerError {
    /// The gRPC code behind the error: `INVALID_ARGUMENT` for options, `FAILED_PRECONDITION`
    /// for redirects, `UNAVAILABLE` for a normal end of the stream.
    pub fn code(&self) -> Code {
        match self {
            Self::Options(_) => Code::InvalidArgument,
            Self::Refused(status) | Self::Disconnected(Some(status)) => status.code(),
            Self::Redirect { .. } => Code::FailedPrecondition,
            Self::Disconnected(None) => Code::Unavailable,
        }
    }
}

impl fmt::Display for WorkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Options(why) => write!(f, "invalid worker options: {why}"),
            Self::Refused(s) => write!(
                f,
                "the server refused the worker: {:?}: {}",
                s.code(),
                s.message()
            ),
            Self::Redirect {
                endpoint,
                reason,
                status,
            } => write!(
                f,
                "refusing shard redirect to {endpoint:?}: {reason} ({})",
                status.message()
            ),
            Self::Disconnected(None) => f.write_str("worker stream ended"),
            Self::Disconnected(Some(s)) => {
                write!(f, "worker stream ended: {:?}: {}", s.code(), s.message())
            }
        }
    }
}

impl std::error::Error for WorkerError {}

/// Serves `opts.pool` until `shutdown` resolves, calling `handler` for each lease.
///
/// At most the granted slots run at once (the server may grant fewer than
/// [`WorkerOptions::slots`]; a lease beyond the grant is handed back unrun). Every running
/// lease is heartbeaten every third of the pool's lease TTL. The handler's result is reported
/// as the attempt's outcome: output, [`TaskError`] or, for a panic, a retryable failure. When
/// the server aborts an attempt, [`Lease::cancel`] is cancelled and nothing is reported.
///
/// The stream is opened again with backoff whenever it ends ([`WorkerOptions::initial_backoff`]
/// doubling up to [`WorkerOptions::max_backoff`]; at once after `shutdown{not_leader}`), and a
/// shard redirect is followed within the rules of [`MAX_REDIRECTS`] and
/// [`WorkerOptions::insecure_redirect_http`].
///
/// When `shutdown` resolves the worker asks for no more leases, lets running handlers finish
/// for up to [`WorkerOptions::drain_timeout`], then cancels the rest and gives them 5 more
/// seconds to report before it closes the stream and returns `Ok(())`.
pub async fn run_worker<H, F, S>(
    opts: WorkerOptions,
    handler: H,
    shutdown: S,
) -> Result<(), WorkerError>
where
    H: Fn(Lease) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Bytes, TaskError>> + Send + 'static,
    S: Future<Output = ()> + Send,
{
    serve(opts, handler, shutdown, Network).await
}

/// Opens channels: over the network, or in memory in the crate's tests.
pub(crate) trait Connect: Send + Sync + 'static {
    fn channel(&self, endpoint: Endpoint) -> Channel;
}

struct Network;

impl Connect for Network {
    fn channel(&self, endpoint: Endpoint) -> Channel {
        endpoint.connect_lazy()
    }
}

pub(crate) type Handler = dyn Fn(Lease) -> session::HandlerFuture + Send + Sync + 'static;

/// What every session of one worker shares.
pub(crate) struct Worker<C> {
    opts: WorkerOptions,
    target: Target,
    authorization: Option<MetadataValue<Ascii>>,
    handler: Arc<Handler>,
    connect: C,
}

pub(crate) async fn serve<H, F, S, C>(
    opts: WorkerOptions,
    handler: H,
    shutdown: S,
    connect: C,
) -> Result<(), WorkerError>
where
    H: Fn(Lease) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Bytes, TaskError>> + Send + 'static,
    S: Future<Output = ()> + Send,
    C: Connect,
{
    let worker = Worker::new(opts, handler, connect)?;
    let stop = CancellationToken::new();
    let run = worker.run(&stop);
    tokio::pin!(run);
    tokio::select! {
        result = &mut run => return result,
        () = shutdown => stop.cancel(),
    }
    run.await
}

impl<C: Connect> Worker<C> {
    fn new<H, F>(opts: WorkerOptions, handler: H, connect: C) -> Result<Self, WorkerError>
    where
        H: Fn(Lease) -> F + Send + Sync + 'static,
        F: Future<Output = Result<Bytes, TaskError>> + Send + 'static,
    {
        let invalid = |why: String| Err(WorkerError::Options(why));
        // A bare host:port is plain http, as for the other SDKs.
        let endpoint = if opts.endpoint.contains("://") {
            opts.endpoint.clone()
        } else {
            format!("http://{}", opts.endpoint)
        };
        let target = match Target::parse(&endpoint) {
            Ok(target) => target,
            Err(why) => return invalid(format!("endpoint {:?}: {why}", opts.endpoint)),
        };
        if opts.tls.is_some() && !target.secure {
            return invalid(format!(
                "TLS settings need an https:// endpoint, not {:?}",
                opts.endpoint
            ));
        }
        if opts.pool.is_empty() {
            return invalid("no pool".into());
        }
        if opts.slots == 0 {
            return invalid("slots must be at least 1".into());
        }
        if opts.initial_backoff.is_zero() {
            // Reconnecting without a pause would hammer a server that is down.
            return invalid("initial_backoff must not be zero".into());
        }
        let authorization = match &opts.token {
            None => None,
            Some(token) => match MetadataValue::try_from(format!("Bearer {token}")) {
                Ok(mut value) => {
                    value.set_sensitive(true);
                    Some(value)
                }
                Err(_) => return invalid("the token is not a valid header value".into()),
            },
        };
        let handler: Arc<Handler> = Arc::new(move |lease| Box::pin(handler(lease)));
        Ok(Self {
            opts,
            target,
            authorization,
            handler,
            connect,
        })
    }

    /// Sessions one after another, until `stop` or an error that retrying cannot fix.
    async fn run(&self, stop: &CancellationToken) -> Result<(), WorkerError> {
        let opts = &self.opts;
        let mut target = self.target.clone();
        let mut redirects = 0;
        let mut delay = opts.initial_backoff;
        while !stop.is_cancelled() {
            let endpoint = self
                .endpoint(&target)
                .map_err(|e| WorkerError::Options(format!("endpoint {:?}: {e}", target.uri)))?;
            let end = self.session(endpoint, stop).await;
            if let Some((endpoint, status)) = end.redirect() {
                if stop.is_cancelled() {
                    return Ok(());
                }
                target = self.redirect(&target, endpoint, redirects, status)?;
                redirects += 1;
                tracing::info!(endpoint = %target.uri, "cronoq worker redirected");
                continue;
            }
            redirects = 0;
            let code = end.status.as_ref().map(Status::code);
            if let Some(status) = end.status.as_ref().filter(|s| fatal(s.code())) {
                return Err(WorkerError::Refused(status.clone()));
            }
            if stop.is_cancelled() {
                return Ok(());
            }
            if !opts.reconnect {
                return Err(WorkerError::Disconnected(end.status));
            }
            // The shard it was sent to is gone: the configured server knows where the pool is.
            if code == Some(Code::Unavailable) {
                target = self.target.clone();
            }
            if end.registered || end.not_leader {
                delay = opts.initial_backoff;
            }
            let wait = if end.not_leader {
                Duration::ZERO
            } else {
                delay
            };
            tracing::info!(after = ?wait, status = ?end.status, "cronoq worker reconnecting");
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                () = tokio::time::sleep(wait) => {}
            }
            if !end.not_leader {
                delay = (delay * 2).min(opts.max_backoff.max(opts.initial_backoff));
            }
        }
        Ok(())
    }

    /// The target a shard refusal names, if the safety rules let the worker go there.
    fn redirect(
        &self,
        current: &Target,
        endpoint: String,
        redirects: u32,
        status: &Status,
    ) -> Result<Target, WorkerError> {
        let refuse = |reason: String| WorkerError::Redirect {
            endpoint: endpoint.clone(),
            reason,
            status: status.clone(),
        };
        if redirects >= MAX_REDIRECTS {
            return Err(refuse(format!("{} redirects in a row", redirects + 1)));
        }
        let target = Target::parse(&endpoint).map_err(|why| refuse(why.into()))?;
        let has_token = self.opts.token.is_some();
        if let Some(why) = endpoint::refuse_redirect(
            current,
            &target,
            has_token,
            self.opts.insecure_redirect_http,
        ) {
            return Err(refuse(why.into()));
        }
        if has_token && !target.secure && !target.loopback() {
            tracing::warn!(endpoint = %target.uri, "cronoq worker sends its token over plain http");
        }
        Ok(target)
    }

    /// The channel settings for `target`: TLS for `https://`, with the configured CA and
    /// identity, and the configured domain only for the configured server.
    fn endpoint(&self, target: &Target) -> Result<Endpoint, tonic::transport::Error> {
        let endpoint =
            Endpoint::from_shared(target.uri.clone())?.connect_timeout(Duration::from_secs(10));
        if !target.secure {
            return Ok(endpoint);
        }
        let mut tls = ClientTlsConfig::new();
        let settings = self.opts.tls.clone().unwrap_or_default();
        tls = match settings.ca_pem {
            Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
            None => tls.with_native_roots(),
        };
        if let Some((cert, key)) = settings.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = settings.domain.filter(|_| *target == self.target) {
            tls = tls.domain_name(domain);
        }
        endpoint.tls_config(tls)
    }
}

/// The codes no retry can fix. FAILED_PRECONDITION gets here only when it was not a redirect
/// (a server that needs a newer worker protocol).
fn fatal(code: Code) -> bool {
    matches!(
        code,
        Code::Unauthenticated
            | Code::PermissionDenied
            | Code::NotFound
            | Code::InvalidArgument
            | Code::Unimplemented
            | Code::FailedPrecondition
    )
}

impl SessionEnd {
    /// The endpoint of a shard refusal: FAILED_PRECONDITION naming the pool's shard, in the
    /// initial metadata or the trailers.
    fn redirect(&self) -> Option<(String, &Status)> {
        let status = self.status.as_ref()?;
        if status.code() != Code::FailedPrecondition {
            return None;
        }
        let endpoint = [status.metadata(), &self.header]
            .into_iter()
            .find_map(|md| md.get(session::ENDPOINT_KEY)?.to_str().ok())?;
        Some((endpoint.to_owned(), status))
    }
}
