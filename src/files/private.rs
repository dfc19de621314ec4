//! State is the daemon's user's alone, as sshd's StrictModes has it: whoever else can write a
//! state file, or a directory of them, can forge what it says (a pull record, a verification),
//! and no checksum written beside it tells (the writer writes a matching one). So at start a
//! directory writable by its group or others has those bits taken away (logged): what is in it is
//! then judged file by file. A directory owned by another user is refused: its owner can make it
//! writable again, and only the operator can give it back. A state file writable or owned by
//! another is never tightened (what it says may already be forged): reads refuse it
//! ([`super::read::read_private`]) and it is set aside. (The root dir's lock file, which holds
//! only a pid, is judged as a directory is.) Root may own any of them: root can write them
//! whatever their owner.

use std::{
    fs::{self, File, Permissions},
    io,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// The group's and others' write bits.
const WRITABLE_BY_OTHERS: u32 = 0o022;

/// Why state was not trusted as it is.
#[derive(Debug, thiserror::Error)]
pub enum PrivateError {
    #[error(
        "{} is owned by uid {owner}, neither cri-imaged's user (uid {user}) nor root: its owner could forge the state in it; check what it holds, then `chown {user} {}` or remove it",
        path.display(),
        path.display()
    )]
    Foreign { path: PathBuf, owner: u32, user: u32 },
    #[error("cannot read the owner and mode of {}: {source}", path.display())]
    Inspect { path: PathBuf, source: io::Error },
    #[error("{} is writable by others (mode {mode:04o}) and could not be made private: {source}", path.display())]
    Tighten { path: PathBuf, mode: u32, source: io::Error },
}

/// What makes state untrustworthy, as its owner and mode say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Exposed {
    /// Owned by neither the daemon's user nor root.
    #[error("owned by uid {owner}, neither cri-imaged's user (uid {user}) nor root")]
    Owner { owner: u32, user: u32 },
    /// Writable by its group or by others.
    #[error("writable by others (mode {mode:04o})")]
    Writable { mode: u32 },
}

/// The owner and permission bits of a file or directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    pub owner: u32,
    /// The permission bits (`st_mode & 0o7777`).
    pub mode: u32,
}

impl Ownership {
    pub fn of(metadata: &fs::Metadata) -> Self {
        Self { owner: metadata.uid(), mode: metadata.mode() & 0o7777 }
    }

    /// Why state owned and moded so is not `user`'s alone, if it is not. An owner other than
    /// `user` or root comes first: tightening the mode would not help, its owner can undo it.
    pub fn exposed_to_others(self, user: u32) -> Option<Exposed> {
        if self.owner != user && self.owner != 0 {
            Some(Exposed::Owner { owner: self.owner, user })
        } else if self.mode & WRITABLE_BY_OTHERS != 0 {
            Some(Exposed::Writable { mode: self.mode })
        } else {
            None
        }
    }

    /// The mode with no one but the owner able to write.
    pub fn tightened(self) -> u32 {
        self.mode & !WRITABLE_BY_OTHERS
    }
}

/// The daemon's user: the effective uid, which owns what it creates.
pub fn user() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// A directory whose group's and others' write bits were taken away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tightened {
    pub path: PathBuf,
    pub from: u32,
    pub to: u32,
}

/// Makes the directory at `path` (a link is followed: an operator may link `--root-dir`
/// elsewhere) writable by no one but its owner, or refuses it, as [`secure_open`] does.
pub fn secure_dir(path: &Path) -> Result<Option<Tightened>, PrivateError> {
    let dir = File::open(path).map_err(|source| PrivateError::Inspect { path: path.to_owned(), source })?;
    secure_open(&dir, path)
}

/// Makes `file` (open, at `path`; a directory too) writable by no one but its owner, saying so in
/// the log, or refuses it if another user owns it. Judged and changed through the open file, so a
/// rename in between changes nothing. Returns what it changed.
pub fn secure_open(file: &File, path: &Path) -> Result<Option<Tightened>, PrivateError> {
    let metadata = file.metadata().map_err(|source| PrivateError::Inspect { path: path.to_owned(), source })?;
    let ownership = Ownership::of(&metadata);
    match ownership.exposed_to_others(user()) {
        None => Ok(None),
        Some(Exposed::Owner { owner, user }) => Err(PrivateError::Foreign { path: path.to_owned(), owner, user }),
        Some(Exposed::Writable { mode }) => {
            let to = ownership.tightened();
            file.set_permissions(Permissions::from_mode(to)).map_err(|source| PrivateError::Tighten {
                path: path.to_owned(),
                mode,
                source,
            })?;
            tracing::warn!(
                path = %path.display(),
                from = format_args!("{mode:04o}"),
                to = format_args!("{to:04o}"),
                "state was writable by others; made writable by its owner only (each state file is still checked before it is read)"
            );
            Ok(Some(Tightened { path: path.to_owned(), from: mode, to }))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::chown;

    use super::*;

    const USER: u32 = 1000;

    fn exposed(owner: u32, mode: u32) -> Option<Exposed> {
        Ownership { owner, mode }.exposed_to_others(USER)
    }

    #[test]
    fn state_owned_by_the_daemons_user_or_root_and_writable_by_its_owner_only_is_private() {
        for mode in [0o700, 0o600, 0o755, 0o644, 0o400, 0o000] {
            assert_eq!(exposed(USER, mode), None, "{mode:o}");
            assert_eq!(exposed(0, mode), None, "root's, {mode:o}");
        }
    }

    #[test]
    fn a_group_or_world_write_bit_exposes_state_and_tightening_takes_only_those_away() {
        for (mode, tightened) in [(0o777, 0o755), (0o770, 0o750), (0o702, 0o700), (0o620, 0o600), (0o1777, 0o1755)] {
            assert_eq!(exposed(USER, mode), Some(Exposed::Writable { mode }), "{mode:o}");
            assert_eq!(Ownership { owner: USER, mode }.tightened(), tightened, "{mode:o}");
        }
    }

    #[test]
    fn another_users_state_is_exposed_whatever_its_mode() {
        for mode in [0o700, 0o600, 0o777] {
            assert_eq!(exposed(65534, mode), Some(Exposed::Owner { owner: 65534, user: USER }), "{mode:o}");
        }
        assert_eq!(Ownership { owner: 65534, mode: 0o600 }.exposed_to_others(65534), None, "its own user's");
    }

    #[test]
    fn a_directory_writable_by_others_is_tightened_and_one_another_user_owns_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        let open = root.path().join("open");
        fs::create_dir(&open).expect("created");
        fs::set_permissions(&open, Permissions::from_mode(0o777)).expect("chmod");
        let tightened = secure_dir(&open).expect("tightened").expect("changed");
        assert_eq!((tightened.from, tightened.to), (0o777, 0o755));
        assert_eq!(fs::metadata(&open).expect("metadata").mode() & 0o7777, 0o755);
        assert_eq!(secure_dir(&open).expect("private now"), None, "once is enough");
        assert!(secure_dir(&root.path().join("none")).is_err(), "a missing one is not taken for private");
        if user() != 0 {
            return; // Only root can give a directory to another user.
        }
        let foreign = root.path().join("foreign");
        fs::create_dir(&foreign).expect("created");
        chown(&foreign, Some(65534), None).expect("chown");
        let refused = secure_dir(&foreign).expect_err("refused");
        assert!(matches!(refused, PrivateError::Foreign { owner: 65534, user: 0, .. }), "{refused:?}");
        assert!(refused.to_string().contains("chown 0"), "says how to fix it: {refused}");
    }
}
