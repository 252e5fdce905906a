//! Generates the cronoq.v1 messages and the Workers server trait from the repository's proto.
//! The vendored protoc is used unless `PROTOC` points at another, so no system package is
//! needed to build.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from("../../src/cronoq/proto");
    let proto = root.join("cronoq/v1/cronoq.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    println!("cargo:rerun-if-env-changed=PROTOC");
    if std::env::var_os("PROTOC").is_none() {
        // SAFETY: a build script runs on one thread, and nothing has read the environment yet.
        unsafe { std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?) };
    }
    tonic_prost_build::configure()
        .build_client(false)
        .compile_protos(&[proto], &[root])?;
    Ok(())
}
