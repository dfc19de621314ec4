//! The container runtime behind a small trait, and its CRI `runtime.v1.ImageService` client.

use std::{future::Future, path::PathBuf, sync::Arc, time::Duration};

use bytes::Bytes;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    AuthConfig, ImageFsInfoRequest, ImageSpec, ImageStatusRequest, PodSandboxConfig, PullImageRequest,
    image_service_client::ImageServiceClient,
};
use tokio::net::UnixStream;
use tonic::{
    codegen::http::uri::PathAndQuery,
    transport::{Channel, Endpoint, Uri},
};

use crate::{
    passthrough::RawCodec,
    reference::{self, ImageReference},
};

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
}

impl RuntimeError {
    /// The gRPC code this failure carries.
    pub fn code(&self) -> tonic::Code {
        match self {
            Self::Status(status) => status.code(),
            Self::Timeout(_) => tonic::Code::DeadlineExceeded,
            Self::EmptyImageRef(_) => tonic::Code::Unknown,
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
        Self::Status(status)
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

/// Whether `status` is tonic's client enforcing the `grpc-timeout` we sent: it reports its own
/// timer, which runs beside ours and often fires first, as CANCELLED "Timeout expired". That is
/// our request deadline passing, not a cancellation.
fn is_client_timeout(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Cancelled && status.message() == tonic::TimeoutExpired(()).to_string()
}

/// An image the runtime has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresentImage {
    /// The runtime's id for the image; the kubelet's image ref.
    pub id: String,
    /// Size in bytes, as the runtime reports it.
    pub size: u64,
}

/// What one upstream pull needs. No `Debug`: it carries credentials.
#[derive(Clone, Default)]
pub struct PullSpec {
    /// The image, with the default tag applied.
    pub image: ImageSpec,
    /// The same image parsed once where the request came in, normalised; `None` when it does not
    /// parse (a CRI PullImage may name an image only the runtime understands).
    pub reference: Option<Arc<ImageReference>>,
    /// Registry credentials, passed to the runtime as they are. Never logged.
    pub auth: Option<AuthConfig>,
    /// The pod's sandbox config, passed to the runtime as it is.
    pub sandbox_config: Option<PodSandboxConfig>,
    /// Over the registry rate limit, wait for a token even in fail mode: set on the CRI path,
    /// where the kubelet throttles its own pulls.
    pub wait_for_rate_limit: bool,
}

impl PullSpec {
    /// A pull of `image`, its reference parsed here, once, with the default tag (the runtime
    /// reads an untagged name as `:latest`).
    pub fn for_image(image: ImageSpec) -> Self {
        let reference = reference::parse_with_default_tag(&image.image).ok().map(|(reference, _)| Arc::new(reference));
        Self { image, reference, ..Default::default() }
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
}

/// Where the runtime listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeEndpoint(PathBuf);

/// A runtime endpoint that cri-imaged cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("runtime endpoint is empty")]
    Empty,
    #[error("runtime endpoint {0:?} is not supported: use unix:///path/to.sock or an absolute socket path")]
    Unsupported(String),
}

impl RuntimeEndpoint {
    /// Accepts `unix:///path` (as the kubelet's `--container-runtime-endpoint`) or a bare absolute path.
    pub fn parse(endpoint: &str) -> Result<Self, EndpointError> {
        if endpoint.is_empty() {
            return Err(EndpointError::Empty);
        }
        let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
        if !path.starts_with('/') {
            return Err(EndpointError::Unsupported(endpoint.to_owned()));
        }
        Ok(Self(PathBuf::from(path)))
    }

    /// The socket path.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl std::fmt::Display for RuntimeEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unix://{}", self.0.display())
    }
}

/// A CRI image service client over a unix socket.
///
/// The channel connects on first use and reconnects after the runtime restarts (containerd
/// re-creates its socket), so the daemon can start before the runtime does.
#[derive(Clone)]
pub struct CriClient {
    channel: Channel,
    client: ImageServiceClient<Channel>,
    request_timeout: Duration,
}

impl CriClient {
    /// A lazily connecting client; `request_timeout` bounds every call but pulls.
    pub fn new(endpoint: &RuntimeEndpoint, request_timeout: Duration) -> Self {
        let path = endpoint.path().to_owned();
        // The URI is a placeholder: the connector below dials the socket.
        let channel =
            Endpoint::from_static("http://localhost").connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
            }));
        let client = ImageServiceClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Self { channel, client, request_timeout }
    }

    /// The connection to the runtime, for other services on its socket (containerd's events).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Runs a non-pull call under the request deadline, told to the runtime too.
    async fn bounded<T, F>(&self, call: impl FnOnce(ImageServiceClient<Channel>) -> F) -> Result<T, RuntimeError>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match tokio::time::timeout(self.request_timeout, call(self.client.clone())).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) if is_client_timeout(&status) => Err(RuntimeError::Timeout(self.request_timeout)),
            Ok(Err(status)) => Err(status.into()),
            Err(_) => Err(RuntimeError::Timeout(self.request_timeout)),
        }
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.request_timeout);
        request
    }
}

