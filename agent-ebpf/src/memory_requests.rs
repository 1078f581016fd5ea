//! The `faults` group's other half: calls that ask the kernel for memory, `brk` (the heap
//! grows) and anonymous `mmap`, each recorded with its stacks and the bytes it asked for.
//! Every call is recorded (they are far rarer than the faults that follow them), but for the
//! CPU budget's `fault_ratio`: then one in that many, counted as many times.
use agent_common::{kind, memory_call, run, RequestLayout};
use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext};

use crate::{
    aggregate,
    buffers::{active_set, BufferSet},
    config::{config, field, passes_filters, rates, sampled_out},
    run_time::{run_ended, run_started},
    task::current_brk,
    thread_cache::current_key,
    walk,
};

#[no_mangle]
static REQUEST_LAYOUT: RequestLayout = RequestLayout { brk: 0, mmap_len: 0, mmap_flags: 0 };

const MAP_ANONYMOUS: u64 = 0x20;
const PAGE: u64 = 4096;

#[tracepoint]
pub fn brk_called(ctx: TracePointContext) -> u32 {
    let start = run_started();
    let set = active_set();
    let asked: u64 = field(&ctx, config(&REQUEST_LAYOUT).brk);
    // brk(0) asks where the heap ends, and a lower end gives memory back.
    let grows = asked.saturating_sub(current_brk());
    let recorded = grows > 0 && record(&set, memory_call::BRK, grows);
    run_ended(&set, run::FAULTS, start, recorded);
    0
}

#[tracepoint]
pub fn mmap_called(ctx: TracePointContext) -> u32 {
    let start = run_started();
    let set = active_set();
    let layout = config(&REQUEST_LAYOUT);
    let (length, flags): (u64, u64) = (field(&ctx, layout.mmap_len), field(&ctx, layout.mmap_flags));
    // The kernel maps whole pages.
    let recorded = flags & MAP_ANONYMOUS != 0 && length > 0 && record(&set, memory_call::MMAP, length.saturating_add(PAGE - 1) & !(PAGE - 1));
    run_ended(&set, run::FAULTS, start, recorded);
    0
}

/// Records a call asking for `bytes` if the filters pass it and it is one of the
/// `fault_ratio` recorded, counted that many times. Whether it was.
#[inline(always)]
fn record(set: &BufferSet, call: u32, bytes: u64) -> bool {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let ratio = rates().fault_ratio.max(1);
    if !passes_filters(tgid) || sampled_out(ratio) {
        return false;
    }
    let mut key = current_key(kind::MEMORY_REQUEST, set);
    key.aux = call;
    walk::capture(set, tgid, &mut key);
    // No overflow: a length below 2^48 times a ratio of at most 10,000.
    aggregate::record(set, &key, ratio as u64, bytes.wrapping_mul(ratio as u64));
    true
}
