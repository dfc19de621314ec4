//! CRI-O's image store watched with inotify, so that the presence cache never outlives a change
//! on a runtime without containerd's event service.
//!
//! CRI-O keeps images in a containers/storage store, which writes a new `images.json` and renames
//! it over the old one, then records the write in `images.lock` (a `pwrite`), at every pull, tag
//! and removal. Either forgets everything; the files are never read. Every reader of the store
//! (each ImageStatus, ListImages, ours and the kubelet's) opens the lock read-write and closes it
//! unwritten, so a close of the lock (`IN_CLOSE_WRITE`) is no change: taken as one, every runtime
//! call emptied the cache and presence on CRI-O was no faster than asking. The kernel queues the
//! event inside the rename, before the runtime answers the call that made it, so reading the queue
//! dry is a barrier: every change that had returned when the read began has been applied, and the
//! cache is current as of that moment (see [`super`]: `max_staleness` means the same as with
//! containerd, and the proof needs no round trip). A full queue (`IN_Q_OVERFLOW`) or a lost watch
//! (the directory deleted, moved or unmounted) forgets everything and stops remembering until the
//! watch is set up again.

use std::{
    ffi::CStr,
    io,
    mem::MaybeUninit,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use tokio::{io::unix::AsyncFd, time::Instant};

use super::{PresenceCache, SETTLE, Signal};
use crate::{retry::Doubling, shutdown::Shutdown};

/// The file containers/storage rewrites at every change of its images.
pub const IMAGES_JSON: &str = "images.json";
/// Its lock, created beside it.
const IMAGES_LOCK: &str = "images.lock";
/// What is asked of the kernel: the two names created, written, renamed or deleted, and the
/// directory itself going away (`IN_IGNORED`, `IN_UNMOUNT` and `IN_Q_OVERFLOW` come unasked).
const WATCHED: WatchFlags = WatchFlags::CLOSE_WRITE
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::CREATE)
    .union(WatchFlags::DELETE)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR);
/// Room for many events per read; a name is at most 255 bytes.
const READ_BUFFER: usize = 16 << 10;
/// Waits between attempts to watch again.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Why watching the image store stopped.
#[derive(Debug, thiserror::Error)]
pub enum StoreWatchError {
    #[error("cannot watch {}: {source}", .path.display())]
    Watch { path: PathBuf, source: io::Error },
    #[error("{} holds no regular file {IMAGES_JSON} or {IMAGES_LOCK}: no containers/storage image store", .0.display())]
    NotAStore(PathBuf),
    #[error("the inotify queue overflowed: changes were lost")]
    Overflow,
    #[error("the watch on {} was lost (deleted, moved or unmounted)", .0.display())]
    Lost(PathBuf),
    #[error("reading inotify events: {0}")]
    Read(io::Error),
}

/// What one inotify event means to the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Another file (containers/storage's temporary files, say).
    Nothing,
    /// `images.json` or its lock was written, renamed or deleted.
    Changed,
    /// The watch is gone.
    Lost,
    /// The kernel dropped events.
    Overflow,
}

/// What an event with these flags, on this name, means (pure).
pub fn classify(flags: ReadFlags, name: Option<&CStr>) -> Seen {
    if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
        return Seen::Overflow;
    }
    let gone = ReadFlags::IGNORED | ReadFlags::UNMOUNT | ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF;
    if flags.intersects(gone) {
        return Seen::Lost;
    }
    let replaced = ReadFlags::MOVED_TO | ReadFlags::MOVED_FROM | ReadFlags::CREATE | ReadFlags::DELETE;
    let changes = match name.map(CStr::to_bytes) {
        Some(name) if name == IMAGES_JSON.as_bytes() => replaced | ReadFlags::MODIFY | ReadFlags::CLOSE_WRITE,
        // Written only to record a change; opened and closed unwritten by every reader.
        Some(name) if name == IMAGES_LOCK.as_bytes() => replaced | ReadFlags::MODIFY,
        _ => return Seen::Nothing,
    };
    if flags.intersects(changes) { Seen::Changed } else { Seen::Nothing }
}

/// Whether `dir` holds a containers/storage image store: a regular `images.json` or
/// `images.lock` (not followed if a link; never read). The lock is created when the store is
/// opened, `images.json` only at the first pull, so a fresh CRI-O's store holds the lock alone.
pub fn holds_store(dir: &Path) -> bool {
    [IMAGES_JSON, IMAGES_LOCK]
        .iter()
        .any(|name| std::fs::symlink_metadata(dir.join(name)).is_ok_and(|meta| meta.file_type().is_file()))
}

/// An inotify watch on an image store's directory.
pub struct StoreWatch {
    fd: AsyncFd<OwnedFd>,
    dir: PathBuf,
}

