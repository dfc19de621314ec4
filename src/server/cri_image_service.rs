//! `runtime.v1.ImageService` on our socket, so a kubelet (`--image-service-endpoint`) or crictl
//! (`--image-endpoint`) pulls through cri-imaged without knowing it.
//!
//! ListImages, ImageStatus, RemoveImage and ImageFsInfo are the runtime's answers with their
//! bytes untouched, but for the images we pin marked `pinned` (see [`crate::pinned`]):
//! ImageStatus (not verbose) and ListImages remembered by the presence cache
//! while it is proven current, ImageFsInfo from a snapshot of a bounded age (see
//! [`crate::presence::answers`]); PullImage goes through the scheduler and the registry limits.
//! A RemoveImage (like every pull) empties the presence cache before its answer is sent, so no
//! answer after it is one remembered from before.
//! An ImageStatus that finds the image hands it out, as EnsureImageExists does: image GC keeps it
//! for the hand-out window, and one whose removal by image GC overlapped the call is answered
//! absent (see [`crate::gc::guard`]).
//! StreamImages (KEP-5825) is ListImages' answer cut into messages, or, where nothing is
//! remembered, the runtime's own stream when it has one (see `stream_images`). A method we do not
//! know is relayed to the runtime whole, for it to answer or refuse: a newer kubelet's call the
//! runtime has must not be refused here.

use std::{convert::Infallible, future::Future, pin::Pin, sync::Arc};

use crate::cri::{PullImageRequest, PullImageResponse};
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use tonic::{Request, Response, Status, body::Body, server::NamedService};

use super::{Services, metrics::CallMetrics, roles::Granted, status::CriPullError};
use crate::{
    access::Role,
    credentials::RegistryAuth,
    gc::{ImageGuard, guard::HandOut},
    pinned::PinnedImages,
    presence::{PresenceCache, answers::CriCall},
    pull::path::PullPath,
    runtime::passthrough::RawCodec,
    runtime::{ImageRuntime, MAX_MESSAGE_BYTES, Messages, PullSpec},
};

mod stream_images;

/// The service's gRPC name.
pub const CRI_IMAGE_SERVICE: &str = "runtime.v1.ImageService";

/// What every method's path starts with.
const CRI_METHOD_PREFIX: &str = "/runtime.v1.ImageService/";

/// The calls answered with the runtime's bytes.
const FORWARDED: [&str; 4] = [LIST_IMAGES, IMAGE_STATUS, REMOVE_IMAGE, IMAGE_FS_INFO];
const LIST_IMAGES: &str = "/runtime.v1.ImageService/ListImages";
const IMAGE_FS_INFO: &str = "/runtime.v1.ImageService/ImageFsInfo";
const REMOVE_IMAGE: &str = "/runtime.v1.ImageService/RemoveImage";
const IMAGE_STATUS: &str = "/runtime.v1.ImageService/ImageStatus";
const PULL_IMAGE: &str = "/runtime.v1.ImageService/PullImage";
const STREAM_IMAGES: &str = "/runtime.v1.ImageService/StreamImages";

/// The service; cheap to clone.
pub struct CriImageService<R> {
    /// Pulls go through the pull path (scheduler, single-flight, limits, records).
    pulls: Arc<PullPath>,
    /// Everything else is forwarded to the runtime.
    runtime: Arc<R>,
    presence: Arc<PresenceCache>,
    /// Marked pinned in ImageStatus and ListImages answers.
    pinned: Arc<PinnedImages>,
    /// Marks what ImageStatus hands out, for image GC.
    guard: Arc<ImageGuard>,
    /// Counts the calls relayed unread.
    calls: Arc<CallMetrics>,
}

impl<R> CriImageService<R> {
    pub fn new(services: &Services<R>) -> Self {
        Self {
            pulls: services.pulls.clone(),
            runtime: services.runtime.clone(),
            presence: services.presence.clone(),
            pinned: services.pinned.clone(),
            guard: services.guard.clone(),
            calls: services.calls.clone(),
        }
    }
}

