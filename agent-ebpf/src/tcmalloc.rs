//! The `alloc` group on gperftools tcmalloc's own sampled path, for a process whose tcmalloc
//! samples (`TCMALLOC_SAMPLE_PARAMETER`): no probe on each allocator call. A sampled
//! allocation gets a span of its own, with its size in the span's stack trace, and tcmalloc
//! links it into its list of sampled objects (`DLL_Prepend` onto that list's head); freeing it
//! unlinks it (`DLL_Remove` of a span marked sampled). Both functions also move the spans of
//! tcmalloc's central free lists, rarely: the head (the cookie) and the mark tell them apart.
use agent_common::{counter, tcmalloc_span, LiveAllocation, LiveKey};
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::uprobe,
    programs::ProbeContext,
    EbpfContext as _,
};

use crate::{
    allocations::{count_step, record_sampled, LIVE_ALLOCATIONS},
    buffers::{active_set, bump},
};

/// `DLL_Prepend(list, span)`: a sampled allocation when `list` is the sampled objects' head.
#[uprobe]
pub fn tcmalloc_sampled(ctx: ProbeContext) -> u32 {
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    count_step(cookie);
    let head = cookie & tcmalloc_span::HEAD_MASK;
    let (list, span) = (ctx.arg::<u64>(0).unwrap_or(0), ctx.arg::<u64>(1).unwrap_or(0));
    let set = active_set();
    bump(&set, counter::SAMPLED_PATH_HITS);
    if list != head || span == 0 {
        return 0;
    }
    let read = |at: u64| unsafe { bpf_probe_read_user((span + at) as *const u64) }.ok();
    let (Some(page), Some(trace)) = (read(tcmalloc_span::START), read(tcmalloc_span::OBJECTS)) else { return 0 };
    let Ok(size) = (unsafe { bpf_probe_read_user(trace as *const u64) }) else { return 0 };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let key = record_sampled(&set, tgid, size);
    let live = LiveAllocation { key, size, at_ns: unsafe { bpf_ktime_get_ns() } };
    let address = page << tcmalloc_span::PAGE_SHIFT;
    if LIVE_ALLOCATIONS.insert(&LiveKey { tgid, _pad: 0, address }, &live, 0).is_err() {
        bump(&set, counter::ALLOC_UNTRACKED);
    }
    0
}

/// `DLL_Remove(span)`: a sampled allocation freed when the span is marked sampled.
#[uprobe]
pub fn tcmalloc_freed(ctx: ProbeContext) -> u32 {
    count_step(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) });
    let span = ctx.arg::<u64>(0).unwrap_or(0);
    bump(&active_set(), counter::SAMPLED_PATH_HITS);
    let Ok(flags) = (unsafe { bpf_probe_read_user((span + tcmalloc_span::FLAGS) as *const u8) }) else { return 0 };
    if flags & tcmalloc_span::SAMPLED == 0 {
        return 0;
    }
    let Ok(page) = (unsafe { bpf_probe_read_user((span + tcmalloc_span::START) as *const u64) }) else { return 0 };
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let _ = LIVE_ALLOCATIONS.remove(&LiveKey { tgid, _pad: 0, address: page << tcmalloc_span::PAGE_SHIFT });
    0
}
