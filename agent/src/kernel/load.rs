//! Loads the BPF object with the run's settings and attaches its programs: the perf event on
//! every online CPU, and the tracepoints the settings enable. What it returns owns the
//! programs: dropping it detaches them.
use std::{
    collections::HashMap,
    os::fd::{AsFd as _, AsRawFd as _},
    time::SystemTime,
};

use agent_common::{names, LiveAllocation, LiveKey, OffCpuStart, Rates, SampleKey, SampleValue, SocketOwner, UserStack};
use anyhow::{Context as _, Result};
use aya::{
    maps::{Array, HashMap as BpfHashMap, IterableMap as _, MapData, PerCpuArray, PerCpuHashMap, RingBuf, StackTraceMap},
    programs::{
        trace_point::TracePointLinkId,
        uprobe::UProbeLinkId,
        PerfEvent, ProgramError, ProgramInfo, TracePoint, UProbe,
    },
    util::{nr_cpus, online_cpus},
    Ebpf, EbpfLoader,
};

use super::{
    accounting::RunTimeStats,
    aya_errors::chain,
    announce::Announcements,
    barrier::ProgramBarrier,
    events::KernelSettings,
    btf::Btf,
    alloc_sampling::{gap_table, LiveSet},
    layouts::{area_layout, exit_group_dead, fork_child_pid, net_layouts, request_layout, switch_layout, task_layout, transmit_attribution},
    sampling::{FaultSampling, Paused, PerfSampling, SamplingRates},
    unwind_maps::UnwindMaps,
    Stack,
};

/// Executable mappings (with unwind tables) of all processes together: ~20 per process on a
/// typical host, 32 bytes each.
const MAPPING_SLOTS: u32 = 65536;

/// The off-CPU program's tracepoint.
pub(super) const SCHED_SWITCH: (&str, &str) = ("sched", "sched_switch");

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ember"));

pub(super) struct BufferSet {
    pub(super) counts: PerCpuHashMap<MapData, SampleKey, SampleValue>,
    pub(super) stacks: StackTraceMap<MapData>,
    pub(super) user_stacks: BpfHashMap<MapData, u32, UserStack>,
}

