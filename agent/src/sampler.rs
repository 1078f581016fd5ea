//! Kernel side, seen from userspace: loads the BPF object with the run's settings, attaches
//! the sampling program to every online CPU, and drains the double-buffered maps.
use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use agent_common::{counter, names, SampleKey};
use anyhow::{Context as _, Result};
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap, PerCpuValues, RingBuf, StackTraceMap},
    programs::{
        perf_event::{HardwareEvent, PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        PerfEvent, TracePoint,
    },
    util::{nr_cpus, online_cpus},
    Ebpf, EbpfLoader,
};

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ember"));

/// The perf event that drives sampling. Software `cpu-clock` works everywhere, including VMs
/// without a PMU; hardware events need one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Event {
    CpuClock,
    TaskClock,
    Cycles,
    Instructions,
}

impl Event {
    fn config(self) -> PerfEventConfig {
        match self {
            Event::CpuClock => PerfEventConfig::Software(SoftwareEvent::CpuClock),
            Event::TaskClock => PerfEventConfig::Software(SoftwareEvent::TaskClock),
            Event::Cycles => PerfEventConfig::Hardware(HardwareEvent::CpuCycles),
            Event::Instructions => PerfEventConfig::Hardware(HardwareEvent::Instructions),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Event::CpuClock => "cpu-clock",
            Event::TaskClock => "task-clock",
            Event::Cycles => "cycles",
            Event::Instructions => "instructions",
        }
    }
}

#[derive(Clone, Debug)]
pub struct SamplerOptions {
    pub event: Event,
    pub frequency: u64,
    /// Distinct (thread, stacks) keys per interval; samples beyond are counted as `map_full`.
    pub max_keys: u32,
    /// Distinct stacks per interval (user and kernel share the map).
    pub max_stacks: u32,
    /// Sample only these processes (empty: all).
    pub pids: Vec<u32>,
    /// Sample only this cgroup v2 id.
    pub cgroup_id: Option<u64>,
}

/// One drained buffer set: what the kernel aggregated over one interval.
#[derive(Debug, Default)]
pub struct RawInterval {
    pub start: Option<SystemTime>,
    pub end: Option<SystemTime>,
    pub counts: Vec<(SampleKey, u64)>,
    pub stacks: HashMap<u32, Vec<u64>>,
    /// Summed over CPUs, indexed by `agent_common::counter`.
    pub counters: [u64; counter::COUNT as usize],
}

struct BufferSet {
    counts: PerCpuHashMap<MapData, SampleKey, u64>,
    stacks: StackTraceMap<MapData>,
    counters: PerCpuArray<MapData, u64>,
}

pub struct Sampler {
    // Owns the programs; dropping it detaches them.
    _ebpf: Ebpf,
    sets: [BufferSet; 2],
    active: Array<MapData, u32>,
    active_index: u32,
    active_since: SystemTime,
    nr_cpus: usize,
}

