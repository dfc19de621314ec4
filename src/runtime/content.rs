//! The runtime's content store (containerd's content service): the blobs a pull writes, read by
//! the progress poller. Kept apart from [`super::ImageRuntime`] so that only the poller asks for it.

use std::{future::Future, time::SystemTime};

use super::RuntimeError;

/// The content half of a container runtime, as the progress poller reads it. Every call is
/// unsupported unless the runtime says otherwise (CRI-O has no content service).
pub trait ContentStore: Send + Sync + 'static {
    /// The blobs being written now (containerd's content ingests): (ref, offset, total).
    fn list_ingests(&self) -> impl Future<Output = Result<Vec<(String, u64, u64)>, RuntimeError>> + Send {
        async { Err(RuntimeError::Unsupported("list its content ingests")) }
    }

    /// The digest of the newest image manifest of `repository` on registry `host` (no port)
    /// committed at or after `since`, if any (containerd labels each with its source).
    fn find_manifest(
        &self,
        host: &str,
        repository: &str,
        since: SystemTime,
    ) -> impl Future<Output = Result<Option<String>, RuntimeError>> + Send {
        let _ = (host, repository, since);
        async { Err(RuntimeError::Unsupported("look up manifests")) }
    }

    /// A committed blob's bytes, at most `limit` of them.
    fn read_blob(&self, digest: &str, limit: usize) -> impl Future<Output = Result<Vec<u8>, RuntimeError>> + Send {
        let _ = (digest, limit);
        async { Err(RuntimeError::Unsupported("read blobs")) }
    }

    /// Whether the content store has the blob committed.
    fn has_blob(&self, digest: &str) -> impl Future<Output = Result<bool, RuntimeError>> + Send {
        let _ = digest;
        async { Err(RuntimeError::Unsupported("look up blobs")) }
    }
}
