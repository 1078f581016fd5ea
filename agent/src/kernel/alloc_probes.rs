//! The `alloc` group's probes: attached to one process's allocator at a time (a uprobe with a
//! pid traps in that process only; without one it would trap in every process that maps the
//! file), taken out of a process that is gone, and out of all together when their time is up
//! or the CPU budget says so. What a hit costs is measured here, on the agent's own code, for
//! the budget to count the probes.
use std::{hint::black_box, num::NonZeroU32, path::Path, time::Instant};

use agent_common::{allocator_call, names};
use anyhow::{Context as _, Result};
use aya::programs::{
    uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    UProbe,
};

use super::{aya_errors::chain, load::Sampler, probe_costs::TrapCosts};
use crate::maps_line::MapsLine;

/// What a probe does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocProbe {
    /// An allocation function: `allocator_call` says where its size is.
    Allocates(u64),
    Frees,
    /// tcmalloc's list of sampled objects growing, the list's head at this address in the
    /// process, and shrinking.
    SampledAllocation(u64),
    SampledFree,
}

/// A probe, where (file offset) in the allocator's file, and whether the kernel steps the
/// instruction there out of line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocSite {
    /// The function's symbol.
    pub function: &'static str,
    pub probe: AllocProbe,
    pub offset: u64,
    pub stepped: bool,
}

impl Sampler {
    /// Probes the allocator functions of process `pid` in `file` (a path that reaches the file
    /// it maps). Returns how many probes went in.
    pub fn probe_allocator(&mut self, pid: u32, file: &Path, sites: &[AllocSite]) -> Result<usize> {
        let pid = NonZeroU32::new(pid).context("pid 0 has no allocator")?;
        let ebpf = self.ebpf.as_mut().context("the programs are stopped")?;
        let mut links = Vec::new();
        for &AllocSite { probe, offset, stepped, .. } in sites {
            let point = |cookie| UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie };
            let step = if stepped { allocator_call::STEPPED } else { 0 };
            let attached: Vec<(&'static str, Option<u64>)> = match probe {
                AllocProbe::Allocates(call) => vec![(names::PROG_ALLOCATION_CALLED, Some(call | step)), (names::PROG_ALLOCATION_RETURNED, Some(call))],
                AllocProbe::Frees => vec![(names::PROG_FREE_CALLED, Some(step))],
                AllocProbe::SampledAllocation(head) => vec![(names::PROG_TCMALLOC_SAMPLED, Some(head | step))],
                AllocProbe::SampledFree => vec![(names::PROG_TCMALLOC_FREED, Some(step))],
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

    /// Measures what a hit costs on this host, once: calls of a function of the agent's own
    /// with the free probe on it (which returns at once for a null address) on an instruction
    /// the kernel emulates and on one it steps, less the same calls without.
    pub fn measure_trap_costs(&mut self) -> Result<TrapCosts> {
        let offset = own_file_offset(ember_trap_target as *const () as usize).context("finding the agent's own code in /proc/self/maps")?;
        let ebpf = self.ebpf.as_mut().context("the programs are stopped")?;
        let prog: &mut UProbe = ebpf.program_mut(names::PROG_FREE_CALLED).context("program missing")?.try_into()?;
        let mut probed_ns = |offset| -> Result<f64> {
            let point = UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: Some(0) };
            let link = prog
                .attach(point, "/proc/self/exe", UProbeScope::CallingProcess)
                .map_err(|e| anyhow::anyhow!("probing the agent's own code: {e}{}", chain(&e)))?;
            let ns = ns_per_call();
            prog.detach(link).context("detaching the trap measurement")?;
            Ok(ns)
        };
        let bare = ns_per_call();
        let emulated = probed_ns(offset + TRAP_TARGET_PUSH)?;
        let stepped = probed_ns(offset + TRAP_TARGET_MOV)?;
        let costs = TrapCosts { trap_ns: (emulated - bare).max(0.0), step_ns: (stepped - emulated).max(0.0) };
        self.alloc_trap_costs = Some(costs);
        Ok(costs)
    }

    /// Whether allocator probes are in.
    pub fn probes_allocators(&self) -> bool {
        !self.alloc_links.is_empty()
    }

    /// What a hit of the allocator probes costs, once measured.
    pub fn alloc_trap_costs(&self) -> Option<TrapCosts> {
        self.alloc_trap_costs
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

// What the trap measurement probes, written out so that its instructions are known: a push,
// which the kernel emulates (since 6.10; before, it steps it too), and a mov, which it steps.
std::arch::global_asm!(
    ".pushsection .text.ember_trap_target,\"ax\",@progbits",
    ".globl ember_trap_target",
    ".type ember_trap_target,@function",
    "ember_trap_target:",
    "push rbp",
    "mov rax, rdi",
    "pop rbp",
    "ret",
    ".size ember_trap_target, .-ember_trap_target",
    ".popsection",
);
const TRAP_TARGET_PUSH: u64 = 0;
const TRAP_TARGET_MOV: u64 = 1;

extern "C" {
    fn ember_trap_target(address: u64) -> u64;
}

/// Average ns of a call of `ember_trap_target`.
fn ns_per_call() -> f64 {
    let start = Instant::now();
    for _ in 0..TRAP_CALLS {
        black_box(unsafe { ember_trap_target(black_box(0)) });
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
