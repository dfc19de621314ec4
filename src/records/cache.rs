//! A bounded cache that keeps what is used (CLOCK, the second-chance approximation of LRU): a hit
//! only sets a flag, so lookups allocate nothing; an insertion past the bound evicts the first
//! entry the clock hand finds unused since it last passed.

use std::collections::HashMap;

struct Slot<V> {
    key: String,
    value: V,
    used: bool,
}

/// At most `capacity` values by key.
pub struct ClockCache<V> {
    slots: Vec<Option<Slot<V>>>,
    index: HashMap<String, usize>,
    free: Vec<usize>,
    hand: usize,
    capacity: usize,
}

impl<V: Clone> ClockCache<V> {
    pub fn new(capacity: usize) -> Self {
        Self { slots: Vec::new(), index: HashMap::new(), free: Vec::new(), hand: 0, capacity: capacity.max(1) }
    }

    pub fn get(&mut self, key: &str) -> Option<V> {
        let slot = self.slots[*self.index.get(key)?].as_mut()?;
        slot.used = true;
        Some(slot.value.clone())
    }

    /// Inserts or replaces; returns whether another entry was evicted to make room.
    pub fn insert(&mut self, key: &str, value: V) -> bool {
        if let Some(&at) = self.index.get(key)
            && let Some(slot) = self.slots[at].as_mut()
        {
            slot.value = value;
            slot.used = true;
            return false;
        }
        let slot = Slot { key: key.to_owned(), value, used: true };
        if let Some(at) = self.free.pop() {
            self.index.insert(key.to_owned(), at);
            self.slots[at] = Some(slot);
            return false;
        }
        if self.slots.len() < self.capacity {
            self.index.insert(key.to_owned(), self.slots.len());
            self.slots.push(Some(slot));
            return false;
        }
        let at = self.victim();
        if let Some(evicted) = self.slots[at].take() {
            self.index.remove(&evicted.key);
        }
        self.index.insert(key.to_owned(), at);
        self.slots[at] = Some(slot);
        true
    }

    pub fn remove(&mut self, key: &str) {
        if let Some(at) = self.index.remove(key) {
            self.slots[at] = None;
            self.free.push(at);
        }
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The next slot unused since the hand last passed, clearing flags on the way.
    fn victim(&mut self) -> usize {
        loop {
            let at = self.hand;
            self.hand = (self.hand + 1) % self.slots.len();
            match self.slots[at].as_mut() {
                Some(slot) if slot.used => slot.used = false,
                _ => return at,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_used_stays_and_the_rest_goes_first() {
        let mut cache = ClockCache::new(3);
        for key in ["a", "b", "c"] {
            assert!(!cache.insert(key, key.to_uppercase()));
        }
        // A full pass clears every flag and evicts "a"; then "b" is used, so "c" goes next.
        assert!(cache.insert("d", "D".into()));
        assert_eq!(cache.get("a"), None);
        assert_eq!(cache.get("b").as_deref(), Some("B"));
        assert!(cache.insert("e", "E".into()));
        assert_eq!(cache.get("c"), None);
        assert_eq!(cache.get("b").as_deref(), Some("B"));
        assert_eq!(cache.len(), 3);
        cache.remove("b");
        assert!(!cache.insert("f", "F".into()), "a removed entry's slot is reused");
        assert_eq!(cache.len(), 3);
        assert!(!cache.insert("f", "F2".into()), "replacing evicts nothing");
        assert_eq!(cache.get("f").as_deref(), Some("F2"));
    }
}
