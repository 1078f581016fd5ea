//! The programs' measurement of their own run time, when userspace asks for it (the
//! governor's source where the kernel's `bpf_stats` are off).
use agent_common::{counter, run};
use aya_ebpf::helpers::bpf_ktime_get_ns;

use crate::{
    buffers::{add, bump, BufferSet},
    config::config,
};

/// Non-zero: each program counts its runs and their time in the set's `counter::RUN_NS` counters.
#[no_mangle]
pub static MEASURE_RUN_TIME: u8 = 0;

/// Run-time measurement (`MEASURE_RUN_TIME`): the start of a run, or 0 when not measuring.
#[inline(always)]
pub fn run_started() -> u64 {
    if config(&MEASURE_RUN_TIME) != 0 {
        unsafe { bpf_ktime_get_ns() }
    } else {
        0
    }
}

/// Counts a run of `source` and the time since `start` (from `run_started`), apart as it
/// recorded something or not.
#[inline(always)]
pub fn run_ended(set: &BufferSet, source: u32, start: u64, recorded: bool) {
    if start != 0 {
        let slot = if recorded { run::RECORDED_NS } else { run::SKIPPED_NS };
        let index = counter::RUN_NS + run::SLOTS * source + slot;
        add(set, index, unsafe { bpf_ktime_get_ns() }.saturating_sub(start));
        // The run count sits next to its time.
        bump(set, index + 1);
    }
}
