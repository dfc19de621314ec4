//! The unix socket we serve on: the one systemd passes (socket activation), or one we create
//! safely, never stolen from a live daemon, and removed on exit only while it is still ours.

use std::{
    io,
    os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

use tokio::net::{UnixListener, UnixStream};

/// Mode of the listening socket: the owner and its group (the kubelet's) may connect.
pub const SOCKET_MODE: u32 = 0o660;
/// Mode of a socket directory we create: nobody but the owner may add or replace entries, and
/// anyone may pass through to the socket, whose own mode says who may connect (the directory's
/// group is the daemon's, not the socket's: 0750 would keep the socket's group out).
pub const DIRECTORY_MODE: u32 = 0o755;

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot create socket directory {path}: {source}")]
    CreateDir { path: PathBuf, source: io::Error },
    #[error(
        "socket directory {path} is writable by others (mode {mode:o}), who could replace the socket; \
         use a directory only its owner (and group) may write to"
    )]
    UnsafeDirectory { path: PathBuf, mode: u32 },
    #[error("{0} is in use: another process answers on it; stop it or choose another --listen path")]
    InUse(PathBuf),
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    #[error("cannot remove stale socket {path}: {source}")]
    RemoveStale { path: PathBuf, source: io::Error },
    #[error("cannot listen on {path}: {source}")]
    Bind { path: PathBuf, source: io::Error },
    #[error("cannot set mode {SOCKET_MODE:o} on {path}: {source}")]
    Permissions { path: PathBuf, source: io::Error },
    #[error(
        "the socket systemd passed (LISTEN_FDS) cannot be served: {0}; it must be a unix stream socket (ListenStream=/path)"
    )]
    Passed(io::Error),
}

/// The listening socket systemd passed (`LISTEN_FDS`, `LISTEN_PID` ours), if any. The socket
/// unit owns its file, its mode and its group; we never remove it.
pub fn passed_by_systemd() -> Result<Option<UnixListener>, ListenError> {
    let mut passed = listenfd::ListenFd::from_env();
    if passed.len() > 1 {
        tracing::warn!(sockets = passed.len(), "systemd passed more than one socket; serving the first");
    }
    let Some(listener) = passed.take_unix_listener(0).map_err(ListenError::Passed)? else { return Ok(None) };
    listener.set_nonblocking(true).map_err(ListenError::Passed)?;
    UnixListener::from_std(listener).map(Some).map_err(ListenError::Passed)
}

/// The socket file we bound, told apart from any later one at the same path by its inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketFile {
    path: PathBuf,
    device: u64,
    inode: u64,
}

impl SocketFile {
    /// Removes the socket file if it is still the one we bound. A successor that replaced it
    /// while we drained (a restart, a rolling update) keeps its own.
    pub fn remove_if_ours(&self) {
        match std::fs::symlink_metadata(&self.path) {
            Ok(metadata) if (metadata.dev(), metadata.ino()) == (self.device, self.inode) => {
                if let Err(error) = std::fs::remove_file(&self.path) {
                    tracing::warn!(path = %self.path.display(), %error, "cannot remove our socket");
                }
            }
            Ok(_) => tracing::info!(path = %self.path.display(), "socket now belongs to another daemon; left in place"),
            Err(_) => {}
        }
    }
}

