//! Off-CPU: why a thread left the CPU, and where it last blocked.
use crate::SampleKey;

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
    /// The thread's run time (ns) when it blocked: if its wake-up goes unseen, what it ran
    /// since tells how long it was blocked.
    pub run_ns: u64,
}
