//! `WatchEvents`, served beside the generated ImageManager service with a response body of its
//! own: a herd of a thousand pods publishes two thousand events, and a hundred watchers reading
//! them through tonic's per-message encoder doubled the daemon's CPU per herd.
//!
//! Instead [`batches`] frames each event once and seals events into batches that every watcher
//! shares; a watcher's body sends them as they are.

mod batches;

use std::{convert::Infallible, future::Future, pin::Pin, sync::Arc, task::Poll};

use http_body::Frame;
use tonic::{
    Status,
    body::Body,
    codec::{Codec, Streaming},
    server::NamedService,
};

use self::batches::{Batches, Ended, Watcher};
use super::{
    API_MAX_REQUEST_BYTES,
    streams::{StreamShutDown, trailers},
};
use crate::{
    api,
    events::{self, Event, Events, Filter},
    shutdown::Shutdown,
};

/// The method's path.
pub const WATCH_EVENTS: &str = "/imagemanager.v1.ImageManager/WatchEvents";

/// The ImageManager service `S`, with `WatchEvents` served here.
#[derive(Clone)]
pub struct WithWatch<S> {
    inner: S,
    batches: Arc<Batches>,
    /// Streams end when the daemon stops.
    shutdown: Shutdown,
}

impl<S> WithWatch<S> {
    pub fn new(inner: S, events: Arc<Events>, shutdown: Shutdown) -> Self {
        Self { inner, batches: Batches::new(events), shutdown }
    }
}

impl<S: NamedService> NamedService for WithWatch<S> {
    const NAME: &'static str = S::NAME;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tower::Service<http::Request<Body>> for WithWatch<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != WATCH_EVENTS {
            return Box::pin(self.inner.call(request));
        }
        let (batches, shutdown) = (self.batches.clone(), self.shutdown.clone());
        Box::pin(async move {
            Ok(match read_request(request).await {
                Ok(api::WatchEventsRequest { pod_uid, namespace, image }) => {
                    respond(batches.watch(Filter { pod_uid, namespace, image }), shutdown)
                }
                Err(status) => status.into_http(),
            })
        })
    }
}

/// The call had no request message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("WatchEvents takes one WatchEventsRequest message; the call sent none")]
pub struct NoRequestMessage;

/// The call's one message, decoded as tonic decodes any request: size limit, framing, prost.
async fn read_request(request: http::Request<Body>) -> Result<api::WatchEventsRequest, Status> {
    let decoder = tonic_prost::ProstCodec::<api::Event, api::WatchEventsRequest>::default().decoder();
    let mut messages = Streaming::new_request(decoder, request.into_body(), None, Some(API_MAX_REQUEST_BYTES));
    messages.message().await?.ok_or_else(|| NoRequestMessage.into())
}

/// A gRPC response whose body is `watcher`'s events until the daemon stops.
fn respond(watcher: Watcher, shutdown: Shutdown) -> http::Response<Body> {
    let stopping: BoxFuture<()> = Box::pin(shutdown.requested());
    let frames = futures_util::stream::unfold(Some((watcher, stopping)), |state| async move {
        let (mut watcher, mut stopping) = state?;
        let next = tokio::select! {
            next = watcher.next() => next.map_err(|Ended| Status::new(tonic::Code::Ok, "")),
            () = &mut stopping => Err(StreamShutDown.into()),
        };
        Some(match next {
            Ok(frames) => (Ok::<_, Status>(Frame::data(frames)), Some((watcher, stopping))),
            Err(end) => (Ok(Frame::trailers(trailers(end))), None),
        })
    });
    let mut response = http::Response::new(Body::new(http_body_util::StreamBody::new(frames)));
    response.headers_mut().insert(http::header::CONTENT_TYPE, tonic::metadata::GRPC_CONTENT_TYPE);
    response
}

pub(super) fn wire_event(event: &Event, dropped: u64) -> api::Event {
    let duration = |duration: std::time::Duration| prost_types::Duration::try_from(duration).ok();
    api::Event {
        time: Some(prost_types::Timestamp::from(event.time)),
        r#type: event.kind.as_str().to_owned(),
        reason: event.reason.to_owned(),
        message: event.message.clone(),
        pod: event.pod.as_ref().map(wire_pod),
        container_name: event.container.clone(),
        image: event.image.clone(),
        image_ref: event.image_ref.clone(),
        pull_duration: event.pull.and_then(|pull| duration(pull.pull)),
        pull_duration_with_waiting: event.pull.and_then(|pull| duration(pull.total)),
        image_size_bytes: event.pull.map_or(0, |pull| pull.image_size),
        dropped,
        progress: event.progress.as_ref().map(wire_progress),
        waiting_pods: event.waiting.iter().map(wire_pod).collect(),
    }
}

fn wire_pod(pod: &events::Pod) -> api::PodRef {
    api::PodRef {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        annotations: Default::default(),
    }
}

pub fn wire_progress(progress: &events::ProgressFacts) -> api::PullProgress {
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    api::PullProgress {
        bytes_done: progress.bytes_done,
        bytes_total: progress.bytes_total,
        layers_done: count(progress.layers_done),
        layers_total: count(progress.layers_total),
        bytes_per_second: progress.bytes_per_second,
        layers: progress
            .layers
            .iter()
            .map(|layer| api::LayerProgress {
                digest: layer.digest.to_string(),
                size_bytes: layer.size,
                bytes_done: layer.bytes_done,
                done: layer.done,
            })
            .collect(),
    }
}
