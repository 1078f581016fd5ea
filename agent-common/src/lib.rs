//! Types and names shared by Ember's BPF programs (`agent-ebpf`) and the agent, so that the
//! layout of every map key and value is defined once and the two sides cannot drift.
#![no_std]

/// Length of a task's `comm` as the kernel stores it (TASK_COMM_LEN).
pub const COMM_LEN: usize = 16;

/// Aggregation key of every kind of sample. All samples with equal keys are summed in the
/// kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SampleKey {
    /// Process id (the kernel's tgid) of the task the event ran on.
    pub tgid: u32,
    /// Thread id (the kernel's pid).
    pub pid: u32,
    /// cgroup v2 id of the task (inode number of its cgroup directory).
    pub cgroup_id: u64,
    /// Id in the user stack map of set `stack_set`, or a negative `stack_status` value.
    pub user_stack_id: i32,
    /// Id in the stack map of set `stack_set`, or a negative `stack_status` value.
    pub kernel_stack_id: i32,
    /// Thread name at the time of the event, NUL padded.
    pub comm: [u8; COMM_LEN],
    /// Network device name (network kinds), NUL padded.
    pub device: [u8; IFNAMSIZ],
    /// One of `kind`.
    pub kind: u8,
    /// Buffer set whose stack map holds the stack ids. Off-CPU events are counted when a
    /// thread wakes, possibly intervals after it blocked and its stacks were captured.
    pub stack_set: u8,
    /// Which life of its pid the process was in (`process_tag`): samples taken before an
    /// exec, or by an earlier process with the same pid, are named from that life's mappings.
    pub process_tag: u16,
    /// Off-CPU: the `block_state` of the switch. kfree_skb: the drop reason. Else 0.
    pub aux: u32,
    /// The user stack's `UserStack::check` (0 with a status): with the id, 95 bits that tell
    /// stacks apart, so that a sample whose key exists already can skip storing its stack.
    pub user_stack_check: u64,
}

/// What a key accumulates: events, and their total (ns off-CPU, bytes on the network).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleValue {
    pub count: u64,
    pub total: u64,
}

/// Length of a network device name (IFNAMSIZ).
pub const IFNAMSIZ: usize = 16;

/// Event kinds, one per program and tracepoint.
pub mod kind {
    pub const ON_CPU: u8 = 0;
    pub const OFF_CPU: u8 = 1;
    pub const NET_DEV_QUEUE: u8 = 2;
    pub const NET_DEV_XMIT: u8 = 3;
    pub const NETIF_RECEIVE_SKB: u8 = 4;
    pub const NAPI_GRO_RECEIVE_ENTRY: u8 = 5;
    pub const TCP_RETRANSMIT_SKB: u8 = 6;
    pub const KFREE_SKB: u8 = 7;
    pub const COUNT: usize = 8;
    /// The network kinds, in order, as indices into `NET_LAYOUTS`.
    pub const FIRST_NET: u8 = NET_DEV_QUEUE;
}

/// Why a task left the CPU (from sched_switch's prev_state), as bits of the state filter.
pub mod block_state {
    /// Preempted while runnable: time waiting for a CPU.
    pub const PREEMPTED: u32 = 1;
    /// Interruptible sleep (S): waiting for an event, a lock, the network, a timer.
    pub const SLEEPING: u32 = 2;
    /// Uninterruptible sleep (D): usually disk IO.
    pub const UNINTERRUPTIBLE: u32 = 4;
}

/// Where a thread last blocked: kept per thread from its first switch-out until it exits;
/// `start_ns` is 0 from switch-in to the next switch-out.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffCpuStart {
    pub key: SampleKey,
    pub start_ns: u64,
    /// What the block counts for: the off-CPU sampling ratio when it was sampled.
    pub weight: u32,
    /// The buffer set generation the stacks were captured in.
    pub generation: u32,
}

/// Sampling ratios the governor sets while the programs run: one event in `ratio` is
/// recorded, and counted `ratio` times, so totals stay unbiased.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rates {
    pub off_cpu_ratio: u32,
    pub net_ratio: u32,
}

/// The last thread that sent on a socket, and its send stacks: transmit events are
/// attributed to it, because TCP often transmits a socket's data from softirq context on an
/// unrelated task (when ACKs arrive).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketOwner {
    pub key: SampleKey,
    /// Interval (generation) in which the stacks were captured: they stay valid for it and
    /// the next one.
    pub generation: u32,
    pub _pad: u32,
}

