//! The drain: at the end of each interval, switches the programs to the other buffer set and
//! reads and clears the one they wrote to, keeping the stacks that later events still
//! reference. Called by the resolve stage once per interval.
use std::{
    collections::{HashMap, HashSet},
    time::SystemTime,
};

use agent_common::{counter, kind, python_stop, unwind_stop, SampleKey, SampleValue, UserStack};
use anyhow::{Context as _, Result};
use aya::maps::{HashMap as BpfHashMap, IterableMap as _, MapData, PerCpuValues, StackTraceMap};

use super::{
    batch,
    load::Sampler,
    rates::spread_unsampled,
    sampling::SamplingRates,
};

/// A stack read from a stack map, leaf first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stack {
    pub frames: Vec<u64>,
    /// Why the walk ended (`agent_common::unwind_stop`); kernel stacks are always `END`.
    pub stop: u32,
    /// Python frames, innermost first (`agent_common::python_frame`), and why their walk
    /// ended (`python_stop`); None where the process runs no interpreter Ember knows.
    pub python: Option<(Vec<u64>, u32)>,
}

/// Which stack map a key's stack id refers to: (user, buffer set, id).
pub type StackRef = (bool, u8, u32);

/// One drained buffer set: what the kernel aggregated over one interval.
#[derive(Debug, Default)]
pub struct RawInterval {
    pub start: Option<SystemTime>,
    pub end: Option<SystemTime>,
    pub counts: Vec<(SampleKey, SampleValue)>,
    /// Stacks by map and id: off-CPU keys may name the other set's maps.
    pub stacks: HashMap<StackRef, Stack>,
    pub counters: Counters,
    /// The rates the interval was sampled at.
    pub rates: SamplingRates,
}

/// The set's counters summed over CPUs, indexed by `agent_common::counter`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counters(pub [u64; counter::COUNT as usize]);

impl Default for Counters {
    fn default() -> Counters {
        Counters([0; counter::COUNT as usize])
    }
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

        let mut interval = RawInterval { start: Some(start), end: Some(end), rates: self.rates, ..Default::default() };
        let unsampled = std::mem::take(&mut self.unsampled);
        // After a frequency change: each on-CPU key's samples per CPU, by its index in counts.
        let mut per_cpu = Vec::new();
        let set = &mut self.sets[idle as usize];
        batch::read(set.counts.map(), self.nr_cpus, true, |key: SampleKey, values: &[SampleValue]| {
            let value = values.iter().fold(SampleValue::default(), |sum, v| SampleValue { count: sum.count + v.count, total: sum.total + v.total });
            if !unsampled.is_empty() && key.kind == kind::ON_CPU {
                per_cpu.push((interval.counts.len(), values.iter().map(|v| v.count).collect()));
            }
            interval.counts.push((key, value));
        })
        .context("reading and clearing sample counts")?;
        // Stacks of threads still blocked off-CPU stay: their block is counted when they wake,
        // in a later interval, by these ids.
        let retained = self.referenced_stack_ids(idle as u8, idle_generation);
        let set = &mut self.sets[idle as usize];
        let mut stacks = drain_stacks(&mut set.stacks, &retained)?;
        stacks.extend(drain_stacks(&mut set.user_stacks, &retained)?);
        // A thread that blocked while the other set was active is counted here with that
        // set's stack ids, which were all read at that set's last drain, before any was
        // deleted. (Reading the live map instead could find a reused id: another stack.)
        let other = self.active_index as u8;
        for (key, _) in &interval.counts {
            if key.stack_set == other {
                for (user, id) in [(true, key.user_stack_id), (false, key.kernel_stack_id)] {
                    if let Some(stack) = u32::try_from(id).ok().and_then(|id| self.last_stacks[other as usize].get(&(user, id))) {
                        interval.stacks.insert((user, other, id as u32), stack.clone());
                    }
                }
            }
        }
        interval.stacks.extend(stacks.iter().map(|((user, id), stack)| ((*user, idle as u8, *id), stack.clone())));
        self.last_stacks[idle as usize] = stacks;
        // On-CPU samples each CPU took without recording them.
        let mut unrecorded = vec![0u64; self.nr_cpus];
        for index in 0..counter::COUNT {
            let zero = PerCpuValues::try_from(vec![0u64; self.nr_cpus])?;
            let slot = idle * counter::COUNT + index;
            let values = self.counters.get(&slot, 0).context("reading counters")?;
            interval.counters.0[index as usize] = values.iter().sum();
            if index == counter::IDLE || index == counter::FILTERED {
                unrecorded.iter_mut().zip(values.iter()).for_each(|(sum, n)| *sum += n);
            }
            self.counters.set(slot, zero, 0).context("clearing counters")?;
        }
        spread_unsampled(&unsampled, &per_cpu, &unrecorded, &mut interval.counts);
        self.add_live_allocations(&mut interval)?;
        Ok(interval)
    }

    /// Stack ids in `set` that later events will be counted with: those of threads blocked
    /// right now, and the send stacks captured in the interval being drained (transmits
    /// use them during the next interval too).
    fn referenced_stack_ids(&self, set: u8, generation: u32) -> HashSet<(bool, u32)> {
        let blocked = self.off_cpu_start.iter().flat_map(|m| m.iter().filter_map(Result::ok).map(|(_, s)| s));
        // A thread that woke keeps its entry for its next block, with start 0.
        let blocked = blocked.filter(|start| start.start_ns != 0 && start.key.stack_set == set).map(|start| start.key);
        let senders = self.sock_owner.iter().flat_map(|m| m.iter().filter_map(Result::ok).map(|(_, o)| o));
        let senders = senders.filter(|owner| owner.generation == generation).map(|owner| owner.key);
        blocked
            .chain(senders)
            .flat_map(|key| [(true, key.user_stack_id), (false, key.kernel_stack_id)])
            .filter_map(|(user, id)| Some((user, u32::try_from(id).ok()?)))
            .collect()
    }
}

