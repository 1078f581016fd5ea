//! Collection: owns the loaded sampler, reacts to new-process announcements from the kernel
//! (capturing mappings while the process runs), and turns each drain into a resolved interval.
use agent_common::{kind, ProcessEvent};
use anyhow::{Context as _, Result};
use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

use crate::{
    metrics,
    procs::ProcessTable,
    resolve::{resolve, DropReasons, ResolvedInterval},
    sampler::{Sampler, SamplerOptions},
    targets::Targets,
    tracefs::Format,
};

pub struct Collector {
    sampler: Sampler,
    process_events: AsyncFd<RingBuf<MapData>>,
    pub processes: ProcessTable,
    targets: Targets,
    drop_reasons: DropReasons,
    /// Capacities of the counts and stacks maps, for the fill metrics.
    capacity: (u32, u32),
}

impl Collector {
    /// Must be called inside a tokio runtime.
    pub fn start(options: &SamplerOptions, targets: Targets) -> Result<Collector> {
        let (sampler, ring) = Sampler::start(options)?;
        let drop_reasons = if options.net.iter().any(|e| e.kind() == kind::KFREE_SKB) {
            Format::read("skb", "kfree_skb")?.symbols("reason")
        } else {
            DropReasons::new()
        };
        // SAFETY: the ring buffer owns its map fd, which stays open and unchanged for as
        // long as the AsyncFd owns the ring buffer.
        let process_events = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
            .map_err(|e| anyhow::anyhow!("registering the process ring buffer: {e}"))?;
        Ok(Collector {
            sampler,
            process_events,
            processes: ProcessTable::default(),
            targets,
            drop_reasons,
            capacity: (options.max_keys, options.max_stacks),
        })
    }

    /// Waits for the kernel to announce new processes and captures them. Loop on it.
    pub async fn capture_new_processes(&mut self) -> Result<()> {
        let mut guard = self.process_events.readable_mut().await.context("polling the process ring buffer")?;
        guard.clear_ready();
        drop(guard);
        self.read_process_events();
        Ok(())
    }

    fn read_process_events(&mut self) {
        let ring = self.process_events.get_mut();
        let mut tgids = Vec::new();
        while let Some(item) = ring.next() {
            if item.len() >= size_of::<ProcessEvent>() {
                // SAFETY: the kernel wrote a ProcessEvent (#[repr(C)], shared definition).
                let event: ProcessEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                tgids.push(event.tgid);
            }
        }
        for tgid in tgids {
            self.processes.capture(tgid);
        }
    }

    /// Ends the current interval: drains the kernel's buffers and resolves the samples.
    pub fn drain(&mut self) -> Result<ResolvedInterval> {
        self.read_process_events();
        let raw = self.sampler.drain()?;
        for (map, entries, capacity) in [("counts", raw.counts.len(), self.capacity.0), ("stacks", raw.stacks.len(), self.capacity.1)] {
            metrics::set("ember_map_entries", &[("map", map)], entries as f64);
            metrics::set("ember_map_capacity", &[("map", map)], capacity as f64);
            metrics::set("ember_map_fill_ratio", &[("map", map)], entries as f64 / f64::from(capacity.max(1)));
        }
        let interval = resolve(raw, &mut self.processes, &mut self.targets, &self.drop_reasons);
        self.processes.sweep();
        metrics::set("ember_processes_tracked", &[], self.processes.len() as f64);
        Ok(interval)
    }
}
