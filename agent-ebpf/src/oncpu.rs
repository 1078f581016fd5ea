//! On-CPU sampling: the perf_event program, one sample per tick of the CPU clock.
use agent_common::{counter, kind, run};
use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::perf_event, programs::PerfEventContext};

use crate::{
    buffers::{active_set, bump, BufferSet},
    config::passes_filters,
    perf_sample::record_sample,
    run_time::{run_ended, run_started},
};

#[perf_event]
pub fn sample_cpu(ctx: PerfEventContext) -> u32 {
    let start = run_started();
    let set = active_set();
    let recorded = sample(&ctx, &set);
    run_ended(&set, run::ON_CPU, start, recorded);
    0
}

#[inline(always)]
fn sample(ctx: &PerfEventContext, set: &BufferSet) -> bool {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, pid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if pid == 0 {
        bump(set, counter::IDLE);
        return false;
    }
    if !passes_filters(tgid) {
        bump(set, counter::FILTERED);
        return false;
    }
    bump(set, counter::SAMPLES);
    // The period is the time the sample stands for (ns, for the clock events): on-CPU time
    // stays exact whatever frequency the governor sets.
    record_sample(ctx, set, tgid, kind::ON_CPU, unsafe { (*ctx.ctx).sample_period });
    true
}
