//! The runtime's images as image GC sees them, for `ListImages`: listed and matched to the
//! containers that use them as a pass does, with the ages the last pass recorded.

use std::{collections::HashMap, sync::Arc, time::SystemTime};

use super::{GcError, ImageGc};
use crate::{
    gc::plan::{ImageRecord, Kept, record_key},
    runtime::ImageRuntime,
};

/// An image on the node as image GC sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeImage {
    pub id: String,
    /// Its repo tags and digests.
    pub names: Vec<String>,
    pub size: u64,
    /// The runtime handler it is kept for; empty for the default one.
    pub runtime_handler: String,
    /// By the runtime, by `--pinned-image`, or the sandbox image.
    pub pinned: bool,
    /// By a container, in any state.
    pub in_use: bool,
    /// `None` before image GC first saw it.
    pub first_detected: Option<SystemTime>,
    /// `None` when never seen in use.
    pub last_used: Option<SystemTime>,
}

impl<R: ImageRuntime> ImageGc<R> {
    /// Every image the runtime lists, by id and runtime handler. Reads what a pass reads (the
    /// images, the containers, the pins) and changes nothing: the ages are the last pass's.
    pub async fn images(&self) -> Result<Vec<NodeImage>, GcError> {
        let config = self.config();
        let runtime = &self.parts.runtime;
        let listed = runtime.list_images().await.map_err(|source| GcError::Runtime { what: "list images", source })?;
        let in_use = self.in_use(&listed, &config).await?;
        let seen = self.seen_records().await;
        let mut images: Vec<NodeImage> = listed
            .into_iter()
            .map(|image| {
                let key = record_key(&image.id, &image.runtime_handler);
                let holds = in_use.get(&key).copied().unwrap_or_default();
                let record = seen.get(&key);
                NodeImage {
                    pinned: image.pinned || holds.has(Kept::Pinned) || holds.has(Kept::SandboxImage),
                    in_use: holds.has(Kept::InUse),
                    first_detected: record.map(|record| record.first_detected),
                    last_used: record.and_then(|record| record.last_used),
                    id: image.id,
                    names: image.names,
                    size: image.size,
                    runtime_handler: image.runtime_handler,
                }
            })
            .collect();
        images.sort_by(|a, b| (&a.id, &a.runtime_handler).cmp(&(&b.id, &b.runtime_handler)));
        Ok(images)
    }

    /// The records as the last pass left them; before the first, as the ages file kept them.
    async fn seen_records(&self) -> Arc<HashMap<String, ImageRecord>> {
        if let Some(seen) = self.seen().clone() {
            return seen;
        }
        let loaded = Arc::new(self.load_ages().await);
        self.seen().get_or_insert(loaded).clone()
    }

    pub(super) fn seen(&self) -> std::sync::MutexGuard<'_, Option<Arc<HashMap<String, ImageRecord>>>> {
        self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
