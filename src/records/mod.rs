//! Pull records (KEP-2535): which credentials pulled each image, so that a pod gets a cached
//! private image only if it could have pulled it. The kubelet's files under `--root-dir`
//! (`image_manager/pulling/` intents, `image_manager/pulled/` records), written crash-safely, with
//! a bounded cache in front that answers alone while every record fits in it.
//!
//! - [`format`](mod@format): the files' JSON, the kubelet's.
//! - [`fs`]: durable writes.
//! - [`policy`]: which present images are verified (pure).
//! - [`check`]: may a pod use an image its records name; merging a pull into a record (pure).
//! - [`cache`]: the bounded cache.
//! - [`metrics`]: the kubelet's `imagemanager` metrics.

pub mod cache;
pub mod check;
pub mod format;
pub mod fs;
pub mod metrics;
pub mod policy;

use std::{
    collections::{HashMap, HashSet},
    io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, SystemTime},
};

use self::{
    cache::ClockCache,
    format::{FormatError, Intent, PullCredentials, PulledRecord, SecretRecord},
    fs::RecordDir,
    metrics::RecordsMetrics,
};
use crate::{retry::Doubling, runtime::ImageRuntime};

/// The most records kept in memory; more stay on disk, read when asked for.
pub const RECORDS_IN_MEMORY: usize = 10_000;
/// The most intents kept in memory.
pub const INTENTS_IN_MEMORY: usize = 1024;

/// Why the records could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    #[error("pull records in {path}: {error}")]
    Io { path: PathBuf, error: io::Error },
    #[error("pull record {path} {error}")]
    Format { path: PathBuf, error: FormatError },
    #[error("the pull records' writer stopped: {0}")]
    Writer(String),
}

struct State {
    records: ClockCache<Arc<PulledRecord>>,
    /// Every record on disk is in `records`: a miss means there is none.
    records_authoritative: bool,
    /// Intents on disk, by image as the pod wrote it.
    intents: HashSet<String>,
    /// Every intent on disk is in `intents`.
    intents_authoritative: bool,
    /// Pulls under way, by image: the intent goes when the last one ends. (The sets of intents
    /// are not bounded: there is one an image being pulled, or left by a crash.)
    intents_in_flight: HashMap<String, u32>,
    /// Intents of pulls whose outcome was never recorded: found at start (a crash), or left by a
    /// pull whose record could not be written. Only a record replaces one; a failed pull of its
    /// image leaves it.
    orphaned: HashSet<String>,
    /// Until the intents found at start are settled (each turned into a record or found absent),
    /// an image pulled under them may be named another way than its intent (a digest for a tag):
    /// every image counts as pulled by cri-imaged, so every image is verified.
    unsettled: bool,
    records_on_disk: usize,
}

/// The records and their cache.
pub struct PullRecords {
    pulling: RecordDir,
    pulled: RecordDir,
    state: Mutex<State>,
    /// Serialises reading, merging and writing a record.
    writes: tokio::sync::Mutex<()>,
    /// Serialises recording intents, so that no pull starts before its image's intent is on disk.
    intent_writes: tokio::sync::Mutex<()>,
    metrics: Arc<RecordsMetrics>,
}

