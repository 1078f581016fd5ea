//! The sampling the programs run under: the rates in force, the perf events that drive
//! on-CPU sampling, one per CPU, with when their clock ticks, and those that drive the
//! sampling of page faults.
use std::time::{Duration, Instant};

use agent_common::Rates;
use anyhow::{Context as _, Result};
use aya::programs::{
    perf_event::{PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent},
    PerfEvent,
};

use super::{aya_errors::chain, events::Event};

/// The rates in force: on-CPU frequency (Hz), one off-CPU block, one network event and one
/// event of the faults group (a page-fault sample, a brk or mmap call) in how many are
/// recorded; and what the CPU budget paused, when no rate is low enough.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SamplingRates {
    pub frequency: u64,
    pub off_cpu_ratio: u32,
    pub net_ratio: u32,
    pub fault_ratio: u32,
    pub paused: Paused,
}

/// What the CPU budget paused: off-CPU tracking (its program detached: it runs at every
/// context switch, recording or not), and the capture of new processes at their exec (they
/// are captured at their first sample instead).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Paused {
    pub off_cpu: bool,
    pub exec_capture: bool,
    /// The allocator probes were taken out for good: their traps took the budget.
    pub alloc_probes: bool,
}

impl Paused {
    /// What is paused, as the profiles' comments and the logs name it ("" for nothing).
    pub fn names(self) -> String {
        let names = [(self.off_cpu, "off_cpu"), (self.exec_capture, "exec_capture"), (self.alloc_probes, "alloc_probes")];
        names.iter().filter(|(on, _)| *on).map(|(_, name)| *name).collect::<Vec<_>>().join(",")
    }
}

impl SamplingRates {
    pub(super) fn kernel(self) -> Rates {
        Rates {
            off_cpu_ratio: self.off_cpu_ratio,
            net_ratio: self.net_ratio,
            exec_announcements_paused: u32::from(self.paused.exec_capture),
            fault_ratio: self.fault_ratio,
        }
    }
}

/// The perf events that drive on-CPU sampling, one per CPU, re-opened to change frequency.
pub(super) struct PerfSampling {
    pub(super) event: Event,
    pub(super) cpus: Vec<u32>,
    /// Each CPU's event (in the order of `cpus`), and when it was opened.
    pub(super) links: Vec<(PerfEventLinkId, Instant)>,
    /// When the clock events' ticks fall, as of the last attach.
    pub(super) ticks: TickPhase,
}

impl PerfSampling {
    pub(super) fn new(event: Event, cpus: Vec<u32>) -> PerfSampling {
        let ticks = TickPhase { start: Instant::now(), period: Duration::from_secs(1) };
        PerfSampling { event, cpus, links: Vec::new(), ticks }
    }

    /// Opens the event on every CPU at `frequency` and attaches the program to each.
    pub(super) fn attach(&mut self, prog: &mut PerfEvent, frequency: u64) -> Result<()> {
        let opening = Instant::now();
        for &cpu in &self.cpus {
            let link = prog
                .attach(self.event.config(), PerfEventScope::AllProcessesOneCpu { cpu }, SamplePolicy::Frequency(frequency), false)
                .map_err(|e| perf_open_error(self.event, cpu, &e))?;
            // A clock event starts ticking once enabled, just before `attach` returns.
            self.links.push((link, Instant::now()));
        }
        // A clock event ticks a period after it is opened, then every period (the kernel
        // turns the frequency into a fixed period). The CPUs' events were opened one after
        // the other: take the middle.
        let start = opening + Instant::now().duration_since(opening) / 2;
        self.ticks = TickPhase { start, period: Duration::from_nanos(1_000_000_000 / frequency.max(1)) };
        Ok(())
    }

    /// Closes the events and opens them at `frequency`. Returns, per CPU (by id), what each
    /// closed clock event ran after its last tick (ns), which no sample of it stands for: half
    /// a period on average, 0.5 s per CPU at 1 Hz.
    pub(super) fn reopen(&mut self, prog: &mut PerfEvent, frequency: u64, nr_cpus: usize) -> Result<Vec<u64>> {
        let period = self.ticks.period.as_nanos().max(1);
        let mut unsampled = vec![0u64; nr_cpus];
        for (&cpu, (link, opened)) in self.cpus.iter().zip(std::mem::take(&mut self.links)) {
            prog.detach(link).context("detaching the on-CPU sampler")?;
            if let Some(slot) = unsampled.get_mut(cpu as usize).filter(|_| self.event.is_clock()) {
                *slot = (opened.elapsed().as_nanos() % period) as u64;
            }
        }
        self.attach(prog, frequency)?;
        Ok(unsampled)
    }
}