impl<R> Clone for CriImageService<R> {
    fn clone(&self) -> Self {
        Self {
            pulls: self.pulls.clone(),
            runtime: self.runtime.clone(),
            presence: self.presence.clone(),
            pinned: self.pinned.clone(),
            guard: self.guard.clone(),
            calls: self.calls.clone(),
        }
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

/// Just the image id of an ImageStatusResponse (`image.id`); prost skips every other field.
#[derive(Clone, PartialEq, prost::Message)]
struct StatusImageId {
    #[prost(message, optional, tag = "1")]
    image: Option<ImageId>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ImageId {
    #[prost(string, tag = "1")]
    id: String,
}

/// Just `verbose` of an ImageStatusRequest; prost skips the image.
#[derive(Clone, PartialEq, prost::Message)]
struct StatusVerbose {
    #[prost(bool, tag = "2")]
    verbose: bool,
}

/// Whether an ImageStatusRequest's answer may be remembered: not verbose (its info is the
/// runtime's to give), and readable.
fn rememberable_status(request: &Bytes) -> bool {
    matches!(<StatusVerbose as prost::Message>::decode(request.clone()), Ok(StatusVerbose { verbose: false }))
}

/// The runtime's ImageStatus answer `raw`, unchanged, once its image is marked handed out; the
/// answer for an absent image (an empty message) when image GC's removal of it overlapped.
fn handed_out(hand_out: &HandOut, raw: Bytes) -> Bytes {
    let id = match <StatusImageId as prost::Message>::decode(raw.clone()) {
        Ok(StatusImageId { image: Some(ImageId { id }) }) if !id.is_empty() => id,
        // Absent, or an answer we cannot read: nothing to hand out.
        _ => return raw,
    };
    if hand_out.complete(&id, tokio::time::Instant::now()) {
        return raw;
    }
    tracing::info!(image_ref = %id, "the image was being removed by image GC; answered absent");
    Bytes::new()
}

impl<R: ImageRuntime> CriImageService<R> {
    /// The runtime's answer to `method` with `request`, as bytes: remembered when it can be. An
    /// image's status is a hand-out, which image GC respects for a while, only to a caller that may
    /// pull: a reader polling it must not keep an image from being collected.
    async fn answer(self, method: &'static str, request: Bytes, hands_out: bool) -> Result<Bytes, Status> {
        match method {
            IMAGE_STATUS if !hands_out => {
                if rememberable_status(&request) {
                    self.remembered(CriCall::ImageStatus, method, request).await
                } else {
                    Ok(self.pinned.mark(self.runtime.forward_raw(method, request).await?))
                }
            }
            IMAGE_STATUS => {
                let hand_out = self.guard.handing_out();
                let answer = if rememberable_status(&request) {
                    self.remembered(CriCall::ImageStatus, method, request).await?
                } else {
                    self.pinned.mark(self.runtime.forward_raw(method, request).await?)
                };
                Ok(handed_out(&hand_out, answer))
            }
            LIST_IMAGES => self.remembered(CriCall::ListImages, method, request).await,
            // The request has no fields (yet): one that has some is the runtime's to read.
            IMAGE_FS_INFO if request.is_empty() => {
                let asked_at = tokio::time::Instant::now();
                if let Some(answer) = self.presence.fs_info(asked_at) {
                    return Ok(answer);
                }
                let ticket = self.presence.fs_info_ticket();
                let answer = self.runtime.forward_raw(method, request).await?;
                self.presence.remember_fs_info(ticket, &answer, asked_at);
                Ok(answer)
            }
            _ => {
                // Whether a removal succeeds, fails or is cancelled half way, it may have changed
                // what is present: forget before answering, or when given up on.
                let _forget = (method == REMOVE_IMAGE).then(|| ForgetOnDrop(self.presence.clone()));
                self.runtime.forward_raw(method, request).await
            }
        }
    }

    /// StreamImages: the answer ListImages would give, cut into messages. Where answers are not
    /// remembered (strict mode, or a runtime whose image events are not watched) it is the
    /// runtime's own StreamImages, when it has one: its messages as it sent them, pins marked.
    async fn stream_images(self, request: Bytes) -> Result<Messages, Status> {
        if self.presence.answer_ticket().is_none()
            && let Some(messages) = self.runtimes_stream(request.clone()).await?
        {
            return Ok(messages);
        }
        let answer = self.remembered(CriCall::ListImages, LIST_IMAGES, request).await?;
        let messages = stream_images::cut(answer, stream_images::MESSAGE_BYTES);
        Ok(Box::pin(futures_util::stream::iter(messages.into_iter().map(Ok))))
    }

    /// The runtime's StreamImages, its pins marked; `None` from a runtime without it (it answers
    /// UNIMPLEMENTED, at once or as its first message, as the kubelet's client expects either).
    async fn runtimes_stream(&self, request: Bytes) -> Result<Option<Messages>, Status> {
        let mut messages = match self.runtime.forward_stream(STREAM_IMAGES, request).await {
            Err(status) if status.code() == tonic::Code::Unimplemented => return Ok(None),
            answer => answer?,
        };
        let first = messages.next().await;
        if matches!(&first, Some(Err(status)) if status.code() == tonic::Code::Unimplemented) {
            return Ok(None);
        }
        let pinned = self.pinned.clone();
        let all = futures_util::stream::iter(first).chain(messages);
        Ok(Some(Box::pin(all.map(move |message| message.map(|message| pinned.mark(message))))))
    }

    /// The runtime's answer to `call`, from the presence cache when it is remembered and proven
    /// current; else asked, and remembered if nothing changed meanwhile.
    async fn remembered(&self, call: CriCall, method: &'static str, request: Bytes) -> Result<Bytes, Status> {
        if let Some(answer) = self.presence.recall_answer(call, &request, tokio::time::Instant::now()).await {
            return Ok(answer);
        }
        let ticket = self.presence.answer_ticket();
        let answer = self.pinned.mark(self.runtime.forward_raw(method, request.clone()).await?);
        if let Some(ticket) = ticket {
            self.presence.remember_answer(ticket, call, &request, &answer);
        }
        Ok(answer)
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
        let pulls = self.pulls.clone();
        let path = request.uri().path().to_owned();
        if let Some(method) = FORWARDED.into_iter().find(|method| *method == path) {
            let service = self.clone();
            let granted = request.extensions().get::<Granted>().and_then(|granted| granted.role);
            let hands_out = granted.is_some_and(|role| role >= Role::Pull);
            let forward = tower::service_fn(move |call: Request<Bytes>| {
                service.clone().answer(method, call.into_inner(), hands_out).map(|answer| answer.map(Response::new))
            });
            let mut grpc = tonic::server::Grpc::new(RawCodec)
                .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES));
            return Box::pin(async move { Ok(grpc.unary(forward, request).await) });
        }
        if path == STREAM_IMAGES {
            let service = self.clone();
            let stream = tower::service_fn(move |call: Request<Bytes>| {
                let service = service.clone();
                async move { service.stream_images(call.into_inner()).await.map(Response::new) }
            });
            let mut grpc = tonic::server::Grpc::new(RawCodec)
                .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES));
            return Box::pin(async move { Ok(grpc.server_streaming(stream, request).await) });
        }
        if path == PULL_IMAGE {
            let pull = tower::service_fn(move |call: Request<PullImageRequest>| {
                let pulls = pulls.clone();
                async move {
                    let peer = super::request::peer(&call);
                    let PullImageRequest { image, auth, sandbox_config } = call.into_inner();
                    let auth = auth.map(|auth| Arc::new(RegistryAuth::from_cri(auth)));
                    let spec = PullSpec { image: image.unwrap_or_default(), auth, sandbox_config };
                    let pulled =
                        pulls.pull_image(spec, peer).await.map_err(|error| Status::from(CriPullError(error)))?;
                    Ok(Response::new(PullImageResponse { image_ref: pulled.image_ref }))
                }
            });
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
                .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES));
            return Box::pin(async move { Ok(grpc.unary(pull, request).await) });
        }
        // A method we do not know (a newer CRI's): the runtime's to answer, or to refuse.
        let method = path.strip_prefix(CRI_METHOD_PREFIX).unwrap_or(&path);
        self.calls.relayed(method);
        let runtime = self.runtime.clone();
        Box::pin(async move { Ok(runtime.relay(request).await.unwrap_or_else(|status| status.into_http())) })
    }
}