impl ImageRuntime for CriClient {
    async fn image_status(&self, image: ImageSpec) -> Result<Option<PresentImage>, RuntimeError> {
        let request = self.request(ImageStatusRequest { image: Some(image), verbose: false });
        let response = self.bounded(|mut client| async move { client.image_status(request).await }).await?;
        Ok(response.image.map(|image| PresentImage { id: image.id, size: image.size }))
    }

    async fn pull_image(&self, spec: PullSpec) -> Result<String, RuntimeError> {
        let name = spec.image.image.clone();
        let request =
            PullImageRequest { image: Some(spec.image), auth: spec.auth, sandbox_config: spec.sandbox_config };
        // Pulls are unbounded here, as in the kubelet; the caller decides how long to wait.
        let response = self.client.clone().pull_image(request).await?.into_inner();
        if response.image_ref.is_empty() {
            return Err(RuntimeError::EmptyImageRef(name));
        }
        Ok(response.image_ref)
    }

    async fn probe(&self) -> Result<(), RuntimeError> {
        let request = self.request(ImageFsInfoRequest {});
        self.bounded(|mut client| async move { client.image_fs_info(request).await }).await?;
        Ok(())
    }

    async fn forward_raw(&self, path: &'static str, message: Bytes) -> Result<Bytes, tonic::Status> {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let request = self.request(message);
        let call = async move {
            grpc.ready().await.map_err(|error| tonic::Status::unavailable(error.to_string()))?;
            grpc.unary(request, PathAndQuery::from_static(path), RawCodec).await
        };
        let timed_out = || tonic::Status::deadline_exceeded(RuntimeError::Timeout(self.request_timeout).to_string());
        match tokio::time::timeout(self.request_timeout, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) if is_client_timeout(&status) => Err(timed_out()),
            Ok(Err(status)) => Err(status),
            Err(_) => Err(timed_out()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_accepts_unix_urls_and_absolute_paths() {
        let url = RuntimeEndpoint::parse("unix:///run/containerd/containerd.sock").expect("unix url");
        let bare = RuntimeEndpoint::parse("/run/containerd/containerd.sock").expect("bare path");
        assert_eq!(url, bare);
        assert_eq!(url.to_string(), "unix:///run/containerd/containerd.sock");
    }

    #[test]
    fn endpoint_rejects_tcp_relative_and_empty() {
        assert_eq!(RuntimeEndpoint::parse(""), Err(EndpointError::Empty));
        for bad in ["tcp://127.0.0.1:1234", "run/containerd.sock", "unix://relative.sock"] {
            assert!(
                matches!(RuntimeEndpoint::parse(bad), Err(EndpointError::Unsupported(ref e)) if e == bad),
                "{bad} should be refused"
            );
        }
    }

    #[test]
    fn runtime_errors_read_like_grpc_go() {
        let error = RuntimeError::from(tonic::Status::not_found("no such image"));
        assert_eq!(error.to_string(), "rpc error: code = NotFound desc = no such image");
        let cancelled = RuntimeError::from(tonic::Status::cancelled("gone"));
        assert_eq!(cancelled.to_string(), "rpc error: code = Canceled desc = gone");
    }
}
