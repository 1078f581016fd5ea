//! Off-CPU: sched_switch, the time threads spend blocked, by where they blocked.
use agent_common::{block_state, counter, kind, run, OffCpuStart, SwitchLayout};
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};

use crate::{
    aggregate::record,
    buffers::{active_set, bump, kernel_stack_id, BufferSet},
    config::{config, field, passes_filters, rates, sampled_out},
    run_time::{run_ended, MEASURE_RUN_TIME},
    task::current_run_time,
    thread_cache::current_key,
    walk,
};

/// Off-CPU: per thread that has blocked, where and when it last blocked (start 0 once it
/// woke). Not an LRU: a full table must refuse (and count) a new thread's block, never
/// silently evict one being measured. A thread that exits leaves it (`process_exit`), so
/// entries cannot leak.
#[map]
pub static OFF_CPU_START: HashMap<u32, OffCpuStart> = HashMap::with_max_entries(65536, 0);

#[no_mangle]
static SWITCH_LAYOUT: SwitchLayout = SwitchLayout { prev_pid: 0, prev_state: 0, prev_state_size: 0, next_pid: 0 };
#[no_mangle]
static OFF_CPU_STATES: u32 = block_state::PREEMPTED | block_state::SLEEPING | block_state::UNINTERRUPTIBLE;
#[no_mangle]
static OFF_CPU_MIN_NS: u64 = 0;
#[no_mangle]
static OFF_CPU_MAX_NS: u64 = u64::MAX;

/// Which `block_state` a sched_switch prev_state means (0: not tracked, e.g. exiting,
/// stopped, idle kernel threads). Preemption is reported as TASK_RUNNING (0) or with the
/// TASK_REPORT_MAX bit, above every state bit.
#[inline(always)]
fn block_class(prev_state: u64) -> u32 {
    match prev_state {
        0 => block_state::PREEMPTED,
        1 => block_state::SLEEPING,
        2 => block_state::UNINTERRUPTIBLE,
        s if s >= 0x100 => block_state::PREEMPTED,
        _ => 0,
    }
}

/// Off-CPU: at switch-out, remember where the thread blocked (its stacks, captured now, in
/// its own context); at switch-in, add the time it was away to that place.
#[tracepoint]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    let layout = config(&SWITCH_LAYOUT);
    let now = unsafe { bpf_ktime_get_ns() };
    let set = active_set();
    let prev_pid: u32 = field(&ctx, layout.prev_pid);
    let next_pid: u32 = field(&ctx, layout.next_pid);
    let mut recorded = false;
    if prev_pid != 0 {
        let state: u64 = if layout.prev_state_size == 8 {
            field(&ctx, layout.prev_state)
        } else {
            field::<u32>(&ctx, layout.prev_state) as u64
        };
        recorded = switch_out(&ctx, &set, state, now);
    }
    if next_pid != 0 {
        recorded |= switch_in(&set, next_pid, now);
    }
    // `now` is this run's start.
    if config(&MEASURE_RUN_TIME) != 0 {
        run_ended(&set, run::OFF_CPU, now, recorded);
    }
    0
}

#[inline(always)]
/// Returns whether it captured the block's stacks.
fn switch_out(ctx: &TracePointContext, set: &BufferSet, state: u64, now: u64) -> bool {
    let class = block_class(state);
    if class & config(&OFF_CPU_STATES) == 0 {
        return false;
    }
    // Sampled out first: on a switch-heavy host most switches should cost next to nothing.
    let ratio = rates().off_cpu_ratio.max(1);
    if sampled_out(ratio) {
        return false;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !passes_filters(tgid) {
        return false;
    }
    let mut key = current_key(kind::OFF_CPU, set);
    key.aux = class;
    let last = OFF_CPU_START.get_ptr_mut(&key.pid);
    match walk::walk(set, tgid, key.process_tag, None) {
        // Most blocks repeat the thread's last one: if that was in this interval, its user
        // stack is stored already.
        Ok(walked) if last.is_some_and(|last| unsafe { (*last).generation == set.generation && walked.is_named_in(&(*last).key) }) => {
            walked.name_in(&mut key)
        }
        Ok(walked) => walk::store(set, walked, &mut key),
        Err(status) => key.user_stack_id = status,
    }
    key.kernel_stack_id = kernel_stack_id(ctx, set);
    let run_ns = current_run_time();
    // Still blocked by the table: the kernel did not run the program for the switch that woke
    // the thread (seen on a busy host, by every program on the tracepoint at once). What the
    // thread ran since is the part of the time since it blocked that it was not blocked.
    // (After the walk: the verifier then checks the walk once, not for each branch.)
    if let Some(entry) = last {
        let unseen = unsafe { &*entry };
        if unseen.start_ns != 0 {
            bump(set, counter::OFF_CPU_WAKES_UNSEEN);
            count_block(set, unseen, now.saturating_sub(unseen.start_ns).saturating_sub(run_ns.saturating_sub(unseen.run_ns)));
        }
    }
    let start = OffCpuStart { key, start_ns: now, weight: ratio, generation: set.generation, run_ns };
    // A thread that blocked before keeps its entry, emptied when it woke: it is rewritten in
    // place, which costs less than the map's delete at switch-in and insert here. (Only this
    // thread's exit deletes it.)
    match last {
        Some(entry) => unsafe { *entry = start },
        None => {
            if OFF_CPU_START.insert(&key.pid, &start, BPF_NOEXIST as u64).is_err() {
                bump(set, counter::OFF_CPU_TABLE_FULL);
            }
        }
    }
    true
}

/// Returns whether it found (and counted) a block of this thread.
#[inline(always)]
fn switch_in(set: &BufferSet, pid: u32, now: u64) -> bool {
    let Some(entry) = OFF_CPU_START.get_ptr_mut(&pid) else { return false };
    let start = unsafe { *entry };
    if start.start_ns == 0 {
        return false; // not blocked since it last woke
    }
    unsafe { (*entry).start_ns = 0 };
    count_block(set, &start, now.saturating_sub(start.start_ns));
    true
}

/// Adds a block of `blocked` ns to where it started, unless the block time range leaves it out.
#[inline(always)]
fn count_block(set: &BufferSet, start: &OffCpuStart, blocked: u64) {
    if blocked < config(&OFF_CPU_MIN_NS) || blocked > config(&OFF_CPU_MAX_NS) {
        bump(set, counter::OFF_CPU_OUT_OF_RANGE);
        return;
    }
    let weight = start.weight.max(1) as u64;
    bump(set, counter::OFF_CPU_BLOCKS);
    record(set, &start.key, weight, blocked * weight);
}
