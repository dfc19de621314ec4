//! The `imagemanager.v1.ImageManager` service: translates, calls the manager, translates back.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::{
    api::{self, image_manager_server},
    ensure::{EnsureRequest, ImageManager},
    runtime::ImageRuntime,
};

/// The gRPC face of an [`ImageManager`].
pub struct ImageManagerService<R> {
    manager: Arc<ImageManager<R>>,
}

impl<R> ImageManagerService<R> {
    pub fn new(manager: Arc<ImageManager<R>>) -> Self {
        Self { manager }
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
}
