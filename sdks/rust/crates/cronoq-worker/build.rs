//! Compiles the repository's cronoq.v1 proto into message types and the Workers, Tasks and
//! Admin clients. The server stubs are compiled for the crate's own tests only, where a fake
//! Workers server stands in for what the real server cannot be made to do.
//!
//! protoc comes from `protoc-bin-vendored` unless `PROTOC` names one, so a build needs no
//! system package.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from("../../../../src/cronoq/proto");
    let proto = root.join("cronoq/v1/cronoq.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    println!("cargo:rerun-if-env-changed=PROTOC");
    if std::env::var_os("PROTOC").is_none() {
        // SAFETY: build scripts are single-threaded; nothing else reads the environment yet.
        unsafe { std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?) };
    }
    tonic_prost_build::configure()
        .server_mod_attribute("cronoq.v1", "#[cfg(test)]")
        .bytes(".cronoq.v1")
        .compile_protos(&[proto], &[root])?;
    Ok(())
}
