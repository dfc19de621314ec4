//! containerd's own services beside its CRI plugin, as far as cri-imaged uses them.

/// The event service: the presence cache watches image events (the server is for tests' fakes).
pub mod events {
    tonic::include_proto!("containerd.services.events.v1");
}

/// The content service: the subset pull progress is read from.
pub mod content {
    tonic::include_proto!("containerd.services.content.v1");
}

/// The lease service: what a pre-pull fetched, kept past its cancellation.
pub mod leases {
    tonic::include_proto!("containerd.services.leases.v1");
}