/// Byte offsets of a tracepoint's fields, read from its format file at start-up.
/// `ABSENT` marks a field the tracepoint does not have.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldLayout {
    /// Packet length (u32).
    pub len: u32,
    /// `__data_loc char[] name`: the device name.
    pub name: u32,
    /// kfree_skb's `enum skb_drop_reason reason` (u32).
    pub reason: u32,
    /// The skb pointer.
    pub skbaddr: u32,
}

impl FieldLayout {
    pub const ABSENT: u32 = u32::MAX;
    pub const NONE: FieldLayout =
        FieldLayout { len: Self::ABSENT, name: Self::ABSENT, reason: Self::ABSENT, skbaddr: Self::ABSENT };
}

/// Transmit events: `aux` says whom the event is attributed to.
pub mod attribution {
    /// The task current when the packet was queued.
    pub const CURRENT_TASK: u32 = 0;
    /// The last sender on the packet's socket, with its send stacks.
    pub const SOCKET_OWNER: u32 = 1;
}

/// sched_switch field offsets and sizes, from its format file.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchLayout {
    pub prev_pid: u32,
    pub prev_state: u32,
    /// 4 or 8 (`long prev_state` since 5.x, `int` before).
    pub prev_state_size: u32,
    pub next_pid: u32,
}

/// mmap:vm_unmapped_area field offsets (where the kernel found room for a new mapping), from
/// its format file.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AreaLayout {
    pub addr: u32,
    pub length: u32,
}

/// Why a sample key carries no stack id. The sample itself is still counted.
pub mod stack_status {
    /// The sample has no stack of this kind (user-mode sample: no kernel stack;
    /// kernel thread: no user stack). Not an error.
    pub const NONE: i32 = -1;
    /// Another stack already occupies this stack's hash bucket (`-EEXIST`).
    pub const COLLISION: i32 = -2;
    /// `bpf_get_stackid` failed for another reason (e.g. `-ENOMEM`).
    pub const ERROR: i32 = -3;
}

/// Most frames Ember's walker records in a user stack (the kernel's default
/// `perf_event_max_stack`).
pub const MAX_USER_FRAMES: usize = 127;

/// A user stack walked by Ember's own unwinder, stored under a 31-bit hash of its frames.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserStack {
    /// A second hash of the frames, independent of the id: an id whose stored stack has
    /// another check is a hash collision.
    pub check: u64,
    /// Frames used in `frames`, leaf first.
    pub len: u32,
    /// One of `unwind_stop`: why the walk ended.
    pub stop: u32,
    pub frames: [u64; MAX_USER_FRAMES],
}

/// Why the user-stack walk ended. Anything but `END` is a truncated stack: it keeps the
/// frames it has, and the reason is counted (`counter::UNWIND_STOPS`) and shown at its root.
pub mod unwind_stop {
    /// The outermost frame was reached: the stack is complete.
    pub const END: u32 = 0;
    /// `MAX_USER_FRAMES` frames were recorded.
    pub const DEPTH: u32 = 1;
    /// Reading the stack failed (a bad pointer, or memory paged out).
    pub const READ_FAULT: u32 = 2;
    /// No unwind row covers the address (code without call frame information).
    pub const NO_INFO: u32 = 3;
    /// The row's rule is beyond the walker (a DWARF expression, another register).
    pub const UNSUPPORTED: u32 = 4;
    /// A signal handler's trampoline: the caller's registers are in a signal frame.
    pub const SIGNAL: u32 = 5;
    /// The caller's frame would not be above the callee's: a corrupt stack, or a frame
    /// pointer that is not one.
    pub const BAD_FRAME: u32 = 6;
    pub const COUNT: u32 = 7;
    /// Set beside the reason when the walk came before the process's tables were loaded: by
    /// frame pointers only, which skip the caller of a function that keeps none.
    pub const FRAME_POINTERS_ONLY: u32 = 1 << 8;

    /// Each reason's name, as counters and markers show it.
    pub const NAMES: [&str; COUNT as usize] =
        ["end", "depth", "read_fault", "no_info", "unsupported", "signal", "bad_frame"];
}

