//! The `imagemanager.v1.ImageManager` service: translates, calls the manager or the collector,
//! translates back.

use std::{sync::Arc, time::SystemTime};

use tonic::{Request, Response, Status};

use crate::{
    api::{self, image_manager_server},
    ensure::{EnsureRequest, ImageManager},
    gc::{ImageGc, Outcome, PassRequest, collector::Chosen, plan::DiskUsage},
    runtime::{ImageFsUsage, ImageRuntime},
};

/// The gRPC face of an [`ImageManager`] and its [`ImageGc`].
pub struct ImageManagerService<R> {
    manager: Arc<ImageManager<R>>,
    gc: Arc<ImageGc<R>>,
}

impl<R> ImageManagerService<R> {
    pub fn new(manager: Arc<ImageManager<R>>, gc: Arc<ImageGc<R>>) -> Self {
        Self { manager, gc }
    }
}

#[tonic::async_trait]
impl<R: ImageRuntime> image_manager_server::ImageManager for ImageManagerService<R> {
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
