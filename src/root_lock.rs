//! One daemon per `--root-dir`: an exclusive `flock` on `cri-imaged.lock` in it, held while the
//! daemon serves. A second daemon on the directory is refused, naming the holder (its pid, PID
//! namespace and host name: across pods a pid alone names nobody). The hand-
//! overs the socket allows are allowed here too: a daemon taking the socket over
//! (`--take-over-socket`) waits for the lock in the background while it serves, and a daemon lets
//! the lock go when it starts draining, as it lets its socket go, so that a successor can start.

use std::{
    fmt,
    fs::{File, OpenOptions},
    io,
    os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt},
    path::{Path, PathBuf},
    time::Duration,
};

use rustix::{
    fs::{FlockOperation, flock},
    io::Errno,
};

use crate::{
    files::private::{self, PrivateError},
    retry::Doubling,
    shutdown::Shutdown,
};

/// The lock file's name in `--root-dir`.
pub const FILE_NAME: &str = "cri-imaged.lock";

/// The root dir's mode when it is created here, as the pull records would create it.
const DIRECTORY_MODE: u32 = 0o700;

/// Only the daemon's user reads whose the directory is.
const FILE_MODE: u32 = 0o600;

/// A daemon taking over tries for the lock this often: a hand-over is quick, a drain may be long.
const WAITS: Doubling = Doubling::new(Duration::from_millis(50), Duration::from_secs(1));

/// The most of the lock file read for its holder (a pid, a host name of at most 64 bytes and a
/// namespace's name are far shorter).
const HOLDER_BYTES: usize = 256;

/// The longest host name or namespace name taken from the lock file (HOST_NAME_MAX is 64).
const NAME_CHARS: usize = 64;

/// Why the root dir's lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum RootLockError {
    #[error(
        "--root-dir {} is in use by another cri-imaged ({holder}), which holds {}: one daemon per root dir; stop that one first",
        dir.display(),
        path.display()
    )]
    Held { dir: PathBuf, path: PathBuf, holder: Holder },
    #[error("cannot create --root-dir {}: {source}", dir.display())]
    CreateDir { dir: PathBuf, source: io::Error },
    #[error("cannot open the lock file {}: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error("the lock file {} is not a regular file (a link, a FIFO or a directory); remove it", path.display())]
    NotRegular { path: PathBuf },
    #[error("cannot lock {}: {source}", path.display())]
    Lock { path: PathBuf, source: io::Error },
    /// The root dir, or the lock file, is another user's: refused (see [`crate::files::private`]).
    #[error("--root-dir: {0}")]
    Private(#[from] PrivateError),
}

/// The daemon holding the lock, as far as its file says. A pid alone misleads across PID
/// namespaces: in a pod the holder is often pid 1 of the pod's own; its host name (in a pod, the
/// pod's name) and its PID namespace say which daemon that is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holder {
    /// `None` while the holder has yet to write it (it writes it right after locking).
    pub pid: Option<u32>,
    /// The PID namespace its pid is in, as `/proc/self/ns/pid` names it (`pid:[INODE]`).
    pub pid_namespace: Option<String>,
    /// Its host name (`/proc/sys/kernel/hostname`: in a pod, the pod's name).
    pub host: Option<String>,
}

impl Holder {
    /// This process, as it writes itself to the lock file.
    fn this_process() -> Self {
        let pid_namespace =
            std::fs::read_link("/proc/self/ns/pid").ok().map(|link| link.to_string_lossy().into_owned());
        let host = read_bounded(Path::new("/proc/sys/kernel/hostname")).or_else(|| std::env::var("HOSTNAME").ok());
        Self { pid: Some(std::process::id()), pid_namespace, host }
    }

    /// The lock file's text: the pid on the first line, then `key=value` lines.
    fn to_file(&self) -> String {
        let mut text = self.pid.map(|pid| format!("{pid}\n")).unwrap_or_default();
        for (key, value) in [("pid_namespace", &self.pid_namespace), ("host", &self.host)] {
            if let Some(value) = value.as_deref().and_then(name) {
                text.push_str(&format!("{key}={value}\n"));
            }
        }
        text
    }

    /// Reads what [`Holder::to_file`] wrote; anything else in the file is ignored.
    fn from_file(text: &str) -> Self {
        let mut lines = text.lines();
        let pid = lines.next().and_then(|line| line.trim().parse().ok());
        let mut holder = Self { pid, ..Self::default() };
        for (key, value) in lines.filter_map(|line| line.split_once('=')) {
            match key {
                "pid_namespace" => holder.pid_namespace = name(value),
                "host" => holder.host = name(value),
                _ => {}
            }
        }
        holder
    }
}

/// `value` if it is a plausible name: printable ASCII, no spaces, not too long (the file may
/// have been written by anyone able to, and the name goes into a message).
fn name(value: &str) -> Option<String> {
    let value = value.trim();
    let plausible = !value.is_empty() && value.len() <= NAME_CHARS && value.chars().all(|c| c.is_ascii_graphic());
    plausible.then(|| value.to_owned())
}