#[cfg(test)]
mod tests {
    use crate::cri::{Image, ImageStatusResponse};
    use prost::Message;

    use super::*;

    fn status_of(id: &str) -> Bytes {
        let image = Image { id: id.into(), repo_tags: vec!["registry.local/app:v1".into()], ..Default::default() };
        ImageStatusResponse { image: Some(image), ..Default::default() }.encode_to_vec().into()
    }

    #[test]
    fn an_image_status_that_finds_the_image_hands_it_out_unchanged() {
        let guard = Arc::new(ImageGuard::default());
        let pass_began = guard.now();
        let answer = status_of("sha256:app");
        assert_eq!(handed_out(&guard.handing_out(), answer.clone()), answer, "the runtime's bytes as they came");
        assert!(guard.claim("sha256:app", &[], pass_began).is_none(), "image GC keeps what was handed out");
        let absent = Bytes::from(ImageStatusResponse::default().encode_to_vec());
        assert_eq!(handed_out(&guard.handing_out(), absent.clone()), absent);
    }

    #[test]
    fn an_image_status_overlapping_its_removal_by_image_gc_answers_absent() {
        let guard = Arc::new(ImageGuard::default());
        let hand_out = guard.handing_out();
        let removal = guard.claim("sha256:app", &[], guard.now()).expect("claimed");
        let answer = handed_out(&hand_out, status_of("sha256:app"));
        assert_eq!(ImageStatusResponse::decode(answer).expect("decodes"), ImageStatusResponse::default());
        drop(removal);
    }
}