pub struct Sampler {
    /// Owns the programs: dropping it detaches them (`stop`).
    pub(super) ebpf: Option<Ebpf>,
    /// The on-CPU perf events (on-CPU sampling only).
    pub(super) perf: Option<PerfSampling>,
    /// The page-fault events (the `faults` group only).
    pub(super) faults: Option<FaultSampling>,
    pub(super) rates: SamplingRates,
    pub(super) rates_map: Array<MapData, Rates>,
    pub(super) barrier: ProgramBarrier,
    pub(super) sets: [BufferSet; 2],
    /// Both sets' counters (`names::COUNTERS`).
    pub(super) counters: PerCpuArray<MapData, u64>,
    pub(super) active: Array<MapData, u32>,
    /// Interval number; the programs write to set `generation & 1`.
    pub(super) generation: u32,
    pub(super) active_index: u32,
    pub(super) active_since: SystemTime,
    pub(super) nr_cpus: usize,
    /// Per CPU (by id), what on-CPU events closed since the last drain ran after their last
    /// tick (ns): the drain adds it to the samples that came next (`rates::spread_unsampled`).
    pub(super) unsampled: Vec<u64>,
    /// The off-CPU program's attachment, while it is attached (off-CPU only; the CPU
    /// budget pauses it).
    pub(super) switch_link: Option<TracePointLinkId>,
    /// Threads blocked off-CPU, with where they blocked (off-CPU only).
    pub(super) off_cpu_start: Option<BpfHashMap<MapData, u32, OffCpuStart>>,
    /// Sockets' last senders (transmit attribution only).
    pub(super) sock_owner: Option<BpfHashMap<MapData, u64, SocketOwner>>,
    /// Each set's stacks as read at its last drain, by (user, id).
    pub(super) last_stacks: [HashMap<(bool, u32), Stack>; 2],
    /// The kernel's accounting of the programs' run time, on under a CPU budget.
    pub(super) run_time_stats: Option<RunTimeStats>,
    /// Sampled allocations not yet freed (the `alloc` group only), and what the drain keeps
    /// of them.
    pub(super) live: Option<BpfHashMap<MapData, LiveKey, LiveAllocation>>,
    pub(super) live_set: Option<LiveSet>,
    /// The allocator probes in: by process, the program and its link.
    pub(super) alloc_links: HashMap<u32, Vec<(&'static str, UProbeLinkId)>>,
    /// What one of their traps costs here (ns), once measured.
    pub(super) alloc_trap_costs: Option<super::probe_costs::TrapCosts>,
}

impl Sampler {
    /// Loads and attaches the programs. Also returns the kernel's announcements of new
    /// processes, for the caller to poll, and the user-stack walker's maps, for the caller to
    /// fill. Must be called inside a tokio runtime.
    pub fn start(settings: &KernelSettings) -> Result<(Sampler, Announcements, UnwindMaps)> {
        let filter_tgids = u8::from(!settings.pids.is_empty());
        let cgroup = settings.cgroup_id.unwrap_or(0);
        let measure_run_time = u8::from(settings.measure_run_time);
        let switch = settings.off_cpu.as_ref().map(|_| switch_layout()).transpose()?;
        let (fork_child_pid, exit_group_dead) = (fork_child_pid()?, exit_group_dead()?);
        let area_layout = area_layout();
        let requests = settings.fault_period.map(|_| request_layout()).transpose()?;
        let net_layouts = net_layouts(&settings.net)?;
        let btf = Btf::from_sys_fs()?;
        let task_layout = task_layout(&btf)?;
        let attribution = transmit_attribution(&settings.net, &btf)?;
        drop(btf);
        let mut loader = EbpfLoader::new();
        // The programs get the kernel structures' offsets they need as globals (`layouts`),
        // not by CO-RE relocations, so aya's parse of the kernel's BTF (~20 MB of peak
        // memory) buys nothing.
        loader.btf(None);
        loader.override_global(names::FILTER_TGIDS, &filter_tgids, true);
        loader.override_global(names::FILTER_CGROUP, &cgroup, true);
        loader.override_global(names::MEASURE_RUN_TIME, &measure_run_time, true);
        loader.override_global(names::FORK_CHILD_PID, &fork_child_pid, true);
        loader.override_global(names::EXIT_GROUP_DEAD, &exit_group_dead, true);
        loader.override_global(names::TASK_LAYOUT, &task_layout, true);
        if let Some(layout) = &area_layout {
            loader.override_global(names::AREA_LAYOUT, layout, true);
        }
        if let Some(layout) = &requests {
            loader.override_global(names::REQUEST_LAYOUT, layout, true);
        }
        let gaps = settings.alloc.as_ref().map(|alloc| gap_table(alloc.mean_bytes));
        if let Some(gaps) = &gaps {
            loader.override_global(names::ALLOC_GAP_TABLE, &gaps[..], true);
        }
        loader.map_max_entries(names::LIVE_ALLOCATIONS, settings.alloc.as_ref().map_or(1, |a| a.max_live));
        if settings.alloc.is_none() {
            loader.map_max_entries(names::ALLOC_IN_CALL, 1);
        }
        loader.override_global(names::NET_LAYOUTS, &net_layouts[..], true);
        if let Some((skb_sk, send_sk, send_ret)) = &attribution {
            loader.override_global(names::SKB_SK_OFFSET, skb_sk, true);
            loader.override_global(names::SEND_SK_OFFSET, send_sk, true);
            loader.override_global(names::SEND_RET_OFFSET, send_ret, true);
        }
        if let (Some(off_cpu), Some(switch)) = (&settings.off_cpu, &switch) {
            loader.override_global(names::SWITCH_LAYOUT, switch, true);
            loader.override_global(names::OFF_CPU_STATES, &off_cpu.states, true);
            loader.override_global(names::OFF_CPU_MIN_NS, &off_cpu.min_block_ns, true);
            loader.override_global(names::OFF_CPU_MAX_NS, &off_cpu.max_block_ns, true);
        }
        // Features that are off get one-entry maps: preallocated maps cost kernel memory.
        loader.map_max_entries(names::OFF_CPU_START, settings.off_cpu.as_ref().map_or(1, |o| o.max_threads.max(1)));
        if attribution.is_none() {
            loader.map_max_entries(names::SOCK_OWNER, 1);
        }
        for name in names::COUNTS {
            loader.map_max_entries(name, settings.max_keys.max(1));
        }
        for name in names::STACKS.into_iter().chain(names::USER_STACKS) {
            loader.map_max_entries(name, settings.max_stacks.max(1));
        }
        loader.map_max_entries(names::UNWIND_ROWS, settings.unwind_rows.max(1));
        // A page (UNWIND_PAGE) of code has about ten rows; the sparsest table measured,
        // librustc_driver's, has 5.7: an index entry per four rows is enough.
        loader.map_max_entries(names::UNWIND_PAGES, (settings.unwind_rows / 4).max(1));
        loader.map_max_entries(names::MAPPINGS, MAPPING_SLOTS);
        let mut ebpf = loader.load(OBJECT).map_err(|e| anyhow::anyhow!("loading the BPF object failed: {e}{}", chain(&e)))?;

        let mut filter: BpfHashMap<_, u32, u8> = BpfHashMap::try_from(take(&mut ebpf, names::TGID_FILTER)?)?;
        for pid in &settings.pids {
            filter.insert(pid, 1, 0).context("writing the pid filter")?;
        }

        attach_tracepoint(&mut ebpf, names::PROG_EXEC, "sched", "sched_process_exec")?;
        attach_tracepoint(&mut ebpf, names::PROG_EXIT, "sched", "sched_process_exit")?;
        attach_tracepoint(&mut ebpf, names::PROG_FORK, "sched", "sched_process_fork")?;
        // Cgroup v2 moves, and v1's transfers of a cgroup's tasks: the programs keep each
        // thread's cgroup id until one of these.
        attach_tracepoints(&mut ebpf, names::PROG_CGROUP_MOVED, &[("cgroup", "cgroup_attach_task"), ("cgroup", "cgroup_transfer_tasks")])?;
        if area_layout.is_some() {
            attach_tracepoint(&mut ebpf, names::PROG_AREA_PLACED, "mmap", "vm_unmapped_area")?;
        }
        let switch_link = match settings.off_cpu {
            Some(_) => Some(attach_loaded(load_tracepoint(&mut ebpf, names::PROG_SWITCH)?, SCHED_SWITCH)?),
            None => None,
        };
        if attribution.is_some() {
            attach_tracepoint(&mut ebpf, names::PROG_SEND, "sock", "sock_send_length")?;
        }
        for event in &settings.net {
            let (category, name) = event.tracepoint();
            attach_tracepoint(&mut ebpf, event.program(), category, name)?;
        }
        let rates = SamplingRates {
            frequency: settings.frequency,
            off_cpu_ratio: settings.off_cpu.as_ref().map_or(1, |o| o.ratio.max(1)),
            net_ratio: 1,
            fault_ratio: 1,
            paused: Paused::default(),
        };
        let mut rates_map: Array<_, Rates> = Array::try_from(take(&mut ebpf, names::RATES)?)?;
        rates_map.set(0, rates.kernel(), 0).context("writing sampling ratios")?;
        let cpus = online_cpus().map_err(|(path, e)| anyhow::anyhow!("reading {path}: {e}"))?;
        let perf = if settings.cpu {
            let mut perf = PerfSampling::new(settings.event, cpus.clone());
            perf.attach(load_perf_event(&mut ebpf, names::PROG_SAMPLE)?, settings.frequency)?;
            Some(perf)
        } else {
            None
        };

        let faults = settings.fault_period.map(|period| FaultSampling::attach(load_perf_event(&mut ebpf, names::PROG_FAULT)?, cpus.clone(), period)).transpose()?;
        if faults.is_some() {
            attach_tracepoint(&mut ebpf, names::PROG_BRK, "syscalls", "sys_enter_brk")?;
            attach_tracepoint(&mut ebpf, names::PROG_MMAP, "syscalls", "sys_enter_mmap")?;
        }

        // Loaded now, attached to each chosen process's allocator by the resolve stage.
        if settings.alloc.is_some() {
            for program in names::ALLOC_PROGRAMS {
                load_uprobe(&mut ebpf, program)?;
            }
        }
        let live = match settings.alloc {
            Some(_) => Some(BpfHashMap::try_from(take(&mut ebpf, names::LIVE_ALLOCATIONS)?)?),
            None => None,
        };

        let sets = [0, 1].map(|i| -> Result<BufferSet> {
            Ok(BufferSet {
                counts: PerCpuHashMap::try_from(take(&mut ebpf, names::COUNTS[i])?)?,
                stacks: StackTraceMap::try_from(take(&mut ebpf, names::STACKS[i])?)?,
                user_stacks: BpfHashMap::try_from(take(&mut ebpf, names::USER_STACKS[i])?)?,
            })
        });
        let [a, b] = sets;
        let sets = [a?, b?];
        let counters = PerCpuArray::try_from(take(&mut ebpf, names::COUNTERS)?)?;
        let active = Array::try_from(take(&mut ebpf, names::ACTIVE_SET)?)?;
        let process_events = RingBuf::try_from(take(&mut ebpf, names::PROCESS_EVENTS)?)?;
        let told = BpfHashMap::try_from(take(&mut ebpf, names::UNMAPPED_TOLD)?)?;
        let nr_cpus = nr_cpus().map_err(|(path, e)| anyhow::anyhow!("reading {path}: {e}"))?;
        // The filter map must outlive loading only; the program keeps its own reference.
        drop(filter);
        let off_cpu_start = match settings.off_cpu {
            Some(_) => Some(BpfHashMap::try_from(take(&mut ebpf, names::OFF_CPU_START)?)?),
            None => None,
        };
        let sock_owner = match attribution {
            Some(_) => Some(BpfHashMap::try_from(take(&mut ebpf, names::SOCK_OWNER)?)?),
            None => None,
        };
        let unwind_maps = UnwindMaps::new(
            Array::try_from(take(&mut ebpf, names::UNWIND_ROWS)?)?,
            Array::try_from(take(&mut ebpf, names::UNWIND_PAGES)?)?,
            Array::try_from(take(&mut ebpf, names::MAPPINGS)?)?,
            BpfHashMap::try_from(take(&mut ebpf, names::PROCESS_MAPPINGS)?)?,
            BpfHashMap::try_from(take(&mut ebpf, names::EXE_TEMPLATES)?)?,
            BpfHashMap::try_from(take(&mut ebpf, names::PYTHON_PROCESSES)?)?,
        )?;
        let barrier = ProgramBarrier::new(active.map().fd().as_fd().as_raw_fd())?;
        let sampler = Sampler {
            ebpf: Some(ebpf),
            perf,
            faults,
            rates,
            rates_map,
            barrier,
            sets,
            counters,
            active,
            generation: 0,
            active_index: 0,
            active_since: SystemTime::now(),
            nr_cpus,
            unsampled: Vec::new(),
            switch_link,
            off_cpu_start,
            sock_owner,
            last_stacks: Default::default(),
            run_time_stats: if settings.measure_run_time { RunTimeStats::enable() } else { None },
            live,
            live_set: settings.alloc.as_ref().map(|alloc| LiveSet::new(alloc.mean_bytes, alloc.leak_age)),
            alloc_links: HashMap::new(),
            alloc_trap_costs: None,
        };
        Ok((sampler, Announcements::new(process_events, told)?, unwind_maps))
    }
}

impl Sampler {
    /// Whether off-CPU tracking runs (paused or not).
    pub fn tracks_off_cpu(&self) -> bool {
        self.off_cpu_start.is_some()
    }

