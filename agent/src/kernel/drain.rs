//! The drain: at the end of each interval, switches the programs to the other buffer set and
//! reads and clears the one they wrote to, keeping the stacks that later events still
//! reference. Called by the resolve stage once per interval.
use std::{
    collections::{HashMap, HashSet},
    time::SystemTime,
};

use agent_common::{counter, SampleKey, SampleValue};
use anyhow::{Context as _, Result};
use aya::maps::PerCpuValues;

use super::load::Sampler;

/// One drained buffer set: what the kernel aggregated over one interval.
#[derive(Debug, Default)]
pub struct RawInterval {
    pub start: Option<SystemTime>,
    pub end: Option<SystemTime>,
    pub counts: Vec<(SampleKey, SampleValue)>,
    /// Stacks by (buffer set, stack id): off-CPU keys may name the other set's map.
    pub stacks: HashMap<(u8, u32), Vec<u64>>,
    /// Summed over CPUs, indexed by `agent_common::counter`.
    pub counters: [u64; counter::COUNT as usize],
}

impl Sampler {
    /// Switches the programs to the other buffer set and returns the contents of the one they
    /// wrote to until now, leaving it empty. Every sample lands in exactly one interval.
    pub fn drain(&mut self) -> Result<RawInterval> {
        let (idle, idle_generation) = (self.active_index, self.generation);
        self.generation = self.generation.wrapping_add(1);
        self.active_index = self.generation & 1;
        self.active.set(0, self.generation, 0).context("switching buffer sets")?;
        let end = SystemTime::now();
        let start = std::mem::replace(&mut self.active_since, end);
        // A program that read the old index just before the switch may still be writing to
        // the old set: wait until every program running now has finished.
        self.barrier.wait()?;

        let mut interval = RawInterval { start: Some(start), end: Some(end), ..Default::default() };
        let set = &mut self.sets[idle as usize];
        let keys: Vec<SampleKey> = set.counts.keys().collect::<Result<_, _>>().context("reading sample keys")?;
        for key in keys {
            if let Ok(values) = set.counts.get(&key, 0) {
                let value = values.iter().fold(SampleValue::default(), |sum, v| SampleValue {
                    count: sum.count + v.count,
                    total: sum.total + v.total,
                });
                interval.counts.push((key, value));
            }
            set.counts.remove(&key).context("clearing sample counts")?;
        }
        // Stacks of threads still blocked off-CPU stay: their block is counted when they wake,
        // in a later interval, by these ids.
        let retained = self.referenced_stack_ids(idle as u8, idle_generation);
        let set = &mut self.sets[idle as usize];
        let ids: Vec<u32> = set.stacks.stack_ids().collect::<Result<_, _>>().context("reading stack ids")?;
        let mut stacks = HashMap::new();
        for id in ids {
            if let Ok(stack) = set.stacks.get(&id, 0) {
                stacks.insert(id, stack.frames().iter().map(|f| f.ip).collect::<Vec<u64>>());
            }
            if !retained.contains(&id) {
                set.stacks.remove(&id).context("clearing stacks")?;
            }
        }
        // A thread that blocked while the other set was active is counted here with that
        // set's stack ids, which were all read at that set's last drain, before any was
        // deleted. (Reading the live map instead could find a reused id: another stack.)
        let other = self.active_index as u8;
        for (key, _) in &interval.counts {
            if key.stack_set == other {
                for id in [key.user_stack_id, key.kernel_stack_id].into_iter().filter(|id| *id >= 0) {
                    if let Some(stack) = self.last_stacks[other as usize].get(&(id as u32)) {
                        interval.stacks.insert((other, id as u32), stack.clone());
                    }
                }
            }
        }
        interval.stacks.extend(stacks.iter().map(|(id, stack)| ((idle as u8, *id), stack.clone())));
        self.last_stacks[idle as usize] = stacks;
        let set = &mut self.sets[idle as usize];
        for index in 0..counter::COUNT {
            let zero = PerCpuValues::try_from(vec![0u64; self.nr_cpus])?;
            let values = set.counters.get(&index, 0).context("reading counters")?;
            interval.counters[index as usize] = values.iter().sum();
            set.counters.set(index, zero, 0).context("clearing counters")?;
        }
        Ok(interval)
    }

    /// Stack ids in `set` that later events will be counted with: those of threads blocked
    /// right now, and the send stacks captured in the interval being drained (transmits
    /// use them during the next interval too).
    fn referenced_stack_ids(&self, set: u8, generation: u32) -> HashSet<u32> {
        let blocked = self.off_cpu_start.iter().flat_map(|m| m.iter().filter_map(Result::ok).map(|(_, s)| s.key));
        let blocked = blocked.filter(|key| key.stack_set == set);
        let senders = self.sock_owner.iter().flat_map(|m| m.iter().filter_map(Result::ok).map(|(_, o)| o));
        let senders = senders.filter(|owner| owner.generation == generation).map(|owner| owner.key);
        blocked
            .chain(senders)
            .flat_map(|key| [key.user_stack_id, key.kernel_stack_id])
            .filter(|id| *id >= 0)
            .map(|id| id as u32)
            .collect()
    }
}