impl Sampler {
    /// Loads and attaches the programs. Also returns the ring buffer that announces new
    /// processes, for the caller to poll.
    pub fn start(options: &SamplerOptions) -> Result<(Sampler, RingBuf<MapData>)> {
        let filter_tgids = u8::from(!options.pids.is_empty());
        let cgroup = options.cgroup_id.unwrap_or(0);
        let mut loader = EbpfLoader::new();
        // The programs read no kernel structures (no CO-RE relocations), so parsing the
        // kernel's BTF (~20 MB of peak memory) buys nothing.
        loader.btf(None);
        loader.override_global(names::FILTER_TGIDS, &filter_tgids, true);
        loader.override_global(names::FILTER_CGROUP, &cgroup, true);
        for name in names::COUNTS {
            loader.map_max_entries(name, options.max_keys.max(1));
        }
        for name in names::STACKS {
            loader.map_max_entries(name, options.max_stacks.max(1));
        }
        let mut ebpf = loader.load(OBJECT).map_err(|e| anyhow::anyhow!("loading the BPF object failed: {e}{}", chain(&e)))?;

        let mut filter: BpfHashMap<_, u32, u8> = BpfHashMap::try_from(take(&mut ebpf, names::TGID_FILTER)?)?;
        for pid in &options.pids {
            filter.insert(pid, 1, 0).context("writing the pid filter")?;
        }

        let exec: &mut TracePoint = ebpf.program_mut(names::PROG_EXEC).context("program missing")?.try_into()?;
        exec.load().map_err(|e| anyhow::anyhow!("loading {}: {e}{}", names::PROG_EXEC, chain(&e)))?;
        exec.attach("sched", "sched_process_exec").context(
            "attaching to tracepoint sched:sched_process_exec (is tracefs mounted at /sys/kernel/tracing?)",
        )?;

        let prog: &mut PerfEvent = ebpf.program_mut(names::PROG_SAMPLE).context("program missing")?.try_into()?;
        prog.load().map_err(|e| anyhow::anyhow!("loading {}: {e}{}", names::PROG_SAMPLE, chain(&e)))?;
        let cpus = online_cpus().map_err(|(path, e)| anyhow::anyhow!("reading {path}: {e}"))?;
        for cpu in cpus {
            prog.attach(
                options.event.config(),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(options.frequency),
                false,
            )
            .map_err(|e| perf_open_error(options.event, cpu, &e))?;
        }

        let sets = [0, 1].map(|i| -> Result<BufferSet> {
            Ok(BufferSet {
                counts: PerCpuHashMap::try_from(take(&mut ebpf, names::COUNTS[i])?)?,
                stacks: StackTraceMap::try_from(take(&mut ebpf, names::STACKS[i])?)?,
                counters: PerCpuArray::try_from(take(&mut ebpf, names::COUNTERS[i])?)?,
            })
        });
        let [a, b] = sets;
        let sets = [a?, b?];
        let active = Array::try_from(take(&mut ebpf, names::ACTIVE_SET)?)?;
        let process_events = RingBuf::try_from(take(&mut ebpf, names::PROCESS_EVENTS)?)?;
        let nr_cpus = nr_cpus().map_err(|(path, e)| anyhow::anyhow!("reading {path}: {e}"))?;
        // The filter map must outlive loading only; the program keeps its own reference.
        drop(filter);
        let sampler = Sampler { _ebpf: ebpf, sets, active, active_index: 0, active_since: SystemTime::now(), nr_cpus };
        Ok((sampler, process_events))
    }

    /// Switches the programs to the other buffer set and returns the contents of the one they
    /// wrote to until now, leaving it empty. Every sample lands in exactly one interval.
    pub fn drain(&mut self) -> Result<RawInterval> {
        let idle = self.active_index;
        self.active_index ^= 1;
        self.active.set(0, self.active_index, 0).context("switching buffer sets")?;
        let end = SystemTime::now();
        let start = std::mem::replace(&mut self.active_since, end);
        // A program that read the old index just before the switch may still be writing to
        // the old set; BPF programs run for microseconds and cannot sleep, so a short pause
        // lets them finish.
        std::thread::sleep(Duration::from_millis(2));

        let set = &mut self.sets[idle as usize];
        let mut interval = RawInterval { start: Some(start), end: Some(end), ..Default::default() };
        let keys: Vec<SampleKey> = set.counts.keys().collect::<Result<_, _>>().context("reading sample keys")?;
        for key in keys {
            if let Ok(values) = set.counts.get(&key, 0) {
                interval.counts.push((key, values.iter().sum()));
            }
            set.counts.remove(&key).context("clearing sample counts")?;
        }
        let ids: Vec<u32> = set.stacks.stack_ids().collect::<Result<_, _>>().context("reading stack ids")?;
        for id in ids {
            if let Ok(stack) = set.stacks.get(&id, 0) {
                interval.stacks.insert(id, stack.frames().iter().map(|f| f.ip).collect());
            }
            set.stacks.remove(&id).context("clearing stacks")?;
        }
        for index in 0..counter::COUNT {
            let zero = PerCpuValues::try_from(vec![0u64; self.nr_cpus])?;
            let values = set.counters.get(&index, 0).context("reading counters")?;
            interval.counters[index as usize] = values.iter().sum();
            set.counters.set(index, zero, 0).context("clearing counters")?;
        }
        Ok(interval)
    }
}

fn take(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map> {
    ebpf.take_map(name).with_context(|| format!("BPF object has no map {name}"))
}

/// Appends the sources of an error, which aya keeps out of its Display.
fn chain(error: &dyn std::error::Error) -> String {
    let mut out = String::new();
    let mut source = error.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
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
