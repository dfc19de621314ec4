//! Who may do what on the socket. Roles are ordered, read < pull < admin; [`table`] says what
//! each method needs, [`policy`] which role a caller holds, from the credentials the kernel gave
//! when it connected (SO_PEERCRED, SO_PEERGROUPS). Pure: the server asks, counts and logs.

pub mod policy;
pub mod table;

use std::fmt;

pub use self::{
    policy::{Caller, Denied, Grant, Policy, Subject, allow},
    table::{Method, Need},
};

/// What a caller may do; each role may do what the ones below it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Status, lists, events, watches: nothing changes.
    Read,
    /// Pulls (EnsureImageExists, CRI PullImage) and one's own pre-pulls.
    Pull,
    /// Everything: removals, deleting GC passes, others' backoffs and pre-pulls.
    Admin,
}

impl Role {
    /// Every role, lowest first.
    pub const ALL: [Role; 3] = [Role::Read, Role::Pull, Role::Admin];

    /// Its name, as flags and messages write it (a metric's label too).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Pull => "pull",
            Self::Admin => "admin",
        }
    }

    /// The role named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|role| role.as_str() == name)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A held role's label, `none` for a caller holding none.
pub fn label(role: Option<Role>) -> &'static str {
    role.map_or("none", Role::as_str)
}
