//! Directories of state files (pull records and intents, image ages), one file per key, written
//! so that a crash at any instant leaves either the old file or the new one, never a torn one:
//! write a temporary file, fsync it, rename it over the old one, fsync the directory (and a new
//! directory's parent). The kubelet renames without the fsyncs. A temporary file is removed at
//! start only when its writer (the pid in its name) is gone. The directory is made the daemon's
//! user's alone as it is opened, or refused ([`super::private`]). Reads take the files as hostile
//! ([`super::read::read_private`]): one that is not a regular file, is larger than the
//! directory's cap, or is owned or writable by another user, is quarantined, counted and read as
//! no file. The directory remembers, across restarts (the file
//! stays beside the others), which keys had a file set aside: a reader for whom a lost file is not
//! the same as none (a pull record) asks [`StateDir::was_set_aside`].

use std::{
    collections::HashSet,
    fs::{self, File, OpenOptions},
    io::{self, Write},
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

use prometheus_client::metrics::counter::Counter;
use sha2::{Digest, Sha256};

use super::{
    private,
    read::{self, QUARANTINE_SUFFIX, ReadError},
};

/// The suffix of a file being written; one left over is from a write that never finished.
const TMP_SUFFIX: &str = ".tmp";

/// Makes each temporary file's name unique, with the process id, so that two writes of one file
/// (one abandoned by its caller, still running; or another process's on the same root dir) never
/// share one.
static WRITES: AtomicU64 = AtomicU64::new(0);

/// The largest file read, unless [`StateDir::with_limit`] says otherwise: the kubelet's records
/// are a few KiB.
pub const STATE_FILE_LIMIT: u64 = 1 << 20;

/// A directory of state files, one per key.
#[derive(Debug, Clone)]
pub struct StateDir {
    path: PathBuf,
    /// The largest file read.
    limit: u64,
    /// Files set aside as unreadable.
    quarantined: Counter,
    /// The names of the keys whose file was set aside, now or by an earlier daemon.
    set_aside_keys: Arc<Mutex<HashSet<String>>>,
}

impl StateDir {
    /// Opens `path`, creating it (and its parents) with mode 0700, each new directory made
    /// durable in its parent; one found writable by others is made private (logged), one another
    /// user owns refused (`PermissionDenied`, saying whose it is). Removes temporary files left by
    /// writes a crash interrupted, and returns how many it removed. A temporary file that cannot
    /// be removed stays, ignored: no read takes it for a state file.
    pub fn open(path: PathBuf) -> io::Result<(Self, usize)> {
        let new_dirs: Vec<PathBuf> = path
            .ancestors()
            .take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists())
            .map(Path::to_owned)
            .collect();
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&path)?;
        for dir in new_dirs.iter().rev() {
            match dir.parent() {
                Some(parent) if parent.as_os_str().is_empty() => sync_dir(Path::new("."))?,
                Some(parent) => sync_dir(parent)?,
                None => {}
            }
        }
        private::secure_dir(&path).map_err(|error| io::Error::new(io::ErrorKind::PermissionDenied, error))?;
        let mut stale = 0;
        let mut set_aside = HashSet::new();
        for entry in fs::read_dir(&path)? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if left_by_a_crash(&name) && fs::remove_file(entry.path()).is_ok() {
                stale += 1;
            } else if let Some(key_name) = set_aside_key(&name) {
                set_aside.insert(key_name.to_owned());
            }
        }
        let set_aside_keys = Arc::new(Mutex::new(set_aside));
        Ok((Self { path, limit: STATE_FILE_LIMIT, quarantined: Counter::default(), set_aside_keys }, stale))
    }

    /// Reads files of at most `limit` bytes.
    pub fn with_limit(self, limit: u64) -> Self {
        Self { limit, ..self }
    }

    /// Counts the files set aside in `quarantined`.
    pub fn counting_quarantined(self, quarantined: Counter) -> Self {
        Self { quarantined, ..self }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file name for `key`, as the kubelet names it: `sha256-` and the hex SHA-256 of the key.
    pub fn file_name(key: &str) -> String {
        format!("sha256-{:x}", Sha256::digest(key.as_bytes()))
    }

    /// Replaces the file for `key` with `contents`, durably (see the module docs), mode 0600;
    /// returns whether there was one to replace.
    pub fn write(&self, key: &str, contents: &[u8]) -> io::Result<bool> {
        let name = Self::file_name(key);
        let target = self.path.join(&name);
        let replaced = target.exists();
        let write = WRITES.fetch_add(1, Ordering::Relaxed);
        let temporary = self.path.join(format!("{name}.{}.{write}{TMP_SUFFIX}", std::process::id()));
        let written = write_synced(&temporary, contents).and_then(|()| fs::rename(&temporary, &target));
        if let Err(error) = written {
            // Not left for the next start to find (a full disk would otherwise fill up with them).
            let _ = fs::remove_file(&temporary);
            return Err(error);
        }
        sync_dir(&self.path)?;
        Ok(replaced)
    }

    /// Replaces the files for each key of `files` with its contents and removes those for each
    /// key of `removed`, durably, as [`StateDir::write`] and [`StateDir::remove`] would one by one
    /// but with one flush of the directory for them all: each file is whole and flushed before it
    /// takes its name. On an error, what was done before it stays done; returns how many files
    /// were written before it, and the error.
    pub fn write_many<'a>(
        &self,
        files: impl IntoIterator<Item = (&'a str, &'a [u8])>,
        removed: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), (usize, io::Error)> {
        let mut written = 0;
        let mut outcome = Ok(());
        for (key, contents) in files {
            let name = Self::file_name(key);
            let write = WRITES.fetch_add(1, Ordering::Relaxed);
            let temporary = self.path.join(format!("{name}.{}.{write}{TMP_SUFFIX}", std::process::id()));
            let done = write_synced(&temporary, contents).and_then(|()| fs::rename(&temporary, self.path.join(&name)));
            if let Err(error) = done {
                let _ = fs::remove_file(&temporary);
                outcome = Err(error);
                break;
            }
            written += 1;
        }
        if outcome.is_ok() {
            for key in removed {
                match fs::remove_file(self.path.join(Self::file_name(key))) {
                    Err(error) if error.kind() != io::ErrorKind::NotFound => {
                        outcome = Err(error);
                        break;
                    }
                    _ => {}
                }
            }
        }
        // What was renamed or removed before an error is made durable all the same.
        let synced = sync_dir(&self.path);
        outcome.and(synced).map_err(|error| (written, error))
    }

    /// The file for `key`, or `None` when there is none (or it was quarantined). Blocking: call
    /// it off the async runtime's threads.
    pub fn read(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        self.read_path(&self.path.join(Self::file_name(key)))
    }

    /// Whether a file for `key` was ever set aside as unreadable (it stays beside the others, so a
    /// restart still knows).
    pub fn was_set_aside(&self, key: &str) -> bool {
        self.set_aside_keys.lock().unwrap_or_else(PoisonError::into_inner).contains(&Self::file_name(key))
    }

    fn read_path(&self, path: &Path) -> io::Result<Option<Vec<u8>>> {
        match read::read_private(path, self.limit) {
            Ok(contents) => Ok(contents),
            Err(ReadError::Io(error)) => Err(error),
            Err(ReadError::Refused(refused)) => {
                self.set_aside(path, &refused);
                Ok(None)
            }
        }
    }

    /// Sets the state file at `path` aside as unreadable for `why` (quarantined, counted,
    /// logged), so that no later read finds it.
    pub fn set_aside(&self, path: &Path, why: &dyn std::fmt::Display) {
        self.quarantined.inc();
        if let Some(name) = path.file_name() {
            let mut set_aside = self.set_aside_keys.lock().unwrap_or_else(PoisonError::into_inner);
            set_aside.insert(name.to_string_lossy().into_owned());
        }
        match read::quarantine(path) {
            Ok(aside) => tracing::warn!(
                path = %path.display(), aside = %aside.display(), "state file is {why}; quarantined and read as none"
            ),
            Err(error) => tracing::warn!(
                path = %path.display(), %error, "state file is {why}, and could not be set aside; read as none"
            ),
        }
    }

    /// Removes the file for `key`, durably; no file is not an error.
    pub fn remove(&self, key: &str) -> io::Result<()> {
        match fs::remove_file(self.path.join(Self::file_name(key))) {
            Ok(()) => sync_dir(&self.path),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Every state file (not temporary ones): its path and contents, or why it could not be
    /// read (one that cannot is the caller's to report and pass over). A file removed since the
    /// listing is left out.
    pub fn read_all(&self) -> io::Result<Vec<(PathBuf, io::Result<Vec<u8>>)>> {
        let mut files = Vec::new();
        for entry in fs::read_dir(&self.path)? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("sha256-") && !name.ends_with(TMP_SUFFIX) && !name.ends_with(QUARANTINE_SUFFIX) {
                match self.read_path(&entry.path()) {
                    Ok(None) => {}
                    contents => files.push((entry.path(), contents.map(Option::unwrap_or_default))),
                }
            }
        }
        Ok(files)
    }

    /// Removes the file at `path` (one [`StateDir::read_all`] returned), durably.
    pub fn remove_path(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)?;
        sync_dir(&self.path)
    }
}

