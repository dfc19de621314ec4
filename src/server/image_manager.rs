//! The `imagemanager.v1.ImageManager` service: translates, calls the manager or the collector,
//! translates back.

use std::{pin::Pin, sync::Arc, time::SystemTime};

use futures_util::Stream;
use tonic::{Request, Response, Status};

use super::streams::StreamShutDown;

use crate::{
    api::{self, image_manager_server},
    ensure::{EnsureRequest, ImageManager},
    events::{self, Event, Events, Filter, Next},
    gc::{ImageGc, Outcome, PassRequest, collector::Chosen, plan::DiskUsage},
    runtime::{ImageFsUsage, ImageRuntime},
    shutdown::Shutdown,
};

/// The gRPC face of an [`ImageManager`], its [`ImageGc`] and the node's [`Events`].
pub struct ImageManagerService<R> {
    manager: Arc<ImageManager<R>>,
    gc: Arc<ImageGc<R>>,
    events: Arc<Events>,
    /// Event streams end when the daemon stops.
    shutdown: Shutdown,
}

impl<R> ImageManagerService<R> {
    pub fn new(manager: Arc<ImageManager<R>>, gc: Arc<ImageGc<R>>, events: Arc<Events>, shutdown: Shutdown) -> Self {
        Self { manager, gc, events, shutdown }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<api::Event, Status>> + Send>>;

#[tonic::async_trait]
impl<R: ImageRuntime> image_manager_server::ImageManager for ImageManagerService<R> {
    type WatchEventsStream = EventStream;

    async fn watch_events(
        &self,
        request: Request<api::WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        let api::WatchEventsRequest { pod_uid, namespace, image } = request.into_inner();
        let subscription = self.events.subscribe(Filter { pod_uid, namespace, image });
        let stopping = Box::pin(self.shutdown.clone().requested());
        let stream = futures_util::stream::unfold(
            (subscription, stopping, false),
            |(mut subscription, mut stopping, ended)| async move {
                if ended {
                    return None;
                }
                tokio::select! {
                    next = subscription.next() => {
                        let event = match next? {
                            Next::Event(event) => wire_event(&event, 0),
                            Next::Lagged(lost) => wire_event(&events::lagged(lost), lost),
                        };
                        Some((Ok(event), (subscription, stopping, false)))
                    }
                    () = &mut stopping => {
                        Some((Err(Status::from(StreamShutDown)), (subscription, stopping, true)))
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn ensure_image_exists(
        &self,
        request: Request<api::EnsureImageExistsRequest>,
    ) -> Result<Response<api::EnsureImageExistsResponse>, Status> {
        let request = EnsureRequest::try_from(request.into_inner())?;
        let outcome = self.manager.ensure_image_exists(request).await?;
        let pull_duration = outcome.pull.and_then(|times| prost_types::Duration::try_from(times.total).ok());
        Ok(Response::new(api::EnsureImageExistsResponse {
            image_ref: outcome.image_ref,
            message: outcome.message,
            pulled: outcome.pull.is_some(),
            pull_duration,
            image_size_bytes: outcome.image_size,
        }))
    }

    async fn garbage_collect(
        &self,
        request: Request<api::GarbageCollectRequest>,
    ) -> Result<Response<api::GarbageCollectResponse>, Status> {
        let api::GarbageCollectRequest { dry_run, delete_unused } = request.into_inner();
        // In a task of its own: a caller that goes away does not cut a pass between a removal and
        // what follows it (the presence cache, the pull record, the ages).
        let gc = self.gc.clone();
        let pass = tokio::spawn(async move { gc.pass(PassRequest { dry_run, delete_unused }).await });
        let report =
            pass.await.map_err(|error| Status::internal(format!("the garbage collection pass stopped: {error}")))??;
        Ok(Response::new(api::GarbageCollectResponse {
            images: report.images.into_iter().map(collected_image).collect(),
            usage_before: report.usage_before.map(image_fs_usage),
            usage_after: report.usage_after.map(image_fs_usage),
            bytes_to_free: report.to_free,
            freed_bytes: report.freed,
            shortfall: report.shortfall.unwrap_or_default(),
        }))
    }
}

fn wire_event(event: &Event, dropped: u64) -> api::Event {
    let duration = |duration: std::time::Duration| prost_types::Duration::try_from(duration).ok();
    api::Event {
        time: Some(prost_types::Timestamp::from(event.time)),
        r#type: event.kind.as_str().to_owned(),
        reason: event.reason.to_owned(),
        message: event.message.clone(),
        pod: event.pod.as_ref().map(|pod| api::PodRef {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            annotations: Default::default(),
        }),
        container_name: event.container.clone(),
        image: event.image.clone(),
        image_ref: event.image_ref.clone(),
        pull_duration: event.pull.and_then(|pull| duration(pull.pull)),
        pull_duration_with_waiting: event.pull.and_then(|pull| duration(pull.total)),
        image_size_bytes: event.pull.map_or(0, |pull| pull.image_size),
        dropped,
    }
}

fn collected_image(image: Chosen) -> api::CollectedImage {
    let timestamp = |time: SystemTime| prost_types::Timestamp::from(time);
    let (removed, error) = match image.outcome {
        Outcome::Removed => (true, String::new()),
        Outcome::WouldRemove => (false, String::new()),
        Outcome::KeptInUse => (false, "kept: handed out or pulled during the pass".to_owned()),
        Outcome::Failed(error) => (false, error),
    };
    api::CollectedImage {
        image_id: image.id,
        names: image.names,
        reason: image.reason.as_str().to_owned(),
        size_bytes: image.size,
        first_detected: Some(timestamp(image.first_detected)),
        last_used: image.last_used.map(timestamp),
        removed,
        error,
    }
}

fn image_fs_usage(usage: ImageFsUsage) -> api::ImageFsUsage {
    let usage_percent = DiskUsage::from(usage).usage_percent();
    api::ImageFsUsage {
        capacity_bytes: usage.capacity,
        available_bytes: usage.available,
        usage_percent: u32::try_from(usage_percent).unwrap_or(100),
    }
}
