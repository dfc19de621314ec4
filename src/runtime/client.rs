//! The CRI `runtime.v1.ImageService` client over a unix socket.

use std::time::Duration;

use bytes::Bytes;
use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    ImageFsInfoRequest, ImageSpec, ImageStatusRequest, ListImagesRequest, PullImageRequest,
    image_service_client::ImageServiceClient,
};
use tokio::net::UnixStream;
use tonic::{
    codegen::http::uri::PathAndQuery,
    transport::{Channel, Endpoint, Uri},
};

use super::{
    ImageRuntime, MAX_MESSAGE_BYTES, PresentImage, PullSpec, RuntimeEndpoint, RuntimeError, passthrough::RawCodec,
};

/// Whether `status` is tonic's client enforcing the `grpc-timeout` we sent: it reports its own
/// timer, which runs beside ours and often fires first, as CANCELLED "Timeout expired". That is
/// our request deadline passing, not a cancellation.
fn is_client_timeout(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Cancelled && status.message() == tonic::TimeoutExpired(()).to_string()
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
        let request = PullImageRequest {
            image: Some(spec.image),
            auth: spec.auth.map(|auth| auth.to_cri()),
            sandbox_config: spec.sandbox_config,
        };
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

    async fn list_image_ids(&self) -> Result<Option<Vec<String>>, RuntimeError> {
        let request = self.request(ListImagesRequest { filter: None });
        let response = self.bounded(|mut client| async move { client.list_images(request).await }).await?;
        Ok(Some(response.images.into_iter().map(|image| image.id).collect()))
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
