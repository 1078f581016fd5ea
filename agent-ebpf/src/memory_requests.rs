//! The `faults` group's other half: calls that ask the kernel for memory, `brk` (the heap
//! grows) and anonymous `mmap`, each recorded with its stacks and the bytes it asked for.
//! Every call is recorded: they are far rarer than the faults that follow them.
use agent_common::{kind, memory_call, RequestLayout};
use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext};

use crate::{
    aggregate,
    buffers::active_set,
    config::{config, field, passes_filters},
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
    let asked: u64 = field(&ctx, config(&REQUEST_LAYOUT).brk);
    // brk(0) asks where the heap ends, and a lower end gives memory back.
    let grows = asked.saturating_sub(current_brk());
    if grows > 0 {
        record(memory_call::BRK, grows);
    }
    0
}

#[tracepoint]
pub fn mmap_called(ctx: TracePointContext) -> u32 {
    let layout = config(&REQUEST_LAYOUT);
    let (length, flags): (u64, u64) = (field(&ctx, layout.mmap_len), field(&ctx, layout.mmap_flags));
    if flags & MAP_ANONYMOUS != 0 && length > 0 {
        // The kernel maps whole pages.
        record(memory_call::MMAP, length.saturating_add(PAGE - 1) & !(PAGE - 1));
    }
    0
}

#[inline(always)]
fn record(call: u32, bytes: u64) {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !passes_filters(tgid) {
        return;
    }
    let set = active_set();
    let mut key = current_key(kind::MEMORY_REQUEST, &set);
    key.aux = call;
    walk::capture(&set, tgid, &mut key);
    aggregate::record(&set, &key, 1, bytes);
}
