//! The profiles Ember writes, one per kind per interval, and what each one measures. A
//! profile kind gathers one or more event kinds (`agent_common::kind`) and says how their
//! counts and totals become pprof sample values and labels.
use agent_common::{attribution, block_state, kind, memory_call};

use crate::resolve::ResolvedSample;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProfileKind {
    Cpu,
    OffCpu,
    /// On-CPU and off-CPU time of the same threads, in one unit: where wall time goes.
    Wall,
    NetTx,
    NetRx,
    NetRetransmit,
    NetDrop,
    /// Page faults: where memory is first touched.
    Faults,
    /// brk and anonymous mmap calls: who asks the kernel for memory.
    MemoryRequests,
    /// Sampled allocator calls and what they still hold: Go's heap profile.
    Heap,
}

/// Bytes a page fault stands for: a base page. (A fault that maps a transparent huge page
/// maps 512 of them and counts one.)
const FAULT_BYTES: i64 = 4096;

impl ProfileKind {
    pub const ALL: [ProfileKind; 10] = [
        ProfileKind::Cpu,
        ProfileKind::OffCpu,
        ProfileKind::Wall,
        ProfileKind::NetTx,
        ProfileKind::NetRx,
        ProfileKind::NetRetransmit,
        ProfileKind::NetDrop,
        ProfileKind::Faults,
        ProfileKind::MemoryRequests,
        ProfileKind::Heap,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ProfileKind::Cpu => "cpu",
            ProfileKind::OffCpu => "offcpu",
            ProfileKind::Wall => "wall",
            ProfileKind::NetTx => "net-tx",
            ProfileKind::NetRx => "net-rx",
            ProfileKind::NetRetransmit => "net-retransmit",
            ProfileKind::NetDrop => "net-drop",
            ProfileKind::Faults => "faults",
            ProfileKind::MemoryRequests => "memory-requests",
            ProfileKind::Heap => "heap",
        }
    }

    /// Whether events of `event_kind` belong in this profile.
    pub fn includes(self, event_kind: u8) -> bool {
        match self {
            ProfileKind::Cpu => event_kind == kind::ON_CPU,
            ProfileKind::OffCpu => event_kind == kind::OFF_CPU,
            ProfileKind::Wall => event_kind == kind::ON_CPU || event_kind == kind::OFF_CPU,
            ProfileKind::NetTx => event_kind == kind::NET_DEV_QUEUE || event_kind == kind::NET_DEV_XMIT,
            ProfileKind::NetRx => event_kind == kind::NETIF_RECEIVE_SKB || event_kind == kind::NAPI_GRO_RECEIVE_ENTRY,
            ProfileKind::NetRetransmit => event_kind == kind::TCP_RETRANSMIT_SKB,
            ProfileKind::NetDrop => event_kind == kind::KFREE_SKB,
            ProfileKind::Faults => event_kind == kind::PAGE_FAULT,
            ProfileKind::MemoryRequests => event_kind == kind::MEMORY_REQUEST,
            ProfileKind::Heap => event_kind == kind::ALLOCATION || event_kind == kind::LIVE_ALLOCATION,
        }
    }

    /// (type, unit) of each sample value; the first is the default.
    pub fn sample_types(self) -> &'static [(&'static str, &'static str)] {
        match self {
            ProfileKind::Cpu => &[("samples", "count"), ("cpu", "nanoseconds")],
            ProfileKind::OffCpu => &[("switches", "count"), ("off_cpu", "nanoseconds")],
            ProfileKind::Wall => &[("wall", "nanoseconds")],
            ProfileKind::NetTx | ProfileKind::NetRx => &[("packets", "count"), ("bytes", "bytes")],
            ProfileKind::NetRetransmit | ProfileKind::NetDrop => &[("packets", "count")],
            ProfileKind::Faults => &[("page_faults", "count"), ("fault_bytes", "bytes")],
            ProfileKind::MemoryRequests => &[("requests", "count"), ("requested_bytes", "bytes")],
            // Go's names, units and order, which pprof and Pyroscope read as a heap profile.
            ProfileKind::Heap => &[("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"), ("inuse_space", "bytes")],
        }
    }

    /// The sample's values, in `sample_types` order. On-CPU samples of the clock events carry
    /// their nanoseconds (their periods) in `total`; those of hardware events count
    /// `nominal_period` ns each.
    pub fn values(self, sample: &ResolvedSample, nominal_period: Option<i64>) -> Vec<i64> {
        let (count, total) = (sample.value.count as i64, sample.value.total as i64);
        let on_cpu_ns = nominal_period.map_or(total, |period| count * period);
        match self {
            ProfileKind::Cpu => vec![count, on_cpu_ns],
            ProfileKind::OffCpu | ProfileKind::NetTx | ProfileKind::NetRx | ProfileKind::MemoryRequests => vec![count, total],
            ProfileKind::Wall if sample.kind == kind::ON_CPU => vec![on_cpu_ns],
            ProfileKind::Wall => vec![total],
            ProfileKind::NetRetransmit | ProfileKind::NetDrop => vec![count],
            // A sample stands for its period's faults.
            ProfileKind::Faults => vec![total, total * FAULT_BYTES],
            ProfileKind::Heap if sample.kind == kind::LIVE_ALLOCATION => vec![0, 0, count, total],
            ProfileKind::Heap => vec![count, total, 0, 0],
        }
    }

    /// Receive, retransmit and drop events run on whatever task is current, often in
    /// softirq or timer context on an unrelated task: their task labels say "ran on", never
    /// "owned by". Transmits are attributed to the socket's sender (see `comment`).
    pub fn task_label_prefix(self) -> &'static str {
        match self {
            ProfileKind::Cpu
            | ProfileKind::OffCpu
            | ProfileKind::Wall
            | ProfileKind::NetTx
            | ProfileKind::Faults
            | ProfileKind::MemoryRequests
            | ProfileKind::Heap => "",
            _ => "ran_on_",
        }
    }

    pub fn comment(self) -> Option<&'static str> {
        match self {
            ProfileKind::Cpu | ProfileKind::OffCpu | ProfileKind::Wall | ProfileKind::MemoryRequests => None,
            ProfileKind::Faults => Some(
                "ember.note=each page-fault sample stands for its period's faults, a 4 KiB page each \
                 (a fault that maps a transparent huge page counts one page)",
            ),
            ProfileKind::Heap => Some(
                "ember.note=allocations are sampled one per mean interval of bytes and scaled to estimates, as Go's heap \
                 profiles are; alloc_* count the interval's allocations, inuse_* what sampled allocations still held at \
                 its end; leak=suspected marks those older than the leak age",
            ),
            ProfileKind::NetTx => Some(
                "ember.note=transmits are attributed to the socket's last sender with its send stacks \
                 (attributed_to=socket-owner); packets with no known sender (ACKs from softirq, forwarded traffic) \
                 to the task current when they were queued, with its stacks (attributed_to=current-task)",
            ),
            _ => Some(
                "ember.note=network events are recorded on the CPU's current task; ran_on_* labels name that task, \
                 which for receive, retransmit and drop paths (softirq, timers) is often not the socket's owner",
            ),
        }
    }
}

