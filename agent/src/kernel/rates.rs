//! Sampling rates while the programs run: what the overhead governor turns. Every rate keeps
//! weights unbiased: an on-CPU sample carries its period, a sampled off-CPU block or network
//! event counts `ratio` times. (What the programs cost, they count themselves:
//! `agent_common::counter::RUN_NS`.)

use agent_common::{names, SampleKey, SampleValue};
use anyhow::{Context as _, Result};
use aya::programs::{PerfEvent, TracePoint};

use super::{
    load::{attach_loaded, Sampler, SCHED_SWITCH},
    sampling::{SamplingRates, TickPhase},
};

/// What profiling cost over one interval, as shares of one core.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Overhead {
    pub budget: f64,
    pub agent: f64,
    pub bpf: f64,
    /// The allocator probes' traps, which the probed processes pay (estimated from the calls
    /// counted and a trap's measured cost).
    pub probes: f64,
    /// What the budget's pauses did not see.
    pub unseen: Unseen,
}

/// What the CPU budget's pauses (`SamplingRates::paused`) did not see over an interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unseen {
    /// The host's context switches while off-CPU tracking was paused.
    pub switches: u64,
    /// Processes started while their capture at exec was paused.
    pub processes: u64,
}

impl Overhead {
    pub fn total(&self) -> f64 {
        self.agent + self.bpf + self.probes
    }
}

/// Adds each CPU's `unsampled` time (ns) to the on-CPU samples the CPU took next (`per_cpu`:
/// an index in `counts` and the key's samples on each CPU), in proportion to their number,
/// with the share of the CPU's samples that were not recorded (`unrecorded`: idle, filtered)
/// left out as they are. In expectation that is what the first sample of the new event would
/// carry, without a cost in the sampling program, which reading a per-CPU value there had
/// (4-7%: one more cold line a sample).
pub(super) fn spread_unsampled(unsampled: &[u64], per_cpu: &[(usize, Vec<u64>)], unrecorded: &[u64], counts: &mut [(SampleKey, SampleValue)]) {
    let taken = |cpu: usize| per_cpu.iter().map(|(_, n)| n.get(cpu).copied().unwrap_or(0)).sum::<u64>() + unrecorded.get(cpu).copied().unwrap_or(0);
    let taken: Vec<u64> = (0..unsampled.len()).map(taken).collect();
    for (index, samples) in per_cpu {
        let share: f64 = unsampled
            .iter()
            .zip(samples)
            .zip(&taken)
            .filter(|(_, &all)| all > 0)
            .map(|((&ns, &n), &all)| ns as f64 * n as f64 / all as f64)
            .sum();
        if let Some((_, value)) = counts.get_mut(*index) {
            value.total += share.round() as u64;
        }
    }
}

impl Sampler {
    pub fn rates(&self) -> SamplingRates {
        self.rates
    }

    /// When the on-CPU sampler ticks, if it samples on a clock.
    pub fn ticks(&self) -> Option<TickPhase> {
        self.perf.as_ref().filter(|perf| perf.event.is_clock()).map(|perf| perf.ticks)
    }

    /// Applies new rates now. A new frequency re-opens the perf events, and each sample
    /// weighs its own period; what the old events ran after their last tick is added to the
    /// next samples of each CPU at the next drain (`spread_unsampled`). A new fault ratio
    /// re-opens the page-fault events at as many periods.
    pub fn set_rates(&mut self, rates: SamplingRates) -> Result<()> {
        if rates.frequency != self.rates.frequency {
            if let (Some(ebpf), Some(perf)) = (self.ebpf.as_mut(), self.perf.as_mut()) {
                let prog: &mut PerfEvent = ebpf.program_mut(names::PROG_SAMPLE).context("program missing")?.try_into()?;
                let unsampled = perf.reopen(prog, rates.frequency, self.nr_cpus)?;
                self.unsampled.resize(unsampled.len(), 0);
                self.unsampled.iter_mut().zip(unsampled).for_each(|(sum, ns)| *sum += ns);
            }
        }
        if rates.fault_ratio != self.rates.fault_ratio {
            if let (Some(ebpf), Some(faults)) = (self.ebpf.as_mut(), self.faults.as_mut()) {
                let prog: &mut PerfEvent = ebpf.program_mut(names::PROG_FAULT).context("program missing")?.try_into()?;
                faults.set_ratio(prog, rates.fault_ratio)?;
            }
        }
        if rates.paused.off_cpu != self.rates.paused.off_cpu {
            self.pause_off_cpu(rates.paused.off_cpu)?;
        }
        self.rates_map.set(0, rates.kernel(), 0).context("writing sampling ratios")?;
        self.rates = rates;
        Ok(())
    }

