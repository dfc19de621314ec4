//! Image ages that survive a restart: the GC's records (first detected, last used, size, pinned)
//! kept in one file under `--root-dir`, written as the pull records are (temporary file, fsync,
//! rename, fsync the directory; mode 0600). The kubelet keeps them in memory only, so after each
//! of its restarts every image looks newly detected and never used.

use std::{
    collections::HashMap,
    io,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

use super::plan::ImageRecord;
use crate::records::fs::RecordDir;

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
struct File {
    images: HashMap<String, Ages>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Ages {
    /// Seconds since the Unix epoch.
    first_detected: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_used: Option<u64>,
    size: u64,
    #[serde(default)]
    pinned: bool,
}

/// The ages' file.
#[derive(Clone)]
pub struct AgesFile {
    dir: RecordDir,
}

impl AgesFile {
    /// Opens `root_dir/image_gc/` (mode 0700), removing a temporary file a crash left.
    pub fn open(root_dir: &Path) -> Result<Self, AgesError> {
        let path = root_dir.join("image_gc");
        let (dir, _) = RecordDir::open(path.clone()).map_err(|error| AgesError::Io { path, error })?;
        Ok(Self { dir })
    }

    /// The ages kept, or none. A file that does not decode is an error: the caller starts
    /// afresh (every image newly detected, as the kubelet always does) and says so.
    pub fn load(&self) -> Result<HashMap<String, ImageRecord>, AgesError> {
        let path = || self.dir.path().join(RecordDir::file_name(KEY));
        let Some(contents) = self.dir.read(KEY).map_err(|error| AgesError::Io { path: path(), error })? else {
            return Ok(HashMap::new());
        };
        let file: File = serde_json::from_slice(&contents)
            .map_err(|error| AgesError::Decode { path: path(), error: error.to_string() })?;
        let time = |seconds: u64| UNIX_EPOCH + Duration::from_secs(seconds);
        Ok(file
            .images
            .into_iter()
            .map(|(id, ages)| {
                let record = ImageRecord {
                    first_detected: time(ages.first_detected),
                    last_used: ages.last_used.map(time),
                    size: ages.size,
                    pinned: ages.pinned,
                };
                (id, record)
            })
            .collect())
    }

    /// Keeps `records`, durably.
    pub fn save(&self, records: &HashMap<String, ImageRecord>) -> Result<(), AgesError> {
        let seconds = |time: SystemTime| time.duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs());
        let images = records
            .iter()
            .map(|(id, record)| {
                let ages = Ages {
                    first_detected: seconds(record.first_detected),
                    last_used: record.last_used.map(seconds),
                    size: record.size,
                    pinned: record.pinned,
                };
                (id.clone(), ages)
            })
            .collect();
        let contents = serde_json::to_vec(&File { images }).unwrap_or_default();
        self.dir
            .write(KEY, &contents)
            .map(|_| ())
            .map_err(|error| AgesError::Io { path: self.dir.path().into(), error })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn ages_survive_a_restart_to_the_second() {
        let root = tempfile::tempdir().expect("tempdir");
        let at = |seconds| UNIX_EPOCH + Duration::from_secs(seconds);
        let records = HashMap::from([
            (
                "sha256:a".to_owned(),
                ImageRecord { first_detected: at(100), last_used: Some(at(200)), size: 7, pinned: false },
            ),
            ("sha256:b".to_owned(), ImageRecord { first_detected: at(300), last_used: None, size: 9, pinned: true }),
        ]);
        AgesFile::open(root.path()).expect("opens").save(&records).expect("saved");
        assert_eq!(AgesFile::open(root.path()).expect("reopens").load().expect("loads"), records);
        let file = root.path().join("image_gc").join(RecordDir::file_name(KEY));
        assert_eq!(std::fs::metadata(file).expect("written").permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn no_file_is_no_ages_and_a_torn_one_is_an_error() {
        let root = tempfile::tempdir().expect("tempdir");
        let ages = AgesFile::open(root.path()).expect("opens");
        assert!(ages.load().expect("none yet").is_empty());
        let file = root.path().join("image_gc").join(RecordDir::file_name(KEY));
        std::fs::write(file, b"{\"images\":{\"sha256:a\":{\"firstDe").expect("written");
        assert!(matches!(ages.load(), Err(AgesError::Decode { .. })));
    }
}
