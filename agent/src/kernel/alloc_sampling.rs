//! The `alloc` group's sampling, as Go's heap profiles sample: the gaps the programs draw
//! between samples, the scaling of sampled figures to estimates, and what the drain keeps of
//! sampled allocations between intervals.
use std::{collections::HashMap, time::Duration};

use agent_common::SampleValue;

use super::Stack;

/// The stack set that live allocations' keys name: their stacks were drained with the
/// interval that sampled them, and are kept here while the allocations live.
pub(super) const KEPT_STACKS: u8 = 2;

/// A user stack by what names it in a key: its id and check.
pub(super) type WalkId = (i32, u64);

/// The `alloc` group's state between drains.
#[derive(Default)]
pub(super) struct LiveSet {
    /// Mean bytes between samples.
    pub(super) mean_bytes: u64,
    /// Per process whose allocator samples itself, its mean.
    pub(super) own_means: HashMap<u32, u64>,
    pub(super) leak_age: Duration,
    /// Stacks of sampled allocations, kept while a live allocation (or this interval's
    /// sample) names them.
    pub(super) stacks: HashMap<WalkId, Stack>,
}

impl LiveSet {
    pub(super) fn new(mean_bytes: u64, leak_age: Duration) -> LiveSet {
        LiveSet { mean_bytes, own_means: HashMap::new(), leak_age, stacks: HashMap::new() }
    }
}

/// What sampled allocations of one key stand for: each of average size `s` had the chance
/// `1 - e^(-s/mean)` of being sampled (pprof's and Go's scaling of heap samples).
pub(super) fn unsampled(value: SampleValue, mean: f64) -> SampleValue {
    if value.count == 0 || value.total == 0 {
        return value;
    }
    let average = value.total as f64 / value.count as f64;
    let factor = 1.0 / (1.0 - (-average / mean).exp());
    SampleValue { count: (value.count as f64 * factor).round() as u64, total: (value.total as f64 * factor).round() as u64 }
}

/// The gaps table the programs draw from: quantiles of the exponential distribution with mean
/// `mean_bytes`, at the middle of each of `ALLOC_GAPS` equal slices of probability.
pub(super) fn gap_table(mean_bytes: u64) -> Vec<u64> {
    let n = agent_common::ALLOC_GAPS;
    (0..n).map(|i| (mean_bytes as f64 * -((i as f64 + 0.5) / n as f64).ln()).round().max(1.0) as u64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gaps_average_the_mean() {
        let table = gap_table(512 << 10);
        let mean = table.iter().sum::<u64>() as f64 / table.len() as f64;
        assert!((mean / (512 << 10) as f64 - 1.0).abs() < 0.01, "mean gap {mean}");
    }

    #[test]
    fn small_allocations_stand_for_a_mean_of_bytes_each_and_big_ones_for_themselves() {
        let mean = (512 << 10) as f64;
        let small = unsampled(SampleValue { count: 10, total: 640 }, mean);
        assert!((small.total as f64 / (10.0 * mean) - 1.0).abs() < 0.001, "{small:?}");
        let big = unsampled(SampleValue { count: 2, total: 200 << 20 }, mean);
        assert_eq!(big, SampleValue { count: 2, total: 200 << 20 });
    }
}