/// One row of an unwind table in the kernel: from `pc` (relative to the table's base) up to
/// the next row, how to find the caller (x86-64).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    pub pc: u32,
    /// CFA = rsp or rbp (by `kind`) + this.
    pub cfa_offset: u16,
    /// One of `row_kind`.
    pub kind: u8,
    /// Where the caller's rbp is saved, in 8-byte words from the CFA; 0: rbp unchanged.
    pub rbp_offset: i8,
}

/// What a row says; the first three find the caller, the rest end the walk with the
/// `unwind_stop` of that name.
pub mod row_kind {
    pub const CFA_RSP: u8 = 0;
    pub const CFA_RBP: u8 = 1;
    /// A PLT entry: CFA = rsp + 8, + 8 from byte `cfa_offset` of its 16-byte entry on.
    pub const PLT: u8 = 2;
    pub const OUTERMOST: u8 = 3;
    pub const SIGNAL: u8 = 4;
    pub const NO_INFO: u8 = 5;
    pub const UNSUPPORTED: u8 = 6;
}

/// Rows one table may have (64 MiB of rows): a binary with more is walked by frame pointers.
pub const MAX_TABLE_ROWS: u32 = 1 << 23;

/// An executable mapping of a process, as the walker sees it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ExecMapping {
    pub start: u64,
    pub end: u64,
    /// A pc in the mapping minus this is its address in the table's terms (`UnwindRow::pc`).
    pub bias: u64,
    /// The table's rows in the row array: `rows` from `first_row`. 0 rows: walk this
    /// mapping's code by frame pointers.
    pub first_row: u32,
    pub rows: u32,
    /// The table's page index in the page array: `pages` entries from `first_page`, one
    /// per `UNWIND_PAGE` bytes of code, so that a search starts among a page's few rows, not
    /// the whole table's.
    pub first_page: u32,
    pub pages: u32,
}

impl ExecMapping {
    pub fn covers(&self, pc: u64) -> bool {
        self.start <= pc && pc < self.end
    }
}

/// Bytes of code per page index entry: small, so that each frame's search is short (a page of
/// code has ten rows or so), but not below a few rows' worth of code, so that the page index
/// stays within a quarter of the rows' memory.
pub const UNWIND_PAGE: u64 = 512;

/// The rows (table-relative indices `first..end`) that can cover an address in one page: from
/// the row that covers the page's first byte to the one that covers the next page's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageRows {
    pub first: u32,
    pub end: u32,
}

/// Executable mappings (with tables) the walker can tell apart in one process.
pub const MAX_MAPPINGS: u32 = 1024;

/// Where a process's executable mappings are in the mapping array: `count` from `first`,
/// sorted by address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessMappings {
    pub first: u32,
    pub count: u32,
    /// Names these mappings while any process has them loaded: processes whose mappings are
    /// the same (workers forked from one parent) share them, and the rows the walker keeps
    /// under this generation. Never 0, and never given to other mappings.
    pub generation: u32,
}

