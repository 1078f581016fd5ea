//! Kernel side, seen from userspace: loads the BPF object with the run's settings, attaches
//! the sampling program to every online CPU, and drains the double-buffered maps.
use std::{
    collections::{HashMap, HashSet},
    time::{Duration, SystemTime},
};

use agent_common::{
    counter, kind, names, FieldLayout, OffCpuStart, SampleKey, SampleValue, SocketOwner, SwitchLayout,
};
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

use crate::{btf::Btf, tracefs::Format};

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
    /// On-CPU sampling (perf event on every CPU).
    pub cpu: bool,
    pub event: Event,
    pub frequency: u64,
    /// Off-CPU tracking (sched_switch), if enabled.
    pub off_cpu: Option<OffCpuOptions>,
    /// Network tracepoints to record.
    pub net: Vec<NetEvent>,
    /// Distinct (thread, stack) keys per interval; events beyond are counted as `map_full`.
    pub max_keys: u32,
    /// Distinct stacks per interval (user and kernel share the map).
    pub max_stacks: u32,
    /// Only these processes (empty: all).
    pub pids: Vec<u32>,
    /// Only this cgroup v2 id.
    pub cgroup_id: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct OffCpuOptions {
    /// `agent_common::block_state` bits to include.
    pub states: u32,
    pub min_block_ns: u64,
    pub max_block_ns: u64,
    /// Record one block in `ratio` (counted `ratio` times).
    pub ratio: u32,
}

/// A network tracepoint Ember can record, as an index into `names::NET_PROGRAMS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetEvent(pub usize);

impl NetEvent {
    /// What `--net-events` defaults to: one transmit and one receive point (net_dev_xmit
    /// and napi_gro_receive_entry would count the same packets again), retransmits, drops.
    pub const DEFAULT: [&str; 4] = ["net:net_dev_queue", "net:netif_receive_skb", "tcp:tcp_retransmit_skb", "skb:kfree_skb"];

    /// Parses "category:name". Tracepoints this kernel lacks, or that Ember does not record,
    /// are one-line errors listing the alternatives.
    pub fn parse(text: &str) -> Result<NetEvent> {
        let Some((category, name)) = text.split_once(':') else {
            anyhow::bail!("network event {text:?} must be category:name, e.g. net:net_dev_queue");
        };
        if let Some(i) = names::NET_PROGRAMS.iter().position(|&(_, c, n)| c == category && n == name) {
            return Ok(NetEvent(i));
        }
        // Unknown to this kernel: the tracefs error lists what exists here.
        crate::tracefs::Format::read(category, name)?;
        let supported: Vec<String> = names::NET_PROGRAMS.iter().map(|(_, c, n)| format!("{c}:{n}")).collect();
        anyhow::bail!("tracepoint {text} is not one Ember records; it records {}", supported.join(", "))
    }

    pub fn kind(self) -> u8 {
        kind::FIRST_NET + self.0 as u8
    }

    pub fn tracepoint(self) -> (&'static str, &'static str) {
        let (_, category, name) = names::NET_PROGRAMS[self.0];
        (category, name)
    }
}

/// One drained buffer set: what the kernel aggregated over one interval.
#[derive(Debug, Default)]
pub struct RawInterval {
    pub start: Option<SystemTime>,
    pub end: Option<SystemTime>,
    pub counts: Vec<(SampleKey, SampleValue)>,
    /// Stacks by (buffer set, stack id): off-CPU keys may name the other set's map.
    pub stacks: HashMap<(u8, u32), Vec<u64>>,
    /// Summed over CPUs, indexed by `agent_common::counter`.
    pub counters: [u64; counter::COUNT as usize],
}

struct BufferSet {
    counts: PerCpuHashMap<MapData, SampleKey, SampleValue>,
    stacks: StackTraceMap<MapData>,
    counters: PerCpuArray<MapData, u64>,
}

pub struct Sampler {
    // Owns the programs; dropping it detaches them.
    _ebpf: Ebpf,
    sets: [BufferSet; 2],
    active: Array<MapData, u32>,
    /// Interval number; the programs write to set `generation & 1`.
    generation: u32,
    active_index: u32,
    active_since: SystemTime,
    nr_cpus: usize,
    /// Threads blocked off-CPU, with where they blocked (off-CPU only).
    off_cpu_start: Option<BpfHashMap<MapData, u32, OffCpuStart>>,
    /// Sockets' last senders (transmit attribution only).
    sock_owner: Option<BpfHashMap<MapData, u64, SocketOwner>>,
    /// Each set's stacks as read at its last drain, by id.
    last_stacks: [HashMap<u32, Vec<u64>>; 2],
}

