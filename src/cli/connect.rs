//! The connection to the daemon's socket, and what to do when there is none: each way a connect
//! fails names the path tried and the next step.

use std::{
    io,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::CliError;

/// Connects to `socket` now (not at the first call), so that a missing or refused socket is told
/// before anything is printed.
pub async fn connect(socket: &Path, timeout: Duration) -> Result<Channel, CliError> {
    // A stream of our own first: its io::Error says which way the connect failed, where tonic's
    // wraps it.
    match tokio::time::timeout(timeout, UnixStream::connect(socket)).await {
        Err(_) => return Err(CliError::NoAnswer { socket: socket.to_owned(), timeout }),
        Ok(Err(error)) => return Err(refused(socket, error)),
        Ok(Ok(_)) => {}
    }
    channel(socket, timeout)
        .await
        .map_err(|error| CliError::Lost { socket: socket.to_owned(), error: error.to_string() })
}

/// A channel over `socket`. Its `:authority` is `localhost`: a socket path there is no URI
/// authority, and the daemon's h2 would have to rewrite it.
pub async fn channel(socket: &Path, timeout: Duration) -> Result<Channel, tonic::transport::Error> {
    let socket = socket.to_owned();
    Endpoint::from_static("http://localhost")
        .connect_timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }))
        .await
}

/// Why a connect to `socket` failed, with what to do.
pub fn refused(socket: &Path, error: io::Error) -> CliError {
    let socket = socket.to_owned();
    match error.kind() {
        io::ErrorKind::NotFound => CliError::NoSocket { socket },
        io::ErrorKind::ConnectionRefused => CliError::NotListening { socket },
        io::ErrorKind::PermissionDenied => CliError::Permission { hint: permission_hint(&socket), socket },
        _ => CliError::Connect { socket, error },
    }
}

/// Who may open `socket`: its owner and group, or the directory in the way, and how to join.
fn permission_hint(socket: &Path) -> String {
    let (path, metadata) = match std::fs::metadata(socket) {
        Ok(metadata) => (socket.to_owned(), metadata),
        // The socket cannot even be looked at: a directory on its way is closed to us.
        Err(_) => match closed_directory(socket) {
            Some(found) => found,
            None => return String::new(),
        },
    };
    let group = group_name(metadata.gid()).unwrap_or_else(|| metadata.gid().to_string());
    let owner = user_name(metadata.uid()).unwrap_or_else(|| metadata.uid().to_string());
    let mode = metadata.permissions().mode() & 0o7777;
    if path != socket {
        // Joining the directory's group is not the fix: the socket's group decides who calls.
        return format!(
            ": its directory {} is {owner}:{group} {mode:04o} and closed to you; it must let others pass (chmod o+x, as the socket unit's DirectoryMode=0755 does), or run as root",
            path.display()
        );
    }
    let mut hint = format!(
        ": the socket {} is {owner}:{group} {mode:04o}; run as root or as a member of group {group}",
        socket.display()
    );
    let in_session =
        rustix::process::getgroups().is_ok_and(|groups| groups.iter().any(|gid| gid.as_raw() == metadata.gid()));
    if listed_member(&group) && !in_session {
        hint.push_str(&format!(" (you were added to {group} since you logged in: log in again, or `newgrp {group}`)"));
    } else {
        hint.push_str(&format!(" (`sudo usermod -aG {group} $USER`, then log in again)"));
    }
    hint
}

/// The nearest directory above `socket` that we cannot search, with its metadata.
fn closed_directory(socket: &Path) -> Option<(PathBuf, std::fs::Metadata)> {
    socket.ancestors().skip(1).find_map(|directory| {
        let metadata = std::fs::metadata(directory).ok()?;
        std::fs::read_dir(directory).is_err().then(|| (directory.to_owned(), metadata))
    })
}

/// A name from `/etc/group` (or `/etc/passwd`) by its id: the third field is the id.
fn name_of(file: &str, id: u32) -> Option<String> {
    let text = read_small(file)?;
    text.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        (fields.nth(1)?.parse::<u32>().ok()? == id).then(|| name.to_owned())
    })
}

fn group_name(gid: u32) -> Option<String> {
    name_of("/etc/group", gid)
}

fn user_name(uid: u32) -> Option<String> {
    name_of("/etc/passwd", uid)
}

/// Whether `/etc/group` lists the user running us in `group`.
fn listed_member(group: &str) -> bool {
    let me = rustix::process::getuid().as_raw();
    let (Some(user), Some(text)) = (user_name(me), read_small("/etc/group")) else { return false };
    text.lines().any(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        fields.first() == Some(&group) && fields.get(3).is_some_and(|members| members.split(',').any(|m| m == user))
    })
}

/// A system file of a few KiB (`/etc/group`, `/etc/passwd`), through the hostile-file reader;
/// none past 1 MiB.
fn read_small(path: &str) -> Option<String> {
    let bytes = crate::files::read::read_named(std::path::Path::new(path), 1 << 20).ok()?;
    String::from_utf8(bytes).ok()
}