/// Indices of the per-CPU counter array of each buffer set. Every sample the program sees is
/// counted in `SAMPLES` or `IDLE`; every sample or stack that could not be kept is counted
/// under its reason, so that userspace can report losses instead of hiding them.
pub mod counter {
    /// On-CPU samples accepted after filters (each is aggregated or counted as `MAP_FULL`).
    pub const SAMPLES: u32 = 0;
    /// Events of any kind lost because the counts map was full.
    pub const MAP_FULL: u32 = 1;
    /// User stacks replaced by a marker because of a stack map hash collision.
    pub const USER_STACK_COLLISION: u32 = 2;
    /// Kernel stacks replaced by a marker because of a stack map hash collision.
    pub const KERNEL_STACK_COLLISION: u32 = 3;
    /// User stacks that could not be captured for another reason.
    pub const USER_STACK_ERROR: u32 = 4;
    /// Kernel stacks that could not be captured for another reason.
    pub const KERNEL_STACK_ERROR: u32 = 5;
    /// New-process notifications lost because the ring buffer was full (retried later).
    pub const PROCESS_EVENT_LOST: u32 = 6;
    /// Samples of the idle task (pid 0), counted but not aggregated.
    pub const IDLE: u32 = 7;
    /// On-CPU samples skipped by the pid or cgroup filter.
    pub const FILTERED: u32 = 8;
    /// Off-CPU blocks not tracked because the per-thread table was full.
    pub const OFF_CPU_TABLE_FULL: u32 = 9;
    /// Off-CPU blocks left out by the minimum / maximum block time.
    pub const OFF_CPU_OUT_OF_RANGE: u32 = 10;
    /// Network events (every kind) recorded: sampled, and accepted by the filters.
    pub const NET_EVENTS: u32 = 11;
    /// Off-CPU blocks counted (sampled).
    pub const OFF_CPU_BLOCKS: u32 = 12;
    /// User stacks walked before userspace had loaded the process's mappings (cold start):
    /// walked by frame pointers only.
    pub const UNWIND_NO_PROCESS: u32 = 13;
    /// Times a process mapped something where code the walks knew of it had been (a library
    /// closed and another loaded in its place): its mappings were read again, as a new life.
    pub const CODE_REPLACED: u32 = 14;
    /// Network events skipped by the pid or cgroup filter (apart from `FILTERED`: the drain
    /// spreads what on-CPU events ran unsampled over each CPU's samples, filtered included).
    pub const NET_FILTERED: u32 = 15;
    /// User stack walks by how they ended, from here on one counter per `unwind_stop`
    /// reason (index `UNWIND_STOPS + reason`; `END` counts complete stacks).
    pub const UNWIND_STOPS: u32 = 16;
    /// What the programs cost, measured by themselves while `MEASURE_RUN_TIME` is set (under
    /// a CPU budget), by source (`run::ON_CPU`, `run::OFF_CPU`, `run::NET`), at index
    /// `RUN_NS + run::SLOTS * source + slot`, the nanoseconds and number of runs that recorded
    /// something (the part a sampling rate scales) and of runs that recorded nothing (sampled
    /// out, filtered, idle: the part no rate lowers). A program's own clock misses what the
    /// kernel spends to enter and leave it; the run counts let the agent add that.
    pub const RUN_NS: u32 = UNWIND_STOPS + super::unwind_stop::COUNT;
    /// Number of counters.
    pub const COUNT: u32 = RUN_NS + super::run::SLOTS * super::run::SOURCES;

    /// Each counter's name, as profile comments (`ember.counter.<name>=<value>`) and the
    /// agent's metrics and logs call it.
    pub const NAMES: [(u32, &str); COUNT as usize] = [
        (SAMPLES, "samples"),
        (MAP_FULL, "map_full"),
        (USER_STACK_COLLISION, "user_stack_collision"),
        (KERNEL_STACK_COLLISION, "kernel_stack_collision"),
        (USER_STACK_ERROR, "user_stack_error"),
        (KERNEL_STACK_ERROR, "kernel_stack_error"),
        (PROCESS_EVENT_LOST, "process_event_lost"),
        (IDLE, "idle"),
        (FILTERED, "filtered"),
        (OFF_CPU_TABLE_FULL, "off_cpu_table_full"),
        (OFF_CPU_OUT_OF_RANGE, "off_cpu_out_of_range"),
        (NET_EVENTS, "net_events"),
        (OFF_CPU_BLOCKS, "off_cpu_blocks"),
        (UNWIND_NO_PROCESS, "unwind_no_process"),
        (CODE_REPLACED, "code_replaced"),
        (NET_FILTERED, "net_filtered"),
        (UNWIND_STOPS, "unwind_complete"),
        (UNWIND_STOPS + 1, "unwind_stop_depth"),
        (UNWIND_STOPS + 2, "unwind_stop_read_fault"),
        (UNWIND_STOPS + 3, "unwind_stop_no_info"),
        (UNWIND_STOPS + 4, "unwind_stop_unsupported"),
        (UNWIND_STOPS + 5, "unwind_stop_signal"),
        (UNWIND_STOPS + 6, "unwind_stop_bad_frame"),
        (RUN_NS + 0, "bpf_run_ns_on_cpu"),
        (RUN_NS + 1, "bpf_runs_on_cpu"),
        (RUN_NS + 2, "bpf_run_ns_skipped_on_cpu"),
        (RUN_NS + 3, "bpf_runs_skipped_on_cpu"),
        (RUN_NS + 4, "bpf_run_ns_off_cpu"),
        (RUN_NS + 5, "bpf_runs_off_cpu"),
        (RUN_NS + 6, "bpf_run_ns_skipped_off_cpu"),
        (RUN_NS + 7, "bpf_runs_skipped_off_cpu"),
        (RUN_NS + 8, "bpf_run_ns_net"),
        (RUN_NS + 9, "bpf_runs_net"),
        (RUN_NS + 10, "bpf_run_ns_skipped_net"),
        (RUN_NS + 11, "bpf_runs_skipped_net"),
    ];
}

