//! The `alloc` group: uprobes on a process's allocator. Every call traps, so the programs do
//! as little as they can for the calls they do not sample: allocations are sampled by bytes,
//! a Poisson process with the configured mean, and only a sampled one has its stacks walked
//! and is kept in the live table until it is freed.
use agent_common::{allocator_call, counter, kind, LiveAllocation, LiveKey, SampleKey, ALLOC_GAPS};
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::{map, uprobe, uretprobe},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext as _,
};

use crate::{
    aggregate,
    buffers::{active_set, bump, BufferSet},
    thread_cache::current_key,
    walk,
};

/// Exponential gaps between samples (bytes), set by userspace at load.
#[no_mangle]
static ALLOC_GAP_TABLE: [u64; ALLOC_GAPS] = [0; ALLOC_GAPS];

/// Sampled allocations not yet freed; userspace sizes it.
#[map]
pub(crate) static LIVE_ALLOCATIONS: HashMap<LiveKey, LiveAllocation> = HashMap::with_max_entries(1, 0);
/// Per thread, the allocator call it is in, from entry to return. LRU: a return the kernel
/// could not catch (its return-probe stack full) leaves an entry that must not stay.
#[map]
static IN_CALL: LruHashMap<u64, InCall> = LruHashMap::with_max_entries(16384, 0);
/// Per CPU, the bytes left before the next sample (0: not drawn yet).
#[map]
static UNTIL_SAMPLE: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct InCall {
    /// The stack pointer at the probe, the entry's (`probe_site` keeps the probe before
    /// anything moves it): the return is the one that finds it 8 bytes higher.
    sp: u64,
    started_ns: u64,
    call: u64,
    size: u64,
    /// realloc: the block it replaces. posix_memalign: where it writes the address.
    pointer: u64,
    sampled: u64,
    key: SampleKey,
}

/// A call within a call in progress is the allocator's own (glibc's `realloc(NULL, n)` calls
/// `malloc`, perhaps as a tail call, from the same stack pointer) while the outer one is this
/// recent: counting it would count the bytes twice.
const NESTED_NS: u64 = 1_000_000_000;

#[uprobe]
pub fn allocation_called(ctx: ProbeContext) -> u32 {
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    count_step(cookie);
    let pid_tgid = bpf_get_current_pid_tgid();
    let sp = unsafe { (*ctx.regs).rsp };
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(outer) = unsafe { IN_CALL.get(&pid_tgid) } {
        if sp <= outer.sp && now.wrapping_sub(outer.started_ns) < NESTED_NS {
            return 0;
        }
    }
    let call = cookie & !allocator_call::STEPPED;
    let arg = |n| ctx.arg::<u64>(n).unwrap_or(0);
    let (size, pointer) = match call {
        // Each factor capped at 4 GiB: the product cannot overflow (a 128-bit product is not
        // a BPF instruction), and a larger calloc fails anyway.
        allocator_call::CALLOC => (arg(0).min(u32::MAX as u64) * arg(1).min(u32::MAX as u64), 0),
        allocator_call::REALLOC => (arg(1), arg(0)),
        allocator_call::MEMALIGN => (arg(1), 0),
        allocator_call::POSIX_MEMALIGN => (arg(2), arg(0)),
        _ => (arg(0), 0),
    };
    let set = active_set();
    bump(&set, counter::ALLOC_CALLS);
    let mut in_call = InCall { sp, started_ns: now, call, size, pointer, sampled: 0, key: SampleKey::default() };
    if size > 0 && take_sample(size) {
        in_call.key = record_sampled(&set, (pid_tgid >> 32) as u32, size);
        in_call.sampled = 1;
    }
    let _ = IN_CALL.insert(&pid_tgid, &in_call, 0);
    0
}

#[uretprobe]
pub fn allocation_returned(ctx: RetProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(in_call) = (unsafe { IN_CALL.get(&pid_tgid) }) else { return 0 };
    // A nested call returning (see `NESTED_NS`): the outer one is still in progress.
    if unsafe { (*ctx.regs).rsp } != in_call.sp.wrapping_add(8) {
        return 0;
    }
    let in_call = *in_call;
    let _ = IN_CALL.remove(&pid_tgid);
    let tgid = (pid_tgid >> 32) as u32;
    let returned: u64 = ctx.ret();
    let address = match in_call.call {
        allocator_call::POSIX_MEMALIGN if returned == 0 => unsafe { bpf_probe_read_user(in_call.pointer as *const u64) }.unwrap_or(0),
        allocator_call::POSIX_MEMALIGN => 0,
        _ => returned,
    };
    // realloc gives its block back when it returns another, or when asked for 0 bytes.
    if in_call.call == allocator_call::REALLOC && in_call.pointer != 0 && (address != 0 || in_call.size == 0) {
        let _ = LIVE_ALLOCATIONS.remove(&LiveKey { tgid, _pad: 0, address: in_call.pointer });
    }
    if in_call.sampled != 0 && address != 0 {
        let live = LiveAllocation { key: in_call.key, size: in_call.size, at_ns: in_call.started_ns };
        if LIVE_ALLOCATIONS.insert(&LiveKey { tgid, _pad: 0, address }, &live, 0).is_err() {
            bump(&active_set(), counter::ALLOC_UNTRACKED);
        }
    }
    0
}

#[uprobe]
pub fn free_called(ctx: ProbeContext) -> u32 {
    count_step(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) });
    let address = ctx.arg::<u64>(0).unwrap_or(0);
    // `free(NULL)` is not counted: the agent measures what a trap costs with such calls.
    if address != 0 {
        bump(&active_set(), counter::FREE_CALLS);
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        let _ = LIVE_ALLOCATIONS.remove(&LiveKey { tgid, _pad: 0, address });
    }
    0
}

/// Records a sampled allocation of `size` bytes with its stacks, counted at the call in the
/// set that holds its stack (the drain scales it); returns its key.
#[inline(always)]
pub(crate) fn record_sampled(set: &BufferSet, tgid: u32, size: u64) -> SampleKey {
    let mut key = current_key(kind::ALLOCATION, set);
    walk::capture(set, tgid, &mut key);
    aggregate::record(set, &key, 1, size);
    bump(set, counter::ALLOC_SAMPLES);
    key
}

/// Counts a hit the kernel stepped, by the probe's cookie.
#[inline(always)]
pub(crate) fn count_step(cookie: u64) {
    if cookie & allocator_call::STEPPED != 0 {
        bump(&active_set(), counter::PROBE_STEPS);
    }
}

/// Whether an allocation of `size` bytes is sampled: the CPU's count of bytes to the next
/// sample runs out within it. Big allocations are always sampled; the drain scales each
/// sampled one by the chance it had (`1 - e^(-size/mean)`).
#[inline(always)]
fn take_sample(size: u64) -> bool {
    let Some(until) = UNTIL_SAMPLE.get_ptr_mut(0) else { return false };
    let left = match unsafe { *until } {
        0 => next_gap(),
        left => left,
    };
    let sampled = size >= left;
    unsafe { *until = if sampled { next_gap() } else { left - size } };
    sampled
}

#[inline(always)]
fn next_gap() -> u64 {
    let index = unsafe { bpf_get_prandom_u32() } as usize % ALLOC_GAPS;
    // Volatile: the table is written into the object after compilation.
    let gap = unsafe { core::ptr::read_volatile(core::ptr::addr_of!(ALLOC_GAP_TABLE).cast::<u64>().add(index)) };
    gap.max(1)
}
