//! The `alloc` group at each drain: the live table's sampled allocations become the
//! interval's memory in use (`kind::LIVE_ALLOCATION` keys, suspected leaks marked), and every
//! sampled figure is scaled to an estimate of all allocations.
use std::collections::{HashMap, HashSet};

use agent_common::{kind, stack_status, LiveAllocation, LiveKey, SampleKey, SampleValue};
use anyhow::{Context as _, Result};
use aya::maps::IterableMap as _;

use super::{
    alloc_sampling::{unsampled, WalkId, KEPT_STACKS},
    batch,
    drain::RawInterval,
    load::Sampler,
};
use crate::ops::metrics;

impl Sampler {
    /// Adds the live allocations to a drained interval and scales the sampled figures.
    pub(super) fn add_live_allocations(&mut self, interval: &mut RawInterval) -> Result<()> {
        let (Some(live), Some(set)) = (self.live.as_ref(), self.live_set.as_mut()) else { return Ok(()) };
        let sampled: Vec<&SampleKey> = interval.counts.iter().map(|(key, _)| key).filter(|key| key.kind == kind::ALLOCATION).collect();
        for key in &sampled {
            if let Some(stack) = u32::try_from(key.user_stack_id).ok().and_then(|id| interval.stacks.get(&(true, key.stack_set, id))) {
                set.stacks.insert((key.user_stack_id, key.user_stack_check), stack.clone());
            }
        }
        let mut entries = Vec::new();
        batch::read(live.map(), 1, false, |key: LiveKey, value: &[LiveAllocation]| entries.push((key, value[0]))).context("reading live allocations")?;
        // A process that exited gave its memory back: its entries go, counted.
        let tgids: HashSet<u32> = entries.iter().map(|(key, _)| key.tgid).collect();
        let exited: HashSet<u32> = tgids.into_iter().filter(|tgid| !std::path::Path::new(&format!("/proc/{tgid}")).exists()).collect();
        if !exited.is_empty() {
            let gone: Vec<LiveKey> = entries.iter().filter(|(key, _)| exited.contains(&key.tgid)).map(|(key, _)| *key).collect();
            batch::delete(live.map(), &gone).context("forgetting exited processes' allocations")?;
            metrics::add("ember_alloc_released_at_exit_total", &[], gone.len() as f64);
            entries.retain(|(key, _)| !exited.contains(&key.tgid));
        }
        let now = monotonic_ns();
        let leak_ns = set.leak_age.as_nanos() as u64;
        let mut slots: HashMap<WalkId, u32> = HashMap::new();
        let mut in_use: HashMap<SampleKey, SampleValue> = HashMap::new();
        for (_, allocation) in &entries {
            let mut key = allocation.key;
            key.kind = kind::LIVE_ALLOCATION;
            key.aux = u32::from(now.saturating_sub(allocation.at_ns) > leak_ns);
            key.stack_set = KEPT_STACKS;
            let walk = (key.user_stack_id, key.user_stack_check);
            if key.user_stack_id >= 0 {
                key.user_stack_id = match set.stacks.get(&walk) {
                    Some(stack) => {
                        let next = slots.len() as u32;
                        let slot = *slots.entry(walk).or_insert(next);
                        interval.stacks.entry((true, KEPT_STACKS, slot)).or_insert_with(|| stack.clone());
                        slot as i32
                    }
                    None => stack_status::ERROR,
                };
            }
            let value = in_use.entry(key).or_default();
            value.count += 1;
            value.total += allocation.size;
        }
        let named: HashSet<WalkId> = entries.iter().map(|(_, a)| (a.key.user_stack_id, a.key.user_stack_check)).collect();
        let sampled: HashSet<WalkId> = sampled.iter().map(|key| (key.user_stack_id, key.user_stack_check)).collect();
        set.stacks.retain(|walk, _| named.contains(walk) || sampled.contains(walk));
        metrics::set("ember_alloc_live_tracked", &[], entries.len() as f64);
        interval.counts.extend(in_use);
        for (key, value) in interval.counts.iter_mut() {
            if key.kind == kind::ALLOCATION || key.kind == kind::LIVE_ALLOCATION {
                let mean = set.own_means.get(&key.tgid).copied().unwrap_or(set.mean_bytes);
                *value = unsampled(*value, mean as f64);
            }
        }
        // Once its last samples are scaled, an ended process's mean goes.
        set.own_means.retain(|tgid, _| std::path::Path::new(&format!("/proc/{tgid}")).exists());
        Ok(())
    }

    /// Process `tgid`'s allocator samples itself, one allocation per `mean` bytes on average:
    /// its samples are scaled by that mean, not the group's.
    pub fn set_alloc_mean(&mut self, tgid: u32, mean: u64) {
        if let Some(set) = self.live_set.as_mut() {
            set.own_means.insert(tgid, mean);
        }
    }

    /// Forgets every live allocation (read and deleted in one pass).
    pub(super) fn forget_live_allocations(&mut self) -> Result<()> {
        let Some(live) = self.live.as_ref() else { return Ok(()) };
        batch::read(live.map(), 1, true, |_: LiveKey, _: &[LiveAllocation]| {}).context("forgetting live allocations")
    }
}

/// CLOCK_MONOTONIC in ns: the clock of `bpf_ktime_get_ns`.
fn monotonic_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}
