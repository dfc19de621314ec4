//! The pre-pulls kept across restarts: one file under `--root-dir` in `pre_pulls/`, written as
//! the pull records are (temporary file, fsync, rename, directory fsync; mode 0600), read as
//! hostile input (bounded, regular file only; an entry that does not hold together is dropped,
//! a file that does not decode is reported and the book starts empty). Credentials are never
//! written: a pre-pull resumed after a restart pulls with the node's own.

use std::{
    io,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

use super::book::{self, Book, PrePull, Spec, State};
use crate::files::StateDir;

/// The one key the pre-pulls are stored under.
const KEY: &str = "pre-pulls";

/// About 400 bytes a pre-pull: room for the book's cap many times over.
const STORE_LIMIT: u64 = 4 << 20;

/// The longest text field kept (an image, a reason, a message).
const MAX_FIELD: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("pre-pulls in {path}: {error}")]
    Io { path: PathBuf, error: io::Error },
    #[error("pre-pulls in {path} do not decode: {error}")]
    Decode { path: PathBuf, error: String },
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    pre_pulls: Vec<Kept>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kept {
    image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    runtime_handler: String,
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
        }
    }
}

impl Kept {
    /// The pre-pull this entry holds, if it holds one together.
    fn restore(self) -> Option<PrePull> {
        let fields = [&self.image, &self.runtime_handler, &self.image_ref, &self.reason, &self.message];
        if fields.iter().any(|field| field.len() > MAX_FIELD) {
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
            priority: self.priority,
            deadline: self.deadline_ms.map(time),
            pin_for,
            declared: self.declared,
        };
        Some(PrePull {
            id: book::id_of(&spec.image, &spec.runtime_handler),
            spec,
            state,
            submitted: time(self.submitted_ms),
            finished: self.finished_ms.map(time),
            credentials: None,
            resumed: self.resumed,
        })
    }
}

/// The pre-pulls' file.
#[derive(Clone)]
pub struct PrePullStore {
    dir: StateDir,
}

impl PrePullStore {
    /// Opens `root_dir/pre_pulls/` (mode 0700), removing temporary files a crash left.
    pub fn open(root_dir: &Path) -> Result<Self, StoreError> {
        let path = root_dir.join("pre_pulls");
        let (dir, _) = StateDir::open(path.clone()).map_err(|error| StoreError::Io { path, error })?;
        Ok(Self { dir: dir.with_limit(STORE_LIMIT) })
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join(StateDir::file_name(KEY))
    }

    /// The book kept, as a restart finds it (see [`Book::restored`]); an empty one when none.
    pub fn load(&self) -> Result<Book, StoreError> {
        let Some(contents) = self.dir.read(KEY).map_err(|error| StoreError::Io { path: self.path(), error })? else {
            return Ok(Book::default());
        };
        let file: File = serde_json::from_slice(&contents)
            .map_err(|error| StoreError::Decode { path: self.path(), error: error.to_string() })?;
        Ok(Book::restored(file.pre_pulls.into_iter().filter_map(Kept::restore).collect()))
    }

    /// The file's contents for `book` (cheap: the caller writes them off the async thread).
    pub fn encode(book: &Book) -> Vec<u8> {
        let file = File { pre_pulls: book.entries().map(Kept::from).collect() };
        serde_json::to_vec(&file).unwrap_or_default()
    }

    /// Writes contents made by [`PrePullStore::encode`], durably.
    pub fn write(&self, contents: &[u8]) -> Result<(), StoreError> {
        self.dir.write(KEY, contents).map(|_| ()).map_err(|error| StoreError::Io { path: self.path(), error })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pre_pulls_survive_a_restart_without_their_credentials_and_what_was_pulling_resumes() {
        let root = tempfile::tempdir().expect("tempdir");
        let store = PrePullStore::open(root.path()).expect("opens");
        let now = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let mut book = Book::default();
        let spec = |image: &str| Spec {
            image: image.into(),
            runtime_handler: String::new(),
            priority: 3,
            deadline: Some(now + Duration::from_secs(600)),
            pin_for: Some(Duration::from_secs(60)),
            declared: false,
        };
        let pulling = book.submit(spec("big:1"), Some(7), now).expect("queued").id.clone();
        book.started(&pulling);
        let done = book.submit(spec("small:1"), None, now).expect("queued").id.clone();
        book.started(&done);
        book.ended(&done, State::Done { image_ref: "sha256:s".into() }, now);
        store.write(&PrePullStore::encode(&book)).expect("written");
        let text = std::fs::read_to_string(store.path()).expect("readable");
        assert!(!text.contains("credentials"), "{text}");

        let restored = store.load().expect("loads");
        let resumed = restored.get(&pulling).expect("kept");
        assert_eq!((resumed.state.as_str(), resumed.resumed, resumed.credentials), ("queued", 1, None));
        assert_eq!(resumed.spec, book.get(&pulling).expect("listed").spec);
        assert_eq!(restored.get(&done).expect("kept").state, State::Done { image_ref: "sha256:s".into() });
    }

    #[test]
    fn entries_that_do_not_hold_together_are_dropped_and_a_torn_file_is_an_error_naming_it() {
        let root = tempfile::tempdir().expect("tempdir");
        let store = PrePullStore::open(root.path()).expect("opens");
        let entries = r#"{"prePulls":[
            {"image":"busybox","state":"queued","submittedMs":1},
            {"image":"busybox:1","state":"sleeping","submittedMs":1},
            {"image":"busybox:2","state":"done","submittedMs":1},
            {"image":"busybox:3","state":"queued","submittedMs":1}]}"#;
        store.write(entries.as_bytes()).expect("written");
        let images: Vec<String> =
            store.load().expect("loads").entries().map(|entry| entry.spec.image.clone()).collect();
        assert_eq!(images, ["busybox:3"], "untagged, unknown state, done without a ref: dropped");
        store.write(b"{\"prePulls\":[{\"ima").expect("written");
        let torn = store.load().expect_err("torn");
        assert!(torn.to_string().contains(&store.path().display().to_string()), "{torn}");
    }
}
