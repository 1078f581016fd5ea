//! On-CPU sampling: the perf_event program, one sample per tick of the CPU clock.
use agent_common::{counter, kind, run};
use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::perf_event, programs::PerfEventContext};

use crate::{
    aggregate::{add_to_existing, record_new},
    buffers::{active_set, bump, kernel_stack_id, BufferSet},
    config::passes_filters,
    run_time::{run_ended, run_started},
    thread_cache::current_key,
    walk,
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
    let mut key = current_key(kind::ON_CPU, set);
    // A sample taken in user mode has the user registers at hand, and no kernel stack (the
    // kernel would walk nothing and return -EFAULT): skip that helper call.
    let regs = unsafe { &(*ctx.ctx).regs };
    let user_mode = walk::in_user_mode(regs);
    let walked = walk::walk(set, tgid, key.process_tag, user_mode.then_some(regs));
    match walked {
        Ok(walked) => walked.name_in(&mut key),
        Err(status) => key.user_stack_id = status,
    }
    if !user_mode {
        key.kernel_stack_id = kernel_stack_id(ctx, set);
    }
    // The period is the time the sample stands for (ns, for the clock events): on-CPU time
    // stays exact whatever frequency the governor sets.
    let period = unsafe { (*ctx.ctx).sample_period };
    // Most samples repeat a key of this interval, whose user stack is stored already (the
    // key names it by id and check): they are one map update.
    if add_to_existing(set, &key, 1, period) {
        return true;
    }
    if let Ok(walked) = walked {
        walk::store(set, walked, &mut key);
    }
    record_new(set, &key, 1, period);
    true
}
