//! The kernel's own accounting of what the programs cost (run time and runs per program),
//! turned on for as long as the agent runs under a CPU budget, where it may: it needs
//! CAP_SYS_ADMIN, and it times every BPF program on the host, not just Ember's (two clock
//! reads a run). Without it, the governor has only the programs' own clock, which misses
//! what the kernel spends to enter and leave them.
use std::os::fd::OwnedFd;

use agent_common::names;
use aya::sys::{enable_stats, Stats};

use super::Sampler;

/// Holds the kernel's run-time accounting on (`BPF_ENABLE_STATS`); dropping it turns it off.
pub(super) struct RunTimeStats {
    _on: OwnedFd,
}

impl RunTimeStats {
    /// Turns the accounting on, or says why it stays off.
    pub(super) fn enable() -> Option<RunTimeStats> {
        match enable_stats(Stats::RunTime) {
            Ok(fd) => Some(RunTimeStats { _on: fd }),
            Err(e) => {
                tracing::info!(
                    error = %e.io_error,
                    "the kernel's accounting of BPF run time stays off (it needs CAP_SYS_ADMIN): the CPU budget relies on the programs' own clock"
                );
                None
            }
        }
    }
}

/// What the programs have cost so far, as the kernel accounts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramCost {
    /// The programs that time themselves (`counter::RUN_NS`): nanoseconds and runs.
    pub timed_ns: u64,
    pub timed_runs: u64,
    /// The others (process exec and exit, the allocator probes), which no rate lowers.
    pub other_ns: u64,
}

impl Sampler {
    /// The kernel's accounting of the attached programs since they were loaded, if it is on.
    pub fn program_cost(&self) -> Option<ProgramCost> {
        self.run_time_stats.as_ref()?;
        let mut cost = ProgramCost::default();
        for (name, program) in self.ebpf.as_ref()?.programs() {
            // A program that is not loaded is not attached either.
            let Ok(info) = program.info() else { continue };
            let ns = info.run_time().as_nanos() as u64;
            let untimed = [names::PROG_EXEC, names::PROG_EXIT];
            if untimed.contains(&name) || names::ALLOC_PROGRAMS.contains(&name) {
                cost.other_ns += ns;
            } else {
                cost.timed_ns += ns;
                cost.timed_runs += info.run_count();
            }
        }
        Some(cost)
    }
}
