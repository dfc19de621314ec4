//! Per-(pod, image) pull backoff with the kubelet's `flowcontrol.Backoff` arithmetic, bounded in
//! size. Pure: every call takes `now`.
//!
//! Memory is the constraint: a node can see 100,000 (pod, image) pairs fail. So a pair is kept as
//! a 128-bit keyed hash instead of the kubelet's `"{uid}_{image}"` string, and the last error is
//! whatever the caller shares among the pods of one failed pull (an `Arc`), not a copy per pod.
//! Beside the keys, the names of the newest pairs to fail ([`BackoffName`]), for listing.

mod names;

use std::{
    collections::{BTreeMap, HashMap},
    hash::{BuildHasher, RandomState},
    time::Duration,
};

use tokio::time::Instant;

use self::names::Names;
pub use self::names::{BackoffName, NAME_BYTES_MOST, NAMED_MOST};

/// How the backoff grows and how much memory it may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    /// The first delay after a failure (kubelet: 10s).
    pub initial: Duration,
    /// The longest delay (kubelet: 300s). Entries not updated for twice this are forgotten.
    pub max: Duration,
    /// The most entries kept; past it the stalest is evicted.
    pub capacity: usize,
}

/// A backoff configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackoffConfigError {
    #[error("image pull backoff initial ({initial:?}) must not exceed its max ({max:?})")]
    InitialAboveMax { initial: Duration, max: Duration },
    #[error("image pull backoff capacity must be at least 1")]
    ZeroCapacity,
}

impl BackoffConfig {
    /// The kubelet's image backoff: 10s doubling to 300s; at most 100,000 entries.
    pub const KUBELET: Self =
        Self { initial: Duration::from_secs(10), max: Duration::from_secs(300), capacity: 100_000 };

    /// Validates the configuration.
    pub fn try_new(initial: Duration, max: Duration, capacity: usize) -> Result<Self, BackoffConfigError> {
        if initial > max {
            return Err(BackoffConfigError::InitialAboveMax { initial, max });
        }
        if capacity == 0 {
            return Err(BackoffConfigError::ZeroCapacity);
        }
        Ok(Self { initial, max, capacity })
    }

    /// Entries not updated for this long are stable again and may be collected.
    fn expiry(&self) -> Duration {
        self.max.saturating_mul(2)
    }
}

/// A refusal: the key is backing off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackingOff<E> {
    /// Time left until a pull may be tried again.
    pub remaining: Duration,
    /// The error of the pull that failed last.
    pub last_error: E,
}

/// A named pair backing off, as [`BackoffStore::backing_off`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed<E> {
    pub name: BackoffName,
    /// Time left until a pull may be tried again.
    pub remaining: Duration,
    /// The delay the last failure set.
    pub delay: Duration,
    pub last_error: E,
}

/// A (pod, image) pair, as the kubelet's `"{uid}_{image}"` key but in 16 bytes. The hash is
/// keyed at random per store, so callers cannot craft two pairs that collide; by chance, two of
/// 100,000 pairs collide with odds below 1 in 10^28.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BackoffKey(u128);

struct Entry<E> {
    delay: Duration,
    last_update: Instant,
    /// Position in `by_age`; a later update has a larger number.
    stamp: u64,
    last_error: E,
}

/// The backoff store, keyed by (pod uid, image); `E` is the error a refusal repeats.
pub struct BackoffStore<E> {
    config: BackoffConfig,
    /// Two independently keyed hashers make the 128 bits of a [`BackoffKey`].
    hashers: [RandomState; 2],
    entries: HashMap<BackoffKey, Entry<E>>,
    /// Keys by the stamp of their last update, stalest first.
    by_age: BTreeMap<u64, BackoffKey>,
    next_stamp: u64,
    names: Names,
}

impl<E: Clone> BackoffStore<E> {
    pub fn new(config: BackoffConfig) -> Self {
        Self {
            config,
            hashers: [RandomState::new(), RandomState::new()],
            entries: HashMap::new(),
            by_age: BTreeMap::new(),
            next_stamp: 0,
            names: Names::default(),
        }
    }

    /// The key of a pod, an image and the runtime handler it is pulled for. The kubelet's is
    /// the pod and the image: a pod runs under one runtime class, so for its pods the handler
    /// changes nothing, and a caller pulling one image for two handlers backs off each apart.
    pub fn key(&self, pod_uid: &str, image: &str, runtime_handler: &str) -> BackoffKey {
        // `str` hashing ends each string with a marker, so ("a_b", "c") and ("a", "b_c") differ.
        let [high, low] = self.hashers.each_ref().map(|hasher| hasher.hash_one((pod_uid, image, runtime_handler)));
        BackoffKey(u128::from(high) << 64 | u128::from(low))
    }

