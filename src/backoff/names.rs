//! The names of the newest pairs to fail, beside the store's hashed keys: what ListBackoffs
//! shows and ClearBackoff is given back. Bounded in count and in each name's size, so that the
//! store's memory stays what its keys take.

use std::collections::{BTreeMap, HashMap};

use super::BackoffKey;

/// How many pairs the store names: the newest to fail.
pub const NAMED_MOST: usize = 1024;

/// A name whose parts add up to more than this is not kept: its pair backs off unnamed.
/// Kubernetes' own limits (a uid of 36, a namespace of 63, a name of 253) leave the image well
/// over a kilobyte.
pub const NAME_BYTES_MOST: usize = 2048;

/// A (pod, image, runtime handler) pair as the caller wrote it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackoffName {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// As the pod wrote it: the spelling the pair's key is made of.
    pub image: String,
    pub runtime_handler: String,
}

impl BackoffName {
    fn bytes(&self) -> usize {
        [&self.namespace, &self.name, &self.uid, &self.image, &self.runtime_handler].iter().map(|part| part.len()).sum()
    }
}

/// The newest names, by key.
#[derive(Debug, Default)]
pub(super) struct Names {
    by_key: HashMap<BackoffKey, (u64, BackoffName)>,
    /// Keys by when they were last named, oldest first.
    by_age: BTreeMap<u64, BackoffKey>,
    next_stamp: u64,
}

impl Names {
    /// Names `key` the newest; the oldest name goes past [`NAMED_MOST`].
    pub(super) fn insert(&mut self, key: BackoffKey, name: BackoffName) {
        self.remove(key);
        if name.bytes() > NAME_BYTES_MOST {
            return;
        }
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.by_age.insert(stamp, key);
        self.by_key.insert(key, (stamp, name));
        while self.by_key.len() > NAMED_MOST {
            let Some((_, oldest)) = self.by_age.pop_first() else { break };
            self.by_key.remove(&oldest);
        }
    }

    pub(super) fn remove(&mut self, key: BackoffKey) -> Option<BackoffName> {
        let (stamp, name) = self.by_key.remove(&key)?;
        self.by_age.remove(&stamp);
        Some(name)
    }

    pub(super) fn get(&self, key: BackoffKey) -> Option<&BackoffName> {
        self.by_key.get(&key).map(|(_, name)| name)
    }

    pub(super) fn clear(&mut self) {
        self.by_key.clear();
        self.by_age.clear();
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (BackoffKey, &BackoffName)> {
        self.by_key.iter().map(|(key, (_, name))| (*key, name))
    }
}