/// The programs' own run-time counters (`counter::RUN_NS`): sources, and slots per source.
pub mod run {
    pub const ON_CPU: u32 = 0;
    pub const OFF_CPU: u32 = 1;
    pub const NET: u32 = 2;
    pub const SOURCES: u32 = 3;
    /// Slots of a source: nanoseconds and runs that recorded something, then nanoseconds
    /// and runs that recorded nothing.
    pub const RECORDED_NS: u32 = 0;
    pub const RECORDED_RUNS: u32 = 1;
    pub const SKIPPED_NS: u32 = 2;
    pub const SKIPPED_RUNS: u32 = 3;
    pub const SLOTS: u32 = 4;
}

/// Sent through the ring buffer the first time a process is sampled (and again after it
/// execs), so that userspace captures its memory mappings while it still runs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessEvent {
    pub tgid: u32,
    /// The life of the pid announced (`SampleKey::process_tag`).
    pub tag: u16,
    pub _pad: u16,
    /// 0 for a process seen for the first time or after exec. Else a pc where a user-stack
    /// walk ended outside every mapping userspace gave the walker: code mapped since they
    /// were read (a library loaded with dlopen) if no mapping userspace knows holds it.
    pub pc: u64,
    /// The process's start (ns since boot, its leader's `start_boottime`, which /proc shows
    /// in clock ticks), or 0 when announced from another task's context: userspace checks it
    /// to not read another process's mappings for it after its pid was reused.
    pub start_ns: u64,
    /// Where the process's stack starts (`mm->start_stack`, /proc's stat field 28), or 0 when
    /// announced from another task's context. An exec maps a new stack, at a random place:
    /// userspace checks it to not read the mappings of a program exec'd since for this life.
    pub start_stack: u64,
}

/// Where a sample's process life is told apart (`SampleKey::process_tag`): offsets in
/// `struct task_struct`, from kernel BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskLayout {
    /// `group_leader`: the process's first thread (it keeps the process's start time).
    pub group_leader: u32,
    /// `start_boottime` (u64 ns): set when the task is created, kept through exec.
    pub start_boottime: u32,
    /// `self_exec_id` (u64): counts the execs of the task and its ancestors.
    pub self_exec_id: u32,
    /// `comm` (COMM_LEN bytes): the thread's name.
    pub comm: u32,
    /// `mm`: the process's memory; and in `struct mm_struct`, `start_stack` (u64).
    pub mm: u32,
    pub start_stack: u32,
}

