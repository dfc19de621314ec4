//! What a pre-pull's lease holds: the pull's manifest (also under its download's name, so that a
//! pull resumed later finds it), config, layers and their downloads; and the manifest a resumed
//! pull finds there.

use super::{Poll, Registered};
use crate::{
    pull::progress::{Layer, manifest_config},
    runtime::{ContentStore, Held},
};

impl<R: ContentStore> Poll<R> {
    /// The manifest a pull kept in a lease fetched before it was cut short: the lease holds its
    /// download by containerd's name for it, `manifest-<digest>`.
    pub(super) async fn kept_manifest(&self, pull: &Registered) -> Option<String> {
        let lease = pull.keep_in.as_deref()?;
        let held = self.runtime.held(lease).await.ok()?;
        held.into_iter().find_map(|held| match held {
            Held::Download(reference) => reference.strip_prefix("manifest-").map(str::to_owned),
            Held::Blob(_) => None,
        })
    }
    /// Makes `lease` hold the pull's manifest, config and layers, each layer both as a blob and as
    /// the download containerd names `layer-<digest>`: whatever is cut short later, what it
    /// fetched stays, and a later pull goes on from there. Best effort: the pull goes on anyway;
    /// `false` when nothing is kept.
    pub(super) async fn keep(&self, lease: &str, manifest: &str, blob: &[u8], layers: &[Layer]) -> bool {
        let config = manifest_config(blob).into_iter();
        let blobs = [manifest.to_owned()].into_iter().chain(config).map(Held::Blob);
        // Its manifest named so that a pull resumed later finds it (see `kept_manifest`).
        let blobs = blobs.chain([Held::Download(format!("manifest-{manifest}"))]);
        let layers = layers
            .iter()
            .flat_map(|layer| [Held::Blob(layer.digest.clone()), Held::Download(format!("layer-{}", layer.digest))]);
        let held: Vec<Held> = blobs.chain(layers).collect();
        match self.runtime.hold(lease, &held).await {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(%error, lease, "what the pull fetches is not kept; cut short, it starts over");
                false
            }
        }
    }

    /// Makes `lease`, ending at `expires`, for a pull that may make way for smaller ones.
    pub(super) async fn made_lease(&self, lease: &str, expires: std::time::SystemTime) -> bool {
        match self.runtime.create_lease(lease, expires).await {
            Ok(()) => true,
            Err(error) => {
                tracing::debug!(%error, lease, "no lease for a big pull: should it make way, it starts over");
                false
            }
        }
    }
}
