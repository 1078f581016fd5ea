//! What the perf_event programs share: a sample's stacks, walked in the sampled task's own
//! context, added to its key with the weight the sample stands for.
use aya_ebpf::programs::PerfEventContext;

use crate::{
    aggregate::{add_to_existing, record_new},
    buffers::{kernel_stack_id, BufferSet},
    thread_cache::current_key,
    walk,
};

/// Records a sample of event `kind` standing for `weight` (the event's period).
#[inline(always)]
pub fn record_sample(ctx: &PerfEventContext, set: &BufferSet, tgid: u32, kind: u8, weight: u64) {
    let mut key = current_key(kind, set);
    // A sample taken in user mode has the user registers at hand, and no kernel stack (the
    // kernel would walk nothing and return -EFAULT): skip that helper call.
    let regs = unsafe { &(*ctx.ctx).regs };
    let user_mode = walk::in_user_mode(regs);
    let walked = walk::walk(set, tgid, key.process_tag, user_mode.then_some(regs));
    // Named before the kernel stack is taken: with the kernel stack first, the compiler merged
    // the walk's two outcomes into code that reads a register the verifier sees unset.
    match walked {
        Ok(walked) => walked.name_in(&mut key),
        Err(status) => key.user_stack_id = status,
    }
    if !user_mode {
        key.kernel_stack_id = kernel_stack_id(ctx, set);
    }
    // Most samples repeat a key of this interval, whose user stack is stored already (the
    // key names it by id and check): they are one map update.
    if add_to_existing(set, &key, 1, weight) {
        return;
    }
    if let Ok(walked) = walked {
        walk::store(set, walked, &mut key);
    }
    record_new(set, &key, 1, weight);
}
