//! Stage 2, resolve: owns the loaded kernel side, captures new processes when the kernel
//! announces them (their mappings, while they still run), and turns each drain into a
//! resolved interval of processes, cgroup labels and binary offsets. The commands call it.
mod alloc_members;
mod allocator;
mod binary;
mod call_sites;
mod cgroups;
mod code_areas;
mod interval;
mod jemalloc;
mod life;
mod open;
mod perf_map;
pub(crate) mod probe_site;
mod process_memory;
pub mod pods;
mod proc_dir;
mod procs;
mod python;
pub mod relabel;
mod targets;
mod tcmalloc;
mod untrusted;
mod vdso;

use std::{collections::HashMap, time::Instant};

use agent_common::kind;
use anyhow::{Context as _, Result};

pub use binary::{build_id_of, Binary, BinaryOpened};
pub use cgroups::{cgroup_dir, cgroup_id};
pub use interval::{ResolvedInterval, ResolvedSample, Site};
pub use procs::UserAddress;
pub use python::PythonFrame;
pub use targets::Targets;
#[cfg(fuzzing)]
pub use targets::from_cgroup_path;
#[cfg(fuzzing)]
pub(crate) use {allocator::functions_in as allocator_sites, jemalloc::profiling_in as jemalloc_profiling_in, life::parse_stat, perf_map::{own_pid, PerfMap}, python::fuzzing as python_parsers, vdso::memory_file};

use crate::{
    kernel::{tracefs::Format, Announcements, HostStat, KernelSettings, Sampler},
    ops::metrics,
    unwind::Unwinder,
};
use alloc_members::{Members, FOLLOW_EVERY};
use interval::{resolve, DropReasons};
use life::Life;
use procs::{Captured, ProcessTable};
use python::Pythons;

pub struct Resolver {
    sampler: Sampler,
    announcements: Announcements,
    processes: ProcessTable,
    unwinder: Unwinder,
    pythons: Pythons,
    targets: Targets,
    drop_reasons: DropReasons,
    /// Capacities of the counts and stacks maps, for the fill metrics.
    capacity: (u32, u32),
    /// When the allocator probes come out.
    alloc_until: Option<Instant>,
    /// The cgroup or pods whose processes' allocators are probed, while they are (the
    /// `alloc` group given a cgroup or a pod selector).
    alloc_members: Option<Members>,
    /// Per process, the walker's tells of unknown code this interval that turned out not to
    /// be code, and that it may tell again (`not_code`).
    retold: HashMap<u32, u32>,
    /// The host's counters at the last drain that could read them.
    host: Option<HostStat>,
}

/// Tells of unknown code that was not code, per process and interval, after which the
/// walker's once-per-megabyte-and-interval rule holds again.
const RETELLS: u32 = 4;