    /// Detaches every program. The next drain's barrier waits for any still running, so what
    /// it reads is final and the last drain loses nothing.
    pub fn stop(&mut self) {
        self.ebpf = None;
    }
}

/// Loads a program as its type (aya's program types share no trait for `load`).
macro_rules! load_as {
    ($type:ty, $ebpf:expr, $program:expr) => {{
        let program = $program;
        let prog: &mut $type = $ebpf.program_mut(program).context("program missing")?.try_into()?;
        prog.load().map_err(|e| anyhow::anyhow!("loading {program}: {e}{}", chain(&e)))?;
        log_verified(program, prog.info());
        Ok(prog)
    }};
}

/// Loads a perf_event program.
fn load_perf_event<'a>(ebpf: &'a mut Ebpf, program: &str) -> Result<&'a mut PerfEvent> {
    load_as!(PerfEvent, ebpf, program)
}

/// Loads a tracepoint program.
fn load_tracepoint<'a>(ebpf: &'a mut Ebpf, program: &str) -> Result<&'a mut TracePoint> {
    load_as!(TracePoint, ebpf, program)
}

/// Loads a uprobe program (attached later, to chosen processes).
fn load_uprobe<'a>(ebpf: &'a mut Ebpf, program: &str) -> Result<&'a mut UProbe> {
    load_as!(UProbe, ebpf, program)
}

