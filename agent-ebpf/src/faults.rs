//! The `faults` group: page faults, sampled every `period` faults of the software
//! page-faults event on each CPU. A fault is where a process first touches memory it was
//! given (or touches again memory the kernel took back): where its memory grows. Under a CPU
//! budget the agent lengthens the period (the program's runs are the cost), and each sample
//! still carries its own.
use agent_common::{counter, kind, run};
use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::perf_event, programs::PerfEventContext};

use crate::{
    buffers::{active_set, bump, BufferSet},
    config::passes_filters,
    perf_sample::record_sample,
    run_time::{run_ended, run_started},
};

#[perf_event]
pub fn sample_fault(ctx: PerfEventContext) -> u32 {
    let start = run_started();
    let set = active_set();
    let recorded = sample(&ctx, &set);
    run_ended(&set, run::FAULTS, start, recorded);
    0
}

#[inline(always)]
fn sample(ctx: &PerfEventContext, set: &BufferSet) -> bool {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // Kernel threads fault on kernel memory only, which the event does not count.
    if tgid == 0 || !passes_filters(tgid) {
        return false;
    }
    bump(set, counter::FAULT_SAMPLES);
    record_sample(ctx, set, tgid, kind::PAGE_FAULT, unsafe { (*ctx.ctx).sample_period });
    true
}
