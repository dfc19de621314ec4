//! Adopting the kubelet's pull records (KEP-2535): on a node whose kubelet recorded which
//! credentials pulled each image before cri-imaged served its image manager, those images would
//! otherwise have no record of ours and pass for preloaded, usable by any pod under the default
//! `NeverVerifyPreloadedImages`. At every start, the kubelet's records of images present are
//! merged into ours (a merge is a union: one already merged changes nothing), and each image the
//! kubelet was pulling when it stopped gets a record with no credentials, as the kubelet would
//! give it. The kubelet's directory is only read: its files are the kubelet's, whatever they hold.

use std::{
    collections::HashSet,
    fs,
    path::{Path, PathBuf},
    sync::Arc,
};

use super::{
    PullRecords, RecordsError, blocking,
    format::{FormatError, Intent, PulledRecord},
};
use crate::{
    files::{
        read::{Links, read_bounded},
        state_dir::STATE_FILE_LIMIT,
    },
    runtime::ImageRuntime,
};

/// At most this many of the kubelet's files are read from each directory (it keeps one an image).
const FILES_READ: usize = 100_000;

/// What was adopted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Records of present images merged into ours.
    pub records: usize,
    /// Images the kubelet was pulling, present now, recorded with no credentials.
    pub intents: usize,
}

impl PullRecords {
    /// The kubelet's records under `kubelet_root` (its `--root-dir`) are to be adopted as the
    /// records settle; until then every present image is verified, when there are any (a node
    /// whose kubelet never recorded a pull has no such wait). Reads the directories' first entry
    /// only: called at start.
    pub fn adopt_from(&self, kubelet_root: &Path) {
        let dir = kubelet_root.join("image_manager");
        let any = |sub: &str| fs::read_dir(dir.join(sub)).is_ok_and(|mut entries| entries.next().is_some());
        if any("pulled") || any("pulling") {
            let mut state = self.state();
            state.unsettled = true;
            state.adopt_from = Some(dir);
        }
    }

    /// Merges the kubelet's records and intents of images `runtime` has into ours; `Err` when the
    /// runtime did not answer (to be tried again).
    pub(super) async fn adopt<R: ImageRuntime>(self: &Arc<Self>, runtime: &R) -> Result<Adopted, RecordsError> {
        let Some(dir) = self.state().adopt_from.clone() else { return Ok(Adopted::default()) };
        let present: HashSet<String> = match runtime.list_image_ids().await {
            Ok(Some(ids)) => ids.into_iter().collect(),
            Ok(None) => return Ok(Adopted::default()),
            Err(error) => return Err(RecordsError::Writer(error.to_string())),
        };
        let (records, intents) = blocking(move || {
            Ok((
                read_kubelets(&dir.join("pulled"), PulledRecord::decode),
                read_kubelets(&dir.join("pulling"), Intent::decode),
            ))
        })
        .await?;
        let mut adopted = Adopted::default();
        for record in records.into_iter().filter(|record| present.contains(&record.image_ref)) {
            if record.credential_mapping.is_empty() {
                self.merge_unknown(&record.image_ref).await?;
            }
            for (name, credentials) in record.credential_mapping {
                self.merge(&record.image_ref, &name, credentials).await?;
            }
            adopted.records += 1;
        }
        for intent in intents {
            let spec = crate::cri::ImageSpec { image: intent.image.clone(), ..Default::default() };
            match runtime.image_status(spec).await {
                Ok(Some(found)) => {
                    self.merge_unknown(&found.id).await?;
                    adopted.intents += 1;
                }
                Ok(None) => {}
                Err(error) => return Err(RecordsError::Writer(error.to_string())),
            }
        }
        Ok(adopted)
    }
}

/// The kubelet's files in `dir` that decode; the others are passed over with a warning (a
/// missing directory is a kubelet that never recorded).
fn read_kubelets<T>(dir: &Path, decode: fn(&[u8]) -> Result<T, FormatError>) -> Vec<T> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot read the kubelet's pull records");
            return Vec::new();
        }
    };
    let named = |path: &PathBuf| {
        let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        name.starts_with("sha256-") && !name.ends_with(".tmp")
    };
    let paths: Vec<PathBuf> = entries.flatten().map(|entry| entry.path()).filter(named).take(FILES_READ).collect();
    paths
        .into_iter()
        .filter_map(|path| {
            let decoded = match read_bounded(&path, STATE_FILE_LIMIT, Links::Refuse) {
                // Removed by the kubelet since the listing.
                Ok(None) => return None,
                Ok(Some(contents)) => decode(&contents).map_err(|error| error.to_string()),
                Err(error) => Err(error.to_string()),
            };
            decoded
                .inspect_err(
                    |error| tracing::warn!(path = %path.display(), %error, "a kubelet pull record passed over"),
                )
                .ok()
        })
        .collect()
}

#[cfg(test)]
mod tests;
