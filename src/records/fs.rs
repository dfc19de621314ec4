//! Record files on disk, written so that a crash at any instant leaves either the old file or
//! the new one, never a torn one: write a temporary file, fsync it, rename it over the old one,
//! fsync the directory. The kubelet renames without the fsyncs.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write},
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use sha2::{Digest, Sha256};

use crate::credentials::hash::hex;

/// The suffix of a file being written; one left over is from a write that never finished.
const TMP_SUFFIX: &str = ".tmp";

/// Makes each temporary file's name unique, so that two writes of one record (one abandoned by
/// its caller, still running) never share one.
static WRITES: AtomicU64 = AtomicU64::new(0);

/// A directory of record files, one per key.
#[derive(Debug, Clone)]
pub struct RecordDir {
    path: PathBuf,
}

impl RecordDir {
    /// Opens `path`, creating it (and its parents) with mode 0700, and removes temporary files
    /// left by writes a crash interrupted; returns how many it removed.
    pub fn open(path: PathBuf) -> io::Result<(Self, usize)> {
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&path)?;
        let mut stale = 0;
        for entry in fs::read_dir(&path)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().ends_with(TMP_SUFFIX) {
                fs::remove_file(entry.path())?;
                stale += 1;
            }
        }
        Ok((Self { path }, stale))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file name for `key`, as the kubelet names it: `sha256-` and the hex SHA-256 of the key.
    pub fn file_name(key: &str) -> String {
        format!("sha256-{}", hex(&Sha256::digest(key.as_bytes())))
    }

    /// Replaces the file for `key` with `contents`, durably (see the module docs), mode 0600;
    /// returns whether there was one to replace.
    pub fn write(&self, key: &str, contents: &[u8]) -> io::Result<bool> {
        let name = Self::file_name(key);
        let target = self.path.join(&name);
        let replaced = target.exists();
        let write = WRITES.fetch_add(1, Ordering::Relaxed);
        let temporary = self.path.join(format!("{name}.{write}{TMP_SUFFIX}"));
        let mut file = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&temporary)?;
        file.write_all(contents)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&temporary, &target)?;
        File::open(&self.path)?.sync_all()?;
        Ok(replaced)
    }

    /// The file for `key`, or `None` when there is none.
    pub fn read(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        match fs::read(self.path.join(Self::file_name(key))) {
            Ok(contents) => Ok(Some(contents)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Removes the file for `key`, durably; no file is not an error.
    pub fn remove(&self, key: &str) -> io::Result<()> {
        match fs::remove_file(self.path.join(Self::file_name(key))) {
            Ok(()) => File::open(&self.path)?.sync_all(),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Every record file (not temporary ones): its path and contents.
    pub fn read_all(&self) -> io::Result<Vec<(PathBuf, Vec<u8>)>> {
        let mut files = Vec::new();
        for entry in fs::read_dir(&self.path)? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("sha256-") && !name.ends_with(TMP_SUFFIX) {
                files.push((entry.path(), fs::read(entry.path())?));
            }
        }
        Ok(files)
    }

    /// Removes the file at `path` (one [`RecordDir::read_all`] returned), durably.
    pub fn remove_path(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)?;
        File::open(&self.path)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn records_are_written_whole_with_private_modes_and_named_by_hash() {
        let root = tempfile::tempdir().expect("tempdir");
        let (dir, stale) = RecordDir::open(root.path().join("image_manager/pulled")).expect("opens");
        assert_eq!(stale, 0);
        assert!(!dir.write("sha256:abc", b"first").expect("written"));
        assert!(dir.write("sha256:abc", b"second").expect("rewritten"), "replaced");
        assert_eq!(dir.read("sha256:abc").expect("reads").as_deref(), Some(&b"second"[..]));
        assert_eq!(dir.read("sha256:other").expect("reads"), None);
        let name = RecordDir::file_name("sha256:abc");
        assert_eq!(name, format!("sha256-{}", hex(&Sha256::digest(b"sha256:abc"))));
        let mode = |path: &Path| fs::metadata(path).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode(&dir.path().join(&name)), 0o600);
        assert_eq!(mode(dir.path()), 0o700);
        assert_eq!(dir.read_all().expect("lists").len(), 1, "no temporary file is left");
        dir.remove("sha256:abc").expect("removed");
        dir.remove("sha256:abc").expect("removing twice is fine");
        assert!(dir.read_all().expect("lists").is_empty());
    }

    #[test]
    fn temporary_files_of_interrupted_writes_are_removed_on_open() {
        let root = tempfile::tempdir().expect("tempdir");
        let (dir, _) = RecordDir::open(root.path().to_owned()).expect("opens");
        dir.write("kept", b"whole").expect("written");
        fs::write(dir.path().join(format!("{}.tmp", RecordDir::file_name("torn"))), b"tor").expect("written");
        let (dir, stale) = RecordDir::open(root.path().to_owned()).expect("reopens");
        assert_eq!(stale, 1);
        let files = dir.read_all().expect("lists");
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].1, b"whole");
    }
}