impl PullRecords {
    /// Opens (creating, mode 0700) `root_dir/image_manager/{pulling,pulled}`, removes temporary
    /// files of writes a crash interrupted, and reads the intents. Records are read later
    /// ([`PullRecords::warm`]), so that a node with many starts serving at once.
    pub fn open(root_dir: &Path, metrics: Arc<RecordsMetrics>) -> Result<Self, RecordsError> {
        let base = root_dir.join("image_manager");
        let io_error = |path: &Path| {
            let path = path.to_owned();
            move |error| RecordsError::Io { path, error }
        };
        let (pulling, stale_intents) = RecordDir::open(base.join("pulling")).map_err(io_error(&base))?;
        let pulling = pulling.counting_quarantined(metrics.quarantined("intent"));
        let (pulled, stale_records) = RecordDir::open(base.join("pulled")).map_err(io_error(&base))?;
        let pulled = pulled.counting_quarantined(metrics.quarantined("record"));
        if stale_intents + stale_records > 0 {
            tracing::info!(removed = stale_intents + stale_records, "removed pull records a crash left half-written");
        }
        let mut intents = HashSet::new();
        let mut intents_authoritative = true;
        for (path, contents) in pulling.read_all().map_err(io_error(pulling.path()))? {
            match decode_listed(contents, Intent::decode) {
                Ok(intent) => {
                    intents.insert(intent.image);
                }
                Err(error) => {
                    // Treated as absent on listing; a lookup by image reads the file again and
                    // fails safe (the image is verified).
                    tracing::warn!(path = %path.display(), %error, "pull intent unreadable or corrupt; ignored");
                    intents_authoritative = false;
                }
            }
        }
        let intents_authoritative = intents_authoritative && intents.len() <= INTENTS_IN_MEMORY;
        let records_on_disk = std::fs::read_dir(pulled.path()).map_err(io_error(pulled.path()))?.count();
        let state = State {
            records: ClockCache::new(RECORDS_IN_MEMORY),
            records_authoritative: false,
            intents: intents.clone(),
            intents_authoritative,
            intents_in_flight: HashMap::new(),
            unsettled: !intents.is_empty(),
            orphaned: intents.clone(),
            records_on_disk,
        };
        let records = Self {
            pulling,
            pulled,
            state: Mutex::new(state),
            writes: tokio::sync::Mutex::new(()),
            intent_writes: tokio::sync::Mutex::new(()),
            metrics,
        };
        records.report();
        Ok(records)
    }