/// A short file's first line (procfs), `None` if unreadable or not a [`name`].
fn read_bounded(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    File::open(path).ok()?.take(NAME_CHARS as u64 + 1).read_to_string(&mut text).ok()?;
    name(text.lines().next()?)
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pid {
            Some(pid) => write!(f, "pid {pid}")?,
            None => f.write_str("pid not yet written")?,
        }
        if let Some(namespace) = &self.pid_namespace {
            write!(f, " in PID namespace {namespace}")?;
        }
        if let Some(host) = &self.host {
            write!(f, " on host {host}")?;
        }
        Ok(())
    }
}

/// The root dir's lock: held, or (taking over) awaited. Closing its file lets it go.
#[must_use = "the lock is let go when this is dropped"]
#[derive(Debug)]
pub struct RootLock {
    file: File,
    path: PathBuf,
    held: bool,
}

impl RootLock {
    /// Takes the lock of `root_dir` (created if missing), or refuses naming its holder; with
    /// `take_over`, a held lock is awaited instead (see [`RootLock::release_on`]).
    pub fn take(root_dir: &Path, take_over: bool) -> Result<Self, RootLockError> {
        let path = root_dir.join(FILE_NAME);
        let file = open(root_dir, &path)?;
        let mut lock = Self { file, path, held: false };
        if lock.try_lock()? {
            return Ok(lock);
        }
        let holder = lock.holder();
        if !take_over {
            return Err(RootLockError::Held { dir: root_dir.to_owned(), path: lock.path, holder });
        }
        tracing::info!(
            path = %lock.path.display(),
            %holder,
            "--root-dir is held by the daemon this one takes over from; its lock is taken once that one starts draining"
        );
        Ok(lock)
    }

    /// Keeps the lock until `shutdown` is requested, then lets it go: a draining daemon leaves the
    /// root dir to a successor. One taking over first waits for it, in the background.
    pub fn release_on(self, shutdown: Shutdown) {
        tokio::spawn(self.hold_until(shutdown));
    }

    async fn hold_until(mut self, shutdown: Shutdown) {
        if !self.held {
            tokio::select! {
                () = self.wait() => {}
                () = shutdown.clone().requested() => return,
            }
        }
        shutdown.requested().await;
        tracing::debug!(path = %self.path.display(), "draining: --root-dir's lock let go");
    }

    /// Tries for the lock, more slowly each time, until it is ours.
    async fn wait(&mut self) {
        let mut waits = WAITS;
        loop {
            tokio::time::sleep(waits.next_wait()).await;
            match self.try_lock() {
                Ok(true) => {
                    tracing::info!(path = %self.path.display(), "the daemon taken over from let --root-dir go; its lock is this one's");
                    return;
                }
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, "trying for --root-dir's lock again"),
            }
        }
    }

    /// Whether the lock is now ours; if so, who we are is written to its file.
    fn try_lock(&mut self) -> Result<bool, RootLockError> {
        match flock(&self.file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => return Ok(false),
            Err(error) => return Err(RootLockError::Lock { path: self.path.clone(), source: error.into() }),
        }
        self.held = true;
        // Only now emptied: a refused daemon never erases the holder's pid. The pid only names the
        // holder in a refusal, so failing to write it does not stop the start.
        let holder = Holder::this_process().to_file();
        if let Err(error) = self.file.set_len(0).and_then(|()| self.file.write_all_at(holder.as_bytes(), 0)) {
            tracing::warn!(path = %self.path.display(), %error, "cannot write this daemon's pid to --root-dir's lock file");
        }
        Ok(true)
    }

    /// The holder, as its file says.
    fn holder(&self) -> Holder {
        let mut buffer = [0; HOLDER_BYTES];
        let read = self.file.read_at(&mut buffer, 0).unwrap_or(0);
        Holder::from_file(&String::from_utf8_lossy(&buffer[..read]))
    }
}

/// Opens (creating) the lock file: never through a link, never blocking on a FIFO left in its
/// place, and never truncated here (see [`RootLock::try_lock`]). The root dir is made the daemon's
/// user's alone first, or refused ([`private::secure_dir`]); so is the lock file (whoever else
/// owns it could hold the lock for ever).
fn open(root_dir: &Path, path: &Path) -> Result<File, RootLockError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIRECTORY_MODE)
        .create(root_dir)
        .map_err(|source| RootLockError::CreateDir { dir: root_dir.to_owned(), source })?;
    private::secure_dir(root_dir)?;
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        // std adds O_CLOEXEC: a credential plugin never inherits the lock.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let not_regular = || RootLockError::NotRegular { path: path.to_owned() };
    let file = match opened {
        Ok(file) => file,
        Err(error) if matches!(error.raw_os_error(), Some(libc::ELOOP | libc::EISDIR)) => return Err(not_regular()),
        Err(source) => return Err(RootLockError::Open { path: path.to_owned(), source }),
    };
    let metadata = file.metadata().map_err(|source| RootLockError::Open { path: path.to_owned(), source })?;
    if !metadata.is_file() {
        return Err(not_regular());
    }
    // It holds only who holds it, read for a refusal's message; but whoever else owns it could hold the
    // lock for ever.
    private::secure_open(&file, path)?;
    Ok(file)
}

#[cfg(test)]
mod tests;