/// A stack map the drain reads: the kernel's (`bpf_get_stackid`) or Ember's user stacks.
trait StackMap {
    const USER: bool;
    /// Every id in the map, with its stack if it could be read.
    fn read_all(&self) -> Result<Vec<(u32, Option<Stack>)>>;
    fn remove(&mut self, ids: &[u32]) -> Result<()>;
}

/// The kernel's stack maps have no batch operations: one id at a time.
impl StackMap for StackTraceMap<MapData> {
    const USER: bool = false;
    fn read_all(&self) -> Result<Vec<(u32, Option<Stack>)>> {
        let ids: Vec<u32> = self.stack_ids().collect::<Result<_, _>>().context("reading kernel stack ids")?;
        let read = |id| Some(Stack { frames: self.get(&id, 0).ok()?.frames().iter().map(|f| f.ip).collect(), stop: unwind_stop::END, python: None });
        Ok(ids.into_iter().map(|id| (id, read(id))).collect())
    }
    fn remove(&mut self, ids: &[u32]) -> Result<()> {
        ids.iter().try_for_each(|id| StackTraceMap::remove(self, id)).context("clearing kernel stacks")
    }
}

impl StackMap for BpfHashMap<MapData, u32, UserStack> {
    const USER: bool = true;
    fn read_all(&self) -> Result<Vec<(u32, Option<Stack>)>> {
        let mut stacks = Vec::new();
        batch::read(self.map(), 1, false, |id: u32, stack: &[UserStack]| {
            let stack = &stack[0];
            stacks.push((id, stack.frames.get(..stack.len as usize).map(|frames| Stack { frames: frames.to_vec(), stop: stack.stop, python: python_frames(stack) })));
        })
        .context("reading user stacks")?;
        Ok(stacks)
    }
    fn remove(&mut self, ids: &[u32]) -> Result<()> {
        batch::delete(self.map(), ids).context("clearing user stacks")
    }
}

/// Reads every stack of `map`, by (user, id), and removes those not `retained`.
fn drain_stacks<M: StackMap>(map: &mut M, retained: &HashSet<(bool, u32)>) -> Result<HashMap<(bool, u32), Stack>> {
    let stacks = map.read_all()?;
    let unreferenced: Vec<u32> = stacks.iter().map(|(id, _)| *id).filter(|id| !retained.contains(&(M::USER, *id))).collect();
    map.remove(&unreferenced)?;
    Ok(stacks.into_iter().filter_map(|(id, stack)| Some(((M::USER, id), stack?))).collect())
}