impl Resolver {
    /// Loads and attaches the programs. Must be called inside a tokio runtime. `opened` is
    /// told of each binary as it is first opened.
    pub fn start(settings: &KernelSettings, targets: Targets, opened: Option<BinaryOpened>) -> Result<Resolver> {
        let (sampler, announcements, unwind_maps) = Sampler::start(settings)?;
        binary::raise_open_file_limit();
        let drop_reasons = if settings.net.iter().any(|e| e.kind() == kind::KFREE_SKB) {
            Format::read("skb", "kfree_skb")?.symbols("reason")
        } else {
            DropReasons::new()
        };
        let mut resolver = Resolver {
            sampler,
            announcements,
            processes: ProcessTable::new(opened),
            unwinder: Unwinder::new(unwind_maps),
            pythons: Pythons::default(),
            targets,
            drop_reasons,
            capacity: (settings.max_keys, settings.max_stacks),
            alloc_until: None,
            alloc_members: None,
            retold: HashMap::new(),
            host: HostStat::read(),
        };
        // Processes that already run are loaded now, so that their first samples already have
        // complete stacks (a process is otherwise loaded when first sampled). With a cgroup
        // filter, that is left to the first sample.
        let running = if !settings.pids.is_empty() {
            settings.pids.clone()
        } else if settings.cgroup_id.is_none() {
            procs::running_processes()
        } else {
            Vec::new()
        };
        for tgid in running {
            resolver.processes.capture(tgid, None, false);
        }
        resolver.load_unwind_tables();
        if let Some(alloc) = &settings.alloc {
            let costs = resolver.sampler.measure_trap_costs()?;
            tracing::info!(
                trap_ns = costs.trap_ns.round(), step_ns = costs.step_ns.round(),
                "an allocator probe's trap costs this much here (each allocator call pays two, each free one), and a step of the probed instruction this much more"
            );
            for &pid in &settings.pids {
                resolver.probe_allocator(pid)?;
            }
            resolver.alloc_members = match (&alloc.cgroup, &alloc.pods) {
                (Some(dir), _) => Some(Members::of_cgroup(dir.clone())),
                (None, Some(selector)) => {
                    let pods = resolver.targets.pods().cloned().context("the alloc group's pod selector needs this node's pods: set `kubernetes` in the config")?;
                    let root = cgroups::cgroup2_mount().context("no cgroup2 filesystem is mounted: pods' cgroups cannot be followed")?;
                    tracing::info!(selector = %selector, "alloc group: following the allocators of this node's pods that the selector selects");
                    Some(Members::of_pods(selector.clone(), pods, root))
                }
                (None, None) => None,
            };
            resolver.follow_alloc_members()?;
            resolver.alloc_until = alloc.probe_for.map(|duration| Instant::now() + duration);
        }
        Ok(resolver)
    }

    /// Puts the `alloc` group's probes on the allocator of process `pid`.
    fn probe_allocator(&mut self, pid: u32) -> Result<()> {
        let files = self.processes.code_files(pid);
        anyhow::ensure!(!files.is_empty(), "process {pid} could not be read: is it running?");
        let found = allocator::find(&files).with_context(|| format!("process {pid} maps no allocator Ember can probe (no file of it defines malloc)"))?;
        let sites = match self.own_sampling(pid, &found) {
            Some(sampling) => {
                tracing::info!(pid, period = sampling.period, "tcmalloc samples this process's allocations itself: probed on its own sampled path, not at every call");
                self.sampler.set_alloc_mean(pid, sampling.period);
                sampling.sites.to_vec()
            }
            None => {
                if found.functions.is_jemalloc && jemalloc::profiling_on(pid) {
                    tracing::info!(pid, "jemalloc samples this process's allocations itself (MALLOC_CONF prof:true), but exports no function of its sampled path: every allocator call is probed");
                }
                found.functions.sites.clone()
            }
        };
        let probes = self.sampler.probe_allocator(pid, &found.binary.open_path(), &sites)?;
        // Functions whose probe the kernel steps (no emulated instruction found to put it on).
        let stepped: Vec<&str> = sites.iter().filter(|f| f.stepped).map(|f| f.function).collect();
        tracing::info!(pid, allocator = found.binary.path, probes, stepped = stepped.join(","), "allocator probed");
        Ok(())
    }

    /// tcmalloc's own sampling in process `pid`, if its allocator has a sampled path and it
    /// is on there; says why not where it has one.
    fn own_sampling(&self, pid: u32, found: &allocator::Allocator) -> Option<tcmalloc::Sampling> {
        let path = found.functions.sampled_path.as_ref()?;
        let anchor_at = self.processes.address_of(pid, &found.binary, path.anchor_offset())?;
        match path.in_process(pid, anchor_at) {
            Ok(Some(sampling)) => Some(sampling),
            Ok(None) => {
                tracing::info!(pid, "tcmalloc's own sampling is off in this process (TCMALLOC_SAMPLE_PARAMETER unset): every allocator call is probed");
                None
            }
            Err(e) => {
                tracing::info!(pid, "tcmalloc's sampled path cannot be used ({e:#}): every allocator call is probed");
                None
            }
        }
    }