    pub fn metrics(&self) -> &RecordsMetrics {
        &self.metrics
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn report(&self) {
        let state = self.state();
        self.metrics.on_disk(state.intents.len(), state.records_on_disk);
        let percent = |len: usize, capacity: usize| len * 100 / capacity;
        self.metrics.in_memory(
            percent(state.intents.len(), INTENTS_IN_MEMORY),
            percent(state.records.len(), state.records.capacity()),
        );
    }

    /// Reads every record into memory; from then on, while they fit, a miss needs no disk read.
    /// A record that does not decode is reported once and left for a lookup to fail safe on.
    pub fn warm(&self) -> Result<(), RecordsError> {
        let files =
            self.pulled.read_all().map_err(|error| RecordsError::Io { path: self.pulled.path().into(), error })?;
        let files_read = files.len();
        let mut decoded = Vec::with_capacity(files.len());
        let mut complete = true;
        for (path, contents) in files {
            match decode_listed(contents, PulledRecord::decode) {
                Ok(record) => decoded.push(record),
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "pull record unreadable or corrupt; its image will be verified");
                    complete = false;
                }
            }
        }
        let mut state = self.state();
        state.records_on_disk = files_read;
        let mut evicted = false;
        for record in decoded {
            let image_ref = record.image_ref.clone();
            // A record written since the files were read is newer: kept.
            if state.records.get(&image_ref).is_none() {
                evicted |= state.records.insert(&image_ref, Arc::new(record));
            }
        }
        state.records_authoritative = complete && !evicted;
        drop(state);
        self.report();
        Ok(())
    }

    /// The record of `image_ref`, if any. A record that does not decode is an error, so that the
    /// caller verifies rather than trusts. Answered from memory when it can be; a file is read
    /// off the async runtime's threads.
    pub async fn record(self: &Arc<Self>, image_ref: &str) -> Result<Option<Arc<PulledRecord>>, RecordsError> {
        if let Some(known) = self.record_in_memory(image_ref) {
            return Ok(known);
        }
        let (records, image_ref) = (self.clone(), image_ref.to_owned());
        off_the_runtime(move || records.record_on_disk(&image_ref)).await
    }

    /// The record of `image_ref` as memory knows it, when memory knows.
    fn record_in_memory(&self, image_ref: &str) -> Option<Option<Arc<PulledRecord>>> {
        let mut state = self.state();
        if let Some(record) = state.records.get(image_ref) {
            return Some(Some(record));
        }
        state.records_authoritative.then_some(None)
    }

    fn record_on_disk(&self, image_ref: &str) -> Result<Option<Arc<PulledRecord>>, RecordsError> {
        let path = || self.pulled.path().join(RecordDir::file_name(image_ref));
        let Some(contents) = self.pulled.read(image_ref).map_err(|error| RecordsError::Io { path: path(), error })?
        else {
            return Ok(None);
        };
        let record = PulledRecord::decode(&contents).map_err(|error| RecordsError::Format { path: path(), error })?;
        // A file whose name collides with another ref's is not this ref's record.
        if record.image_ref != image_ref {
            return Ok(None);
        }
        let record = Arc::new(record);
        let mut state = self.state();
        if state.records.insert(image_ref, record.clone()) {
            state.records_authoritative = false;
        }
        Ok(Some(record))
    }

    /// Whether cri-imaged pulled the image: a record of `image_ref`, or an intent for `image` (as
    /// the pod wrote it). A file is read off the async runtime's threads.
    pub async fn pulled_by_cri_imaged(self: &Arc<Self>, image: &str, image_ref: &str) -> Result<bool, RecordsError> {
        if self.state().unsettled || self.record(image_ref).await?.is_some() {
            return Ok(true);
        }
        {
            let state = self.state();
            if state.intents_in_flight.contains_key(image) || state.intents.contains(image) {
                return Ok(true);
            }
            if state.intents_authoritative {
                return Ok(false);
            }
        }
        let (records, image) = (self.clone(), image.to_owned());
        off_the_runtime(move || records.intent_on_disk(&image)).await
    }

    /// Whether an intent for `image` is on disk.
    fn intent_on_disk(&self, image: &str) -> Result<bool, RecordsError> {
        let path = || self.pulling.path().join(RecordDir::file_name(image));
        match self.pulling.read(image).map_err(|error| RecordsError::Io { path: path(), error })? {
            None => Ok(false),
            Some(contents) => {
                let intent = Intent::decode(&contents).map_err(|error| RecordsError::Format { path: path(), error })?;
                Ok(intent.image == image)
            }
        }
    }

    /// Before a pull of `image` (as the pod wrote it): its intent, on disk before the pull starts,
    /// whichever caller writes it. The guard ends it with the pull's outcome; dropped without one
    /// (the caller went away mid-pull, when the pull may still succeed for others), it leaves the
    /// intent on disk, so the image stays verified until a pull records who pulled it.
    pub async fn intend(self: &Arc<Self>, image: &str) -> Result<PullIntent, RecordsError> {
        self.record_intent(image).await?;
        Ok(PullIntent { records: self.clone(), image: image.to_owned(), ended: false })
    }

    async fn record_intent(&self, image: &str) -> Result<(), RecordsError> {
        let _recording = self.intent_writes.lock().await;
        let first = {
            let mut state = self.state();
            let in_flight = state.intents_in_flight.entry(image.to_owned()).or_insert(0);
            *in_flight += 1;
            *in_flight == 1 && !state.intents.contains(image)
        };
        if first {
            let (dir, key) = (self.pulling.clone(), image.to_owned());
            let contents = Intent::new(image).encode();
            let written = blocking(move || dir.write(&key, &contents).map(|_| key)).await;
            match written {
                Ok(key) => {
                    self.state().intents.insert(key);
                }
                Err(error) => {
                    self.end_intent_in_memory(image);
                    return Err(self.io_error(&self.pulling, error));
                }
            }
            self.report();
        }
        Ok(())
    }

    /// After a successful pull: `name`'s credentials merged into the record of `image_ref`, then
    /// the intent ended. If the record cannot be written the intent stays, so that the next start
    /// turns it into a record that verifies every pod.
    pub async fn record_pulled(
        self: &Arc<Self>,
        image: &str,
        image_ref: &str,
        name: &str,
        pulled_with: PullCredentials,
    ) -> Result<(), RecordsError> {
        if let Err(error) = self.merge(image_ref, name, pulled_with).await {
            self.orphan(image);
            return Err(error);
        }
        self.end_intent(image, true).await
    }

    /// A pull of `image` ended without its record: its intent stays until a record replaces it.
    fn orphan(&self, image: &str) {
        self.end_intent_in_memory(image);
        self.state().orphaned.insert(image.to_owned());
    }

    /// After a failed pull: the intent ended (unless it is older than this start: see
    /// [`PullRecords::settle`]).
    pub async fn record_failed(&self, image: &str) -> Result<(), RecordsError> {
        self.end_intent(image, false).await
    }

    /// Adds `secret` to what may use `name` in the record of `image_ref` (a check found it holds
    /// a recorded credential, or a rotated one).
    pub async fn remember(
        self: &Arc<Self>,
        image_ref: &str,
        name: &str,
        secret: SecretRecord,
    ) -> Result<(), RecordsError> {
        let pulled_with = PullCredentials { kubernetes_secrets: vec![secret], ..Default::default() };
        self.merge(image_ref, name, pulled_with).await
    }

    /// Merges `pulled_with` into what may use `name` in the record of `image_ref`, writing it
    /// when it changed.
    pub async fn merge(
        self: &Arc<Self>,
        image_ref: &str,
        name: &str,
        pulled_with: PullCredentials,
    ) -> Result<(), RecordsError> {
        let _writing = self.writes.lock().await;
        let now = SystemTime::now();
        // A record that does not decode is replaced, which heals it.
        let current = self.record(image_ref).await.unwrap_or_else(|error| {
            tracing::info!(%error, "replacing a pull record that could not be read");
            None
        });
        let existed = current.is_some();
        let mut record = current.map_or_else(|| PulledRecord::new(image_ref, now), |record| (*record).clone());
        if !check::merge(&mut record, name, &pulled_with, now) && existed {
            return Ok(());
        }
        let (dir, key, contents) = (self.pulled.clone(), image_ref.to_owned(), record.encode());
        let replaced =
            blocking(move || dir.write(&key, &contents)).await.map_err(|error| self.io_error(&self.pulled, error))?;
        let mut state = self.state();
        if state.records.insert(image_ref, Arc::new(record)) {
            state.records_authoritative = false;
        }
        if !replaced {
            state.records_on_disk += 1;
        }
        drop(state);
        self.report();
        Ok(())
    }

    /// The image `image_ref` was removed at `removed_at`: its record goes, on disk and in
    /// memory, unless a pull wrote it since (in the same second too: keeping a record too long
    /// only verifies pods that need not be).
    pub async fn forget(self: &Arc<Self>, image_ref: &str, removed_at: SystemTime) -> Result<(), RecordsError> {
        let _writing = self.writes.lock().await;
        // Only a file that is this image's record: another ref's may share its name.
        let since = format::rfc3339(removed_at);
        match self.record(image_ref).await {
            Ok(Some(record)) if record.last_updated_time < since => {}
            _ => return Ok(()),
        }
        let (dir, key) = (self.pulled.clone(), image_ref.to_owned());
        blocking(move || dir.remove(&key)).await.map_err(|error| self.io_error(&self.pulled, error))?;
        let mut state = self.state();
        state.records.remove(image_ref);
        state.records_on_disk = state.records_on_disk.saturating_sub(1);
        drop(state);
        self.report();
        Ok(())
    }

    /// One pull ended, `recorded` when its record was written; the last one removes the intent,
    /// except an orphaned one that no record replaced.
    async fn end_intent(&self, image: &str, recorded: bool) -> Result<(), RecordsError> {
        if !self.end_intent_in_memory(image) {
            return Ok(());
        }
        {
            let mut state = self.state();
            if recorded {
                state.orphaned.remove(image);
            } else if state.orphaned.contains(image) {
                return Ok(());
            }
        }
        self.remove_intent(image).await
    }

    /// Removes the intent for `image` unless a pull of it started meanwhile: under the lock
    /// [`PullRecords::record_intent`] takes, so no pull starts trusting a file being removed.
    async fn remove_intent(&self, image: &str) -> Result<(), RecordsError> {
        let _recording = self.intent_writes.lock().await;
        if self.state().intents_in_flight.contains_key(image) {
            return Ok(());
        }
        let (dir, key) = (self.pulling.clone(), image.to_owned());
        blocking(move || dir.remove(&key)).await.map_err(|error| self.io_error(&self.pulling, error))?;
        self.state().intents.remove(image);
        self.report();
        Ok(())
    }

    /// How many EnsureImageExists pulls of `image` (as the pod wrote it) are under way.
    pub fn pulls_in_flight(&self, image: &str) -> u32 {
        self.state().intents_in_flight.get(image).copied().unwrap_or(0)
    }

    /// One pull of `image` ended; whether it was the last.
    fn end_intent_in_memory(&self, image: &str) -> bool {
        let mut state = self.state();
        match state.intents_in_flight.get_mut(image) {
            Some(count) if *count > 1 => {
                *count -= 1;
                false
            }
            _ => {
                state.intents_in_flight.remove(image);
                true
            }
        }
    }

    fn io_error(&self, dir: &RecordDir, error: RecordsError) -> RecordsError {
        match error {
            RecordsError::Writer(_) | RecordsError::Format { .. } => error,
            RecordsError::Io { error, .. } => RecordsError::Io { path: dir.path().into(), error },
        }
    }

    /// After start, while serving: each intent a crash (or a failed record write) left behind
    /// whose image is present becomes a record with no credentials (so every pod is verified),
    /// and goes; then every record is read into memory; then the records of images that are
    /// gone, last written before `started`, are removed.
    pub async fn settle<R: ImageRuntime>(self: Arc<Self>, runtime: &R, started: SystemTime) {
        // Until the runtime answers for every intent (it may still be starting at boot).
        let mut waits = Doubling::new(Duration::from_millis(100), Duration::from_secs(30));
        while !self.convert_orphaned_intents(runtime).await {
            tokio::time::sleep(waits.next_wait()).await;
        }
        self.state().unsettled = false;
        let records = self.clone();
        match tokio::task::spawn_blocking(move || records.warm()).await {
            Ok(Err(error)) => tracing::warn!(%error, "cannot read the pull records; each is read when asked for"),
            Err(error) => tracing::warn!(%error, "reading the pull records stopped"),
            Ok(Ok(())) => {}
        }
        if let Err(error) = self.prune(runtime, started).await {
            tracing::warn!(%error, "cannot prune the records of images that are gone");
        }
    }

    /// One pass over the orphaned intents; whether the runtime answered for each.
    async fn convert_orphaned_intents<R: ImageRuntime>(self: &Arc<Self>, runtime: &R) -> bool {
        let orphaned: Vec<String> = self.state().orphaned.iter().cloned().collect();
        let mut answered = true;
        for image in orphaned {
            let spec = k8s_cri::v1::ImageSpec { image: image.clone(), ..Default::default() };
            match runtime.image_status(spec).await {
                Ok(Some(found)) => {
                    let converted = self.merge_unknown(&found.id).await;
                    if let Err(error) = converted {
                        tracing::warn!(%error, image, "cannot turn a pull intent into a record; kept");
                        answered = false;
                        continue;
                    }
                    tracing::info!(image, image_ref = %found.id, "a pull intent left from before is now a record: every pod is verified for this image");
                    self.state().orphaned.remove(&image);
                    if let Err(error) = self.remove_intent(&image).await {
                        tracing::warn!(%error, image, "cannot remove a pull intent");
                    }
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(%error, image, "cannot tell whether a pull intent's image is present; asking again");
                    answered = false;
                }
            }
        }
        answered
    }

    /// A record of `image_ref` pulled under unknown circumstances: no credentials at all (an
    /// existing record is left as it is).
    async fn merge_unknown(self: &Arc<Self>, image_ref: &str) -> Result<(), RecordsError> {
        self.merge(image_ref, "", PullCredentials::default()).await
    }

    async fn prune<R: ImageRuntime>(&self, runtime: &R, started: SystemTime) -> Result<(), RecordsError> {
        // Held from before the images are listed: a pull that lands meanwhile records after the
        // prune, never has its record removed as that of an absent image.
        let _writing = self.writes.lock().await;
        let ids = match runtime.list_image_ids().await {
            Ok(Some(ids)) => ids.into_iter().collect::<HashSet<_>>(),
            Ok(None) => return Ok(()),
            Err(error) => return Err(RecordsError::Writer(error.to_string())),
        };
        let dir = self.pulled.clone();
        let before = format::rfc3339(started);
        let removed = blocking(move || {
            let mut removed = Vec::new();
            for (path, contents) in dir.read_all()? {
                // One that cannot be read was reported when the records were read.
                let Some(record) = contents.ok().and_then(|contents| PulledRecord::decode(&contents).ok()) else {
                    continue;
                };
                if !ids.contains(&record.image_ref) && record.last_updated_time < before {
                    dir.remove_path(&path)?;
                    removed.push(record.image_ref);
                }
            }
            Ok(removed)
        })
        .await
        .map_err(|error| self.io_error(&self.pulled, error))?;
        let mut state = self.state();
        for image_ref in &removed {
            state.records.remove(image_ref);
        }
        state.records_on_disk = state.records_on_disk.saturating_sub(removed.len());
        drop(state);
        if !removed.is_empty() {
            tracing::info!(removed = removed.len(), "removed the pull records of images that are gone");
        }
        self.report();
        Ok(())
    }
}

