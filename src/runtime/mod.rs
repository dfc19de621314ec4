//! The container runtime: what cri-imaged needs of it (small traits, its image service and its
//! content store, so the core is testable with a fake) and how it talks to it.
//!
//! - `client`: the CRI `runtime.v1.ImageService` client over a unix socket.
//! - `content`: the runtime's content store, which the progress poller reads, and its leases,
//!   which keep a pre-pull's downloads.
//! - `content_client`: containerd's content and lease services, as the CRI client calls them.
//! - `endpoint`: where the runtime listens.
//! - `forward`: one unary call's bytes to the runtime and back, over `h2` directly (the
//!   pass-through's hot path); and any call relayed whole, frames and all.
//! - [`passthrough`]: a gRPC codec that forwards message bytes untouched.
//! - [`containerd`]: containerd's event, content and lease services, beside its CRI plugin.
//! - `fake`: one scripted runtime for the unit tests.

mod client;
pub mod containerd;
mod content;
mod content_client;
mod endpoint;
#[cfg(test)]
pub mod fake;
mod forward;
pub mod passthrough;

use std::{future::Future, path::PathBuf, sync::Arc, time::Duration};

use crate::cri::{ImageSpec, PodSandboxConfig};
use bytes::Bytes;

pub use self::{
    client::{CriClient, sandbox_image_from_status},
    content::{ContentStore, Held},
    endpoint::{EndpointError, RuntimeEndpoint},
    forward::Messages,
};
use crate::credentials::RegistryAuth;

/// The largest message exchanged with the runtime, as the kubelet allows (16 MiB).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Why a runtime call failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The runtime answered with a gRPC error, or the connection to it failed.
    #[error("rpc error: code = {} desc = {}", go_code_name(.0.code()), .0.message())]
    Status(tonic::Status),
    /// The runtime did not answer within the request deadline.
    #[error("rpc error: code = DeadlineExceeded desc = context deadline exceeded (after {0:?})")]
    Timeout(Duration),
    /// The runtime reported success for a pull but named no image.
    #[error("imageRef of image {0:?} is not set")]
    EmptyImageRef(String),
    /// The runtime reported no image filesystem, or one whose usage cannot be read.
    #[error("image filesystem: {0}")]
    ImageFs(String),
    /// This runtime cannot do what was asked (a fake, or a runtime without the call).
    #[error("the runtime cannot {0}")]
    Unsupported(&'static str),
    /// The runtime answered a removal, but still has the image.
    #[error("image {0} is still present after the runtime answered its removal")]
    NotRemoved(String),
}

impl RuntimeError {
    /// The gRPC code this failure carries.
    pub fn code(&self) -> tonic::Code {
        match self {
            Self::Status(status) => status.code(),
            Self::Timeout(_) => tonic::Code::DeadlineExceeded,
            Self::EmptyImageRef(_) | Self::ImageFs(_) | Self::NotRemoved(_) => tonic::Code::Unknown,
            Self::Unsupported(_) => tonic::Code::Unimplemented,
        }
    }

    /// The runtime's own message, without the `rpc error:` wrapping.
    pub fn runtime_message(&self) -> String {
        match self {
            Self::Status(status) => status.message().to_owned(),
            other => other.to_string(),
        }
    }
}

impl From<tonic::Status> for RuntimeError {
    fn from(status: tonic::Status) -> Self {
        Self::Status(connection_failure_as_unavailable(status))
    }
}

/// A failure of the connection to the runtime (it died mid-call), not an answer from it, as
/// grpc-go reports one: UNAVAILABLE, with the cause. tonic reports some as UNKNOWN with an empty
/// message and the cause only in its source, which a caller could neither act on nor read.
pub fn connection_failure_as_unavailable(status: tonic::Status) -> tonic::Status {
    let cause = std::error::Error::source(&status).map(ToString::to_string);
    match cause {
        Some(cause) if matches!(status.code(), tonic::Code::Unknown | tonic::Code::Internal) => {
            let message = match status.message() {
                "" => format!("the connection to the runtime failed: {cause}"),
                said => format!("the connection to the runtime failed: {said}: {cause}"),
            };
            tonic::Status::unavailable(message)
        }
        _ => status,
    }
}

/// grpc-go's names for codes, so our messages read like the kubelet's `rpc error: code = …`.
fn go_code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "Canceled",
        tonic::Code::Unknown => "Unknown",
        tonic::Code::InvalidArgument => "InvalidArgument",
        tonic::Code::DeadlineExceeded => "DeadlineExceeded",
        tonic::Code::NotFound => "NotFound",
        tonic::Code::AlreadyExists => "AlreadyExists",
        tonic::Code::PermissionDenied => "PermissionDenied",
        tonic::Code::ResourceExhausted => "ResourceExhausted",
        tonic::Code::FailedPrecondition => "FailedPrecondition",
        tonic::Code::Aborted => "Aborted",
        tonic::Code::OutOfRange => "OutOfRange",
        tonic::Code::Unimplemented => "Unimplemented",
        tonic::Code::Internal => "Internal",
        tonic::Code::Unavailable => "Unavailable",
        tonic::Code::DataLoss => "DataLoss",
        tonic::Code::Unauthenticated => "Unauthenticated",
    }
}