/// The software page-faults events that drive the `faults` group's program, one per CPU,
/// re-opened to change their period. Each sample carries its period, so the weights stay
/// true; what a closed event counted since its last sample (under a period on each CPU) is
/// lost. That is rare and small: the budget changes the period seldom, and sizes it to the
/// fault rate, so a period is a fraction of a millisecond of the host's faults.
pub(super) struct FaultSampling {
    cpus: Vec<u32>,
    /// The configured period (`--fault-period`): the shortest.
    base: u64,
    links: Vec<PerfEventLinkId>,
}

impl FaultSampling {
    /// Opens the event on every CPU of `cpus`, sampled every `period` faults, and attaches
    /// `prog` to each.
    pub(super) fn attach(prog: &mut PerfEvent, cpus: Vec<u32>, period: u64) -> Result<FaultSampling> {
        let mut faults = FaultSampling { cpus, base: period, links: Vec::new() };
        faults.open(prog, period)?;
        Ok(faults)
    }

    fn open(&mut self, prog: &mut PerfEvent, period: u64) -> Result<()> {
        for &cpu in &self.cpus {
            let event = PerfEventConfig::Software(SoftwareEvent::PageFaults);
            let link = prog
                .attach(event, PerfEventScope::AllProcessesOneCpu { cpu }, SamplePolicy::Period(period), false)
                .map_err(|e| anyhow::anyhow!("attaching the page-fault sampler to CPU {cpu}: {e}{}", chain(&e)))?;
            self.links.push(link);
        }
        Ok(())
    }

    /// Re-opens the events sampled every `ratio` configured periods.
    pub(super) fn set_ratio(&mut self, prog: &mut PerfEvent, ratio: u32) -> Result<()> {
        for link in std::mem::take(&mut self.links) {
            prog.detach(link).context("detaching the page-fault sampler")?;
        }
        self.open(prog, self.base.saturating_mul(u64::from(ratio.max(1))))
    }
}

/// When the on-CPU sampler's clock ticks: every `period` from `start`, on every CPU.
#[derive(Clone, Copy, Debug)]
pub struct TickPhase {
    start: Instant,
    period: Duration,
}

impl TickPhase {
    /// The first time at or after `t` that lies halfway between two ticks.
    pub fn between_ticks(&self, t: Instant) -> Instant {
        let period = self.period.as_nanos().max(1);
        let phase = t.saturating_duration_since(self.start).as_nanos() % period;
        let half = period / 2;
        let wait = if phase <= half { half - phase } else { period - phase + half };
        t + Duration::from_nanos(wait as u64)
    }
}

fn perf_open_error(event: Event, cpu: u32, error: &aya::programs::ProgramError) -> anyhow::Error {
    let detail = chain(error);
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap_or_default();
    if detail.contains("No such file") || detail.contains("not supported") || detail.contains("Operation not supported") {
        anyhow::anyhow!(
            "perf event {} is not supported on this machine (no hardware PMU?): use --event cpu-clock",
            event.name()
        )
    } else if detail.contains("Permission denied") || detail.contains("not permitted") {
        anyhow::anyhow!(
            "perf_event_open on CPU {cpu} was refused (kernel.perf_event_paranoid = {}): run as root or grant CAP_PERFMON",
            paranoid.trim()
        )
    } else {
        anyhow::anyhow!("attaching the sampler to CPU {cpu} failed: {error}{detail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_fall_halfway_between_ticks() {
        let start = Instant::now();
        let ticks = TickPhase { start, period: Duration::from_millis(1000) };
        let at = |ms: u64| start + Duration::from_millis(ms);
        // Ticks at 0, 1000, 2000...: the midpoints at 500, 1500...
        assert_eq!(ticks.between_ticks(at(2000)), at(2500));
        assert_eq!(ticks.between_ticks(at(2010)), at(2500));
        assert_eq!(ticks.between_ticks(at(2500)), at(2500));
        assert_eq!(ticks.between_ticks(at(2600)), at(3500));
        // Before the first tick, as after it.
        assert_eq!(ticks.between_ticks(start), at(500));
    }
}
