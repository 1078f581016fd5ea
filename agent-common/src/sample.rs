//! The sample key and value every program aggregates by, and what a key's fields mean.
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
    /// A page fault in user memory (the `faults` group), sampled every `period` faults.
    pub const PAGE_FAULT: u8 = 8;
    /// A call that asked the kernel for memory (`brk`, anonymous `mmap`), weighed by the
    /// bytes asked for; `SampleKey::aux` says which (`memory_call`).
    pub const MEMORY_REQUEST: u8 = 9;
    /// An allocation sampled by the `alloc` group, weighed by its bytes (the drain scales
    /// both to estimates of all allocations).
    pub const ALLOCATION: u8 = 10;
    /// Sampled allocations still live at a drain, from the live table: userspace makes these
    /// keys, no program records them. `SampleKey::aux` is 1 for those older than the leak age.
    pub const LIVE_ALLOCATION: u8 = 11;
    pub const COUNT: usize = 12;
    /// The network kinds, in order, as indices into `NET_LAYOUTS`.
    pub const FIRST_NET: u8 = NET_DEV_QUEUE;
    pub const NET_COUNT: usize = (KFREE_SKB - FIRST_NET) as usize + 1;
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
