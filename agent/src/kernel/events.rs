//! What the kernel side can be asked to record: the perf event that drives on-CPU sampling,
//! the network tracepoints, and the resolved settings the loader receives. Parsing user input
//! into these is the settings module's job; this one only knows what exists.
use std::{path::PathBuf, time::Duration};

use agent_common::{kind, names};
use aya::programs::perf_event::{HardwareEvent, PerfEventConfig, SoftwareEvent};

use crate::pod_selector::PodSelector;

/// The perf event that drives sampling. Software `cpu-clock` works everywhere, including VMs
/// without a PMU; hardware events need one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    CpuClock,
    TaskClock,
    Cycles,
    Instructions,
}

impl Event {
    pub const ALL: [Event; 4] = [Event::CpuClock, Event::TaskClock, Event::Cycles, Event::Instructions];

    pub(super) fn config(self) -> PerfEventConfig {
        match self {
            Event::CpuClock => PerfEventConfig::Software(SoftwareEvent::CpuClock),
            Event::TaskClock => PerfEventConfig::Software(SoftwareEvent::TaskClock),
            Event::Cycles => PerfEventConfig::Hardware(HardwareEvent::CpuCycles),
            Event::Instructions => PerfEventConfig::Hardware(HardwareEvent::Instructions),
        }
    }

    /// Whether a sample's period is time (ns): hrtimer-driven software events.
    pub fn is_clock(self) -> bool {
        matches!(self, Event::CpuClock | Event::TaskClock)
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

/// A network tracepoint Ember can record, as an index into `names::NET_PROGRAMS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetEvent(pub usize);

impl NetEvent {
    /// What `--net-events` defaults to: one transmit and one receive point (net_dev_xmit
    /// and napi_gro_receive_entry would count the same packets again), retransmits, drops.
    pub const DEFAULT: [&str; 4] = ["net:net_dev_queue", "net:netif_receive_skb", "tcp:tcp_retransmit_skb", "skb:kfree_skb"];

    /// The tracepoint `category:name`, if Ember has a program for it.
    pub fn find(category: &str, name: &str) -> Option<NetEvent> {
        names::NET_PROGRAMS.iter().position(|&(_, c, n)| c == category && n == name).map(NetEvent)
    }

    /// Every tracepoint Ember has a program for, as "category:name".
    pub fn supported() -> Vec<String> {
        names::NET_PROGRAMS.iter().map(|(_, c, n)| format!("{c}:{n}")).collect()
    }

    pub fn kind(self) -> u8 {
        kind::FIRST_NET + self.0 as u8
    }

    pub fn tracepoint(self) -> (&'static str, &'static str) {
        let (_, category, name) = names::NET_PROGRAMS[self.0];
        (category, name)
    }

    pub(super) fn program(self) -> &'static str {
        names::NET_PROGRAMS[self.0].0
    }
}

/// Everything the loader needs, resolved and validated by `settings`.
#[derive(Clone, Debug)]
pub struct KernelSettings {
    /// On-CPU sampling (perf event on every CPU).
    pub cpu: bool,
    pub event: Event,
    pub frequency: u64,
    /// Off-CPU tracking (sched_switch), if enabled.
    pub off_cpu: Option<OffCpuSettings>,
    /// Network tracepoints to record.
    pub net: Vec<NetEvent>,
    /// Page faults (the `faults` group): one in how many is sampled on each CPU, if enabled.
    pub fault_period: Option<u64>,
    /// The `alloc` group, if enabled: probes on the allocators of the `pids` processes.
    pub alloc: Option<AllocSettings>,
    /// Distinct (thread, stack) keys per interval; events beyond are counted as `map_full`.
    pub max_keys: u32,
    /// Distinct user stacks, and distinct kernel stacks, per interval.
    pub max_stacks: u32,
    /// Unwind table rows the kernel holds, for all executables together (the table memory
    /// budget, 8 bytes a row).
    pub unwind_rows: u32,
    /// Only these processes (empty: all).
    pub pids: Vec<u32>,
    /// Only this cgroup v2 id.
    pub cgroup_id: Option<u64>,
    /// The programs time themselves (`counter::RUN_NS`), for the overhead governor.
    pub measure_run_time: bool,
}

impl KernelSettings {
    /// Whether any enabled network event is one of `kinds` (`agent_common::kind`).
    pub fn records_net(&self, kinds: &[u8]) -> bool {
        self.net.iter().any(|e| kinds.contains(&e.kind()))
    }

    /// Small maps and nothing recorded, for tests of the real programs to add to.
    #[cfg(test)]
    pub fn for_tests() -> KernelSettings {
        KernelSettings {
            cpu: false,
            event: Event::CpuClock,
            frequency: 97,
            off_cpu: None,
            net: Vec::new(),
            fault_period: None,
            alloc: None,
            max_keys: 64,
            max_stacks: 64,
            unwind_rows: 64,
            pids: Vec::new(),
            cgroup_id: None,
            measure_run_time: false,
        }
    }
}

#[derive(Clone, Debug)]
pub struct AllocSettings {
    /// Mean bytes allocated between two samples.
    pub mean_bytes: u64,
    /// Sampled allocations tracked until freed at once.
    pub max_live: u32,
    /// Live allocations older than this are labelled suspected leaks.
    pub leak_age: Duration,
    /// The probes come out after this long (None: when the agent stops).
    pub probe_for: Option<Duration>,
    /// Without pids: the cgroup (its directory) whose processes are probed, those that join
    /// it later too.
    pub cgroup: Option<PathBuf>,
    /// Without pids or cgroup: the pods of this node whose processes are probed.
    pub pods: Option<PodSelector>,
}

#[derive(Clone, Debug)]
pub struct OffCpuSettings {
    /// `agent_common::block_state` bits to include.
    pub states: u32,
    pub min_block_ns: u64,
    pub max_block_ns: u64,
    /// Record one block in `ratio` (counted `ratio` times).
    pub ratio: u32,
    /// Threads whose blocks can be measured: each keeps its entry from its first block until
    /// it exits. Blocks of threads beyond are counted as `off_cpu_table_full`.
    pub max_threads: u32,
}

#[cfg(test)]
impl OffCpuSettings {
    /// Every block of every state, whatever its length, for up to 64 threads.
    pub fn for_tests() -> OffCpuSettings {
        let states = agent_common::block_state::PREEMPTED | agent_common::block_state::SLEEPING | agent_common::block_state::UNINTERRUPTIBLE;
        OffCpuSettings { states, min_block_ns: 0, max_block_ns: u64::MAX, ratio: 1, max_threads: 64 }
    }
}