/// An image the runtime has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresentImage {
    /// The runtime's id for the image; the kubelet's image ref.
    pub id: String,
    /// Size in bytes, as the runtime reports it.
    pub size: u64,
    /// `repository@digest` names: which manifest digests the image was pulled as.
    pub repo_digests: Vec<String>,
}

/// An image as the runtime lists it, for garbage collection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredImage {
    pub id: String,
    pub size: u64,
    /// The runtime protects it (the CRI `pinned` flag): never collected.
    pub pinned: bool,
    /// Its repo tags and repo digests.
    pub names: Vec<String>,
    /// The runtime handler it is kept for (CRI `spec.runtime_handler`, KEP-4216); empty for
    /// the default one, and from runtimes that do not tell them apart.
    pub runtime_handler: String,
}

/// An image a container uses: by ref, id or name as asked for, under the runtime handler it
/// was created with (empty for the default one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsedImage {
    pub image: String,
    pub runtime_handler: String,
}

/// An image used under the default runtime handler.
impl From<&str> for UsedImage {
    fn from(image: &str) -> Self {
        Self::new(image, "")
    }
}

impl UsedImage {
    pub fn new(image: impl Into<String>, runtime_handler: impl Into<String>) -> Self {
        Self { image: image.into(), runtime_handler: runtime_handler.into() }
    }
}

/// The filesystem holding the runtime's images, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageFsUsage {
    pub capacity: u64,
    pub available: u64,
}

/// What the runtime's PullImage needs. No `Debug`: it carries credentials.
#[derive(Clone, Default)]
pub struct PullSpec {
    /// The image as the runtime gets it (EnsureImageExists applies the default tag first).
    pub image: ImageSpec,
    /// Registry credentials, passed to the runtime as they are. Never logged.
    pub auth: Option<Arc<RegistryAuth>>,
    /// The pod's sandbox config, passed to the runtime as it is.
    pub sandbox_config: Option<PodSandboxConfig>,
}

/// A probe of `runtime` bounded by `timeout`: a runtime that does not answer in time (frozen,
/// overloaded) is not serving. Health, GetStatus and the readiness notice all ask it this way.
pub async fn probe_within<R: ImageRuntime>(runtime: &R, timeout: Duration) -> Result<(), RuntimeError> {
    tokio::time::timeout(timeout, runtime.probe()).await.unwrap_or(Err(RuntimeError::Timeout(timeout)))
}

/// The image filesystem, read by the probe [`probe_within`] makes where the runtime can say
/// (its `ImageFsInfo` is that probe): `Ok(None)` from a runtime that answered but has no image
/// filesystem to report, or cannot report one at all.
pub async fn probe_image_fs_within<R: ImageRuntime>(
    runtime: &R,
    timeout: Duration,
) -> Result<Option<ImageFsUsage>, RuntimeError> {
    let measured = tokio::time::timeout(timeout, runtime.image_fs_usage()).await;
    match measured.unwrap_or(Err(RuntimeError::Timeout(timeout))) {
        Ok(usage) => Ok(Some(usage)),
        // It answered; its filesystem could not be read.
        Err(RuntimeError::ImageFs(_)) => Ok(None),
        Err(RuntimeError::Unsupported(_)) => probe_within(runtime, timeout).await.map(|()| None),
        Err(error) => Err(error),
    }
}

