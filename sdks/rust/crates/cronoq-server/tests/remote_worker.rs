//! The README's program written for the published crates, `examples/remote_worker.rs`, against the
//! real cronoq-server over TLS: it serves a task and stops on Ctrl-C (SIGINT).

#[allow(dead_code)] // shared with cronoq-worker's tests, which use all of it
#[path = "../../cronoq-worker/tests/common/mod.rs"]
mod common;

use common::{Bearer, CLIENT_TOKEN, CronoqServer, Tasks, WORKER_TOKEN, task};
use cronoq_worker::proto::tasks_client::TasksClient;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

#[tokio::test]
async fn the_published_crates_worker_serves_over_tls_and_stops_on_ctrl_c() {
    let source = include_str!("../examples/remote_worker.rs");
    assert!(
        include_str!("../../../README.md").contains(source),
        "README.md must show crates/cronoq-server/examples/remote_worker.rs as it is"
    );
    let pki = common::pki::Pki::new();
    let dir = common::Scratch::new("seed");
    let (cert, key) = pki.leaf(&["127.0.0.1"]);
    let config = format!(
        "[server]\ngrpc_addr = \"127.0.0.1:0\"\nhttp_addr = \"127.0.0.1:0\"\nshutdown_grace_s = 0.5\n\
         [server.tls]\ncert = {:?}\nkey = {:?}\n\
         [[auth.tokens]]\ntoken = {WORKER_TOKEN:?}\nrole = \"worker\"\n\
         [[auth.tokens]]\ntoken = {CLIENT_TOKEN:?}\nrole = \"client\"\n\
         [[pools]]\nname = \"default\"\n",
        dir.write("server.pem", &cert),
        dir.write("server.key", &key),
    );
    let server = CronoqServer::with_config(&config);
    let endpoint = format!("https://{}", server.addr);
    let child = std::process::Command::new(common::example("remote_worker"))
        .env("CRONOQ_ENDPOINT", &endpoint)
        .env("CRONOQ_WORKER_TOKEN", WORKER_TOKEN)
        .env("CRONOQ_CA", dir.write("ca.pem", &pki.ca()))
        .spawn()
        .unwrap();

    let channel = Endpoint::from_shared(endpoint)
        .unwrap()
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pki.ca())))
        .unwrap()
        .connect_lazy();
    let mut tasks = Tasks(TasksClient::with_interceptor(
        channel,
        Bearer::new(CLIENT_TOKEN),
    ));
    let id = tasks.submit(task("default", "over tls")).await;
    let result = tasks.wait(id).await;
    assert_eq!(
        result.output.as_deref(),
        Some(&b"OVER TLS"[..]),
        "{result:?}"
    );

    common::interrupt(child).await;
}