    /// Waits for the kernel to announce new processes and captures them; while the `alloc`
    /// group follows a cgroup, probes its new members too. Loop on it.
    pub async fn capture_new_processes(&mut self) -> Result<()> {
        if self.alloc_members.is_none() {
            self.announcements.readable().await?;
            self.capture_announced();
            return Ok(());
        }
        let announced = tokio::select! {
            ready = self.announcements.readable() => Some(ready),
            _ = tokio::time::sleep(FOLLOW_EVERY) => None,
        };
        if let Some(ready) = announced {
            ready?;
            self.capture_announced();
        }
        self.follow_alloc_members()
    }

    /// Probes the allocators of the processes that joined the followed cgroup or pods, and
    /// takes the probes out of those that left. Stops following once the CPU budget took the
    /// probes out for good.
    fn follow_alloc_members(&mut self) -> Result<()> {
        if self.sampler.rates().paused.alloc_probes {
            self.alloc_members = None;
        }
        let Some(members) = self.alloc_members.as_mut() else { return Ok(()) };
        let (joined, left) = members.changes();
        for pid in left {
            self.sampler.unprobe_process(pid)?;
        }
        if joined.is_empty() {
            return Ok(());
        }
        for &pid in &joined {
            self.processes.capture(pid, None, false);
        }
        self.load_unwind_tables();
        for pid in joined {
            // A process may be gone already, or be one without an allocator to probe (static).
            if let Err(e) = self.probe_allocator(pid) {
                tracing::info!(pid, "its allocator is not probed: {e:#}");
                metrics::add("ember_alloc_unprobed_total", &[], 1.0);
            }
        }
        Ok(())
    }

    fn capture_announced(&mut self) {
        let events = self.announcements.take();
        // A pid announced again in a later life (it exec'd) shows that life's mappings now:
        // its earlier lives in this batch are read too late (their samples stay unnamed).
        let latest: HashMap<u32, u16> = events.iter().map(|e| (e.tgid, e.tag)).collect();
        for event in events.iter().filter(|e| latest.get(&e.tgid) == Some(&e.tag)) {
            // An exec: read. A first event (pc 0): read unless this life was taken whole. A
            // walk through unknown code: read again unless known code holds it (the programs
            // tell each megabyte once per interval and life).
            let read = match event.pc {
                _ if event.at_exec == 1 => true,
                0 => !self.processes.whole(event.tgid, event.tag),
                pc => !self.processes.holds(event.tgid, event.tag, pc),
            };
            tracing::debug!(tgid = event.tgid, tag = event.tag, pc = format_args!("{:#x}", event.pc), read, "process announced");
            // At exec, what the kernel told of the executable may be enough: no /proc read.
            let from_template = event.from_template == 1;
            let told = event.at_exec == 1 && read && self.processes.capture_exec(event.tgid, event.tag, &event.exe, &event.comm, from_template);
            if from_template && !told {
                // Pointed at a template for an executable no longer known: until it is read,
                // walked by frame pointers, not by a template that may be freed.
                self.unwinder.forget_process(event.tgid);
            }
            if read && !told {
                self.processes.capture(event.tgid, Some(Life { tag: event.tag, start_ns: event.start_ns, start_stack: event.start_stack }), event.at_exec == 1);
                if event.pc != 0 && !self.processes.holds(event.tgid, event.tag, event.pc) {
                    self.not_code(event.tgid, event.pc);
                }
            }
        }
        self.load_unwind_tables();
    }

    /// A walk told of unknown code at `pc`, and the mappings read since hold none there: a
    /// wrong return address, or code not mapped yet. The walker may tell of that megabyte
    /// again this interval, a few times a process: a library dlopen'd there later is then
    /// read at once, and wrong addresses cost a few reads at most.
    fn not_code(&mut self, tgid: u32, pc: u64) {
        let told = self.retold.entry(tgid).or_insert(0);
        tracing::debug!(tgid, pc = format_args!("{pc:#x}"), retold = *told, "a walk told of unknown code where the mappings hold none");
        if *told < RETELLS {
            *told += 1;
            self.announcements.tell_again(tgid, pc);
        }
    }