/// The image half of a container runtime, as cri-imaged uses it.
pub trait ImageRuntime: Send + Sync + 'static {
    /// The image if the runtime has it, `None` if not.
    fn image_status(&self, image: ImageSpec)
    -> impl Future<Output = Result<Option<PresentImage>, RuntimeError>> + Send;

    /// Pulls the image and returns the runtime's image ref.
    fn pull_image(&self, spec: PullSpec) -> impl Future<Output = Result<String, RuntimeError>> + Send;

    /// A cheap call that succeeds while the runtime serves images; used for health.
    fn probe(&self) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// The id of every image the runtime has; `None` from a runtime that cannot list them.
    fn list_image_ids(&self) -> impl Future<Output = Result<Option<Vec<String>>, RuntimeError>> + Send {
        async { Ok(None) }
    }

    /// Every image with its size, pin and names (CRI `ListImages`).
    fn list_images(&self) -> impl Future<Output = Result<Vec<StoredImage>, RuntimeError>> + Send {
        async { Err(RuntimeError::Unsupported("list images")) }
    }

    /// What every container, in any state, was created from: its image ref and its image as
    /// asked for (CRI `RuntimeService.ListContainers` with no filter), and the images it mounts
    /// as volumes (CRI `ContainerStatus`), each with its runtime handler.
    fn container_images(&self) -> impl Future<Output = Result<Vec<UsedImage>, RuntimeError>> + Send {
        async { Err(RuntimeError::Unsupported("list containers")) }
    }

    /// The image the runtime runs pod sandboxes from, when it says (containerd's verbose CRI
    /// `Status` does; containerd 1.6 does not mark it pinned).
    fn sandbox_image(&self) -> impl Future<Output = Result<Option<String>, RuntimeError>> + Send {
        async { Ok(None) }
    }

    /// Capacity and available bytes of the filesystem the runtime keeps images on: the first
    /// one CRI `ImageFsInfo` reports, read with `statvfs`.
    fn image_fs_usage(&self) -> impl Future<Output = Result<ImageFsUsage, RuntimeError>> + Send {
        async { Err(RuntimeError::Unsupported("report its image filesystem")) }
    }

    /// The directory the runtime keeps images in, as the first image filesystem CRI
    /// `ImageFsInfo` reports names it (CRI-O: its image store's directory); `None` when it names
    /// none.
    fn image_fs_mountpoint(&self) -> impl Future<Output = Result<Option<PathBuf>, RuntimeError>> + Send {
        async { Err(RuntimeError::Unsupported("report its image filesystem")) }
    }

    /// Removes the image `name` names (its id, or any name the runtime knows it by) by its id, for
    /// the runtime handler it is kept for (CRI `RemoveImage`), then checks that the runtime no
    /// longer has it ([`RuntimeError::NotRemoved`] if it does). An image already absent is `Ok`.
    fn remove_image(&self, name: &str, runtime_handler: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        let _ = (name, runtime_handler);
        async { Err(RuntimeError::Unsupported("remove images")) }
    }

    /// Forwards one unary `runtime.v1.ImageService` call (`path` such as
    /// `/runtime.v1.ImageService/ListImages`) with its message bytes untouched; the runtime's
    /// error comes back unchanged.
    fn forward_raw(
        &self,
        path: &'static str,
        message: Bytes,
    ) -> impl Future<Output = Result<Bytes, tonic::Status>> + Send {
        async move {
            let _ = message;
            Err(tonic::Status::unimplemented(format!("this runtime does not forward {path}")))
        }
    }

    /// Forwards one server-streaming `runtime.v1.ImageService` call with its message bytes
    /// untouched; the runtime's messages come back as they come, untouched. An error before any
    /// message is the runtime's status (UNIMPLEMENTED from a runtime without the call).
    fn forward_stream(
        &self,
        path: &'static str,
        message: Bytes,
    ) -> impl Future<Output = Result<Messages, tonic::Status>> + Send {
        async move {
            let _ = message;
            Err(tonic::Status::unimplemented(format!("this runtime does not forward {path}")))
        }
    }

    /// Relays one whole call of a method cri-imaged does not know (unary or streaming) with its
    /// headers and frames untouched; the runtime's answer, status and trailers come back as it
    /// sent them. An error only when the runtime could not be asked.
    fn relay(
        &self,
        request: http::Request<tonic::body::Body>,
    ) -> impl Future<Output = Result<http::Response<tonic::body::Body>, tonic::Status>> + Send {
        async move {
            let path = request.uri().path().to_owned();
            Err(tonic::Status::unimplemented(format!("this runtime does not relay {path}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_errors_read_like_grpc_go() {
        let error = RuntimeError::from(tonic::Status::not_found("no such image"));
        assert_eq!(error.to_string(), "rpc error: code = NotFound desc = no such image");
        let cancelled = RuntimeError::from(tonic::Status::cancelled("gone"));
        assert_eq!(cancelled.to_string(), "rpc error: code = Canceled desc = gone");
    }

    #[test]
    fn a_broken_connection_to_the_runtime_is_unavailable_and_says_why() {
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset by peer");
        let broken = tonic::Status::from_error(Box::new(reset));
        assert_eq!(broken.code(), tonic::Code::Unknown, "as tonic reports it");
        let error = RuntimeError::from(broken);
        assert_eq!(error.code(), tonic::Code::Unavailable);
        assert!(error.to_string().contains("the connection to the runtime failed"), "{error}");
        assert!(error.to_string().contains("connection reset by peer"), "{error}");
        let answered = RuntimeError::from(tonic::Status::unknown("the runtime's own words"));
        assert_eq!(answered.code(), tonic::Code::Unknown, "an answer from the runtime is passed on as it is");
    }
}
