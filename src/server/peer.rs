//! Who connected, as the kernel names the caller: SO_PEERCRED (uid, gid, pid, which tokio reads)
//! and the supplementary groups (SO_PEERGROUPS, Linux 4.13 and later), read once per connection
//! and given to each of its requests, so that a role granted to a group holds for its members.

use std::{io, os::fd::AsRawFd, sync::Arc};

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

#[cfg(test)]
mod tests {
    use super::*;

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
