//! Space in one of the kernel's arrays (table rows, process mappings): contiguous ranges,
//! first fit. Freed ranges are held back for one interval (`release`), so that no program
//! still walking with an old table reads another's rows in its place.
pub struct Space {
    /// Free ranges (first, len), sorted, never adjacent.
    free: Vec<(u32, u32)>,
    /// Freed since the last `release`.
    held: Vec<(u32, u32)>,
    capacity: u32,
}

impl Space {
    pub fn new(capacity: u32) -> Space {
        Space { free: vec![(0, capacity)], held: Vec::new(), capacity }
    }

    /// The first index of `len` free entries, now taken; None if no range is that large.
    pub fn take(&mut self, len: u32) -> Option<u32> {
        let index = self.free.iter().position(|&(_, free)| free >= len)?;
        let (first, free) = self.free[index];
        if free == len {
            self.free.remove(index);
        } else {
            self.free[index] = (first + len, free - len);
        }
        Some(first)
    }

    /// Gives entries back, usable after the next `release`.
    pub fn give_back(&mut self, first: u32, len: u32) {
        self.held.push((first, len));
    }

    /// Gives back entries no walk can still be reading (unused since before the last
    /// drain): usable at once.
    pub fn give_back_now(&mut self, first: u32, len: u32) {
        let index = self.free.partition_point(|&(start, _)| start < first);
        self.free.insert(index, (first, len));
        // Merge with the neighbours it touches.
        if index + 1 < self.free.len() && first + len == self.free[index + 1].0 {
            self.free[index].1 += self.free.remove(index + 1).1;
        }
        if index > 0 && self.free[index - 1].0 + self.free[index - 1].1 == first {
            self.free[index - 1].1 += self.free.remove(index).1;
        }
    }

    /// Makes the entries given back before the last interval's drain free again. Call once per
    /// interval, after the drain (whose barrier outlasts every walk that began before it).
    pub fn release(&mut self) {
        for (first, len) in std::mem::take(&mut self.held) {
            self.give_back_now(first, len);
        }
    }

    pub fn used(&self) -> u32 {
        self.capacity - self.free()
    }

    /// Entries free now (in any number of ranges).
    pub fn free(&self) -> u32 {
        self.free.iter().map(|&(_, len)| len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::Space;

    #[test]
    fn ranges_are_reused_only_after_release_and_merge() {
        let mut space = Space::new(100);
        let (a, b, c) = (space.take(30).unwrap(), space.take(30).unwrap(), space.take(30).unwrap());
        assert_eq!((a, b, c), (0, 30, 60));
        assert_eq!(space.take(20), None);
        space.give_back(a, 30);
        space.give_back(b, 30);
        assert_eq!(space.take(20), None, "held back until release");
        space.release();
        assert_eq!(space.used(), 30);
        assert_eq!(space.take(60), Some(0), "the two freed ranges merged");
        space.give_back(c, 30);
        space.release();
        assert_eq!(space.free, vec![(60, 40)]);
    }
}