/// Who a pull is for, to be recorded as soon as it succeeds, before its result is shared: a
/// caller with the same credential arriving the moment after then finds the record, rather than
/// pulling once more.
pub struct RecordTo {
    pub records: Arc<PullRecords>,
    /// The image's name, without tag or digest.
    pub name: String,
    pub pulled_with: PullCredentials,
}

/// A pull's intent, ended by the pull's outcome (see [`PullRecords::intend`]).
pub struct PullIntent {
    records: Arc<PullRecords>,
    image: String,
    ended: bool,
}

impl PullIntent {
    /// The pull succeeded: see [`PullRecords::record_pulled`].
    pub async fn pulled(
        mut self,
        image_ref: &str,
        name: &str,
        pulled_with: PullCredentials,
    ) -> Result<(), RecordsError> {
        self.ended = true;
        self.records.record_pulled(&self.image, image_ref, name, pulled_with).await
    }

    /// The pull failed: the intent goes with the last pull of the image.
    pub async fn failed(mut self) -> Result<(), RecordsError> {
        self.ended = true;
        self.records.record_failed(&self.image).await
    }
}

impl Drop for PullIntent {
    fn drop(&mut self) {
        if !self.ended {
            // No outcome: the intent stays on disk until a record replaces it.
            self.records.orphan(&self.image);
        }
    }
}

/// A listed file decoded, or why it is not, for a warning: it cannot be read, or does not decode.
fn decode_listed<T>(contents: io::Result<Vec<u8>>, decode: fn(&[u8]) -> Result<T, FormatError>) -> Result<T, String> {
    let contents = contents.map_err(|error| format!("cannot be read: {error}"))?;
    decode(&contents).map_err(|error| error.to_string())
}

/// Runs a lookup that reads files off the async threads.
async fn off_the_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, RecordsError> + Send + 'static,
) -> Result<T, RecordsError> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|error| Err(RecordsError::Writer(error.to_string())))
}

/// Runs file I/O off the async threads.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> io::Result<T> + Send + 'static) -> Result<T, RecordsError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(RecordsError::Io { path: PathBuf::new(), error }),
        Err(error) => Err(RecordsError::Writer(error.to_string())),
    }
}

#[cfg(test)]
mod tests;
