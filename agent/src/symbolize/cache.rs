//! The names of addresses already symbolized, in two generations: an address looked up is
//! kept (moved to the young one); when the young generation is full or old enough, at the
//! start of an interval, the old one is dropped and the young one takes its place. Addresses
//! in use stay named; those unseen for a generation go. A host that keeps running new code
//! (process churn samples ever more kernel and libc instructions) then holds what it ran in
//! the last two generations, not all it ever ran.
use std::{collections::HashMap, hash::Hash};

use super::Frames;

pub struct FrameCache<K> {
    young: HashMap<K, Frames>,
    old: HashMap<K, Frames>,
    /// Entries, and intervals, that the young generation takes before it ages.
    generation: (usize, u32),
    young_intervals: u32,
}

impl<K: Hash + Eq> FrameCache<K> {
    /// `generation`: entries, and intervals, that the young generation takes before it ages.
    pub fn new(generation: (usize, u32)) -> Self {
        FrameCache { young: HashMap::new(), old: HashMap::new(), generation, young_intervals: 0 }
    }

    /// Called between intervals: ages the generations if the young one is full or old enough.
    pub fn age(&mut self) {
        self.young_intervals += 1;
        if self.young.len() >= self.generation.0 || self.young_intervals >= self.generation.1 {
            self.old = std::mem::take(&mut self.young);
            self.young_intervals = 0;
        }
    }

    /// Whether `key` is named, keeping it if so.
    pub fn touch(&mut self, key: K) -> bool {
        if self.young.contains_key(&key) {
            return true;
        }
        match self.old.remove(&key) {
            Some(frames) => {
                self.young.insert(key, frames);
                true
            }
            None => false,
        }
    }

    pub fn get(&self, key: &K) -> Option<&Frames> {
        self.young.get(key).or_else(|| self.old.get(key))
    }

    pub fn insert(&mut self, key: K, frames: Frames) {
        self.young.insert(key, frames);
    }

    pub fn remove(&mut self, key: &K) {
        self.young.remove(key);
        self.old.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbolize::Frame;

    fn frames(name: &str) -> Frames {
        std::sync::Arc::from([Frame { function: name.into(), file: String::new(), line: 0 }])
    }

    #[test]
    fn addresses_in_use_stay_and_unused_ones_go_after_two_generations() {
        let mut cache = FrameCache::new((2, 100));
        cache.insert(1, frames("used"));
        cache.insert(2, frames("unused"));
        cache.age(); // full: 1 and 2 are old now
        assert!(cache.touch(1), "an old entry is still there");
        cache.insert(3, frames("new"));
        cache.age(); // 1 and 3 are old; 2 is gone
        assert!(cache.get(&2).is_none(), "an entry unseen for a generation is dropped");
        assert_eq!(cache.get(&1).unwrap()[0].function, "used");
        assert!(cache.touch(3));
        cache.age(); // young holds only 3: not full, nothing ages
        assert!(cache.get(&1).is_some(), "the old generation stays until the young one is full");
        cache.remove(&1);
        assert!(cache.get(&1).is_none() && !cache.touch(1));
    }

    #[test]
    fn a_generation_ages_after_its_intervals_however_few_its_entries() {
        let mut cache = FrameCache::new((100, 2));
        cache.insert(1, frames("unused"));
        cache.age();
        assert!(cache.get(&1).is_some());
        cache.age(); // two intervals: 1 is old now
        cache.age();
        cache.age(); // and gone two intervals later, unseen
        assert!(cache.get(&1).is_none());
    }
}