/// Loads one tracepoint program and attaches it to each of `tracepoints` (category, name).
fn attach_tracepoints(ebpf: &mut Ebpf, program: &str, tracepoints: &[(&str, &str)]) -> Result<()> {
    let prog = load_tracepoint(ebpf, program)?;
    tracepoints.iter().try_for_each(|&tracepoint| attach_loaded(prog, tracepoint).map(drop))
}

/// Attaches a loaded tracepoint program to `tracepoint` (category, name).
pub(super) fn attach_loaded(prog: &mut TracePoint, (category, name): (&str, &str)) -> Result<TracePointLinkId> {
    prog.attach(category, name).map_err(|e| anyhow::anyhow!("attaching to tracepoint {category}:{name}: {e}{}", chain(&e)))
}

/// Loads and attaches one tracepoint program.
fn attach_tracepoint(ebpf: &mut Ebpf, program: &str, category: &str, name: &str) -> Result<()> {
    attach_tracepoints(ebpf, program, &[(category, name)])
}

/// Logs how many instructions the verifier processed for a program, of the 1,000,000 it
/// allows: the stack walker's programs come close, and a change that crosses the limit fails
/// every load with "Argument list too long".
fn log_verified(program: &str, info: Result<ProgramInfo, ProgramError>) {
    if let Some(processed) = info.ok().and_then(|info| info.verified_instruction_count()) {
        tracing::debug!(program, processed, "verified");
    }
}

