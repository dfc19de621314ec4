//! Why a pass leaves an image: what holds it whatever the disk (a container, the sandbox image, a
//! pin, a hand-out or a pre-pull), else its youth or the pass not needing it.

use std::collections::{HashMap, HashSet};

use super::{ImageRecord, record_key};
use crate::{
    reference,
    runtime::{StoredImage, UsedImage},
};

/// Why a pass left an image; of two that hold, the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kept {
    /// A container (in any state) uses it.
    InUse,
    /// The runtime's sandbox image (configured, or as the runtime names it).
    SandboxImage,
    /// Pinned by the runtime or by `--pinned-image`.
    Pinned,
    /// Handed out or pulled within the hand-out window, or pinned for a pre-pull.
    Held,
    /// Detected less than the minimum age ago (or used at the pass's very moment).
    Young,
    /// The pass freed enough without it, or the disk is below the high threshold and the image
    /// is younger than the maximum age.
    NotNeeded,
}

impl Kept {
    const ALL: [Self; 6] = [Self::InUse, Self::SandboxImage, Self::Pinned, Self::Held, Self::Young, Self::NotNeeded];

    /// The RPC's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InUse => "in use",
            Self::SandboxImage => "sandbox image",
            Self::Pinned => "pinned",
            Self::Held => "held",
            Self::Young => "young",
            Self::NotNeeded => "not needed",
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// What holds an image in use: a set of [`Kept`] reasons.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Holds(u8);

impl Holds {
    pub fn of(why: Kept) -> Self {
        Self(why.bit())
    }

    pub fn with(self, why: Kept) -> Self {
        Self(self.0 | why.bit())
    }

    pub fn has(self, why: Kept) -> bool {
        self.0 & why.bit() != 0
    }

    /// The first reason that holds it.
    pub fn first(self) -> Option<Kept> {
        Kept::ALL.into_iter().find(|why| self.has(*why))
    }
}

/// The records in use, by key, with what holds each.
pub type InUse = HashMap<String, Holds>;

/// Why the plan leaves `record` (kept under `key`): what holds it, its runtime's pin included;
/// else `otherwise`.
pub(super) fn why_kept(key: &str, record: &ImageRecord, in_use: &InUse, otherwise: Kept) -> Kept {
    let mut holds = in_use.get(key).copied().unwrap_or_default();
    if record.pinned {
        holds = holds.with(Kept::Pinned);
    }
    holds.first().unwrap_or(otherwise)
}

/// The records of the listed images in use, with what holds each. Each of `used` names an image
/// (by id, or one of its repo tags or digests as written or normalised: `busybox` is
/// `docker.io/library/busybox:latest`) under the runtime handler its container runs with;
/// containers name their image by ref or as they were asked for. An image not listed for that
/// handler counts as used under every handler it is listed for: when unsure, keep. Each of
/// `kept` (the images we pin, those just handed out, each with why) holds its image under every
/// handler.
pub fn in_use<'a>(
    listed: &[StoredImage],
    used: impl IntoIterator<Item = &'a UsedImage>,
    kept: impl IntoIterator<Item = (&'a str, Kept)>,
) -> InUse {
    // Many containers share an image: each name is looked up (and parsed) once.
    let used: HashSet<(&str, &str)> =
        used.into_iter().map(|used| (used.image.as_str(), used.runtime_handler.as_str())).collect();
    let mut by_name: HashMap<&str, &str> = HashMap::with_capacity(listed.len() * 3);
    let mut handlers: HashMap<&str, Vec<&str>> = HashMap::with_capacity(listed.len());
    for image in listed {
        by_name.insert(&image.id, &image.id);
        for name in &image.names {
            by_name.insert(name, &image.id);
        }
        handlers.entry(&image.id).or_default().push(&image.runtime_handler);
    }
    let id_of = |name: &str| match by_name.get(name) {
        Some(id) => Some(*id),
        None => reference::normalized(name).and_then(|name| by_name.get(name.as_str()).copied()),
    };
    let mut keys = InUse::new();
    fn hold(keys: &mut InUse, key: String, why: Kept) {
        let holds = keys.entry(key).or_default();
        *holds = holds.with(why);
    }
    for (name, handler) in used {
        let Some(id) = id_of(name) else { continue };
        match handlers.get(id).is_some_and(|listed| listed.contains(&handler)) {
            true => hold(&mut keys, record_key(id, handler), Kept::InUse),
            false => {
                for handler in handlers.get(id).into_iter().flatten() {
                    hold(&mut keys, record_key(id, handler), Kept::InUse);
                }
            }
        }
    }
    for (name, why) in kept.into_iter().collect::<HashSet<_>>() {
        let Some(id) = id_of(name) else { continue };
        for handler in handlers.get(id).into_iter().flatten() {
            hold(&mut keys, record_key(id, handler), why);
        }
    }
    keys
}
