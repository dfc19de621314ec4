//! The runtime's content store (containerd's content and lease services): the blobs a pull
//! writes, read by the progress poller, and kept by a lease for a pre-pull interrupted part-way
//! (a pull cancelled without one loses all it fetched at containerd's next collection). Kept
//! apart from [`super::ImageRuntime`]: only the poller and pre-pulls ask for it.

use std::{future::Future, time::SystemTime};

/// What a lease holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Held {
    /// A committed blob, by digest.
    Blob(String),
    /// A download under way, by its ref (containerd's `layer-sha256:...`), with what it wrote:
    /// a later pull of the blob goes on from there (an HTTP range request).
    Download(String),
}

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

    /// Creates lease `id`, whose holdings containerd keeps until `expires`; one that exists is
    /// left as it is.
    fn create_lease(&self, id: &str, expires: SystemTime) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        let _ = (id, expires);
        async { Err(RuntimeError::Unsupported("keep downloads in leases")) }
    }

    /// Makes lease `id` hold `held` (which need not exist yet).
    fn hold(&self, id: &str, held: &[Held]) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        let _ = (id, held);
        async { Err(RuntimeError::Unsupported("keep downloads in leases")) }
    }

    /// What lease `id` holds.
    fn held(&self, id: &str) -> impl Future<Output = Result<Vec<Held>, RuntimeError>> + Send {
        let _ = id;
        async { Err(RuntimeError::Unsupported("keep downloads in leases")) }
    }

    /// Ends lease `id`, if it exists.
    fn delete_lease(&self, id: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        let _ = id;
        async { Err(RuntimeError::Unsupported("keep downloads in leases")) }
    }

    /// The ids of the leases whose id starts with `prefix`.
    fn leases(&self, prefix: &str) -> impl Future<Output = Result<Vec<String>, RuntimeError>> + Send {
        let _ = prefix;
        async { Err(RuntimeError::Unsupported("keep downloads in leases")) }
    }
}
