//! Reading a file as hostile input: whoever can write the directory could leave a FIFO that
//! blocks a read forever, a link to `/dev/zero` that never ends, or a file of gigabytes. So a file
//! is opened without following a link and without blocking, must be a regular file, and is read
//! to a cap; a state file must also be the daemon's user's alone ([`read_private`]). One that
//! fails these checks can be set aside ([`quarantine`]), so that the next read finds none.

use std::{
    fs::{File, OpenOptions},
    io::{self, Read},
    os::unix::fs::{FileTypeExt, OpenOptionsExt},
    path::{Path, PathBuf},
    time::SystemTime,
};

use super::private::{self, Exposed, Ownership};

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The file is not one to read: a link, a FIFO, a device, a directory, or too large.
    #[error("{0}")]
    Refused(Refused),
}

/// What made a file one not to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("a symbolic link, not a regular file")]
    Link,
    #[error("a {0}, not a regular file")]
    NotRegular(&'static str),
    #[error("larger than {limit} bytes")]
    TooLarge { limit: u64 },
    /// A state file someone other than the daemon's user may have written.
    #[error("{0}")]
    Exposed(Exposed),
}

/// Whether a link at the path read is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Files cri-imaged writes itself: a link there is never its own.
    Refuse,
    /// A path the operator names (a config file mounted from a ConfigMap is a link).
    Follow,
}

/// The contents of the regular file at `path`, at most `limit` bytes; `None` when there is none.
pub fn read_bounded(path: &Path, limit: u64, links: Links) -> Result<Option<Vec<u8>>, ReadError> {
    read_checked(path, limit, links, None)
}

/// As [`read_bounded`] with links refused, for a state file the daemon wrote: one owned by
/// another user than its own (or root), or writable by others, is refused too (see
/// [`super::private`]). Judged on the file opened, so a rename in between changes nothing.
pub fn read_private(path: &Path, limit: u64) -> Result<Option<Vec<u8>>, ReadError> {
    read_checked(path, limit, Links::Refuse, Some(private::user()))
}

/// Reads as [`read_bounded`] does; with `private_to`, a file not that user's alone is refused.
fn read_checked(path: &Path, limit: u64, links: Links, private_to: Option<u32>) -> Result<Option<Vec<u8>>, ReadError> {
    let no_follow = if links == Links::Refuse { libc::O_NOFOLLOW } else { 0 };
    let opened = OpenOptions::new()
        .read(true)
        // O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer.
        .custom_flags(no_follow | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) if links == Links::Refuse && error.raw_os_error() == Some(libc::ELOOP) => {
            return Err(ReadError::Refused(Refused::Link));
        }
        Err(error) => return Err(error.into()),
    };
    let metadata = file.metadata()?;
    let file_type = metadata.file_type();
    if !file_type.is_file() {
        return Err(ReadError::Refused(Refused::NotRegular(kind(&file_type))));
    }
    if let Some(exposed) = private_to.and_then(|user| Ownership::of(&metadata).exposed_to_others(user)) {
        return Err(ReadError::Refused(Refused::Exposed(exposed)));
    }
    if metadata.len() > limit {
        return Err(ReadError::Refused(Refused::TooLarge { limit }));
    }
    read_to_cap(file, metadata.len(), limit).map(Some)
}

/// A file that is not there, said plainly: io's bare `NotFound` says "entity not found". Every
/// file a person names (a config, a policy, credentials) that is missing is this, after its path.
pub fn missing() -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, "the file does not exist")
}

/// A file the operator names (a docker config, a plugin config): links followed, a regular file of
/// at most `limit` bytes; a missing one is `NotFound`, a refused one `InvalidData` saying why.
pub fn read_named(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    match read_bounded(path, limit, Links::Follow) {
        Ok(Some(contents)) => Ok(contents),
        Ok(None) => Err(missing()),
        Err(ReadError::Io(error)) => Err(error),
        Err(ReadError::Refused(refused)) => Err(io::Error::new(io::ErrorKind::InvalidData, refused.to_string())),
    }
}

/// Reads at most `limit` bytes; a file grown past it since its size was read is refused too.
fn read_to_cap(file: File, size: u64, limit: u64) -> Result<Vec<u8>, ReadError> {
    let mut contents = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(limit.saturating_add(1)).read_to_end(&mut contents)?;
    if contents.len() as u64 > limit {
        return Err(ReadError::Refused(Refused::TooLarge { limit }));
    }
    Ok(contents)
}

fn kind(file_type: &std::fs::FileType) -> &'static str {
    if file_type.is_dir() {
        "directory"
    } else if file_type.is_fifo() {
        "FIFO"
    } else if file_type.is_char_device() {
        "character device"
    } else if file_type.is_block_device() {
        "block device"
    } else if file_type.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// The suffix of a file set aside by [`quarantine`]; readers of a directory pass such files over.
pub const QUARANTINE_SUFFIX: &str = ".quarantined";

