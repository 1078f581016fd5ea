//! The `alloc` group's probes: attached to one process's allocator at a time (a uprobe with a
//! pid traps in that process only; without one it would trap in every process that maps the
//! file), taken out of a process that is gone, and out of all together when their time is up
//! or the CPU budget says so. What a trap costs is measured here, on the agent's own code, for
//! the budget to count the probes.
use std::{hint::black_box, num::NonZeroU32, path::Path, time::Instant};

use agent_common::names;
use anyhow::{Context as _, Result};
use aya::programs::{
    uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    UProbe,
};

use super::{aya_errors::chain, load::Sampler};
use crate::maps_line::MapsLine;

/// What a probe does, where (file offset) in the allocator's file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocProbe {
    /// An allocation function: `allocator_call` says where its size is.
    Allocates(u64),
    Frees,
}

impl Sampler {
    /// Probes the allocator functions of process `pid` in `file` (a path that reaches the file
    /// it maps). Returns how many probes went in.
    pub fn probe_allocator(&mut self, pid: u32, file: &Path, functions: &[(AllocProbe, u64)]) -> Result<usize> {
        let pid = NonZeroU32::new(pid).context("pid 0 has no allocator")?;
        let ebpf = self.ebpf.as_mut().context("the programs are stopped")?;
        let mut links = Vec::new();
        for &(probe, offset) in functions {
            let point = |cookie| UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie };
            let attached: Vec<(&'static str, Option<u64>)> = match probe {
                AllocProbe::Allocates(call) => vec![(names::PROG_ALLOCATION_CALLED, Some(call)), (names::PROG_ALLOCATION_RETURNED, Some(call))],
                AllocProbe::Frees => vec![(names::PROG_FREE_CALLED, None)],
            };
            for (program, cookie) in attached {
                let prog: &mut UProbe = ebpf.program_mut(program).context("program missing")?.try_into()?;
                let link = prog
                    .attach(point(cookie), file, UProbeScope::OneProcess(pid))
                    .map_err(|e| anyhow::anyhow!("probing {} at {offset:#x} in process {pid}: {e}{}", file.display(), chain(&e)))?;
                links.push((program, link));
            }
        }
        let count = links.len();
        self.alloc_links.entry(pid.get()).or_default().extend(links);
        Ok(count)
    }

    /// Measures what a probe's trap costs on this host (ns), once: calls of a function of the
    /// agent's own with the free probe on it (which returns at once for a null address), less
    /// the same calls without.
    pub fn measure_trap_ns(&mut self) -> Result<f64> {
        let offset = own_file_offset(trap_target as *const () as usize).context("finding the agent's own code in /proc/self/maps")?;
        let ebpf = self.ebpf.as_mut().context("the programs are stopped")?;
        let prog: &mut UProbe = ebpf.program_mut(names::PROG_FREE_CALLED).context("program missing")?.try_into()?;
        let bare = ns_per_call();
        let point = UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: None };
        let link = prog
            .attach(point, "/proc/self/exe", UProbeScope::CallingProcess)
            .map_err(|e| anyhow::anyhow!("probing the agent's own code: {e}{}", chain(&e)))?;
        let probed = ns_per_call();
        prog.detach(link).context("detaching the trap measurement")?;
        let trap_ns = (probed - bare).max(0.0);
        self.alloc_trap_ns = Some(trap_ns);
        Ok(trap_ns)
    }

    /// Whether allocator probes are in.
    pub fn probes_allocators(&self) -> bool {
        !self.alloc_links.is_empty()
    }

    /// What a trap of the allocator probes costs (ns), once measured.
    pub fn alloc_trap_ns(&self) -> Option<f64> {
        self.alloc_trap_ns
    }

    /// Takes every allocator probe out, and forgets the live allocations they tracked (their
    /// frees would go unseen from now on).
    pub fn unprobe_allocators(&mut self) -> Result<()> {
        for (_, links) in std::mem::take(&mut self.alloc_links) {
            self.detach_alloc_links(links)?;
        }
        self.forget_live_allocations()
    }

    /// Takes out the probes of process `pid`, which is gone. (What it held is given back
    /// with the other exited processes' at the drain.)
    pub fn unprobe_process(&mut self, pid: u32) -> Result<()> {
        match self.alloc_links.remove(&pid) {
            Some(links) => self.detach_alloc_links(links),
            None => Ok(()),
        }
    }

    fn detach_alloc_links(&mut self, links: Vec<(&'static str, UProbeLinkId)>) -> Result<()> {
        let Some(ebpf) = self.ebpf.as_mut() else { return Ok(()) };
        for (program, link) in links {
            let prog: &mut UProbe = ebpf.program_mut(program).context("program missing")?.try_into()?;
            prog.detach(link).with_context(|| format!("detaching {program}"))?;
        }
        Ok(())
    }
}

/// Calls that measure a trap: enough for a steady figure (a trap costs microseconds on a VM),
/// few enough to take milliseconds.
const TRAP_CALLS: u32 = 2000;

/// What the trap measurement probes: nothing the compiler may fold away.
#[inline(never)]
extern "C" fn trap_target(address: u64) -> u64 {
    black_box(address)
}

/// Average ns of a call of `trap_target`.
fn ns_per_call() -> f64 {
    let start = Instant::now();
    for _ in 0..TRAP_CALLS {
        black_box(trap_target(black_box(0)));
    }
    start.elapsed().as_nanos() as f64 / f64::from(TRAP_CALLS)
}

/// Where an address of the agent's own code is in its executable file.
fn own_file_offset(address: usize) -> Option<u64> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let address = address as u64;
    let line = maps.lines().filter_map(MapsLine::parse).find(|line| line.covers(address))?;
    Some(line.file_offset + (address - line.start))
}