impl Sampler {
    /// Loads and attaches the programs. Also returns the ring buffer that announces new
    /// processes, for the caller to poll.
    pub fn start(options: &SamplerOptions) -> Result<(Sampler, RingBuf<MapData>)> {
        let filter_tgids = u8::from(!options.pids.is_empty());
        let cgroup = options.cgroup_id.unwrap_or(0);
        let switch = options.off_cpu.as_ref().map(|_| switch_layout()).transpose()?;
        let net_layouts = net_layouts(&options.net)?;
        let attribution = transmit_attribution(&options.net)?;
        let mut loader = EbpfLoader::new();
        // The programs read no kernel structures (no CO-RE relocations), so parsing the
        // kernel's BTF (~20 MB of peak memory) buys nothing.
        loader.btf(None);
        loader.override_global(names::FILTER_TGIDS, &filter_tgids, true);
        loader.override_global(names::FILTER_CGROUP, &cgroup, true);
        loader.override_global(names::NET_LAYOUTS, &net_layouts[..], true);
        if let Some((skb_sk, send_sk, send_ret)) = &attribution {
            loader.override_global(names::SKB_SK_OFFSET, skb_sk, true);
            loader.override_global(names::SEND_SK_OFFSET, send_sk, true);
            loader.override_global(names::SEND_RET_OFFSET, send_ret, true);
        }
        if let (Some(off_cpu), Some(switch)) = (&options.off_cpu, &switch) {
            loader.override_global(names::SWITCH_LAYOUT, switch, true);
            loader.override_global(names::OFF_CPU_STATES, &off_cpu.states, true);
            loader.override_global(names::OFF_CPU_MIN_NS, &off_cpu.min_block_ns, true);
            loader.override_global(names::OFF_CPU_MAX_NS, &off_cpu.max_block_ns, true);
            loader.override_global(names::OFF_CPU_RATIO, &off_cpu.ratio, true);
        }
        // Features that are off get one-entry maps: preallocated maps cost kernel memory.
        if options.off_cpu.is_none() {
            loader.map_max_entries(names::OFF_CPU_START, 1);
        }
        if attribution.is_none() {
            loader.map_max_entries(names::SOCK_OWNER, 1);
        }
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

        attach_tracepoint(&mut ebpf, names::PROG_EXEC, "sched", "sched_process_exec")?;
        if options.off_cpu.is_some() {
            attach_tracepoint(&mut ebpf, names::PROG_SWITCH, "sched", "sched_switch")?;
        }
        if attribution.is_some() {
            attach_tracepoint(&mut ebpf, names::PROG_SEND, "sock", "sock_send_length")?;
        }
        for event in &options.net {
            let (category, name) = event.tracepoint();
            attach_tracepoint(&mut ebpf, names::NET_PROGRAMS[event.0].0, category, name)?;
        }
        if options.cpu {
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
        let off_cpu_start = match options.off_cpu {
            Some(_) => Some(BpfHashMap::try_from(take(&mut ebpf, names::OFF_CPU_START)?)?),
            None => None,
        };
        let sock_owner = match attribution {
            Some(_) => Some(BpfHashMap::try_from(take(&mut ebpf, names::SOCK_OWNER)?)?),
            None => None,
        };
        let sampler = Sampler {
            _ebpf: ebpf,
            sets,
            active,
            generation: 0,
            active_index: 0,
            active_since: SystemTime::now(),
            nr_cpus,
            off_cpu_start,
            sock_owner,
            last_stacks: Default::default(),
        };
        Ok((sampler, process_events))
    }

    /// Switches the programs to the other buffer set and returns the contents of the one they
    /// wrote to until now, leaving it empty. Every sample lands in exactly one interval.
    pub fn drain(&mut self) -> Result<RawInterval> {
        let (idle, idle_generation) = (self.active_index, self.generation);
        self.generation = self.generation.wrapping_add(1);
        self.active_index = self.generation & 1;
        self.active.set(0, self.generation, 0).context("switching buffer sets")?;
        let end = SystemTime::now();
        let start = std::mem::replace(&mut self.active_since, end);
        // A program that read the old index just before the switch may still be writing to
        // the old set; BPF programs run for microseconds and cannot sleep, so a short pause
        // lets them finish.
        std::thread::sleep(Duration::from_millis(2));

        let mut interval = RawInterval { start: Some(start), end: Some(end), ..Default::default() };
        let set = &mut self.sets[idle as usize];
        let keys: Vec<SampleKey> = set.counts.keys().collect::<Result<_, _>>().context("reading sample keys")?;
        for key in keys {
            if let Ok(values) = set.counts.get(&key, 0) {
                let value = values.iter().fold(SampleValue::default(), |sum, v| SampleValue {
                    count: sum.count + v.count,
                    total: sum.total + v.total,
                });
                interval.counts.push((key, value));
            }
            set.counts.remove(&key).context("clearing sample counts")?;
        }
        // Stacks of threads still blocked off-CPU stay: their block is counted when they wake,
        // in a later interval, by these ids.
        let retained = self.referenced_stack_ids(idle as u8, idle_generation);
        let set = &mut self.sets[idle as usize];
        let ids: Vec<u32> = set.stacks.stack_ids().collect::<Result<_, _>>().context("reading stack ids")?;
        let mut stacks = HashMap::new();
        for id in ids {
            if let Ok(stack) = set.stacks.get(&id, 0) {
                stacks.insert(id, stack.frames().iter().map(|f| f.ip).collect::<Vec<u64>>());
            }
            if !retained.contains(&id) {
                set.stacks.remove(&id).context("clearing stacks")?;
            }
        }
        // A thread that blocked while the other set was active is counted here with that
        // set's stack ids, which were all read at that set's last drain, before any was
        // deleted. (Reading the live map instead could find a reused id: another stack.)
        let other = self.active_index as u8;
        for (key, _) in &interval.counts {
            if key.stack_set == other {
                for id in [key.user_stack_id, key.kernel_stack_id].into_iter().filter(|id| *id >= 0) {
                    if let Some(stack) = self.last_stacks[other as usize].get(&(id as u32)) {
                        interval.stacks.insert((other, id as u32), stack.clone());
                    }
                }
            }
        }
        interval.stacks.extend(stacks.iter().map(|(id, stack)| ((idle as u8, *id), stack.clone())));
        self.last_stacks[idle as usize] = stacks;
        let set = &mut self.sets[idle as usize];
        for index in 0..counter::COUNT {
            let zero = PerCpuValues::try_from(vec![0u64; self.nr_cpus])?;
            let values = set.counters.get(&index, 0).context("reading counters")?;
            interval.counters[index as usize] = values.iter().sum();
            set.counters.set(index, zero, 0).context("clearing counters")?;
        }
        Ok(interval)
    }

    /// Stack ids in `set` that later events will be counted with: those of threads blocked
    /// right now, and the send stacks captured in the interval being drained (transmits
    /// use them during the next interval too).
    fn referenced_stack_ids(&self, set: u8, generation: u32) -> HashSet<u32> {
        let blocked = self.off_cpu_start.iter().flat_map(|m| m.iter().filter_map(Result::ok).map(|(_, s)| s.key));
        let blocked = blocked.filter(|key| key.stack_set == set);
        let senders = self.sock_owner.iter().flat_map(|m| m.iter().filter_map(Result::ok).map(|(_, o)| o));
        let senders = senders.filter(|owner| owner.generation == generation).map(|owner| owner.key);
        blocked
            .chain(senders)
            .flat_map(|key| [key.user_stack_id, key.kernel_stack_id])
            .filter(|id| *id >= 0)
            .map(|id| id as u32)
            .collect()
    }
}

/// Loads and attaches one tracepoint program.
fn attach_tracepoint(ebpf: &mut Ebpf, program: &str, category: &str, name: &str) -> Result<()> {
    let prog: &mut TracePoint = ebpf.program_mut(program).context("program missing")?.try_into()?;
    prog.load().map_err(|e| anyhow::anyhow!("loading {program}: {e}{}", chain(&e)))?;
    prog.attach(category, name)
        .map_err(|e| anyhow::anyhow!("attaching to tracepoint {category}:{name}: {e}{}", chain(&e)))?;
    Ok(())
}

fn switch_layout() -> Result<SwitchLayout> {
    let format = Format::read("sched", "sched_switch")?;
    let (prev_state, prev_state_size) = format.field("prev_state")?;
    if prev_state_size != 4 && prev_state_size != 8 {
        anyhow::bail!("sched:sched_switch prev_state is {prev_state_size} bytes: expected 4 or 8");
    }
    Ok(SwitchLayout {
        prev_pid: format.offset("prev_pid")?,
        prev_state,
        prev_state_size,
        next_pid: format.offset("next_pid")?,
    })
}

/// Field offsets of every enabled network tracepoint; `NONE` for the others.
fn net_layouts(events: &[NetEvent]) -> Result<[FieldLayout; 6]> {
    let mut layouts = [FieldLayout::NONE; 6];
    for event in events {
        let (category, name) = event.tracepoint();
        let format = Format::read(category, name)?;
        let absent = FieldLayout::ABSENT;
        layouts[event.0] = FieldLayout {
            len: format.optional("len").unwrap_or(absent),
            name: format.optional("name").unwrap_or(absent),
            reason: format.optional("reason").unwrap_or(absent),
            skbaddr: format.optional("skbaddr").unwrap_or(absent),
        };
    }
    Ok(layouts)
}

/// Offsets that attribute transmits to the socket's last sender: sk_buff.sk from kernel BTF
/// and sock:sock_send_length's fields. None when no transmit event is recorded; without BTF
/// or that tracepoint, transmits are attributed to the current task (with a warning).
fn transmit_attribution(events: &[NetEvent]) -> Result<Option<(u32, u32, u32)>> {
    if !events.iter().any(|e| e.kind() == kind::NET_DEV_QUEUE || e.kind() == kind::NET_DEV_XMIT) {
        return Ok(None);
    }
    let offsets = (|| -> Result<(u32, u32, u32)> {
        let skb_sk = Btf::from_sys_fs()?.member_offset("sk_buff", "sk")?;
        let send = Format::read("sock", "sock_send_length")?;
        Ok((skb_sk, send.offset("sk")?, send.offset("ret")?))
    })();
    match offsets {
        Ok(offsets) => Ok(Some(offsets)),
        Err(e) => {
            tracing::warn!("transmits will be attributed to the current task, not the socket's sender: {e:#}");
            Ok(None)
        }
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
