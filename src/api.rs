//! The generated `imagemanager.v1` API and its descriptors for reflection.

include!(concat!(env!("OUT_DIR"), "/imagemanager/imagemanager.v1.rs"));

impl std::fmt::Debug for PullSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullSecret")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .field("uid", &self.uid)
            .field("type", &self.r#type)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for ServiceAccountToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountToken").field("audience", &self.audience).finish_non_exhaustive()
    }
}

/// Descriptors of our API and everything it imports (the CRI, google.protobuf).
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("imagemanager_descriptor");
