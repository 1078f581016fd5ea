//! Types and names shared by Ember's BPF programs (`agent-ebpf`) and the agent, so that the
//! layout of every map key and value is defined once and the two sides cannot drift.
#![no_std]

/// Length of a task's `comm` as the kernel stores it (TASK_COMM_LEN).
pub const COMM_LEN: usize = 16;

/// Aggregation key of one on-CPU sample. All samples with equal keys are summed in the kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    /// Process id (the kernel's tgid).
    pub tgid: u32,
    /// Thread id (the kernel's pid).
    pub pid: u32,
    /// cgroup v2 id of the task (inode number of its cgroup directory).
    pub cgroup_id: u64,
    /// Id in the active set's stack map, or a negative `stack_status` value.
    pub user_stack_id: i32,
    /// Id in the active set's stack map, or a negative `stack_status` value.
    pub kernel_stack_id: i32,
    /// Thread name at the time of the sample, NUL padded.
    pub comm: [u8; COMM_LEN],
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

/// Indices of the per-CPU counter array of each buffer set. Every sample the program sees is
/// counted in `SAMPLES` or `IDLE`; every sample or stack that could not be kept is counted
/// under its reason, so that userspace can report losses instead of hiding them.
pub mod counter {
    /// Samples accepted after filters (each is aggregated or counted as `MAP_FULL`).
    pub const SAMPLES: u32 = 0;
    /// Samples lost because the counts map was full.
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
    /// Samples skipped by the pid or cgroup filter.
    pub const FILTERED: u32 = 8;
    /// Number of counters.
    pub const COUNT: u32 = 9;
}

/// Sent through the ring buffer the first time a process is sampled (and again after it
/// execs), so that userspace captures its memory mappings while it still runs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessEvent {
    pub tgid: u32,
}

/// Map and global names, used by the BPF object and looked up by the loader.
pub mod names {
    pub const COUNTS: [&str; 2] = ["COUNTS_A", "COUNTS_B"];
    pub const STACKS: [&str; 2] = ["STACKS_A", "STACKS_B"];
    pub const COUNTERS: [&str; 2] = ["COUNTERS_A", "COUNTERS_B"];
    /// One-element array: index (0 or 1) of the set the programs write to.
    pub const ACTIVE_SET: &str = "ACTIVE_SET";
    pub const KNOWN_TGIDS: &str = "KNOWN_TGIDS";
    pub const PROCESS_EVENTS: &str = "PROCESS_EVENTS";
    pub const TGID_FILTER: &str = "TGID_FILTER";
    /// Global: non-zero when only tgids in `TGID_FILTER` are sampled.
    pub const FILTER_TGIDS: &str = "FILTER_TGIDS";
    /// Global: non-zero cgroup id to sample exclusively.
    pub const FILTER_CGROUP: &str = "FILTER_CGROUP";
    pub const PROG_SAMPLE: &str = "sample_cpu";
    pub const PROG_EXEC: &str = "process_exec";
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] integers and arrays without padding holes that matter.
    unsafe impl aya::Pod for super::SampleKey {}
    unsafe impl aya::Pod for super::ProcessEvent {}
}