/// Whether `name` is a temporary file no live process is writing: its writer (the pid in its
/// name) is gone. A daemon draining while its successor starts on the same root dir keeps its
/// writes under way.
fn left_by_a_crash(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(TMP_SUFFIX) else { return false };
    // `{file}.{pid}.{write}`; a name without a pid is from before pids were written.
    let writer = stem.rsplit('.').nth(1).and_then(|pid| pid.parse::<u32>().ok());
    writer.is_none_or(|pid| !Path::new("/proc").join(pid.to_string()).exists())
}

/// The name of the key whose file `name` is, when it is one set aside (`NAME.SECONDS.quarantined`,
/// or `NAME.SECONDS-N.quarantined`).
fn set_aside_key(name: &str) -> Option<&str> {
    let (key_name, seconds) = name.strip_suffix(QUARANTINE_SUFFIX)?.rsplit_once('.')?;
    seconds.bytes().all(|byte| byte.is_ascii_digit() || byte == b'-').then_some(key_name)
}

/// Writes `contents` to a new file at `path`, mode 0600, and fsyncs it.
fn write_synced(path: &Path, contents: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    file.write_all(contents)?;
    file.sync_all()
}

/// Makes the entries of `dir` (a rename, a removal, a new directory) durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn files_are_written_whole_with_private_modes_and_named_by_hash() {
        let root = tempfile::tempdir().expect("tempdir");
        let (dir, stale) = StateDir::open(root.path().join("image_manager/pulled")).expect("opens");
        assert_eq!(stale, 0);
        assert!(!dir.write("sha256:abc", b"first").expect("written"));
        assert!(dir.write("sha256:abc", b"second").expect("rewritten"), "replaced");
        assert_eq!(dir.read("sha256:abc").expect("reads").as_deref(), Some(&b"second"[..]));
        assert_eq!(dir.read("sha256:other").expect("reads"), None);
        let name = StateDir::file_name("sha256:abc");
        // `printf sha256:abc | sha256sum`
        assert_eq!(name, "sha256-67e9bc3cfd2163c2978358dfe00d2f912cd4ee0c99f077c3583b39b48aebb124");
        let mode = |path: &Path| fs::metadata(path).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode(&dir.path().join(&name)), 0o600);
        assert_eq!(mode(dir.path()), 0o700);
        assert_eq!(files(&dir), [(name.clone(), b"second".to_vec())]);
        assert_eq!(fs::read_dir(dir.path()).expect("lists").count(), 1, "no temporary file is left");
        dir.remove("sha256:abc").expect("removed");
        dir.remove("sha256:abc").expect("removing twice is fine");
        assert!(dir.read_all().expect("lists").is_empty());
    }

    /// What [`StateDir::read_all`] lists: each file's name and contents.
    fn files(dir: &StateDir) -> Vec<(String, Vec<u8>)> {
        let listed = dir.read_all().expect("lists").into_iter();
        let name = |path: PathBuf| path.file_name().expect("a name").to_string_lossy().into_owned();
        listed.map(|(path, contents)| (name(path), contents.expect("readable"))).collect()
    }

    #[test]
    fn temporary_files_of_interrupted_writes_are_removed_on_open_or_else_ignored() {
        let root = tempfile::tempdir().expect("tempdir");
        let (dir, _) = StateDir::open(root.path().to_owned()).expect("opens");
        dir.write("kept", b"whole").expect("written");
        fs::write(dir.path().join(format!("{}.4194305.0.tmp", StateDir::file_name("torn"))), b"tor").expect("written");
        // One that cannot be removed (a directory) stays, and is never read as a state file.
        fs::create_dir(dir.path().join(format!("{}.tmp", StateDir::file_name("stuck")))).expect("created");
        // A live process's write under way (a draining daemon's, beside its successor) stays.
        let live = dir.path().join(format!("{}.{}.0.tmp", StateDir::file_name("live"), std::process::id()));
        fs::write(&live, b"being written").expect("written");
        let (dir, stale) = StateDir::open(root.path().to_owned()).expect("reopens");
        assert_eq!(stale, 1);
        assert_eq!(files(&dir), [(StateDir::file_name("kept"), b"whole".to_vec())]);
        assert!(live.exists(), "a live writer's file is left to it");
    }

    #[test]
    fn a_file_that_is_no_regular_file_or_too_large_is_quarantined_counted_and_read_as_none() {
        let root = tempfile::tempdir().expect("tempdir");
        let quarantined = Counter::default();
        let (dir, _) = StateDir::open(root.path().to_owned()).expect("opens");
        let dir = dir.with_limit(8).counting_quarantined(quarantined.clone());
        dir.write("kept", b"whole").expect("written");
        dir.write("large", b"nine bytes").expect("written");
        fs::create_dir(dir.path().join(StateDir::file_name("a directory"))).expect("created");
        std::os::unix::fs::symlink("/dev/zero", dir.path().join(StateDir::file_name("zero"))).expect("linked");
        assert_eq!(files(&dir), [(StateDir::file_name("kept"), b"whole".to_vec())], "the others are read");
        assert_eq!(quarantined.get(), 3);
        for key in ["large", "a directory", "zero"] {
            assert_eq!(dir.read(key).expect("no error"), None, "{key} is gone");
        }
        let aside = fs::read_dir(dir.path())
            .expect("lists")
            .filter(|entry| entry.as_ref().expect("entry").file_name().to_string_lossy().ends_with(QUARANTINE_SUFFIX));
        assert_eq!(aside.count(), 3, "each set aside beside the others");
        assert_eq!(files(&dir).len(), 1, "and never read again");
        let remembered =
            |dir: &StateDir| ["large", "a directory", "zero", "kept", "never"].map(|key| dir.was_set_aside(key));
        assert_eq!(remembered(&dir), [true, true, true, false, false]);
        let (reopened, _) = StateDir::open(root.path().to_owned()).expect("reopens");
        assert_eq!(remembered(&reopened), [true, true, true, false, false], "known after a restart too");
    }

    #[test]
    fn a_file_writable_by_others_or_another_users_is_set_aside_and_read_as_none() {
        let root = tempfile::tempdir().expect("tempdir");
        let quarantined = Counter::default();
        let (dir, _) = StateDir::open(root.path().to_owned()).expect("opens");
        let dir = dir.counting_quarantined(quarantined.clone());
        for key in ["kept", "readable by all", "writable by the group", "writable by all", "another user's"] {
            dir.write(key, b"contents").expect("written");
        }
        let path = |key: &str| dir.path().join(StateDir::file_name(key));
        let chmod = |key: &str, mode: u32| fs::set_permissions(path(key), fs::Permissions::from_mode(mode));
        chmod("readable by all", 0o644).expect("chmod");
        chmod("writable by the group", 0o620).expect("chmod");
        chmod("writable by all", 0o666).expect("chmod");
        let others = private::user() == 0;
        if others {
            std::os::unix::fs::chown(path("another user's"), Some(65534), None).expect("chown");
        }
        let read = ["kept", "readable by all", "writable by the group", "writable by all", "another user's"]
            .map(|key| dir.read(key).expect("no error").is_some());
        assert_eq!(read, [true, true, false, false, !others]);
        assert_eq!(quarantined.get(), if others { 3 } else { 2 });
        assert!(dir.was_set_aside("writable by all") && !dir.was_set_aside("readable by all"));
        assert_eq!(files(&dir).len(), 2, "never read again");
    }

    #[test]
    fn a_directory_writable_by_others_is_made_private_on_open_and_another_users_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        let path = root.path().join("state");
        fs::create_dir(&path).expect("created");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o777)).expect("chmod");
        StateDir::open(path.clone()).expect("opens");
        assert_eq!(fs::metadata(&path).expect("metadata").permissions().mode() & 0o777, 0o755);
        if private::user() != 0 {
            return; // Only root can give a directory to another user.
        }
        std::os::unix::fs::chown(&path, Some(65534), None).expect("chown");
        let refused = StateDir::open(path.clone()).expect_err("another user's");
        assert_eq!(refused.kind(), io::ErrorKind::PermissionDenied);
        assert!(refused.to_string().contains("owned by uid 65534"), "{refused}");
    }

    #[test]
    fn a_write_that_fails_leaves_no_temporary_file() {
        let root = tempfile::tempdir().expect("tempdir");
        let (dir, _) = StateDir::open(root.path().to_owned()).expect("opens");
        // The rename cannot replace a directory.
        fs::create_dir(dir.path().join(StateDir::file_name("blocked"))).expect("created");
        assert!(dir.write("blocked", b"never").is_err());
        let names: Vec<_> =
            fs::read_dir(dir.path()).expect("lists").map(|entry| entry.expect("entry").file_name()).collect();
        assert_eq!(names, [std::ffi::OsString::from(StateDir::file_name("blocked"))]);
    }

    #[test]
    fn every_directory_open_creates_is_private() {
        let root = tempfile::tempdir().expect("tempdir");
        let (dir, _) = StateDir::open(root.path().join("a/b/c")).expect("opens");
        dir.write("key", b"contents").expect("written");
        let mode = |path: &Path| fs::metadata(path).expect("metadata").permissions().mode() & 0o777;
        assert_eq!([mode(&root.path().join("a")), mode(&root.path().join("a/b"))], [0o700, 0o700]);
        assert_eq!(dir.read("key").expect("reads").as_deref(), Some(&b"contents"[..]));
    }
}
