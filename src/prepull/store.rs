//! The pre-pulls kept across restarts: one file per pre-pull under `--root-dir` in `pre_pulls/`,
//! named by its id, written as the pull records are (temporary file, fsync, rename, directory
//! fsync; mode 0600), read as hostile input. Each file is bounded ([`ENTRY_LIMIT`], several times
//! the largest pre-pull the book holds, see [`super::book`]'s bounds); one that is not a regular
//! file, is larger, does not decode, does not hold together or is not under its pre-pull's name is
//! set aside (quarantined, counted) and costs only its own pre-pull. Credentials are never
//! written: a pre-pull resumed after a restart pulls with the node's own. A book an earlier
//! version kept in one file is read once, written as files, and removed.

use std::{
    collections::{BTreeMap, HashMap},
    io,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};

use super::book::{self, Book, PrePull, Spec, State};
use crate::files::StateDir;

/// The largest pre-pull's file read. The book bounds every field (an image 1 KiB, a message
/// 1 KiB, ...): an entry stays under it even when its text is all control characters, which JSON
/// writes in six bytes each.
pub const ENTRY_LIMIT: u64 = 16 << 10;

/// The key of the one file an earlier version kept every pre-pull in.
const LEGACY_KEY: &str = "pre-pulls";

/// The largest such file read: it had no bound of its own (a 1.5 MiB runtime handler made each
/// entry 4.5 MiB), and it is read once, at start.
const LEGACY_LIMIT: u64 = 64 << 20;

/// What is written: each pre-pull's file contents, by id.
pub type Written = HashMap<String, Vec<u8>>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("pre-pulls in {path}: {error}")]
    Io { path: PathBuf, error: io::Error },
    #[error("writing pre-pulls stopped: {0}")]
    Interrupted(String),
}

/// The file an earlier version kept: its entries are decoded one by one.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LegacyFile {
    pre_pulls: Vec<serde_json::Value>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kept {
    image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    runtime_handler: String,
    /// Absent for the node's default policy (and in files written before pre-pulls had one).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    namespace: String,
    #[serde(default)]
    priority: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    deadline_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pin_for_ms: Option<u64>,
    #[serde(default)]
    declared: bool,
    state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    image_ref: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    message: String,
    submitted_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    finished_ms: Option<u64>,
    #[serde(default)]
    resumed: u32,
    /// Who asked for it (a uid); absent in files written before owners were kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<u32>,
}

fn millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

fn time(millis: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(millis)
}

impl From<&PrePull> for Kept {
    fn from(entry: &PrePull) -> Self {
        let (image_ref, reason, message) = match &entry.state {
            State::Done { image_ref } => (image_ref.clone(), String::new(), String::new()),
            State::Failed { reason, message } | State::Held { reason, message } => {
                (String::new(), reason.clone(), message.clone())
            }
            _ => Default::default(),
        };
        Self {
            image: entry.spec.image.clone(),
            runtime_handler: entry.spec.runtime_handler.clone(),
            namespace: entry.spec.namespace.clone(),
            priority: entry.spec.priority,
            deadline_ms: entry.spec.deadline.map(millis),
            pin_for_ms: entry.spec.pin_for.map(|pin| u64::try_from(pin.as_millis()).unwrap_or(u64::MAX)),
            declared: entry.spec.declared,
            state: entry.state.as_str().to_owned(),
            image_ref,
            reason,
            message,
            submitted_ms: millis(entry.submitted),
            finished_ms: entry.finished.map(millis),
            resumed: entry.resumed,
            owner: entry.spec.owner,
        }
    }
}

impl Kept {
    /// The pre-pull this entry holds, if it holds one together.
    fn restore(self) -> Option<PrePull> {
        let bounded = self.image.len() <= crate::reference::REFERENCE_LENGTH_MAX
            && self.runtime_handler.len() <= book::MAX_RUNTIME_HANDLER
            && is_namespace_or_none(&self.namespace)
            && self.image_ref.len() <= book::MAX_IMAGE_REF
            && self.reason.len() <= book::MAX_REASON
            && self.message.len() <= book::MAX_MESSAGE;
        if !bounded {
            return None;
        }
        // Kept with its default tag: one that changes when tagged again is not ours.
        if book::with_default_tag(&self.image).ok()? != self.image {
            return None;
        }
        let state = match self.state.as_str() {
            "queued" => State::Queued,
            "pulling" => State::Pulling,
            "held" => State::Held { reason: self.reason, message: self.message },
            "done" if !self.image_ref.is_empty() => State::Done { image_ref: self.image_ref },
            "failed" => State::Failed { reason: self.reason, message: self.message },
            "cancelled" => State::Cancelled,
            _ => return None,
        };
        let pin_for = self.pin_for_ms.map(Duration::from_millis).filter(|pin| *pin <= book::MAX_PIN);
        let spec = Spec {
            image: self.image,
            runtime_handler: self.runtime_handler,
            namespace: self.namespace,
            priority: self.priority,
            deadline: self.deadline_ms.map(time),
            pin_for,
            declared: self.declared,
            owner: self.owner,
        };
        Some(PrePull {
            id: book::id_of(&spec.image, &spec.runtime_handler, &spec.namespace),
            spec,
            state,
            submitted: time(self.submitted_ms),
            finished: self.finished_ms.map(time),
            credentials: None,
            resumed: self.resumed,
        })
    }
}

