//! Map, global and program names, used by the BPF object and looked up by the loader.
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
pub const EXE_TEMPLATES: &str = "EXE_TEMPLATES";
/// Per process (tgid): its CPython interpreter, for the Python walk (`PythonProcess`).
pub const PYTHON_PROCESSES: &str = "PYTHON_PROCESSES";
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
/// Megabytes of processes where walks met unknown code, and when userspace was told.
pub const UNMAPPED_TOLD: &str = "UNMAPPED_TOLD";
/// Global: `[FieldLayout; 6]`, one per network kind from `kind::FIRST_NET`.
pub const NET_LAYOUTS: &str = "NET_LAYOUTS";
pub const PROG_SAMPLE: &str = "sample_cpu";
/// The `faults` group: a perf_event program on the software page-faults event.
pub const PROG_FAULT: &str = "sample_fault";
/// The `faults` group's programs on syscalls:sys_enter_brk and sys_enter_mmap.
pub const PROG_BRK: &str = "brk_called";
pub const PROG_MMAP: &str = "mmap_called";
/// Global: `RequestLayout`.
pub const REQUEST_LAYOUT: &str = "REQUEST_LAYOUT";
/// The `alloc` group's uprobes: on an allocator function's entry (its cookie an
/// `allocator_call`), on its return, and on `free` and its kin.
pub const PROG_ALLOCATION_CALLED: &str = "allocation_called";
pub const PROG_ALLOCATION_RETURNED: &str = "allocation_returned";
pub const PROG_FREE_CALLED: &str = "free_called";
/// The `alloc` group's uprobes on gperftools tcmalloc's sampled path: its list of sampled
/// objects growing (`DLL_Prepend`, the cookie the list's head) and shrinking (`DLL_Remove`).
pub const PROG_TCMALLOC_SAMPLED: &str = "tcmalloc_sampled";
pub const PROG_TCMALLOC_FREED: &str = "tcmalloc_freed";
/// Every program of the `alloc` group.
pub const ALLOC_PROGRAMS: [&str; 5] = [PROG_ALLOCATION_CALLED, PROG_ALLOCATION_RETURNED, PROG_FREE_CALLED, PROG_TCMALLOC_SAMPLED, PROG_TCMALLOC_FREED];
/// Global: `[u64; ALLOC_GAPS]`, the sampling gaps.
pub const ALLOC_GAP_TABLE: &str = "ALLOC_GAP_TABLE";
/// Sampled allocations not yet freed, `LiveKey` to `LiveAllocation`.
pub const LIVE_ALLOCATIONS: &str = "LIVE_ALLOCATIONS";
/// Per thread, the allocator call it is in.
pub const ALLOC_IN_CALL: &str = "IN_CALL";
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