/// A user stack's Python frames, innermost first (the walk writes them from the end of the
/// frames backwards), if its process runs an interpreter the walk was told of.
fn python_frames(stack: &UserStack) -> Option<(Vec<u64>, u32)> {
    if stack.python == 0 && stack.python_stop == python_stop::END {
        return None;
    }
    let count = (stack.python as usize).min(stack.frames.len());
    Some((stack.frames.iter().rev().take(count).copied().collect(), stack.python_stop))
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            atomic::{AtomicU32, Ordering},
            Arc,
        },
        time::{Duration, Instant},
    };

    use agent_common::OffCpuStart;

    use super::*;
    use crate::kernel::{KernelSettings, OffCpuSettings};

    fn clock_ns(clock: libc::clockid_t) -> u64 {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        assert_eq!(unsafe { libc::clock_gettime(clock, &mut t) }, 0);
        t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
    }

    /// A thread sleeps, runs, and sleeps again. While it runs, its entry in the blocked-thread
    /// table is made to say it blocked 200 ms ago, as if the program had not run for the
    /// switch that woke it (the kernel skips it so on a busy host): at the thread's next
    /// block, those 200 ms count as blocked, and what it ran since does not.
    #[test]
    fn a_block_whose_wake_up_went_unseen_counts_at_the_next_one_less_what_the_thread_ran() {
        assert_eq!(unsafe { libc::geteuid() }, 0, "this test loads BPF programs: run it as root");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _entered = runtime.enter();
        let settings = KernelSettings {
            off_cpu: Some(OffCpuSettings::for_tests()),
            pids: vec![std::process::id()],
            ..KernelSettings::for_tests()
        };
        let (mut sampler, _announcements, _unwind_maps) = Sampler::start(&settings).expect("starting the sampler");
        // A switch-out of the running thread between the rewrite and its next block (it may
        // be preempted) finds the entry by the usual path instead: then it runs again.
        let mut reports = Vec::new();
        for _ in 0..5 {
            let (counted, truth, unseen) = sleep_run_sleep(&mut sampler);
            let report = format!("{:.1} ms counted blocked, {:.1} ms expected; {unseen} wake-ups unseen", counted as f64 / 1e6, truth as f64 / 1e6);
            println!("{report}");
            assert!((counted as f64 - truth as f64).abs() < 0.02 * truth as f64, "{report}");
            reports.push(report);
            if unseen == 1 {
                return;
            }
        }
        panic!("no run took the path of an unseen wake-up: {reports:?}");
    }

    /// One run of the thread: what was counted blocked of it, the truth, and the wake-ups
    /// counted as unseen.
    fn sleep_run_sleep(sampler: &mut Sampler) -> (u64, u64, u64) {
        let (tid, stage) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let thread = std::thread::spawn({
            let (tid, stage) = (tid.clone(), stage.clone());
            move || {
                let started = Instant::now();
                tid.store(unsafe { libc::gettid() } as u32, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(200));
                stage.store(1, Ordering::SeqCst);
                let deadline = Instant::now() + Duration::from_secs(5);
                while stage.load(Ordering::SeqCst) != 2 && Instant::now() < deadline {}
                std::thread::sleep(Duration::from_millis(100));
                // Its time off the CPU: its lifetime less what it ran.
                started.elapsed().as_nanos() as u64 - clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
            }
        });
        while stage.load(Ordering::SeqCst) != 1 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let tid = tid.load(Ordering::SeqCst);
        let table = sampler.off_cpu_start.as_mut().expect("off-CPU is loaded");
        let woke = table.get(&tid, 0).expect("the thread has blocked: it is in the table");
        let schedstat = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).expect("the thread's schedstat");
        let ran: u64 = schedstat.split_whitespace().next().and_then(|v| v.parse().ok()).expect("its run time");
        let unseen = OffCpuStart { start_ns: clock_ns(libc::CLOCK_MONOTONIC) - 200_000_000, run_ns: ran, ..woke };
        table.insert(tid, unseen, 0).expect("rewriting the entry");
        stage.store(2, Ordering::SeqCst);
        let truth = thread.join().expect("the thread") + 200_000_000;
        let interval = sampler.drain().expect("draining");
        let counted: u64 = interval.counts.iter().filter(|(k, _)| k.pid == tid && k.kind == kind::OFF_CPU).map(|(_, v)| v.total).sum();
        let unseen = interval.counters.0[counter::OFF_CPU_WAKES_UNSEEN as usize];
        (counted, truth, unseen)
    }
}