/// A Kubernetes namespace's name (a DNS label), or empty.
fn is_namespace_or_none(name: &str) -> bool {
    name.len() <= book::MAX_NAMESPACE
        && name.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// The pre-pulls' files.
#[derive(Clone)]
pub struct PrePullStore {
    dir: StateDir,
}

impl PrePullStore {
    /// Opens `root_dir/pre_pulls/` (mode 0700), removing temporary files a crash left.
    pub fn open(root_dir: &Path) -> Result<Self, StoreError> {
        let path = root_dir.join("pre_pulls");
        let (dir, _) = StateDir::open(path.clone()).map_err(|error| StoreError::Io { path, error })?;
        Ok(Self { dir: dir.with_limit(ENTRY_LIMIT) })
    }

    /// Counts the files set aside in `quarantined`.
    pub fn counting_quarantined(self, quarantined: Counter) -> Self {
        Self { dir: self.dir.counting_quarantined(quarantined) }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The path of pre-pull `id`'s file.
    pub fn path_of(&self, id: &str) -> PathBuf {
        self.dir.path().join(StateDir::file_name(id))
    }

    /// The book kept, as a restart finds it at `now` (see [`Book::restored`]), and what is
    /// written of it. A file that cannot be read whole is set aside and costs only its own
    /// pre-pull; the files of pre-pulls the restored book no longer holds are removed; an
    /// earlier version's single file is written as files, then removed. Blocking.
    pub fn load(&self, now: SystemTime) -> Result<(Book, Written), StoreError> {
        let io = |error| StoreError::Io { path: self.path().to_owned(), error };
        self.migrate().map_err(io)?;
        let mut found: BTreeMap<String, (PrePull, Vec<u8>)> = BTreeMap::new();
        for (path, contents) in self.dir.read_all().map_err(io)? {
            let decoded = contents.map_err(|error| error.to_string()).and_then(|contents| {
                let entry = decode(&contents)?;
                if path != self.path_of(&entry.id) {
                    return Err(format!("not under the name of the pre-pull it holds ({})", entry.id));
                }
                Ok((entry, contents))
            });
            match decoded {
                Ok((entry, contents)) => {
                    found.insert(entry.id.clone(), (entry, contents));
                }
                Err(why) => self.dir.set_aside(&path, &format!("not a pre-pull: {why}")),
            }
        }
        let mut written = Written::new();
        let mut entries = Vec::with_capacity(found.len());
        for (id, (entry, contents)) in found {
            written.insert(id, contents);
            entries.push(entry);
        }
        let book = Book::restored(entries, now);
        // The files of what the restored book forgot (past its caps) go.
        let gone: Vec<String> = written.keys().filter(|id| book.get(id).is_none()).cloned().collect();
        for id in gone {
            self.dir.remove(&id).map_err(io)?;
            written.remove(&id);
        }
        Ok((book, written))
    }

    /// Writes each pre-pull of an earlier version's single file that holds together as a file
    /// of its own, then removes that file (a crash meanwhile does it again at the next start).
    fn migrate(&self) -> io::Result<()> {
        let Some(contents) = self.dir.clone().with_limit(LEGACY_LIMIT).read(LEGACY_KEY)? else { return Ok(()) };
        let path = self.path_of(LEGACY_KEY);
        let entries = self.decode_legacy(&path, &contents);
        for entry in &entries {
            self.dir.write(&entry.id, &encode(entry))?;
        }
        tracing::info!(path = %path.display(), pre_pulls = entries.len(), "pre-pulls kept in one file now kept one file each");
        self.dir.remove(LEGACY_KEY)
    }

    /// The entries of an earlier version's single file that hold together, each decoded alone.
    fn decode_legacy(&self, path: &Path, contents: &[u8]) -> Vec<PrePull> {
        match serde_json::from_slice::<LegacyFile>(contents) {
            Ok(file) => file
                .pre_pulls
                .into_iter()
                .filter_map(|value| serde_json::from_value::<Kept>(value).ok().and_then(Kept::restore))
                .collect(),
            Err(error) => {
                self.dir.set_aside(path, &format!("not a list of pre-pulls: {error}"));
                Vec::new()
            }
        }
    }

    /// Writes the files of `wanted` (each pre-pull's contents by id, made by [`encode`]) that
    /// differ from `written`, and removes those of pre-pulls no longer wanted, durably, with one
    /// flush of the directory for them all; `written` follows what is done, also when a write
    /// fails. Blocking.
    pub fn write_changes(&self, wanted: &BTreeMap<String, Vec<u8>>, written: &mut Written) -> Result<(), StoreError> {
        let changed: Vec<(&str, &[u8])> = wanted
            .iter()
            .filter(|(id, contents)| written.get(*id) != Some(*contents))
            .map(|(id, contents)| (id.as_str(), contents.as_slice()))
            .collect();
        let gone: Vec<String> = written.keys().filter(|id| !wanted.contains_key(*id)).cloned().collect();
        let outcome = self.dir.write_many(changed.iter().copied(), gone.iter().map(String::as_str));
        let done = outcome.as_ref().map_or_else(|(done, _)| *done, |()| changed.len());
        for (id, contents) in &changed[..done] {
            written.insert((*id).to_owned(), contents.to_vec());
        }
        if outcome.is_ok() {
            gone.iter().for_each(|id| {
                written.remove(id);
            });
        }
        outcome.map_err(|(_, error)| StoreError::Io { path: self.path().to_owned(), error })
    }
}

/// The file's contents for one pre-pull (cheap: the caller writes them off the async thread).
pub fn encode(entry: &PrePull) -> Vec<u8> {
    serde_json::to_vec(&Kept::from(entry)).unwrap_or_default()
}

/// One pre-pull's file, if it holds one together.
fn decode(contents: &[u8]) -> Result<PrePull, String> {
    let kept: Kept = serde_json::from_slice(contents).map_err(|error| error.to_string())?;
    kept.restore().ok_or_else(|| "its fields do not hold together".to_owned())
}

#[cfg(test)]
mod tests;