    /// Detaches the off-CPU program (`pause`) or attaches it again. Blocks under way when it
    /// is detached are dropped with their threads' entries: one whose wake-up the program
    /// missed would otherwise count the whole pause as blocked.
    fn pause_off_cpu(&mut self, pause: bool) -> Result<()> {
        let Some(ebpf) = self.ebpf.as_mut() else { return Ok(()) };
        let prog: &mut TracePoint = ebpf.program_mut(names::PROG_SWITCH).context("program missing")?.try_into()?;
        match (pause, self.switch_link.take()) {
            (true, Some(link)) => {
                prog.detach(link).context("detaching the off-CPU program")?;
                if let Some(blocked) = self.off_cpu_start.as_mut() {
                    let threads: Vec<u32> = blocked.keys().filter_map(Result::ok).collect();
                    for tid in threads {
                        // A thread that exited meanwhile took its entry with it.
                        let _ = blocked.remove(&tid);
                    }
                }
            }
            (false, None) => self.switch_link = Some(attach_loaded(prog, SCHED_SWITCH)?),
            (_, link) => self.switch_link = link,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            atomic::{AtomicBool, Ordering},
            Arc,
        },
        time::Duration,
    };

    use agent_common::kind;

    use super::*;
    use crate::kernel::{HostStat, KernelSettings};

    /// CPU time of this process so far (ns). (The governor's twin is a layer up: the kernel
    /// module must not import it.)
    fn process_cpu_ns() -> u64 {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) }, 0);
        t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
    }

    /// A thread per CPU, pinned there, spinning until `stop`.
    fn spin_on_every_cpu(stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
        let cpus = std::thread::available_parallelism().unwrap().get();
        (0..cpus)
            .map(|cpu| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
                    unsafe { libc::CPU_SET(cpu, &mut set) };
                    assert_eq!(unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) }, 0);
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect()
    }

    #[test]
    fn unsampled_time_goes_to_each_cpus_samples_in_proportion_and_unrecorded_ones_keep_their_share() {
        let key = |pid| SampleKey { pid, ..SampleKey::default() };
        let mut counts = vec![(key(1), SampleValue { count: 3, total: 30 }), (key(2), SampleValue { count: 2, total: 20 })];
        // CPU 0: key 1 took 2 samples, key 2 none, 2 idle; CPU 1: key 1 one, key 2 two, none idle.
        let per_cpu = vec![(0, vec![2, 1]), (1, vec![0, 2])];
        spread_unsampled(&[400, 300], &per_cpu, &[2, 0], &mut counts);
        assert_eq!(counts[0].1, SampleValue { count: 3, total: 30 + 200 + 100 });
        assert_eq!(counts[1].1, SampleValue { count: 2, total: 20 + 200 });
    }

    /// The real programs and perf events (needs root): threads keep every CPU busy while the
    /// frequency changes between low rates, at times that fall anywhere between ticks. What
    /// their samples add up to is the CPU time they used: what an old event ran after its last
    /// tick is added to the samples that came next. Without it, some half an old period per
    /// CPU and change went missing (13% here).
    #[test]
    fn frequency_changes_lose_no_on_cpu_time() {
        assert_eq!(unsafe { libc::geteuid() }, 0, "this test loads BPF programs: run it as root");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _entered = runtime.enter();
        let stop = Arc::new(AtomicBool::new(false));
        let spinners = spin_on_every_cpu(&stop);
        let settings = KernelSettings {
            cpu: true,
            max_keys: 4096,
            max_stacks: 4096,
            unwind_rows: 4096,
            pids: vec![std::process::id()],
            ..KernelSettings::for_tests()
        };
        let (mut sampler, _announcements, _unwind_maps) = Sampler::start(&settings).expect("starting the sampler");
        let (cpu_from, host_from) = (process_cpu_ns(), HostStat::read().expect("reading /proc/stat"));
        // 16 changes between 5 and 11 Hz, 0.45 s apart, then a last one to 97 Hz, whose short
        // period leaves little of the end unsampled.
        for change in 0..17 {
            std::thread::sleep(Duration::from_millis(450));
            let frequency = if change == 16 { 97 } else if change % 2 == 0 { 5 } else { 11 };
            sampler.set_rates(SamplingRates { frequency, ..sampler.rates() }).expect("changing the frequency");
        }
        std::thread::sleep(Duration::from_millis(500));
        let cpu_ns = process_cpu_ns() - cpu_from;
        let steal = HostStat::read().expect("reading /proc/stat").since(&host_from).steal_share();
        let interval = sampler.drain().expect("draining");
        stop.store(true, Ordering::Relaxed);
        spinners.into_iter().for_each(|t| t.join().unwrap());
        let pid = std::process::id();
        let sampled_ns: u64 = interval.counts.iter().filter(|(k, _)| k.tgid == pid && k.kind == kind::ON_CPU).map(|(_, v)| v.total).sum();
        let ratio = sampled_ns as f64 / cpu_ns as f64;
        // A clock sampler also charges the threads what the hypervisor stole while they were
        // current, which their CPU time leaves out: up to the host's steal share.
        let report = format!("samples add up to {:.3} s of {:.3} s of CPU ({ratio:.3}; {:.1}% stolen)", sampled_ns as f64 / 1e9, cpu_ns as f64 / 1e9, steal * 100.0);
        println!("{report}");
        assert!((0.95..=1.05 / (1.0 - steal)).contains(&ratio), "{report}");
    }
}
