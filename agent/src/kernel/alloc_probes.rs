//! The `alloc` group's probes: attached to one process's allocator at a time (a uprobe with a
//! pid traps in that process only; without one it would trap in every process that maps the
//! file), and taken out together when their time is up.
use std::{num::NonZeroU32, path::Path};

use agent_common::names;
use anyhow::{Context as _, Result};
use aya::programs::{
    uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    UProbe,
};

use super::{aya_errors::chain, load::Sampler};

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
        self.alloc_links.extend(links);
        Ok(count)
    }

    /// Takes every allocator probe out, and forgets the live allocations they tracked (their
    /// frees would go unseen from now on).
    pub fn unprobe_allocators(&mut self) -> Result<()> {
        let links: Vec<(&'static str, UProbeLinkId)> = std::mem::take(&mut self.alloc_links);
        if let Some(ebpf) = self.ebpf.as_mut() {
            for (program, link) in links {
                let prog: &mut UProbe = ebpf.program_mut(program).context("program missing")?.try_into()?;
                prog.detach(link).with_context(|| format!("detaching {program}"))?;
            }
        }
        self.forget_live_allocations()
    }
}
