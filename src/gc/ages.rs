//! Image ages that survive a restart: the GC's records (first detected, last used, size, pinned)
//! kept in one file under `--root-dir`, written as the pull records are (temporary file, fsync,
//! rename, fsync the directory; mode 0600). The kubelet keeps them in memory only, so after each
//! of its restarts every image looks newly detected and never used.

use std::{
    borrow::Cow,
    collections::HashMap,
    io,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};

use super::plan::ImageRecord;
use crate::files::StateDir;

/// The one key the ages are stored under.
const KEY: &str = "image-ages";

/// Why the ages could not be read or kept.
#[derive(Debug, thiserror::Error)]
pub enum AgesError {
    #[error("image ages in {path}: {error}")]
    Io { path: PathBuf, error: io::Error },
    #[error("image ages in {path} do not decode: {error}")]
    Decode { path: PathBuf, error: String },
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File<'a> {
    #[serde(borrow)]
    images: HashMap<Cow<'a, str>, Ages>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Ages {
    /// Milliseconds since the Unix epoch: finer than the period, so the order of use survives.
    first_detected_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_used_ms: Option<u64>,
    size: u64,
    #[serde(default)]
    pinned: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    runtime_handler: String,
}

/// The largest ages file read: about 150 bytes an image, so room for some 200,000 images.
const AGES_LIMIT: u64 = 32 << 20;

/// The ages' file.
#[derive(Clone)]
pub struct AgesFile {
    dir: StateDir,
}

impl AgesFile {
    /// Opens `root_dir/image_gc/` (mode 0700), removing temporary files a crash left.
    pub fn open(root_dir: &Path) -> Result<Self, AgesError> {
        let path = root_dir.join("image_gc");
        let (dir, _) = StateDir::open(path.clone()).map_err(|error| AgesError::Io { path, error })?;
        Ok(Self { dir: dir.with_limit(AGES_LIMIT) })
    }

    /// Counts an ages file set aside as unreadable in `quarantined`.
    pub fn counting_quarantined(self, quarantined: Counter) -> Self {
        Self { dir: self.dir.counting_quarantined(quarantined) }
    }