/// Sets the file at `path` aside, renamed to `PATH.SECONDS.quarantined` beside it (a link is
/// renamed, not followed), and returns the new path. One set aside in the same second before is
/// kept: the name gets `-1`, `-2`… after the seconds.
pub fn quarantine(path: &Path) -> io::Result<PathBuf> {
    let seconds = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|since| since.as_secs()).unwrap_or(0);
    let named = |suffix: String| {
        let mut aside = path.as_os_str().to_owned();
        aside.push(format!(".{seconds}{suffix}{QUARANTINE_SUFFIX}"));
        PathBuf::from(aside)
    };
    let mut aside = named(String::new());
    for again in 1..=1000 {
        if std::fs::symlink_metadata(&aside).is_err() {
            break;
        }
        aside = named(format!("-{again}"));
    }
    std::fs::rename(path, &aside)?;
    Ok(aside)
}

#[cfg(test)]
mod tests {
    use std::{os::unix::fs::symlink, time::Duration};

    use super::*;

    fn refused(path: &Path, limit: u64) -> Refused {
        match read_bounded(path, limit, Links::Refuse) {
            Err(ReadError::Refused(refused)) => refused,
            other => panic!("{} was not refused: {other:?}", path.display()),
        }
    }

    #[test]
    fn a_regular_file_within_the_cap_is_read_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("record");
        std::fs::write(&file, b"12345").expect("written");
        assert_eq!(read_bounded(&file, 5, Links::Refuse).expect("read").as_deref(), Some(&b"12345"[..]));
        assert_eq!(refused(&file, 4), Refused::TooLarge { limit: 4 });
        assert!(read_bounded(&dir.path().join("none"), 5, Links::Refuse).expect("no file").is_none());
        let link = dir.path().join("link");
        symlink(&file, &link).expect("link");
        assert_eq!(read_bounded(&link, 5, Links::Follow).expect("followed").as_deref(), Some(&b"12345"[..]));
        symlink("/dev/zero", dir.path().join("zero")).expect("link");
        let followed = read_bounded(&dir.path().join("zero"), 5, Links::Follow);
        assert!(matches!(followed, Err(ReadError::Refused(Refused::NotRegular("character device")))), "{followed:?}");
    }

    #[test]
    fn fifos_devices_directories_and_links_are_refused_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
        assert!(made.success());
        let to_zero = dir.path().join("zero");
        symlink("/dev/zero", &to_zero).expect("link");
        let to_fifo = dir.path().join("to-fifo");
        symlink(&fifo, &to_fifo).expect("link");
        // Each would block or never end if read as a file; a second thread keeps the test bounded.
        let (done, finished) = std::sync::mpsc::channel();
        let paths = (fifo.clone(), to_zero.clone(), to_fifo.clone(), dir.path().to_owned());
        std::thread::spawn(move || {
            let (fifo, to_zero, to_fifo, directory) = paths;
            let refusals = [
                refused(&fifo, 1 << 20),
                refused(&to_zero, 1 << 20),
                refused(&to_fifo, 1 << 20),
                refused(&directory, 1),
            ];
            done.send(refusals).expect("sent");
        });
        let refusals = finished.recv_timeout(Duration::from_secs(5)).expect("refused at once, never blocked");
        assert_eq!(
            refusals,
            [Refused::NotRegular("FIFO"), Refused::Link, Refused::Link, Refused::NotRegular("directory")]
        );
        assert_eq!(refused(Path::new("/dev/null"), 1), Refused::NotRegular("character device"));
    }

    #[test]
    fn a_file_the_operator_names_may_be_a_link_but_must_end_at_a_small_regular_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("config.json");
        std::fs::write(&file, b"{}").expect("written");
        let link = dir.path().join("link.json");
        symlink(&file, &link).expect("link");
        assert_eq!(read_named(&link, 2).expect("followed"), b"{}");
        assert_eq!(read_named(&file, 1).expect_err("too large").to_string(), "larger than 1 bytes");
        let fifo = dir.path().join("fifo.json");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo").success());
        assert_eq!(read_named(&fifo, 1 << 20).expect_err("a FIFO").to_string(), "a FIFO, not a regular file");
        assert_eq!(read_named(&dir.path().join("none"), 1).expect_err("none").kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_quarantined_file_is_renamed_aside_and_a_link_is_not_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("target");
        std::fs::write(&target, b"kept").expect("written");
        let link = dir.path().join("record");
        symlink(&target, &link).expect("link");
        let aside = quarantine(&link).expect("set aside");
        assert!(aside.to_string_lossy().ends_with(QUARANTINE_SUFFIX), "{}", aside.display());
        assert!(!link.exists() && aside.symlink_metadata().expect("moved").file_type().is_symlink());
        assert_eq!(std::fs::read(&target).expect("untouched"), b"kept");
        // Set aside again within the same second: both kept, the second under a name of its own.
        std::fs::create_dir(&link).expect("created");
        let again = quarantine(&link).expect("set aside again");
        assert_ne!(again, aside);
        assert!(again.is_dir() && aside.symlink_metadata().expect("still there").file_type().is_symlink());
    }
}
