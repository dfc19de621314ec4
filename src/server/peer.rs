//! Who connected, as the kernel names the caller: SO_PEERCRED (uid, gid, pid, which tokio reads)
//! and the supplementary groups (SO_PEERGROUPS, Linux 4.13 and later), read once per connection
//! and given to each of its requests, so that a role granted to a group holds for its members;
//! and the process, for its share of connections, in whichever PID namespace it runs.

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::Arc,
};

use tonic::transport::server::UdsConnectInfo;

use crate::access::Caller;

/// A connection's caller, in each of its requests' extensions.
#[derive(Debug, Clone)]
pub struct ConnectedPeer {
    /// What tonic's own server gives: the address and SO_PEERCRED.
    pub uds: UdsConnectInfo,
    /// The supplementary groups; empty when the kernel did not say.
    pub groups: Arc<[u32]>,
}

impl ConnectedPeer {
    /// The caller, when the kernel named it.
    pub fn caller(&self) -> Option<Caller> {
        let credentials = self.uds.peer_cred?;
        Some(Caller {
            uid: credentials.uid(),
            gid: credentials.gid(),
            pid: credentials.pid(),
            groups: self.groups.to_vec(),
        })
    }
}

/// The most groups asked for at first; the kernel says how many more there are (NGROUPS_MAX is
/// 65536).
const FIRST_ASK: usize = 64;
const NGROUPS_MAX: usize = 65_536;

/// The supplementary groups of the process at the other end of `socket`, as it connected.
pub fn peer_groups(socket: &impl AsRawFd) -> io::Result<Vec<u32>> {
    match ask_groups(socket, FIRST_ASK) {
        Err(error) if error.raw_os_error() == Some(libc::ERANGE) => ask_groups(socket, NGROUPS_MAX),
        answer => answer,
    }
}

/// SO_PEERGROUPS into room for `room` groups.
fn ask_groups(socket: &impl AsRawFd, room: usize) -> io::Result<Vec<u32>> {
    let mut groups = vec![0 as libc::gid_t; room];
    let mut len = libc::socklen_t::try_from(room * size_of::<libc::gid_t>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `groups` is a live buffer of exactly `len` bytes, which the kernel writes at most
    // (it sets `len` to what it wrote, or fails with ERANGE writing nothing); the descriptor is
    // borrowed from an open socket for the call's length.
    let answer = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERGROUPS,
            groups.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if answer != 0 {
        return Err(io::Error::last_os_error());
    }
    groups.truncate(usize::try_from(len).unwrap_or(0) / size_of::<libc::gid_t>());
    Ok(groups)
}

/// The process a connection's share is counted against.
///
/// A daemon in its own PID namespace (a DaemonSet's pod) is told pid 0 for every caller outside
/// it, so the pid alone would make the whole node one client. The kernel's pidfd names a process
/// in any namespace: on Linux 6.9 and later (pidfs) its inode number is the process's own,
/// never reused while the machine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientKey {
    /// The process's pidfs inode (SO_PEERPIDFD).
    Process(u64),
    /// Its pid in the daemon's PID namespace, where the kernel gives no pidfs inode.
    Pid(i32),
    /// A caller in another PID namespace on an older kernel: all of one user's processes share.
    User(u32),
}

impl ClientKey {
    /// The best name the kernel gave: the pidfs inode, else a pid of our namespace, else the uid.
    pub fn choose(process: Option<u64>, pid: Option<i32>, uid: u32) -> Self {
        match (process, pid) {
            (Some(inode), _) => Self::Process(inode),
            (None, Some(pid)) if pid > 0 => Self::Pid(pid),
            _ => Self::User(uid),
        }
    }
}

/// The process at the other end of `socket`, as it connected: its pidfs inode, when the kernel
/// gives a pidfd (Linux 6.5) that lives on pidfs (6.9; before that every pidfd shares one inode).
pub fn peer_process(socket: &impl AsRawFd) -> io::Result<u64> {
    let mut fd: libc::c_int = -1;
    let mut len = libc::socklen_t::try_from(size_of::<libc::c_int>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `fd` is a live c_int of `len` bytes, which the kernel writes at most; the socket is
    // borrowed from an open one for the call's length.
    let answer = unsafe {
        libc::getsockopt(socket.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERPIDFD, (&raw mut fd).cast(), &mut len)
    };
    if answer != 0 {
        return Err(io::Error::last_os_error());
    }
    if fd < 0 {
        return Err(io::Error::from(io::ErrorKind::Unsupported));
    }
    // SAFETY: the kernel just opened `fd` for us and nothing else owns it; dropping closes it.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd) };
    let filesystem = rustix::fs::fstatfs(&pidfd)?;
    // `f_type`'s width differs between architectures.
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    if i64::from(filesystem.f_type) != PIDFS_MAGIC {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "pidfds are not on pidfs (Linux before 6.9)"));
    }
    Ok(rustix::fs::fstat(&pidfd)?.st_ino)
}

/// statfs(2)'s f_type of pidfs ("PIDF").
const PIDFS_MAGIC: i64 = 0x5049_4446;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_its_pidfs_inode_else_a_pid_of_our_namespace_else_its_user() {
        assert_eq!(ClientKey::choose(Some(7), Some(0), 1000), ClientKey::Process(7));
        assert_eq!(ClientKey::choose(Some(7), Some(42), 1000), ClientKey::Process(7));
        assert_eq!(ClientKey::choose(None, Some(42), 1000), ClientKey::Pid(42));
        // pid 0: the caller is in another PID namespace.
        assert_eq!(ClientKey::choose(None, Some(0), 1000), ClientKey::User(1000));
        assert_eq!(ClientKey::choose(None, None, 1000), ClientKey::User(1000));
    }

    #[test]
    fn two_processes_at_the_other_end_are_two_clients_and_one_process_is_one() {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("the kernel's release");
        let mut numbers = release.split(|c: char| !c.is_ascii_digit()).map(|n| n.parse::<u32>().unwrap_or(0));
        let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
        let answer = peer_process(&std::os::unix::net::UnixStream::pair().expect("a socket pair").0);
        if (major, minor) < (6, 9) {
            eprintln!("SKIPPED: Linux {major}.{minor} has no pidfs; clients are keyed by pid ({answer:?})");
            return;
        }
        let ours = answer.expect("Linux 6.9 and later give a pidfd on pidfs");
        let again = peer_process(&std::os::unix::net::UnixStream::pair().expect("a socket pair").0).expect("pidfd");
        assert_eq!(ours, again, "the same process, asked twice");
        let listener_dir = tempfile::tempdir().expect("tempdir");
        let path = listener_dir.path().join("s");
        let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import socket,sys,time; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); time.sleep(30)",
            ])
            .arg(&path)
            .spawn()
            .expect("python3 connects");
        let (theirs, _) = listener.accept().expect("accept");
        let child_process = peer_process(&theirs).expect("pidfd of the child");
        let _ = child.kill();
        let _ = child.wait();
        assert_ne!(child_process, ours, "another process is another client");
    }

    #[test]
    fn the_groups_of_the_process_at_the_other_end_are_read_from_the_socket() {
        let (ours, _theirs) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
        let mut expected: Vec<u32> =
            rustix::process::getgroups().expect("our groups").into_iter().map(|gid| gid.as_raw()).collect();
        let mut groups = peer_groups(&ours).expect("SO_PEERGROUPS");
        groups.sort_unstable();
        expected.sort_unstable();
        assert_eq!(groups, expected, "the peer is this process");
    }
}
