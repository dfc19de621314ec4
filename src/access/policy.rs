//! Which role a caller holds: root and the kubelet's uid are admin; then the highest role any
//! grant matching the caller gives (by uid, or by gid: its primary group or a supplementary one);
//! a caller no grant matches has the default role.

use std::fmt;

use super::Role;

/// The calling process, as the kernel named it when it connected.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Caller {
    pub uid: u32,
    /// Its primary group.
    pub gid: u32,
    pub pid: Option<i32>,
    /// Its supplementary groups (SO_PEERGROUPS); empty where the kernel does not say.
    pub groups: Vec<u32>,
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "uid {} (gid {}", self.uid, self.gid)?;
        let others: Vec<String> = self.groups.iter().filter(|gid| **gid != self.gid).map(ToString::to_string).collect();
        match others.as_slice() {
            [] => write!(f, ", no other groups)"),
            others => write!(f, ", groups {})", others.join(" ")),
        }
    }
}

/// Who a grant is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    Uid(u32),
    /// A caller whose primary or supplementary group this is.
    Gid(u32),
}

impl Subject {
    fn matches(self, caller: &Caller) -> bool {
        match self {
            Self::Uid(uid) => caller.uid == uid,
            Self::Gid(gid) => caller.gid == gid || caller.groups.contains(&gid),
        }
    }
}

/// A role given to a subject (`--role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub role: Role,
    pub subject: Subject,
}

/// Who holds which role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Besides root, the uid that is always admin (`--reserved-connection-uid`, the kubelet's).
    kubelet_uid: Option<u32>,
    grants: Vec<Grant>,
    /// A caller no grant matches (`--default-role`); `None`: no role.
    default: Option<Role>,
}

impl Default for Policy {
    /// The flags' defaults: root admin, everyone else who can connect pull.
    fn default() -> Self {
        Self::new(None, Vec::new(), Some(Role::Pull))
    }
}

/// A call refused: the method needs a role the caller does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{method} needs the {needed} role; {who} has {has} (--role and --default-role say who has which)",
    who = caller.as_ref().map_or_else(|| "a caller the kernel did not name".to_owned(), ToString::to_string),
    has = held.map_or("no role", Role::as_str)
)]
pub struct Denied {
    pub method: &'static str,
    pub needed: Role,
    pub caller: Option<Caller>,
    pub held: Option<Role>,
}

impl Policy {
    pub fn new(kubelet_uid: Option<u32>, grants: Vec<Grant>, default: Option<Role>) -> Self {
        Self { kubelet_uid, grants, default }
    }

    /// The role `caller` holds; a caller the kernel did not name holds none.
    pub fn role_of(&self, caller: Option<&Caller>) -> Option<Role> {
        let caller = caller?;
        if caller.uid == 0 || Some(caller.uid) == self.kubelet_uid {
            return Some(Role::Admin);
        }
        let granted = self.grants.iter().filter(|grant| grant.subject.matches(caller)).map(|grant| grant.role).max();
        granted.or(self.default)
    }
}

/// Whether `held` is enough for `needed`, as [`Denied`] when it is not.
pub fn allow(method: &'static str, needed: Role, caller: Option<&Caller>, held: Option<Role>) -> Result<(), Denied> {
    if held.is_some_and(|held| held >= needed) {
        return Ok(());
    }
    Err(Denied { method, needed, caller: caller.cloned(), held })
}

#[cfg(test)]
mod tests;