    /// The kubelet's `IsInBackOffSinceUpdate`: `Some` while the last failure's delay has not run
    /// out, unless the entry has expired (not updated for twice the max).
    pub fn check(&self, key: BackoffKey, now: Instant) -> Option<BackingOff<E>> {
        let entry = self.entries.get(&key)?;
        let since = now.saturating_duration_since(entry.last_update);
        if since > self.config.expiry() || since >= entry.delay {
            return None;
        }
        Some(BackingOff { remaining: entry.delay - since, last_error: entry.last_error.clone() })
    }

    /// The kubelet's `Next`: after a failure, start at `initial`, or double up to `max`; an
    /// expired entry starts over. Returns the new delay.
    pub fn record_failure(&mut self, key: BackoffKey, last_error: E, now: Instant) -> Duration {
        let (initial, max, expiry) = (self.config.initial, self.config.max, self.config.expiry());
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        match self.entries.get_mut(&key) {
            Some(entry) => {
                self.by_age.remove(&entry.stamp);
                let expired = now.saturating_duration_since(entry.last_update) > expiry;
                entry.delay = if expired { initial } else { entry.delay.saturating_mul(2).min(max) };
                entry.last_update = now;
                entry.stamp = stamp;
                entry.last_error = last_error;
                self.by_age.insert(stamp, key);
                entry.delay
            }
            None => {
                self.gc(now);
                while self.entries.len() >= self.config.capacity {
                    self.evict_stalest();
                }
                self.by_age.insert(stamp, key);
                self.entries.insert(key, Entry { delay: initial, last_update: now, stamp, last_error });
                initial
            }
        }
    }

    /// Names the pair `key` was made of, once a failure of it is recorded: among the newest
    /// [`NAMED_MOST`], it is listed while it backs off.
    pub fn name(&mut self, key: BackoffKey, name: BackoffName) {
        if self.entries.contains_key(&key) {
            self.names.insert(key, name);
        }
    }

    /// The name of `key`'s pair, when it is among those kept.
    pub fn name_of(&self, key: BackoffKey) -> Option<&BackoffName> {
        self.names.get(key)
    }

    /// The named pairs backing off at `now`, soonest retry first.
    pub fn backing_off(&self, now: Instant) -> Vec<Listed<E>> {
        let mut listed: Vec<Listed<E>> = self
            .names
            .iter()
            .filter_map(|(key, name)| {
                let backing_off = self.check(key, now)?;
                let delay = self.entries.get(&key)?.delay;
                let BackingOff { remaining, last_error } = backing_off;
                Some(Listed { name: name.clone(), remaining, delay, last_error })
            })
            .collect();
        listed
            .sort_by(|a, b| (a.remaining, &a.name.uid, &a.name.image).cmp(&(b.remaining, &b.name.uid, &b.name.image)));
        listed
    }

    /// Forgets `key`'s pair, as if it had never failed: its next pull is tried at once. Whether
    /// the store held it.
    pub fn remove(&mut self, key: BackoffKey) -> bool {
        self.names.remove(key);
        let Some(entry) = self.entries.remove(&key) else { return false };
        self.by_age.remove(&entry.stamp);
        true
    }

    /// Forgets every pair; how many there were.
    pub fn clear(&mut self) -> usize {
        let cleared = self.entries.len();
        self.entries.clear();
        self.by_age.clear();
        self.names.clear();
        cleared
    }

    /// Forgets entries not updated for twice the max, as the kubelet's `GC`.
    pub fn gc(&mut self, now: Instant) {
        let expiry = self.config.expiry();
        while let Some((_, key)) = self.by_age.first_key_value() {
            let stale = self.entries.get(key).is_some_and(|e| now.saturating_duration_since(e.last_update) > expiry);
            if !stale {
                break;
            }
            self.evict_stalest();
        }
    }

    /// Grows delays by `config` from now on; a delay already running keeps its length. Past a
    /// smaller capacity the stalest entries go.
    pub fn set_config(&mut self, config: BackoffConfig) {
        self.config = config;
        while self.entries.len() > config.capacity {
            self.evict_stalest();
        }
    }

    /// How many keys are remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn evict_stalest(&mut self) {
        if let Some((_, key)) = self.by_age.pop_first() {
            self.entries.remove(&key);
            self.names.remove(key);
        }
    }
}

#[cfg(test)]
mod tests;
