//! The one table of what each method needs. Health and reflection are anyone's who can connect
//! (probes and grpcurl need them, and they tell nothing about pods); a path no service serves is
//! answered UNIMPLEMENTED whoever asks, but for the CRI image service, where a method we do not
//! know is relayed to the runtime and may change what is on the node: admin. The calls Kubernetes
//! 1.38 adds (KEP-6061's security profiles), relayed too, need what their like need.

use super::Role;

/// What a method needs of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// This role, whatever the request says.
    Role(Role),
    /// GarbageCollect: read for a dry run, admin for a pass that removes ([`gc_needs`]).
    GcPass,
    /// CancelPrePull: pull for one's own pre-pull, admin for another's ([`cancel_needs`]).
    Cancel,
}

impl Need {
    /// The least a caller needs before the request is read: all of it, for a fixed role; read
    /// for the others, so that a refusal names the role this request needs (a read caller
    /// cancelling another's pre-pull is told it needs admin, not pull).
    pub fn at_the_door(self) -> Role {
        match self {
            Self::Role(role) => role,
            Self::GcPass | Self::Cancel => Role::Read,
        }
    }

    /// The least role any request of the method needs: what a refusal at the door names.
    pub fn least(self) -> Role {
        match self {
            Self::Role(role) => role,
            Self::GcPass => Role::Read,
            Self::Cancel => Role::Pull,
        }
    }
}

/// A method as the table knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Method {
    /// As messages write it: `ClearBackoff`, `CRI RemoveImage`.
    pub name: &'static str,
    /// As the metric's `method` label writes it: `ClearBackoff`, `cri_RemoveImage`.
    pub label: &'static str,
    pub need: Need,
    /// How an allowed call is logged with its caller (a refused one always is, at info).
    pub audit: Audit,
}

/// How an allowed call is logged with its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audit {
    /// It reads: not logged.
    Read,
    /// It may pull, and a pull is logged with its caller where it starts: at debug here, so that
    /// an image answered present (every container start) adds no line at info.
    Pull,
    /// It changes what is on the node or what the daemon does: at info.
    Change,
}

const fn method(name: &'static str, label: &'static str, need: Need, audit: Audit) -> Method {
    Method { name, label, need, audit }
}

const READ: Need = Need::Role(Role::Read);
const PULL: Need = Need::Role(Role::Pull);
const ADMIN: Need = Need::Role(Role::Admin);

/// Our API's methods, by name under `/imagemanager.v1.ImageManager/`.
const IMAGE_MANAGER: [Method; 13] = [
    method("GetStatus", "GetStatus", READ, Audit::Read),
    method("WatchEvents", "WatchEvents", READ, Audit::Read),
    method("ListImages", "ListImages", READ, Audit::Read),
    method("ListEvents", "ListEvents", READ, Audit::Read),
    method("ListBackoffs", "ListBackoffs", READ, Audit::Read),
    method("ListPrePulls", "ListPrePulls", READ, Audit::Read),
    method("GetPrePull", "GetPrePull", READ, Audit::Read),
    method("EnsureImageExists", "EnsureImageExists", PULL, Audit::Pull),
    // Pull, not read: it reads registries with the node's credentials (its docker config, its
    // credential plugins), as a pull does; a read caller would learn what private repositories
    // hold, and spend the node's registry requests. Nothing changes: logged as a pull is.
    method("CheckImagePolicy", "CheckImagePolicy", PULL, Audit::Pull),
    method("SubmitPrePull", "SubmitPrePull", PULL, Audit::Change),
    method("CancelPrePull", "CancelPrePull", Need::Cancel, Audit::Change),
    method("ClearBackoff", "ClearBackoff", ADMIN, Audit::Change),
    method("GarbageCollect", "GarbageCollect", Need::GcPass, Audit::Change),
];

/// The CRI image service's methods, by name under `/runtime.v1.ImageService/`.
const CRI: [Method; 9] = [
    method("CRI ImageStatus", "cri_ImageStatus", READ, Audit::Read),
    method("CRI ListImages", "cri_ListImages", READ, Audit::Read),
    method("CRI StreamImages", "cri_StreamImages", READ, Audit::Read),
    method("CRI ListSecurityProfiles", "cri_ListSecurityProfiles", READ, Audit::Read),
    method("CRI ImageFsInfo", "cri_ImageFsInfo", READ, Audit::Read),
    method("CRI PullImage", "cri_PullImage", PULL, Audit::Pull),
    // It pulls, as PullImage does, but is not one of our pulls: logged as a change.
    method("CRI PullSecurityProfile", "cri_PullSecurityProfile", PULL, Audit::Change),
    method("CRI RemoveImage", "cri_RemoveImage", ADMIN, Audit::Change),
    method("CRI RemoveSecurityProfile", "cri_RemoveSecurityProfile", ADMIN, Audit::Change),
];

/// A CRI image method the table does not know.
const CRI_OTHER: Method = method("a CRI image method cri-imaged does not know", "cri_other", ADMIN, Audit::Change);

/// The method at a request's `path`; `None` for what anyone may call (health, reflection, a
/// path no service serves).
pub fn method_at(path: &str) -> Option<Method> {
    if let Some(name) = path.strip_prefix("/imagemanager.v1.ImageManager/") {
        return IMAGE_MANAGER.into_iter().find(|method| method.name == name);
    }
    let name = path.strip_prefix("/runtime.v1.ImageService/")?;
    let known = CRI.into_iter().find(|method| method.name.strip_prefix("CRI ") == Some(name));
    Some(known.unwrap_or(CRI_OTHER))
}

/// What a GarbageCollect needs: read to see what a pass would remove, admin to remove.
pub fn gc_needs(dry_run: bool) -> Role {
    if dry_run { Role::Read } else { Role::Admin }
}

/// What a CancelPrePull needs: pull for a pre-pull `caller_uid` submitted (and for an id no
/// pre-pull has: NOT_FOUND is told to those who may cancel), admin for any other; one submitted
/// before pre-pulls kept their owner has none: admin. `owner` is `None` for an unknown id.
pub fn cancel_needs(owner: Option<Option<u32>>, caller_uid: Option<u32>) -> Role {
    match (owner, caller_uid) {
        (None, _) => Role::Pull,
        (Some(Some(owner)), Some(caller)) if owner == caller => Role::Pull,
        _ => Role::Admin,
    }
}

/// Every method the table knows, with its path: for tests and the README's table.
pub fn known() -> impl Iterator<Item = (String, Method)> {
    let ours =
        IMAGE_MANAGER.into_iter().map(|method| (format!("/imagemanager.v1.ImageManager/{}", method.name), method));
    let cri = CRI.into_iter().map(|method| {
        (format!("/runtime.v1.ImageService/{}", method.name.strip_prefix("CRI ").unwrap_or(method.name)), method)
    });
    ours.chain(cri)
}
