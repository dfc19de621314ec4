//! Pull records (KEP-2535): which credentials pulled each image, so that a pod gets a cached
//! private image only if it could have pulled it. The kubelet's files under `--root-dir`
//! (`image_manager/pulling/` intents, `image_manager/pulled/` records), written crash-safely
//! ([`crate::files::StateDir`]), with a bounded cache in front that answers alone while every
//! record fits in it. A record is the kubelet's JSON, with no checksum: one that does not decode
//! is a lost record (its image verified), but a well-formed one is believed. Whoever can write
//! the directories can forge one (a private image recorded as every pod's); only root, the
//! daemon's user, can: a directory or file anyone else could write is refused or set aside
//! ([`crate::files::private`]).
//!
//! - [`format`](mod@format): the files' JSON, the kubelet's.
//! - [`verification`]: which present images are verified (pure).
//! - [`check`]: may a pod use an image its records name; merging a pull into a record (pure).
//! - [`cache`]: the bounded cache.
//! - [`metrics`]: the kubelet's `imagemanager` metrics.
//! - [`PullRecords`] (here): the records and intents, on disk and in memory. `lookup` reads them,
//!   `intents` keeps each pull's intent, `merge` writes and forgets records, `settle` deals with
//!   what a crash left, after start, and `adopt` merges the kubelet's own records in.

mod adopt;
pub mod cache;
pub mod check;
pub mod format;
mod intents;
mod lookup;
mod merge;
pub mod metrics;
mod settle;
pub mod verification;

use std::{
    collections::{HashMap, HashSet},
    io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use self::{
    cache::ClockCache,
    format::{FormatError, Intent, PulledRecord},
    metrics::RecordsMetrics,
};
pub use self::{intents::PullIntent, merge::RecordTo};
use crate::files::{self, StateDir};

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
    /// A file that could not be read (no regular file, too large) was set aside: whatever it said
    /// is lost, so its image is verified, never taken for one preloaded.
    #[error("{file} for {key} could not be read (no regular file, or too large); its image is verified")]
    SetAside { file: &'static str, key: String },
    #[error("pull record {path} holds the record of {holds}, not of the image it is named for; the image is verified")]
    Misplaced { path: PathBuf, holds: String },
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
    /// The kubelet's `image_manager` directory, whose records are adopted as the records settle.
    adopt_from: Option<PathBuf>,
    records_on_disk: usize,
}

/// The records and their cache.
pub struct PullRecords {
    pulling: StateDir,
    pulled: StateDir,
    state: Mutex<State>,
    /// Serialises reading, merging and writing a record.
    writes: tokio::sync::Mutex<()>,
    /// Serialises recording intents, so that no pull starts before its image's intent is on disk.
    intent_writes: tokio::sync::Mutex<()>,
    metrics: Arc<RecordsMetrics>,
}

impl PullRecords {
    /// Opens (creating, mode 0700; made private, or refused, as [`StateDir::open`] says)
    /// `root_dir/image_manager/{pulling,pulled}` and `image_manager/` itself, removes temporary
    /// files of writes a crash interrupted, and reads the intents. Records are read later
    /// ([`PullRecords::warm`]), so that a node with many starts serving at once.
    pub fn open(root_dir: &Path, metrics: Arc<RecordsMetrics>) -> Result<Self, RecordsError> {
        let base = root_dir.join("image_manager");
        let io_error = |path: &Path| {
            let path = path.to_owned();
            move |error| RecordsError::Io { path, error }
        };
        let (pulling, stale_intents) = StateDir::open(base.join("pulling")).map_err(io_error(&base))?;
        let pulling = pulling.counting_quarantined(metrics.quarantined("intent"));
        let (pulled, stale_records) = StateDir::open(base.join("pulled")).map_err(io_error(&base))?;
        let pulled = pulled.counting_quarantined(metrics.quarantined("record"));
        // Whoever can write the directory the two are in can put others in their place.
        files::secure_dir(&base)
            .map_err(|error| io_error(&base)(io::Error::new(io::ErrorKind::PermissionDenied, error)))?;
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
            adopt_from: None,
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

    fn io_error(&self, dir: &StateDir, error: RecordsError) -> RecordsError {
        match error {
            RecordsError::Writer(_)
            | RecordsError::Format { .. }
            | RecordsError::SetAside { .. }
            | RecordsError::Misplaced { .. } => error,
            RecordsError::Io { error, .. } => RecordsError::Io { path: dir.path().into(), error },
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