/// Map and global names, used by the BPF object and looked up by the loader.
pub mod names {
    pub const COUNTS: [&str; 2] = ["COUNTS_A", "COUNTS_B"];
    /// Kernel stacks (`bpf_get_stackid`).
    pub const STACKS: [&str; 2] = ["STACKS_A", "STACKS_B"];
    /// User stacks walked by Ember, by hash.
    pub const USER_STACKS: [&str; 2] = ["USER_STACKS_A", "USER_STACKS_B"];
    /// Every loaded unwind table's rows, one array (mmapped by userspace to fill it).
    pub const UNWIND_ROWS: &str = "UNWIND_ROWS";
    /// Every loaded unwind table's page index, one array (`ExecMapping::first_page`).
    pub const UNWIND_PAGES: &str = "UNWIND_PAGES";
    /// Every loaded process's executable mappings, one array.
    pub const MAPPINGS: &str = "MAPPINGS";
    /// Per process (tgid): where its mappings are in `MAPPINGS`.
    pub const PROCESS_MAPPINGS: &str = "PROCESS_MAPPINGS";
    /// Both sets' counters: set A's `counter::COUNT`, then set B's.
    pub const COUNTERS: &str = "COUNTERS";
    /// One-element array: the interval's generation; the programs write to set
    /// `generation & 1`.
    pub const ACTIVE_SET: &str = "ACTIVE_SET";
    /// Socket (struct sock address) to its last sender.
    pub const SOCK_OWNER: &str = "SOCK_OWNER";
    /// Globals: offset of `sk` in struct sk_buff (from BTF; ABSENT: no attribution), and of
    /// sock_send_length's `sk` and `ret` fields.
    pub const SKB_SK_OFFSET: &str = "SKB_SK_OFFSET";
    pub const SEND_SK_OFFSET: &str = "SEND_SK_OFFSET";
    pub const SEND_RET_OFFSET: &str = "SEND_RET_OFFSET";
    pub const PROG_SEND: &str = "sock_send_length";
    pub const KNOWN_TGIDS: &str = "KNOWN_TGIDS";
    pub const PROCESS_EVENTS: &str = "PROCESS_EVENTS";
    pub const TGID_FILTER: &str = "TGID_FILTER";
    /// Global: non-zero when only tgids in `TGID_FILTER` are sampled.
    pub const FILTER_TGIDS: &str = "FILTER_TGIDS";
    /// Global: non-zero cgroup id to sample exclusively.
    pub const FILTER_CGROUP: &str = "FILTER_CGROUP";
    /// Off-CPU: threads currently blocked, with where they blocked.
    pub const OFF_CPU_START: &str = "OFF_CPU_START";
    /// Globals: off-CPU settings.
    pub const SWITCH_LAYOUT: &str = "SWITCH_LAYOUT";
    pub const FORK_CHILD_PID: &str = "FORK_CHILD_PID";
    pub const EXIT_GROUP_DEAD: &str = "EXIT_GROUP_DEAD";
    pub const TASK_LAYOUT: &str = "TASK_LAYOUT";
    pub const AREA_LAYOUT: &str = "AREA_LAYOUT";
    pub const OFF_CPU_STATES: &str = "OFF_CPU_STATES";
    pub const OFF_CPU_MIN_NS: &str = "OFF_CPU_MIN_NS";
    pub const OFF_CPU_MAX_NS: &str = "OFF_CPU_MAX_NS";
    /// Global: non-zero when the programs time themselves (`counter::RUN_NS`).
    pub const MEASURE_RUN_TIME: &str = "MEASURE_RUN_TIME";
    /// `Rates` (one entry), rewritten while the programs run.
    pub const RATES: &str = "RATES";
    /// Global: `[FieldLayout; 6]`, one per network kind from `kind::FIRST_NET`.
    pub const NET_LAYOUTS: &str = "NET_LAYOUTS";
    pub const PROG_SAMPLE: &str = "sample_cpu";
    pub const PROG_EXEC: &str = "process_exec";
    pub const PROG_EXIT: &str = "process_exit";
    pub const PROG_FORK: &str = "process_fork";
    pub const PROG_SWITCH: &str = "sched_switch";
    /// Attached to every tracepoint of a task's move to another cgroup.
    pub const PROG_CGROUP_MOVED: &str = "cgroup_moved";
    /// Attached to mmap:vm_unmapped_area: room found for a new mapping, perhaps where code was.
    pub const PROG_AREA_PLACED: &str = "area_placed";
    /// Network programs by kind, from `kind::FIRST_NET`, with their tracepoints.
    pub const NET_PROGRAMS: [(&str, &str, &str); 6] = [
        ("net_dev_queue", "net", "net_dev_queue"),
        ("net_dev_xmit", "net", "net_dev_xmit"),
        ("netif_receive_skb", "net", "netif_receive_skb"),
        ("napi_gro_receive_entry", "net", "napi_gro_receive_entry"),
        ("tcp_retransmit_skb", "tcp", "tcp_retransmit_skb"),
        ("kfree_skb", "skb", "kfree_skb"),
    ];
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] integers and arrays without padding holes that matter.
    unsafe impl aya::Pod for super::SampleKey {}
    unsafe impl aya::Pod for super::ProcessEvent {}
    unsafe impl aya::Pod for super::SampleValue {}
    unsafe impl aya::Pod for super::OffCpuStart {}
    unsafe impl aya::Pod for super::Rates {}
    unsafe impl aya::Pod for super::FieldLayout {}
    unsafe impl aya::Pod for super::SocketOwner {}
    unsafe impl aya::Pod for super::SwitchLayout {}
    unsafe impl aya::Pod for super::TaskLayout {}
    unsafe impl aya::Pod for super::AreaLayout {}
    unsafe impl aya::Pod for super::UserStack {}
    unsafe impl aya::Pod for super::UnwindRow {}
    unsafe impl aya::Pod for super::ProcessMappings {}
    unsafe impl aya::Pod for super::ExecMapping {}
    unsafe impl aya::Pod for super::PageRows {}
}
