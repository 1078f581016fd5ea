//! A profile's functions, mappings or locations looked up by id. pprof ids are any non-zero
//! numbers; Ember's agents number each table 1..=n in order, which is looked up by
//! subtraction, and any other numbering goes through a map. A profile's validation and its
//! storing look up every frame of every sample: a hash per lookup was a sixth of ingest.
use crate::FastMap;

pub struct ById<'a, T> {
    items: &'a [T],
    /// Id -> position, where the ids are not 1..=n in order.
    sparse: Option<FastMap<u64, usize>>,
}

impl<'a, T> ById<'a, T> {
    pub fn new(items: &'a [T], id: impl Fn(&T) -> u64) -> ById<'a, T> {
        let dense = items.iter().enumerate().all(|(at, item)| id(item) == at as u64 + 1);
        let sparse = (!dense).then(|| items.iter().enumerate().map(|(at, item)| (id(item), at)).collect());
        ById { items, sparse }
    }

    pub fn get(&self, id: u64) -> Option<&'a T> {
        self.position(id).map(|at| &self.items[at])
    }

    /// Where the item of `id` is among the items.
    pub fn position(&self, id: u64) -> Option<usize> {
        let at = match &self.sparse {
            None => usize::try_from(id.checked_sub(1)?).ok()?,
            Some(positions) => *positions.get(&id)?,
        };
        (at < self.items.len()).then_some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_in_order_and_any_other_numbering_find_the_same_items() {
        let dense = [(1, "a"), (2, "b"), (3, "c")];
        let sparse = [(7, "a"), (0, "z"), (2, "b"), (1 << 40, "c")];
        let (dense, sparse) = (ById::new(&dense, |i| i.0), ById::new(&sparse, |i| i.0));
        assert_eq!([1, 2, 3, 0, 4].map(|id| dense.get(id).map(|i| i.1)), [Some("a"), Some("b"), Some("c"), None, None]);
        assert_eq!([7, 2, 1 << 40, 3].map(|id| sparse.get(id).map(|i| i.1)), [Some("a"), Some("b"), Some("c"), None]);
        assert_eq!((dense.position(3), sparse.position(1 << 40)), (Some(2), Some(3)));
    }
}