/// Binds `path`, creating its directory (mode 0755) if missing and replacing a stale socket left
/// by a daemon that died; a socket that still answers, or a directory others may write to, is
/// refused.
pub async fn bind(path: &Path) -> Result<(UnixListener, SocketFile), ListenError> {
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        prepare_directory(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if !metadata.file_type().is_socket() => return Err(ListenError::NotASocket(path.to_owned())),
        Ok(_) => {
            if UnixStream::connect(path).await.is_ok() {
                return Err(ListenError::InUse(path.to_owned()));
            }
            tracing::info!(path = %path.display(), "replacing stale socket");
            std::fs::remove_file(path).map_err(|source| ListenError::RemoveStale { path: path.to_owned(), source })?;
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(ListenError::Bind { path: path.to_owned(), source }),
    }
    let listener = UnixListener::bind(path).map_err(|source| ListenError::Bind { path: path.to_owned(), source })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(|source| ListenError::Permissions { path: path.to_owned(), source })?;
    let metadata =
        std::fs::symlink_metadata(path).map_err(|source| ListenError::Bind { path: path.to_owned(), source })?;
    Ok((listener, SocketFile { path: path.to_owned(), device: metadata.dev(), inode: metadata.ino() }))
}

/// Binds a new socket beside `path` and renames it over `path` (`--take-over-socket`): callers
/// from then on reach this daemon, while one still serving the old socket drains what it had
/// accepted and, on exit, leaves the new socket in place. A rolling update with surge hands the
/// socket over this way and refuses no caller. Refuses what [`bind`] refuses, but a live socket.
pub async fn take_over(path: &Path) -> Result<(UnixListener, SocketFile), ListenError> {
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        prepare_directory(dir)?;
    }
    if let Ok(metadata) = std::fs::symlink_metadata(path)
        && !metadata.file_type().is_socket()
    {
        return Err(ListenError::NotASocket(path.to_owned()));
    }
    let temporary = temporary_name(path);
    let bind_error = |source| ListenError::Bind { path: path.to_owned(), source };
    // One left by a taking over that died half way is ours to replace (its pid was ours).
    let _ = std::fs::remove_file(&temporary);
    let listener = UnixListener::bind(&temporary).map_err(bind_error)?;
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(|source| ListenError::Permissions { path: temporary.clone(), source })?;
    // Said only when a daemon answers on the old socket: on a fresh start there is none to drain.
    let live = UnixStream::connect(path).await.is_ok();
    std::fs::rename(&temporary, path).map_err(bind_error)?;
    let metadata = std::fs::symlink_metadata(path).map_err(bind_error)?;
    if live {
        tracing::info!(path = %path.display(), "took the socket over; a daemon serving the old one drains what it accepted");
    }
    Ok((listener, SocketFile { path: path.to_owned(), device: metadata.dev(), inode: metadata.ino() }))
}

/// Where [`take_over`] binds before renaming over `path`: beside it, hidden, named for this process.
fn temporary_name(path: &Path) -> PathBuf {
    let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.new", std::process::id()))
}

/// The path callers reach `listener` at, if it has one. A listener keeps the name it was bound
/// at, so one [`take_over`] bound names its temporary file, since renamed to the path it serves.
pub fn path_of(listener: &UnixListener) -> Option<PathBuf> {
    let bound = listener.local_addr().ok()?.as_pathname()?.to_owned();
    let name = bound.file_name().and_then(|name| name.to_str()).unwrap_or_default();
    let renamed = name.strip_prefix('.').and_then(|name| name.strip_suffix(&format!(".{}.new", std::process::id())));
    match renamed.filter(|renamed| !renamed.is_empty()) {
        Some(renamed) => Some(bound.with_file_name(renamed)),
        None => Some(bound),
    }
}

