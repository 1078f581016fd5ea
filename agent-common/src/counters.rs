//! The per-CPU counters of each buffer set: every event seen, every loss by reason, and the
//! programs' own run time.
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
    /// Python walks by how they ended, one counter per `python_stop` reason.
    pub const PYTHON_STOPS: u32 = UNWIND_STOPS + crate::unwind_stop::COUNT;
    /// Page-fault samples recorded (the `faults` group), each standing for its period.
    pub const FAULT_SAMPLES: u32 = PYTHON_STOPS + crate::python_stop::COUNT;
    /// Allocator calls the `alloc` group's probes saw (each a trap in the process).
    pub const ALLOC_CALLS: u32 = FAULT_SAMPLES + 1;
    /// Calls of `free` and its kin the probes saw (each a trap too), `free(NULL)` aside.
    pub const FREE_CALLS: u32 = ALLOC_CALLS + 1;
    /// Allocations sampled (one per mean sampling interval of bytes).
    pub const ALLOC_SAMPLES: u32 = FREE_CALLS + 1;
    /// Sampled allocations not tracked until freed: the live table was full. They are in
    /// the allocated totals, not in memory in use.
    pub const ALLOC_UNTRACKED: u32 = ALLOC_SAMPLES + 1;
    /// User stack walks that took the frames below an anchor (the outermost run of Python's
    /// evaluation loop) from what their CPU kept of the thread, instead of walking them.
    pub const UNWIND_TAILS_KEPT: u32 = ALLOC_UNTRACKED + 1;
    /// Off-CPU blocks whose wake-up the program did not see (the kernel did not run it for
    /// that switch): found at the thread's next block, and counted from its run time since.
    pub const OFF_CPU_WAKES_UNSEEN: u32 = UNWIND_TAILS_KEPT + 1;
    /// Allocator probe hits where the kernel stepped the probed instruction out of line (a
    /// second trap, most of a hit's cost on a VM): entries of allocators whose first
    /// instruction it does not emulate, and frees with no emulated instruction to probe.
    pub const PROBE_STEPS: u32 = OFF_CPU_WAKES_UNSEEN + 1;
    /// Hits of the probes on an allocator's own sampled path (each a trap): its sampled
    /// allocations, and its other calls of the functions probed there.
    pub const SAMPLED_PATH_HITS: u32 = PROBE_STEPS + 1;
    /// What the programs cost, measured by themselves while `MEASURE_RUN_TIME` is set (under
    /// a CPU budget), by source (`run::ON_CPU`, `run::OFF_CPU`, `run::NET`, `run::FAULTS`), at index
    /// `RUN_NS + run::SLOTS * source + slot`, the nanoseconds and number of runs that recorded
    /// something (the part a sampling rate scales) and of runs that recorded nothing (sampled
    /// out, filtered, idle: the part no rate lowers). A program's own clock misses what the
    /// kernel spends to enter and leave it; the run counts let the agent add that.
    pub const RUN_NS: u32 = SAMPLED_PATH_HITS + 1;
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
        (PYTHON_STOPS, "python_complete"),
        (PYTHON_STOPS + 1, "python_stop_no_thread"),
        (PYTHON_STOPS + 2, "python_stop_read_fault"),
        (PYTHON_STOPS + 3, "python_stop_depth"),
        (FAULT_SAMPLES, "fault_samples"),
        (ALLOC_CALLS, "alloc_calls"),
        (FREE_CALLS, "free_calls"),
        (ALLOC_SAMPLES, "alloc_samples"),
        (ALLOC_UNTRACKED, "alloc_untracked"),
        (UNWIND_TAILS_KEPT, "unwind_tails_kept"),
        (OFF_CPU_WAKES_UNSEEN, "off_cpu_wakes_unseen"),
        (PROBE_STEPS, "probe_steps"),
        (SAMPLED_PATH_HITS, "sampled_path_hits"),
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
        (RUN_NS + 12, "bpf_run_ns_faults"),
        (RUN_NS + 13, "bpf_runs_faults"),
        (RUN_NS + 14, "bpf_run_ns_skipped_faults"),
        (RUN_NS + 15, "bpf_runs_skipped_faults"),
    ];
}

/// The programs' own run-time counters (`counter::RUN_NS`): sources, and slots per source.
pub mod run {
    pub const ON_CPU: u32 = 0;
    pub const OFF_CPU: u32 = 1;
    pub const NET: u32 = 2;
    /// The `faults` group: page-fault samples, brk and anonymous mmap calls.
    pub const FAULTS: u32 = 3;
    pub const SOURCES: u32 = 4;
    /// Slots of a source: nanoseconds and runs that recorded something, then nanoseconds
    /// and runs that recorded nothing.
    pub const RECORDED_NS: u32 = 0;
    pub const RECORDED_RUNS: u32 = 1;
    pub const SKIPPED_NS: u32 = 2;
    pub const SKIPPED_RUNS: u32 = 3;
    pub const SLOTS: u32 = 4;
}