/// Label value of an off-CPU block's `block_state`, or of an on-CPU sample (wall profile).
pub fn state_label(event_kind: u8, state: u32) -> &'static str {
    match (event_kind, state) {
        (kind::ON_CPU, _) => "on-cpu",
        (_, block_state::PREEMPTED) => "preempted",
        (_, block_state::SLEEPING) => "sleeping",
        (_, block_state::UNINTERRUPTIBLE) => "uninterruptible",
        _ => "other",
    }
}

/// Event kind's tracepoint, for the `tracepoint` label of network profiles.
pub fn tracepoint_label(event_kind: u8) -> &'static str {
    match event_kind {
        kind::NET_DEV_QUEUE => "net:net_dev_queue",
        kind::NET_DEV_XMIT => "net:net_dev_xmit",
        kind::NETIF_RECEIVE_SKB => "net:netif_receive_skb",
        kind::NAPI_GRO_RECEIVE_ENTRY => "net:napi_gro_receive_entry",
        kind::TCP_RETRANSMIT_SKB => "tcp:tcp_retransmit_skb",
        kind::KFREE_SKB => "skb:kfree_skb",
        _ => "",
    }
}

/// Which call asked for memory, for the `call` label of memory-request profiles.
pub fn call_label(aux: u32) -> &'static str {
    match aux {
        memory_call::BRK => "brk",
        memory_call::MMAP => "mmap",
        _ => "other",
    }
}

/// Whom a transmit event is attributed to, for the `attributed_to` label.
pub fn attribution_label(aux: u32) -> &'static str {
    if aux == attribution::SOCKET_OWNER { "socket-owner" } else { "current-task" }
}
