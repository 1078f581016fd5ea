//! Sampling rates while the programs run: what the overhead governor turns. Every rate keeps
//! weights unbiased: an on-CPU sample carries its period, a sampled off-CPU block or network
//! event counts `ratio` times. (What the programs cost, they count themselves:
//! `agent_common::counter::RUN_NS`.)

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
}

impl PerfSampling {
    /// Opens the event on every CPU at `frequency` and attaches the program to each.
    pub(super) fn attach(&mut self, prog: &mut PerfEvent, frequency: u64) -> Result<()> {
        for &cpu in &self.cpus {
            let link = prog
                .attach(self.event.config(), PerfEventScope::AllProcessesOneCpu { cpu }, SamplePolicy::Frequency(frequency), false)
                .map_err(|e| super::load::perf_open_error(self.event, cpu, &e))?;
            self.links.push(link);
        }
        Ok(())
    }
}

impl Sampler {
    pub fn rates(&self) -> SamplingRates {
        self.rates
    }

    /// Applies new rates now. A new frequency re-opens the perf events: the samples lost
    /// between the two are a few microseconds' worth, and each sample weighs its own period.
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
