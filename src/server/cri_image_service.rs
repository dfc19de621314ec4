//! `runtime.v1.ImageService` on our socket, so a kubelet (`--image-service-endpoint`) or crictl
//! (`--image-endpoint`) pulls through cri-imaged without knowing it.
//!
//! ListImages, ImageStatus, RemoveImage and ImageFsInfo are forwarded with their bytes untouched;
//! PullImage goes through the scheduler and the registry limits. A RemoveImage empties the
//! presence cache before its answer is sent, so no answer after it can call the image present.

use std::{convert::Infallible, future::Future, pin::Pin, sync::Arc};

use bytes::Bytes;
use k8s_cri::v1::{PullImageRequest, PullImageResponse};
use tonic::{Request, Response, Status, body::Body, server::NamedService};

use super::status::CriPullError;
use crate::{
    credentials::RegistryAuth,
    ensure::ImageManager,
    presence::PresenceCache,
    runtime::passthrough::RawCodec,
    runtime::{ImageRuntime, MAX_MESSAGE_BYTES, PullSpec},
};

/// The service's gRPC name.
pub const CRI_IMAGE_SERVICE: &str = "runtime.v1.ImageService";

/// The calls forwarded to the runtime unchanged.
const FORWARDED: [&str; 4] = [
    "/runtime.v1.ImageService/ListImages",
    "/runtime.v1.ImageService/ImageStatus",
    REMOVE_IMAGE,
    "/runtime.v1.ImageService/ImageFsInfo",
];
const REMOVE_IMAGE: &str = "/runtime.v1.ImageService/RemoveImage";
const PULL_IMAGE: &str = "/runtime.v1.ImageService/PullImage";

/// The service; cheap to clone.
pub struct CriImageService<R> {
    /// Pulls go through the manager (scheduler, single-flight, limits).
    manager: Arc<ImageManager<R>>,
    /// Everything else is forwarded to the runtime.
    runtime: Arc<R>,
    presence: Arc<PresenceCache>,
}

impl<R> CriImageService<R> {
    pub fn new(manager: Arc<ImageManager<R>>, runtime: Arc<R>, presence: Arc<PresenceCache>) -> Self {
        Self { manager, runtime, presence }
    }
}

impl<R> Clone for CriImageService<R> {
    fn clone(&self) -> Self {
        Self { manager: self.manager.clone(), runtime: self.runtime.clone(), presence: self.presence.clone() }
    }
}

impl<R> NamedService for CriImageService<R> {
    const NAME: &'static str = CRI_IMAGE_SERVICE;
}

type HttpResponse = http::Response<Body>;

/// Empties the presence cache when dropped.
struct ForgetOnDrop(Arc<PresenceCache>);

impl Drop for ForgetOnDrop {
    fn drop(&mut self) {
        self.0.image_changed();
    }
}

impl<R: ImageRuntime> tower::Service<http::Request<Body>> for CriImageService<R> {
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<HttpResponse, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let manager = self.manager.clone();
        let path = request.uri().path().to_owned();
        if let Some(method) = FORWARDED.into_iter().find(|method| *method == path) {
            let presence = (method == REMOVE_IMAGE).then(|| self.presence.clone());
            let runtime = self.runtime.clone();
            let forward = tower::service_fn(move |call: Request<Bytes>| {
                let (runtime, presence) = (runtime.clone(), presence.clone());
                async move {
                    // Whether the removal succeeds, fails or is cancelled half way, it may have
                    // changed what is present: forget before answering, or when given up on.
                    let _forget = presence.map(ForgetOnDrop);
                    runtime.forward_raw(method, call.into_inner()).await.map(Response::new)
                }
            });
            let mut grpc = tonic::server::Grpc::new(RawCodec)
                .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES));
            return Box::pin(async move { Ok(grpc.unary(forward, request).await) });
        }
        if path == PULL_IMAGE {
            let pull = tower::service_fn(move |call: Request<PullImageRequest>| {
                let manager = manager.clone();
                async move {
                    let peer = super::request::peer(&call);
                    let PullImageRequest { image, auth, sandbox_config } = call.into_inner();
                    let auth = auth.map(|auth| Arc::new(RegistryAuth::from_cri(auth)));
                    let spec = PullSpec { auth, sandbox_config, ..PullSpec::for_image(image.unwrap_or_default()) };
                    let pulled =
                        manager.pull_image(spec, peer).await.map_err(|error| Status::from(CriPullError(error)))?;
                    Ok(Response::new(PullImageResponse { image_ref: pulled.image_ref }))
                }
            });
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
                .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES));
            return Box::pin(async move { Ok(grpc.unary(pull, request).await) });
        }
        let status = Status::unimplemented(format!("cri-imaged does not serve {path}"));
        Box::pin(async move { Ok(status.into_http()) })
    }
}
