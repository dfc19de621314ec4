//! Which change signal keeps the presence cache current: containerd's image events where the
//! runtime has them; else CRI-O's image store under inotify, in the directory the runtime's
//! ImageFsInfo names when it holds an `images.json` or `images.lock`, or else
//! `--image-store-path`; else none, and every presence check asks the runtime, as the kubelet
//! does.

use std::{path::PathBuf, sync::Arc};

use tonic::transport::Channel;

use super::{
    PresenceCache, Signal,
    image_events::{self, Finished},
    image_store,
};
use crate::{runtime::ImageRuntime, shutdown::Shutdown};

/// Follows the best signal `runtime` offers until shutdown; `store_path` is the image store to
/// watch when the runtime's ImageFsInfo names none.
pub async fn watch<R: ImageRuntime>(
    channel: Channel,
    runtime: Arc<R>,
    store_path: Option<PathBuf>,
    cache: Arc<PresenceCache>,
    shutdown: Shutdown,
) {
    if image_events::watch(channel, cache.clone(), shutdown.clone()).await == Finished::Stopped {
        return;
    }
    match image_store_dir(&*runtime, store_path).await {
        Some(dir) => image_store::watch(dir, cache, shutdown).await,
        None => {
            cache.set_signal(Signal::None);
            tracing::info!("no image events and no image store to watch: presence checks will always ask the runtime");
        }
    }
}

/// The image store to watch: where the runtime keeps its images if that is one, else `flag`.
async fn image_store_dir<R: ImageRuntime>(runtime: &R, flag: Option<PathBuf>) -> Option<PathBuf> {
    match runtime.image_fs_mountpoint().await {
        Ok(Some(dir)) if image_store::holds_store(&dir) => return Some(dir),
        Ok(Some(dir)) => tracing::debug!(image_fs = %dir.display(), "the image filesystem holds no image store"),
        Ok(None) => {}
        Err(error) => tracing::warn!(%error, "the runtime's image filesystem is unknown"),
    }
    flag
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::fake::FakeRuntime;

    #[tokio::test]
    async fn without_a_store_on_the_image_filesystem_the_flag_names_it() {
        let flag = PathBuf::from("/var/lib/containers/storage/overlay-images");
        let runtime = FakeRuntime::default();
        assert_eq!(image_store_dir(&runtime, Some(flag.clone())).await, Some(flag));
        assert_eq!(image_store_dir(&runtime, None).await, None);
    }
}
