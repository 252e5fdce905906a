//! The real cronoq-server (Python, from the repository's virtualenv) as a child process,
//! configured from a TOML file, with the clients the tests submit and inspect tasks with.

pub mod pki;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use cronoq_worker::proto::admin_client::AdminClient;
use cronoq_worker::proto::tasks_client::TasksClient;
use cronoq_worker::proto::{self, task_ref};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

pub const CLIENT_TOKEN: &str = "client-token-for-the-sdk-tests-0000001";
pub const WORKER_TOKEN: &str = "worker-token-for-the-sdk-tests-0000001";
pub const ADMIN_TOKEN: &str = "admin-token-for-the-sdk-tests-00000001";

/// The configuration the Go and TypeScript SDK tests use too (`{grpc_addr}` is filled in),
/// with pools of the Rust tests' own: the shared `outcomes` pool has a 1 s lease TTL, which
/// a loaded machine can miss, so only the heartbeat case runs on a TTL, a longer one.
fn config(grpc_addr: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../testdata/server.toml");
    let shared = std::fs::read_to_string(path).unwrap();
    shared.replace("{grpc_addr}", grpc_addr)
        + "\n[[pools]]\nname = \"rust-outcomes\"\n\
           retry = { max_attempts = 3, initial_backoff_s = 0.05, jitter = false }\n\
           \n[[pools]]\nname = \"rust-heartbeat\"\nlease_ttl_s = 3\n"
}

#[path = "../../../../testing/python.rs"]
mod python_path;
pub use python_path::python;

pub struct CronoqServer {
    child: Child,
    /// The gRPC listener's host:port.
    pub addr: String,
    config: PathBuf,
}

impl CronoqServer {
    /// Starts the server with the shared configuration, listening on `grpc_addr`.
    pub fn start(grpc_addr: &str) -> Self {
        Self::with_config(&config(grpc_addr))
    }

    /// Starts the server with `config` and waits until it logs `event=ready`.
    pub fn with_config(config: &str) -> Self {
        static FILES: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "cronoq-rust-{}-{}.toml",
            std::process::id(),
            FILES.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::write(&path, config).unwrap();
        let mut child = Command::new(python())
            .args(["-m", "cronoq.server.cli", "-c"])
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let (tx, rx) = mpsc::channel();
        // Reads the log to its end, so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut addr = None;
            let mut log = Vec::new();
            for line in stderr.lines().map_while(Result::ok) {
                if addr.is_none() {
                    addr = line
                        .split_once("event=listening grpc=")
                        .and_then(|(_, rest)| rest.split_whitespace().next())
                        .map(str::to_owned);
                }
                log.push(line.clone());
                if line.contains("event=ready")
                    && let Some(addr) = addr.take()
                {
                    let _ = tx.send(Ok(addr));
                }
            }
            let _ = tx.send(Err(log));
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(addr)) => addr,
            Ok(Err(log)) => panic!("cronoq-server exited before it was ready: {log:#?}"),
            Err(_) => {
                let _ = child.kill();
                panic!("cronoq-server not ready after 30 s");
            }
        };
        Self {
            child,
            addr,
            config: path,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn tasks(&self) -> Tasks {
        Tasks(TasksClient::with_interceptor(
            channel(&self.endpoint()),
            Bearer::new(CLIENT_TOKEN),
        ))
    }

    pub fn admin(&self) -> AdminClient<InterceptedService<Channel, Bearer>> {
        AdminClient::with_interceptor(channel(&self.endpoint()), Bearer::new(ADMIN_TOKEN))
    }
}

impl Drop for CronoqServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.config);
    }
}

fn channel(endpoint: &str) -> Channel {
    Endpoint::from_shared(endpoint.to_owned())
        .unwrap()
        .connect_lazy()
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    pub fn new(token: &str) -> Self {
        Self(Some(format!("Bearer {token}").parse().unwrap()))
    }

    pub fn none() -> Self {
        Self(None)
    }
}

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// The `Tasks` calls the tests make.
pub struct Tasks(pub TasksClient<InterceptedService<Channel, Bearer>>);

impl Tasks {
    pub async fn submit(&mut self, task: proto::TaskSpec) -> u64 {
        let request = proto::SubmitRequest {
            task: Some(task),
            ..Default::default()
        };
        self.0.submit(request).await.unwrap().into_inner().id
    }

    /// Waits up to 20 s for the task to end.
    pub async fn wait(&mut self, id: u64) -> proto::TaskResult {
        let request = proto::WaitRequest {
            task: Some(by_id(id)),
            timeout_s: Some(20.0),
        };
        self.0.wait(request).await.unwrap().into_inner()
    }

    pub async fn get(&mut self, id: u64) -> proto::TaskInfo {
        let request = proto::GetRequest {
            task: Some(by_id(id)),
        };
        self.0.get(request).await.unwrap().into_inner()
    }

    pub async fn cancel(&mut self, id: u64) -> bool {
        let request = proto::CancelRequest {
            task: Some(by_id(id)),
        };
        self.0.cancel(request).await.unwrap().into_inner().cancelled
    }
}

fn by_id(id: u64) -> proto::TaskRef {
    proto::TaskRef {
        target: Some(task_ref::Target::Id(id)),
    }
}

/// A task for `pool` with `payload`.
pub fn task(pool: &str, payload: &str) -> proto::TaskSpec {
    proto::TaskSpec {
        pool: pool.into(),
        payload: payload.to_owned().into(),
        ..Default::default()
    }
}

/// An example program of the workspace, which `cargo test` builds next to the test binaries.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(path.exists(), "{} is built by `cargo test`", path.display());
    path
}

/// Ctrl-C (SIGINT) for an example program, which must then exit cleanly within 30 s.
pub async fn interrupt(mut child: Child) {
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let exit = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking(move || child.wait()),
    )
    .await
    .expect("the example did not stop")
    .unwrap()
    .unwrap();
    assert!(exit.success(), "{exit}");
}

/// A directory of files for one test (certificates, keys), removed when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("cronoq-rust-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// Writes `text` to the file `name` and returns its path.
    pub fn write(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
