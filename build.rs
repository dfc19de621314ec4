//! Generates the cri-imaged API and a descriptor set for server reflection, and containerd's
//! event, content and lease services: the clients the daemon watches image events and pull
//! progress and keeps pre-pulls' downloads with, the servers its tests fake.
use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // The CRI types come from k8s-cri so that values pass between our API
        // and the runtime client without conversion.
        .extern_path(".runtime.v1", "::k8s_cri::v1")
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