    /// The file the ages are kept in.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join(StateDir::file_name(KEY))
    }

    /// The ages kept, or none. A file that cannot be read or does not decode is an error naming
    /// it: the caller starts afresh (every image newly detected, as the kubelet always does),
    /// says so, and its next write replaces the file.
    pub fn load(&self) -> Result<HashMap<String, ImageRecord>, AgesError> {
        let Some(contents) = self.dir.read(KEY).map_err(|error| AgesError::Io { path: self.path(), error })? else {
            return Ok(HashMap::new());
        };
        let file: File = serde_json::from_slice(&contents)
            .map_err(|error| AgesError::Decode { path: self.path(), error: error.to_string() })?;
        let time = |millis: u64| UNIX_EPOCH + Duration::from_millis(millis);
        Ok(file
            .images
            .into_iter()
            .map(|(key, ages)| {
                let record = ImageRecord {
                    first_detected: time(ages.first_detected_ms),
                    last_used: ages.last_used_ms.map(time),
                    size: ages.size,
                    pinned: ages.pinned,
                    runtime_handler: ages.runtime_handler,
                };
                (key.into_owned(), record)
            })
            .collect())
    }

    /// Keeps `records`, durably.
    pub fn save(&self, records: &HashMap<String, ImageRecord>) -> Result<(), AgesError> {
        self.write(&Self::encode(records))
    }

    /// The file's contents for `records` (cheap: the caller writes them off the async thread).
    pub fn encode(records: &HashMap<String, ImageRecord>) -> Vec<u8> {
        let millis = |time: SystemTime| {
            time.duration_since(UNIX_EPOCH).map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
        };
        let images = records
            .iter()
            .map(|(key, record)| {
                let ages = Ages {
                    first_detected_ms: millis(record.first_detected),
                    last_used_ms: record.last_used.map(millis),
                    size: record.size,
                    pinned: record.pinned,
                    runtime_handler: record.runtime_handler.clone(),
                };
                (Cow::Borrowed(key.as_str()), ages)
            })
            .collect();
        serde_json::to_vec(&File { images }).unwrap_or_default()
    }

    /// Writes contents made by [`AgesFile::encode`], durably.
    pub fn write(&self, contents: &[u8]) -> Result<(), AgesError> {
        self.dir.write(KEY, contents).map(|_| ()).map_err(|error| AgesError::Io { path: self.path(), error })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn ages_survive_a_restart_to_the_millisecond() {
        let root = tempfile::tempdir().expect("tempdir");
        let at = |millis| UNIX_EPOCH + Duration::from_millis(millis);
        let records = HashMap::from([
            (
                "sha256:a".to_owned(),
                ImageRecord {
                    first_detected: at(1_700_000_000_123),
                    last_used: Some(at(1_700_000_000_456)),
                    size: 7,
                    pinned: false,
                    runtime_handler: String::new(),
                },
            ),
            (
                "sha256:b".to_owned(),
                ImageRecord {
                    first_detected: at(1_700_000_001_789),
                    last_used: None,
                    size: 9,
                    pinned: true,
                    runtime_handler: String::new(),
                },
            ),
            (
                "sha256:b,kata".to_owned(),
                ImageRecord {
                    first_detected: at(1_700_000_002_000),
                    last_used: None,
                    size: 9,
                    pinned: false,
                    runtime_handler: "kata".into(),
                },
            ),
        ]);
        AgesFile::open(root.path()).expect("opens").save(&records).expect("saved");
        assert_eq!(AgesFile::open(root.path()).expect("reopens").load().expect("loads"), records);
        let file = root.path().join("image_gc").join(StateDir::file_name(KEY));
        assert_eq!(std::fs::metadata(file).expect("written").permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn no_file_is_no_ages_a_torn_one_is_an_error_naming_it_and_no_regular_file_is_set_aside() {
        let root = tempfile::tempdir().expect("tempdir");
        let ages = AgesFile::open(root.path()).expect("opens");
        assert!(ages.load().expect("none yet").is_empty());
        let file = root.path().join("image_gc").join(StateDir::file_name(KEY));
        assert_eq!(ages.path(), file);
        std::fs::write(&file, b"{\"images\":{\"sha256:a\":{\"firstDe").expect("written");
        let torn = ages.load().expect_err("torn");
        assert!(matches!(torn, AgesError::Decode { .. }), "{torn}");
        assert!(torn.to_string().contains(&file.display().to_string()), "{torn}");
        std::fs::write(&file, b"").expect("emptied");
        assert!(matches!(ages.load(), Err(AgesError::Decode { .. })), "an empty file is torn too");
        std::fs::remove_file(&file).expect("removed");
        std::fs::create_dir(&file).expect("a directory in its place");
        let quarantined = Counter::default();
        let ages = ages.counting_quarantined(quarantined.clone());
        assert!(ages.load().expect("set aside, read as none").is_empty());
        assert_eq!(quarantined.get(), 1);
        assert!(!file.exists(), "the directory was moved aside");
    }

    #[test]
    fn a_temporary_file_a_crash_left_is_removed_and_the_whole_file_loads() {
        let root = tempfile::tempdir().expect("tempdir");
        let records = HashMap::from([(
            "sha256:a".to_owned(),
            ImageRecord {
                first_detected: UNIX_EPOCH + Duration::from_millis(5),
                last_used: None,
                size: 1,
                pinned: false,
                runtime_handler: String::new(),
            },
        )]);
        let ages = AgesFile::open(root.path()).expect("opens");
        ages.save(&records).expect("saved");
        let temporary = format!("{}.4194305.3.tmp", StateDir::file_name(KEY));
        std::fs::write(root.path().join("image_gc").join(&temporary), b"{\"images\":{").expect("written");
        let reopened = AgesFile::open(root.path()).expect("reopens");
        assert_eq!(reopened.load().expect("loads"), records);
        assert!(!root.path().join("image_gc").join(temporary).exists(), "removed at open");
    }
}