impl StoreWatch {
    /// Watches `dir`, which must hold an image store; from the moment this returns, every change
    /// is queued. Needs a tokio runtime.
    pub fn open(dir: &Path) -> Result<Self, StoreWatchError> {
        let failed = |error: rustix::io::Errno| StoreWatchError::Watch { path: dir.to_owned(), source: error.into() };
        let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC).map_err(failed)?;
        inotify::add_watch(&fd, dir, WATCHED).map_err(failed)?;
        // Checked once watched, so that a store appearing in between is not missed.
        if !holds_store(dir) {
            return Err(StoreWatchError::NotAStore(dir.to_owned()));
        }
        // SAFETY: the descriptor is owned by the `OwnedFd` moved in, so it stays open and the same
        // for as long as the `AsyncFd` holds it.
        let fd = unsafe { AsyncFd::register(fd) }
            .map_err(|error| StoreWatchError::Watch { path: dir.to_owned(), source: error.into_parts().1 })?;
        Ok(Self { fd, dir: dir.to_owned() })
    }

    /// Reads every queued event without waiting: whether the store changed, or why the watch
    /// can no longer be trusted.
    pub fn drain(&self) -> Result<bool, StoreWatchError> {
        let mut buffer = [MaybeUninit::<u8>::uninit(); READ_BUFFER];
        let mut reader = inotify::Reader::new(self.fd.get_ref(), &mut buffer);
        let mut changed = false;
        loop {
            let event = match reader.next() {
                Ok(event) => event,
                Err(rustix::io::Errno::WOULDBLOCK) => return Ok(changed),
                Err(rustix::io::Errno::INTR) => continue,
                Err(error) => return Err(StoreWatchError::Read(error.into())),
            };
            match classify(event.events(), event.file_name()) {
                Seen::Nothing => {}
                Seen::Changed => changed = true,
                Seen::Lost => return Err(StoreWatchError::Lost(self.dir.clone())),
                Seen::Overflow => return Err(StoreWatchError::Overflow),
            }
        }
    }

    /// Waits until events are queued, then reads them all (see [`Self::drain`]).
    pub async fn next_change(&self) -> Result<bool, StoreWatchError> {
        let mut guard = self.fd.readable().await.map_err(StoreWatchError::Read)?;
        let drained = self.drain();
        // Only readiness seen before this guard is cleared: an event queued since wakes us again.
        guard.clear_ready();
        drained
    }
}

/// Keeps `cache` watching the image store in `dir` until shutdown, watching again after an
/// overflow (at once), a lost watch or a failure to watch (after a wait).
pub async fn watch(dir: PathBuf, cache: Arc<PresenceCache>, shutdown: Shutdown) {
    cache.set_signal(Signal::ImageStore(dir.clone()));
    let stopping = shutdown.requested();
    tokio::pin!(stopping);
    let mut retries = Doubling::new(RETRY_MIN, RETRY_MAX);
    loop {
        let error = tokio::select! {
            error = watch_once(&dir, &cache) => error,
            () = &mut stopping => return cache.set_watching(false),
        };
        if cache.is_watching() {
            retries.reset();
        }
        cache.set_watching(false);
        // The store is still there after an overflow: watch it again at once.
        let retry = if let StoreWatchError::Overflow = error { Duration::ZERO } else { retries.next_wait() };
        tracing::warn!(%error, retry_in = ?retry, "presence checks ask the runtime until the image store is watched again");
        tokio::select! {
            () = tokio::time::sleep(retry) => {}
            () = &mut stopping => return,
        }
    }
}

/// Watches `dir` once: every change forgets everything (and once more [`SETTLE`] later, as for
/// containerd), and every barrier asked for reads the queue dry.
async fn watch_once(dir: &Path, cache: &PresenceCache) -> StoreWatchError {
    let store = match StoreWatch::open(dir) {
        Ok(store) => store,
        Err(error) => return error,
    };
    cache.set_watching(true);
    tracing::info!(image_store = %dir.display(), "watching the runtime's image store; presence answers are remembered");
    let mut settle_at: Option<Instant> = None;
    loop {
        let (drained, started) = tokio::select! {
            biased;
            drained = store.next_change() => (drained, None),
            () = tokio::time::sleep_until(settle_at.unwrap_or_else(Instant::now)), if settle_at.is_some() => {
                settle_at = None;
                cache.image_changed();
                continue;
            }
            () = cache.barrier_wanted() => {
                // Taken before the read: every change that returned before now is in the queue.
                let started = Instant::now();
                cache.metrics().barrier();
                (store.drain(), Some(started))
            }
        };
        match drained {
            Ok(true) => {
                tracing::debug!(image_store = %dir.display(), "image store changed");
                cache.image_changed();
                settle_at = Some(Instant::now() + SETTLE);
            }
            Ok(false) => {}
            Err(error) => return error,
        }
        if let Some(started) = started {
            cache.proven_current_as_of(started);
        }
    }
}

#[cfg(test)]
mod tests;