/// Creates the socket's directory with an explicit mode (the umask can only narrow it), or checks
/// that an existing one cannot be written by others. A sticky directory (such as /tmp) is
/// accepted: there nobody can remove or rename an entry they do not own.
fn prepare_directory(dir: &Path) -> Result<(), ListenError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIRECTORY_MODE)
        .create(dir)
        .map_err(|source| ListenError::CreateDir { path: dir.to_owned(), source })?;
    let mode = std::fs::metadata(dir).map_err(|source| ListenError::CreateDir { path: dir.to_owned(), source })?.mode();
    let others_may_write = mode & 0o002 != 0;
    let sticky = mode & 0o1000 != 0;
    if others_may_write && !sticky {
        return Err(ListenError::UnsafeDirectory { path: dir.to_owned(), mode: mode & 0o7777 });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path).expect("exists").permissions().mode() & 0o7777
    }

    #[tokio::test]
    async fn creates_the_directory_0755_and_the_socket_0660() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nested/run/cri-imaged.sock");
        let _listener = bind(&path).await.expect("bind");
        assert_eq!(mode_of(&path), SOCKET_MODE);
        assert_eq!(mode_of(&dir.path().join("nested/run")), DIRECTORY_MODE);
        assert_eq!(mode_of(&dir.path().join("nested")), DIRECTORY_MODE);
    }

    #[tokio::test]
    async fn refuses_a_directory_others_may_write_to_unless_it_is_sticky() {
        let dir = tempfile::tempdir().expect("tempdir");
        let open = dir.path().join("open");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let error = bind(&open.join("s.sock")).await.expect_err("world-writable");
        assert!(matches!(error, ListenError::UnsafeDirectory { mode: 0o777, .. }), "{error}");
        assert!(!open.join("s.sock").exists(), "nothing was bound");

        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        bind(&open.join("s.sock")).await.expect("a sticky directory, as /tmp, is fine");
    }

    #[tokio::test]
    async fn removes_its_socket_on_exit_but_not_a_successor_s() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        let (_ours, ours) = bind(&path).await.expect("bind");
        ours.remove_if_ours();
        assert!(!path.exists(), "our own socket goes");

        let (_first, first_file) = bind(&path).await.expect("bind again");
        // A successor replaces the socket while we drain (ours no longer answers new connections).
        std::fs::remove_file(&path).expect("the successor's stale check removes ours");
        let (_second, _second_file) = bind(&path).await.expect("successor binds");
        first_file.remove_if_ours();
        assert!(path.exists(), "the successor's socket stays");
        assert!(UnixStream::connect(&path).await.is_ok(), "and answers");
    }

    #[tokio::test]
    async fn replaces_a_stale_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).expect("first bind"));
        assert!(path.exists(), "the dead listener leaves its socket file behind");
        let (listener, _) = bind(&path).await.expect("stale socket is replaced");
        let (client, accepted) = tokio::join!(UnixStream::connect(&path), listener.accept());
        assert!(client.is_ok() && accepted.is_ok(), "the new socket accepts connections");
    }

    #[tokio::test]
    async fn refuses_a_socket_another_process_answers_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("live.sock");
        let _live = UnixListener::bind(&path).expect("live listener");
        let error = bind(&path).await.expect_err("live socket must not be stolen");
        assert!(matches!(error, ListenError::InUse(_)), "{error}");
        assert!(error.to_string().contains("another process answers on it"));
    }

    #[tokio::test]
    async fn refuses_to_replace_a_regular_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("precious.txt");
        std::fs::write(&path, "keep me").expect("write");
        let error = bind(&path).await.expect_err("a file is not a socket");
        assert!(matches!(error, ListenError::NotASocket(_)), "{error}");
        assert_eq!(std::fs::read_to_string(&path).expect("still there"), "keep me");
    }

    #[tokio::test]
    async fn taking_over_a_live_socket_sends_callers_to_the_new_daemon_and_the_old_leaves_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agents.sock");
        let (old, old_file) = bind(&path).await.expect("the old daemon binds");
        assert!(matches!(bind(&path).await, Err(ListenError::InUse(_))), "a plain bind refuses a live socket");
        let _probe = old.accept().await.expect("the refusing bind's probe");
        let (new, _new_file) = take_over(&path).await.expect("taken over");
        let _probe = old.accept().await.expect("the taking over's probe: was the old socket live?");
        assert_eq!(mode_of(&path), SOCKET_MODE);
        let _caller = UnixStream::connect(&path).await.expect("connects");
        let accepted = tokio::time::timeout(std::time::Duration::from_secs(2), new.accept()).await;
        assert!(accepted.is_ok_and(|accepted| accepted.is_ok()), "the new daemon has the caller");
        let at_old = tokio::time::timeout(std::time::Duration::from_millis(100), old.accept()).await;
        assert!(at_old.is_err(), "the old daemon gets no new caller");
        old_file.remove_if_ours();
        assert!(path.exists(), "the old daemon's exit leaves the new socket");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .expect("lists")
            .filter_map(Result::ok)
            .map(|entry| entry.file_name())
            .collect();
        assert_eq!(leftovers, [std::ffi::OsString::from("agents.sock")], "no temporary socket left");
        assert_eq!(path_of(&new), Some(path.clone()), "named by the path callers use, not the temporary one");
        assert_eq!(path_of(&old), Some(path));
    }

    #[tokio::test]
    async fn taking_over_where_no_socket_is_just_binds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agents.sock");
        let (listener, _file) = take_over(&path).await.expect("bound");
        let (client, accepted) = tokio::join!(UnixStream::connect(&path), listener.accept());
        assert!(client.is_ok() && accepted.is_ok(), "serves at the path");
        assert_eq!(path_of(&listener), Some(path));
    }
}
