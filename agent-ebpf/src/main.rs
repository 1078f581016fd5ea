//! Ember's kernel side: capture and aggregate only. Names, paths and symbols are userspace
//! work; everything that cannot be kept is counted by reason in the set's counter array.
#![no_std]
#![no_main]

use agent_common::{counter, stack_status, ProcessEvent, SampleKey};
use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{map, perf_event, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf, StackTrace},
    programs::{PerfEventContext, TracePointContext},
    programs::tracing::StackIdContext,
    EbpfContext,
};

// Sizes are defaults; the loader overrides them from the agent's configuration.
const MAX_KEYS: u32 = 10240;
const MAX_STACKS: u32 = 8192;

// Two buffer sets: the programs write to the one ACTIVE_SET names while userspace drains and
// clears the other, so a drain never races the kernel.
#[map]
static COUNTS_A: PerCpuHashMap<SampleKey, u64> = PerCpuHashMap::with_max_entries(MAX_KEYS, 0);
#[map]
static COUNTS_B: PerCpuHashMap<SampleKey, u64> = PerCpuHashMap::with_max_entries(MAX_KEYS, 0);
#[map]
static STACKS_A: StackTrace = StackTrace::with_max_entries(MAX_STACKS, 0);
#[map]
static STACKS_B: StackTrace = StackTrace::with_max_entries(MAX_STACKS, 0);
#[map]
static COUNTERS_A: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);
#[map]
static COUNTERS_B: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);
#[map]
static ACTIVE_SET: Array<u32> = Array::with_max_entries(1, 0);

/// Processes userspace has been told about; a miss sends a `ProcessEvent`.
#[map]
static KNOWN_TGIDS: LruHashMap<u32, u8> = LruHashMap::with_max_entries(16384, 0);
#[map]
static PROCESS_EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);
/// Tgids to sample when FILTER_TGIDS is set.
#[map]
static TGID_FILTER: HashMap<u32, u8> = HashMap::with_max_entries(1024, 0);

// Load-time configuration (rewritten by the loader before the programs are verified).
#[no_mangle]
static FILTER_TGIDS: u8 = 0;
#[no_mangle]
static FILTER_CGROUP: u64 = 0;

struct BufferSet {
    counts: &'static PerCpuHashMap<SampleKey, u64>,
    stacks: &'static StackTrace,
    counters: &'static PerCpuArray<u64>,
}

#[inline(always)]
fn active_set() -> BufferSet {
    let b = matches!(ACTIVE_SET.get(0), Some(&1));
    if b {
        BufferSet { counts: &COUNTS_B, stacks: &STACKS_B, counters: &COUNTERS_B }
    } else {
        BufferSet { counts: &COUNTS_A, stacks: &STACKS_A, counters: &COUNTERS_A }
    }
}

#[inline(always)]
fn bump(counters: &PerCpuArray<u64>, index: u32) {
    if let Some(slot) = counters.get_ptr_mut(index) {
        // Per-CPU slot: no other writer while this program runs on this CPU.
        unsafe { *slot += 1 };
    }
}

/// Stack id, or a `stack_status` marker with its loss counted.
#[inline(always)]
fn stack_id(ctx: &PerfEventContext, set: &BufferSet, user: bool) -> i32 {
    let flags = if user { BPF_F_USER_STACK as u64 } else { 0 };
    match ctx.get_stackid(set.stacks, flags) {
        Ok(id) => id as i32,
        // -EFAULT: no stack of this kind (user-mode sample, or kernel thread).
        Err(-14) => stack_status::NONE,
        Err(-17) => {
            bump(set.counters, if user { counter::USER_STACK_COLLISION } else { counter::KERNEL_STACK_COLLISION });
            stack_status::COLLISION
        }
        Err(_) => {
            bump(set.counters, if user { counter::USER_STACK_ERROR } else { counter::KERNEL_STACK_ERROR });
            stack_status::ERROR
        }
    }
}

#[inline(always)]
fn passes_filters(tgid: u32) -> bool {
    let filter_tgids = unsafe { core::ptr::read_volatile(&FILTER_TGIDS) };
    if filter_tgids != 0 && unsafe { TGID_FILTER.get(&tgid) }.is_none() {
        return false;
    }
    let cgroup = unsafe { core::ptr::read_volatile(&FILTER_CGROUP) };
    cgroup == 0 || cgroup == unsafe { bpf_get_current_cgroup_id() }
}

/// Tell userspace about a process the first time it is sampled. If the ring buffer is full,
/// forget the process again so that the next sample retries.
#[inline(always)]
fn announce_process(tgid: u32, set: &BufferSet) {
    if unsafe { KNOWN_TGIDS.get(&tgid) }.is_some() {
        return;
    }
    if KNOWN_TGIDS.insert(&tgid, &1, BPF_NOEXIST as u64).is_err() {
        return; // another CPU announced it first
    }
    if PROCESS_EVENTS.output::<ProcessEvent>(&ProcessEvent { tgid }, 0).is_err() {
        let _ = KNOWN_TGIDS.remove(&tgid);
        bump(set.counters, counter::PROCESS_EVENT_LOST);
    }
}

#[perf_event]
pub fn sample_cpu(ctx: PerfEventContext) -> u32 {
    let set = active_set();
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, pid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if pid == 0 {
        bump(set.counters, counter::IDLE);
        return 0;
    }
    if !passes_filters(tgid) {
        bump(set.counters, counter::FILTERED);
        return 0;
    }
    bump(set.counters, counter::SAMPLES);

    // A sample taken in user mode has no kernel stack: skip the helper call (the kernel
    // would walk nothing and return -EFAULT). cs's low bits are the privilege level.
    let in_user_mode = unsafe { (*ctx.ctx).regs.cs } & 3 == 3;
    let key = SampleKey {
        tgid,
        pid,
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        user_stack_id: stack_id(&ctx, &set, true),
        kernel_stack_id: if in_user_mode { stack_status::NONE } else { stack_id(&ctx, &set, false) },
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    if let Some(count) = set.counts.get_ptr_mut(&key) {
        unsafe { *count += 1 };
        return 0;
    }
    // First sample of this key in this interval: only here can the process be new to
    // userspace, so the hot path (existing key) skips the lookup of known processes.
    announce_process(tgid, &set);
    if set.counts.insert(&key, &1, BPF_NOEXIST as u64).is_err() {
        // Either the map is full, or another CPU inserted the key first: retry once.
        match set.counts.get_ptr_mut(&key) {
            Some(count) => unsafe { *count += 1 },
            None => bump(set.counters, counter::MAP_FULL),
        }
    }
    0
}

/// After exec a process has new mappings: forget it so its next sample announces it again.
#[tracepoint]
pub fn process_exec(ctx: TracePointContext) -> u32 {
    let tgid = ctx.tgid();
    let _ = KNOWN_TGIDS.remove(&tgid);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
