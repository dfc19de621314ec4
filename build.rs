//! Generates the CRI `runtime.v1` API (the client cri-imaged asks the runtime with, the server
//! its tests fake), the cri-imaged API and a descriptor set for server reflection, and
//! containerd's event, content and lease services: the clients the daemon watches image events
//! and pull progress and keeps pre-pulls' downloads with, the servers its tests fake.
use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(env::var("OUT_DIR")?);
    std::fs::create_dir_all(out.join("imagemanager"))?;
    tonic_prost_build::configure()
        // Credentials must never be printed; `cri.rs` writes a redacted `Debug`.
        .skip_debug([".runtime.v1.AuthConfig"])
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/runtime/v1/api.proto"], &["proto"])?;
    tonic_prost_build::configure()
        // Our API holds CRI values, so that they pass to the runtime client without conversion.
        .extern_path(".runtime.v1", "crate::cri")
        // A directory of its own: the CRI file it imports is generated again there, without its
        // messages, and must not take the place of the one above.
        .out_dir(out.join("imagemanager"))
        .file_descriptor_set_path(out.join("imagemanager_descriptor.bin"))
        // A pull secret's content and a service-account token must never be printed; `api.rs`
        // writes a redacted `Debug` for each.
        .skip_debug([".imagemanager.v1.PullSecret", ".imagemanager.v1.ServiceAccountToken"])
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/imagemanager/v1/image_manager.proto"], &["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_protos(
        &[
            "proto/containerd/services/events/v1/events.proto",
            "proto/containerd/services/content/v1/content.proto",
            "proto/containerd/services/leases/v1/leases.proto",
        ],
        &["proto"],
    )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