    /// Loads the unwind tables and mappings of processes captured since the last call, and
    /// tells the walk of their interpreters.
    fn load_unwind_tables(&mut self) {
        for Captured { tgid, files, exec } in self.processes.take_captured() {
            let ran_python = self.pythons.runs_python(tgid);
            let python = self.pythons.capture(tgid, &self.processes.interpreter_candidates(tgid));
            let loaded = match (exec, files.as_slice()) {
                (Some(exec), [file]) if file.start == exec.code.start => self.unwinder.load_exec(tgid, file, exec.exe, exec.from_template, python),
                // Read since (its libraries): its executable's template is made from its code.
                (Some(exec), _) => self.unwinder.load_process(tgid, &files).and_then(|()| self.unwinder.template_for(tgid, exec.exe, &exec.code, python)).map(|_| false),
                (None, _) => self.unwinder.load_process(tgid, &files).map(|()| false),
            };
            let written_at_exec = loaded.as_ref().is_ok_and(|&written| written);
            if let Err(e) = loaded {
                tracing::warn!(tgid, "user stacks of this process are walked by frame pointers only: {e:#}");
            }
            // The walk's map is written only where it changes: not a syscall per process (nor
            // for one the exec program told of the interpreter of its template).
            if (python.is_some() || ran_python) && !written_at_exec {
                if let Err(e) = self.unwinder.set_python(tgid, python) {
                    tracing::warn!(tgid, "its Python frames are not walked: {e:#}");
                }
            }
        }
    }

    /// The programs' rates and run times, for the overhead governor.
    pub fn sampler(&mut self) -> &mut Sampler {
        &mut self.sampler
    }

    /// Detaches the programs, so that the next drain is the last and complete.
    pub fn stop_programs(&mut self) {
        self.sampler.stop();
    }

    /// Ends the current interval: drains the kernel's buffers and resolves the samples.
    pub fn drain(&mut self) -> Result<ResolvedInterval> {
        if self.alloc_until.is_some_and(|until| Instant::now() >= until) {
            self.alloc_until = None;
            self.alloc_members = None;
            self.sampler.unprobe_allocators()?;
            tracing::info!("allocator probes taken out: their time is up (alloc_for)");
        }
        untrusted::new_interval();
        self.pythons.new_interval();
        self.retold.clear();
        self.capture_announced();
        let raw = self.sampler.drain()?;
        let user_stacks = raw.stacks.keys().filter(|(user, _, _)| *user).count();
        let maps = [
            ("counts", raw.counts.len(), self.capacity.0),
            ("user_stacks", user_stacks, self.capacity.1),
            ("kernel_stacks", raw.stacks.len() - user_stacks, self.capacity.1),
        ];
        for (map, entries, capacity) in maps {
            metrics::set("ember_map_entries", &[("map", map)], entries as f64);
            metrics::set("ember_map_capacity", &[("map", map)], capacity as f64);
            metrics::set("ember_map_fill_ratio", &[("map", map)], entries as f64 / f64::from(capacity.max(1)));
        }
        let mut interval = resolve(raw, &mut self.processes, &mut self.pythons, &mut self.targets, &self.drop_reasons);
        interval.processes_unread = self.processes.take_unread();
        let host = HostStat::read();
        if let (Some(now), Some(last)) = (host, self.host) {
            interval.host = now.since(&last);
        }
        self.host = host.or(self.host);
        metrics::set("ember_host_cpu_steal_ratio", &[], interval.host.steal_share());
        // Resolving re-reads processes that mapped new code since their capture.
        self.load_unwind_tables();
        for tgid in self.processes.sweep() {
            self.unwinder.forget_process(tgid);
            if self.pythons.forget(tgid) {
                let _ = self.unwinder.set_python(tgid, None);
            }
        }
        let live = self.processes.live_tables();
        let readmitted = self.unwinder.retain(|key| live.contains(key));
        if !readmitted.is_empty() {
            self.processes.reload_mapping(&readmitted);
            self.load_unwind_tables();
        }
        metrics::set("ember_processes_tracked", &[], self.processes.len() as f64);
        Ok(interval)
    }
}
