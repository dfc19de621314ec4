//! `WatchEvents`, served beside the generated ImageManager service so that each event is encoded
//! once for every watcher, not once per watcher: a herd of a thousand pods publishes two thousand
//! events, and a hundred watchers would otherwise encode them two hundred thousand times.
//!
//! A watcher's stream also waits [`EVENT_LINGER`] after the first event of a quiet spell, so that
//! what follows goes with it in one write and one wake-up of the watcher.

use std::{convert::Infallible, future::Future, pin::Pin, sync::Arc, task::Poll};

use bytes::Bytes;
use futures_util::Stream;
use prost::Message;
use tonic::{
    Request, Response, Status,
    body::Body,
    codec::Codec,
    server::{Grpc, NamedService, ServerStreamingService},
};

use super::{API_MAX_REQUEST_BYTES, streams::StreamShutDown};
use crate::{
    api,
    events::{self, Event, Events, Filter, Next},
    runtime::passthrough::{RawCodec, RawEncoder},
    shutdown::Shutdown,
};

/// The method's path.
pub const WATCH_EVENTS: &str = "/imagemanager.v1.ImageManager/WatchEvents";

/// How long an event waits for others to go with it to a watcher.
const EVENT_LINGER: std::time::Duration = std::time::Duration::from_millis(20);

/// The ImageManager service `S`, with `WatchEvents` served here.
#[derive(Clone)]
pub struct WithWatch<S> {
    inner: S,
    events: Arc<Events>,
    /// Streams end when the daemon stops.
    shutdown: Shutdown,
}

impl<S> WithWatch<S> {
    pub fn new(inner: S, events: Arc<Events>, shutdown: Shutdown) -> Self {
        Self { inner, events, shutdown }
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
        let watch = Watch { events: self.events.clone(), shutdown: self.shutdown.clone() };
        let mut grpc = Grpc::new(WatchCodec).apply_max_message_size_config(Some(API_MAX_REQUEST_BYTES), None);
        Box::pin(async move { Ok(grpc.server_streaming(watch, request).await) })
    }
}

/// Decodes the request as prost does; writes the events' bytes as they were encoded.
#[derive(Clone, Copy, Default)]
struct WatchCodec;

impl Codec for WatchCodec {
    type Encode = Bytes;
    type Decode = api::WatchEventsRequest;
    type Encoder = RawEncoder;
    type Decoder = tonic_prost::ProstDecoder<api::WatchEventsRequest>;

    fn encoder(&mut self) -> RawEncoder {
        RawCodec.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstCodec::<api::Event, api::WatchEventsRequest>::default().decoder()
    }
}

struct Watch {
    events: Arc<Events>,
    shutdown: Shutdown,
}

type EventStream = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>;

impl ServerStreamingService<api::WatchEventsRequest> for Watch {
    type Response = Bytes;
    type ResponseStream = EventStream;
    type Future = BoxFuture<Result<Response<EventStream>, Status>>;

    fn call(&mut self, request: Request<api::WatchEventsRequest>) -> Self::Future {
        let api::WatchEventsRequest { pod_uid, namespace, image } = request.into_inner();
        let subscription = self.events.subscribe(Filter { pod_uid, namespace, image });
        let stopping = Box::pin(self.shutdown.clone().requested());
        let stream = futures_util::stream::unfold(
            (subscription, stopping, false),
            |(mut subscription, mut stopping, ended)| async move {
                if ended {
                    return None;
                }
                let end =
                    |subscription, stopping| Some((Err(Status::from(StreamShutDown)), (subscription, stopping, true)));
                // What has come meanwhile goes out at once: tonic writes it all in one frame.
                if let Some(next) = subscription.try_next() {
                    return Some((Ok(encoded(next)), (subscription, stopping, false)));
                }
                let next = tokio::select! {
                    next = subscription.next() => next?,
                    () = &mut stopping => return end(subscription, stopping),
                };
                tokio::select! {
                    () = tokio::time::sleep(EVENT_LINGER) => {}
                    () = &mut stopping => return end(subscription, stopping),
                }
                Some((Ok(encoded(next)), (subscription, stopping, false)))
            },
        );
        let stream: EventStream = Box::pin(stream);
        Box::pin(async move { Ok(Response::new(stream)) })
    }
}

/// The event as the wire carries it: encoded by the first watcher to send it, shared after.
fn encoded(next: Next) -> Bytes {
    match next {
        Next::Event(event) => event.wire.get_or_init(|| wire_event(&event, 0).encode_to_vec().into()).clone(),
        Next::Lagged(lost) => wire_event(&events::lagged(lost), lost).encode_to_vec().into(),
    }
}

fn wire_event(event: &Event, dropped: u64) -> api::Event {
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
    }
}
