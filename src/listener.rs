//! The unix socket we serve on: created safely, never stolen from a live daemon.

use std::{
    io,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
};

use tokio::net::{UnixListener, UnixStream};

/// Mode of the listening socket: the owner and its group (the kubelet's) may connect.
pub const SOCKET_MODE: u32 = 0o660;

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot create socket directory {path}: {source}")]
    CreateDir { path: PathBuf, source: io::Error },
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
}

/// Binds `path`, creating its directory if missing and replacing a stale socket left by a
/// daemon that died; a socket that still answers is refused.
pub async fn bind(path: &Path) -> Result<UnixListener, ListenError> {
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| ListenError::CreateDir { path: dir.to_owned(), source })?;
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
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn creates_the_directory_and_sets_mode_0660() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nested/run/cri-imaged.sock");
        let _listener = bind(&path).await.expect("bind");
        let mode = std::fs::metadata(&path).expect("socket exists").permissions().mode() & 0o777;
        assert_eq!(mode, SOCKET_MODE);
    }

    #[tokio::test]
    async fn replaces_a_stale_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).expect("first bind"));
        assert!(path.exists(), "the dead listener leaves its socket file behind");
        let listener = bind(&path).await.expect("stale socket is replaced");
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
}
