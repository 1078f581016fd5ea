//! Sampling rates while the programs run: what the overhead governor turns. Every rate keeps
//! weights unbiased: an on-CPU sample carries its period, a sampled off-CPU block or network
//! event counts `ratio` times. (What the programs cost, they count themselves:
//! `agent_common::counter::RUN_NS`.)

use std::time::{Duration, Instant};

use agent_common::{names, Rates};
use anyhow::{Context as _, Result};
use aya::programs::{
    perf_event::{PerfEventLinkId, PerfEventScope, SamplePolicy},
    PerfEvent,
};

use super::{events::Event, load::Sampler};

/// The rates in force: on-CPU frequency (Hz), one off-CPU block and one network event in
/// how many are recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SamplingRates {
    pub frequency: u64,
    pub off_cpu_ratio: u32,
    pub net_ratio: u32,
}

impl SamplingRates {
    pub(super) fn kernel(self) -> Rates {
        Rates { off_cpu_ratio: self.off_cpu_ratio, net_ratio: self.net_ratio }
    }
}

/// What profiling cost over one interval, as shares of one core.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Overhead {
    pub budget: f64,
    pub agent: f64,
    pub bpf: f64,
}

impl Overhead {
    pub fn total(&self) -> f64 {
        self.agent + self.bpf
    }
}

/// The perf events that drive on-CPU sampling, one per CPU, re-opened to change frequency.
pub(super) struct PerfSampling {
    pub(super) event: Event,
    pub(super) cpus: Vec<u32>,
    pub(super) links: Vec<PerfEventLinkId>,
    /// When the clock events' ticks fall, as of the last attach.
    pub(super) ticks: TickPhase,
}

impl PerfSampling {
    pub(super) fn new(event: Event, cpus: Vec<u32>) -> PerfSampling {
        PerfSampling { event, cpus, links: Vec::new(), ticks: TickPhase { start: Instant::now(), period: Duration::from_secs(1) } }
    }

    /// Opens the event on every CPU at `frequency` and attaches the program to each.
    pub(super) fn attach(&mut self, prog: &mut PerfEvent, frequency: u64) -> Result<()> {
        let opening = Instant::now();
        for &cpu in &self.cpus {
            let link = prog
                .attach(self.event.config(), PerfEventScope::AllProcessesOneCpu { cpu }, SamplePolicy::Frequency(frequency), false)
                .map_err(|e| super::load::perf_open_error(self.event, cpu, &e))?;
            self.links.push(link);
        }
        // A clock event ticks a period after it is opened, then every period (the kernel
        // turns the frequency into a fixed period). The CPUs' events were opened one after
        // the other: take the middle.
        let start = opening + Instant::now().duration_since(opening) / 2;
        self.ticks = TickPhase { start, period: Duration::from_nanos(1_000_000_000 / frequency.max(1)) };
        Ok(())
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

impl Sampler {
    pub fn rates(&self) -> SamplingRates {
        self.rates
    }

    /// When the on-CPU sampler ticks, if it samples on a clock.
    pub fn ticks(&self) -> Option<TickPhase> {
        self.perf.as_ref().filter(|perf| perf.event.is_clock()).map(|perf| perf.ticks)
    }

    /// Applies new rates now. A new frequency re-opens the perf events, and each sample
    /// weighs its own period. What the old events ran since their last tick no sample stands
    /// for: half an old period per CPU, as drains fall halfway between ticks (0.5 ms at
    /// 999 Hz, 0.5 s at 1 Hz; BENCHMARKS.md, session 20).
    pub fn set_rates(&mut self, rates: SamplingRates) -> Result<()> {
        if rates.frequency != self.rates.frequency {
            if let (Some(ebpf), Some(perf)) = (self.ebpf.as_mut(), self.perf.as_mut()) {
                let prog: &mut PerfEvent = ebpf.program_mut(names::PROG_SAMPLE).context("program missing")?.try_into()?;
                for link in perf.links.drain(..) {
                    prog.detach(link).context("detaching the on-CPU sampler")?;
                }
                perf.attach(prog, rates.frequency)?;
            }
        }
        self.rates_map.set(0, rates.kernel(), 0).context("writing sampling ratios")?;
        self.rates = rates;
        Ok(())
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