fn take(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map> {
    ebpf.take_map(name).with_context(|| format!("BPF object has no map {name}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use agent_common::names;

    use super::*;
    use crate::kernel::{AllocSettings, KernelSettings, NetEvent, OffCpuSettings};

    /// The real programs (needs root), every one the settings can load. The verifier's work
    /// is the agent's start-up: about 2.5 µs of CPU per instruction it processes, every time
    /// the agent starts, and seconds of wall time on a busy host. The stack walk's step is
    /// where it grows: a step whose state the verifier cannot match with an earlier one's is
    /// checked again for every frame (300,000 instructions a program when it was so).
    #[test]
    fn the_verifier_checks_each_program_in_few_instructions() {
        assert_eq!(unsafe { libc::geteuid() }, 0, "this test loads BPF programs: run it as root");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _entered = runtime.enter();
        let settings = KernelSettings {
            cpu: true,
            off_cpu: Some(OffCpuSettings::for_tests()),
            net: (0..names::NET_PROGRAMS.len()).map(NetEvent).collect(),
            fault_period: Some(1000),
            alloc: Some(AllocSettings { mean_bytes: 1 << 19, max_live: 64, leak_age: Duration::from_secs(60), probe_for: None, cgroup: None, pods: None }),
            pids: vec![std::process::id()],
            ..KernelSettings::for_tests()
        };
        let (sampler, _announcements, _unwind_maps) = Sampler::start(&settings).expect("starting the sampler with every program");
        let programs = sampler.ebpf.as_ref().expect("the programs are loaded").programs();
        let verified: Vec<(String, Option<u32>)> = programs.map(|(name, program)| (name.to_string(), program.info().ok().and_then(|i| i.verified_instruction_count()))).collect();
        println!("instructions verified: {verified:?}");
        assert!(verified.iter().all(|(_, n)| n.is_some()), "every program of the object is loaded: {verified:?}");
        let counts = verified.iter().map(|(name, n)| (name, n.unwrap_or(0)));
        let total: u32 = counts.clone().map(|(_, n)| n).sum();
        let dearest = counts.max_by_key(|(_, n)| *n).expect("programs");
        // A program the walk made 300,000 took 0.7 s; all of them together under 1 s.
        assert!(dearest.1 <= 60_000, "{} took {} instructions to verify", dearest.0, dearest.1);
        assert!(total <= 400_000, "{total} instructions verified in all: {verified:?}");
    }
}
