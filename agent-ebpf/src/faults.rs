//! The `faults` group: page faults, sampled every `period` faults of the software
//! page-faults event on each CPU. A fault is where a process first touches memory it was
//! given (or touches again memory the kernel took back): where its memory grows.
use agent_common::{counter, kind};
use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::perf_event, programs::PerfEventContext};

use crate::{
    buffers::{active_set, bump},
    config::passes_filters,
    perf_sample::record_sample,
};

#[perf_event]
pub fn sample_fault(ctx: PerfEventContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // Kernel threads fault on kernel memory only, which the event does not count.
    if tgid == 0 || !passes_filters(tgid) {
        return 0;
    }
    let set = active_set();
    bump(&set, counter::FAULT_SAMPLES);
    record_sample(&ctx, &set, tgid, kind::PAGE_FAULT, unsafe { (*ctx.ctx).sample_period });
    0
}
