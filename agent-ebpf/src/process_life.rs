//! A process's life as the walks and userspace must follow it: fork, exec, exit, code
//! replaced in place (dlclose then dlopen), and moves between cgroups.
use agent_common::{counter, FieldLayout, AreaLayout};
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::tracepoint,
    programs::TracePointContext,
    EbpfContext,
};

use crate::{
    announce::{announce_process, told, KNOWN_TGIDS},
    buffers::{active_set, bump},
    config::{config, field, passes_filters, rates},
    offcpu::OFF_CPU_START,
    python,
    task::{current_life, CODE_REPLACEMENTS},
    thread_cache::bump_fields_epoch,
    walk,
};

/// Where sched_process_fork's record holds `child_pid`, and sched_process_exit's
/// `group_dead` (`FieldLayout::ABSENT` if it has none), from their format files.
#[no_mangle]
static FORK_CHILD_PID: u32 = 0;
#[no_mangle]
static EXIT_GROUP_DEAD: u32 = FieldLayout::ABSENT;

#[no_mangle]
static AREA_LAYOUT: AreaLayout = AreaLayout { addr: 0, length: 0 };

/// A task moved to another cgroup: threads' kept cgroups are read again.
#[tracepoint]
pub fn cgroup_moved(_ctx: TracePointContext) -> u32 {
    bump_fields_epoch();
    0
}

/// A thread exits: its off-CPU entry goes. When the process's last thread exits (the
/// record's `group_dead`, since 6.16, where the tracepoint fires before the memory is torn
/// down), its mappings are forgotten and it is marked exited (`told::EXITED`). Without
/// `group_dead`, the process is forgotten at its main thread's exit, as before; threads that
/// run on announce it again.
#[tracepoint]
pub fn process_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, pid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    let _ = OFF_CPU_START.remove(&pid);
    let group_dead = config(&EXIT_GROUP_DEAD);
    if group_dead != FieldLayout::ABSENT {
        if field::<u8>(&ctx, group_dead) != 0 {
            let _ = KNOWN_TGIDS.insert(&tgid, &told::EXITED, 0);
            forget_code(tgid);
        }
    } else if tgid == pid {
        forget(tgid);
    }
    0
}

/// Neither the process nor its mappings are known any more: its next event announces it.
#[inline(always)]
fn forget(tgid: u32) {
    let _ = KNOWN_TGIDS.remove(&tgid);
    forget_code(tgid);
}

/// The process's code is not what it was: its mappings go, and so does its count of code
/// replacements (its lives from here on are told apart by its start time and exec count).
#[inline(always)]
fn forget_code(tgid: u32) {
    walk::forget_process(tgid);
    python::forget_process(tgid);
    let _ = CODE_REPLACEMENTS.remove(&tgid);
}

/// A new process or thread: its pid may have been a dead process's, whose mark and
/// mappings go, so that the new one's first event announces it (and it is not symbolized
/// with the dead one's mappings).
#[tracepoint]
pub fn process_fork(ctx: TracePointContext) -> u32 {
    forget(field(&ctx, config(&FORK_CHILD_PID)));
    0
}

/// After exec a process has new mappings: forget its old ones, and have the tables of its
/// binary in place before its first sample: on a busy host a short-lived process may be
/// sampled once or twice in all, and a walk made before its tables are loaded stops at the
/// first frame without a frame pointer. An executable userspace has a template for is put in
/// place here, and userspace is told without being woken; any other is announced at once,
/// for userspace to load. Its first event announces it again, to read the libraries the
/// loader has mapped since.
#[tracepoint]
pub fn process_exec(ctx: TracePointContext) -> u32 {
    let tgid = ctx.tgid();
    forget(tgid);
    // Under the CPU budget's pause of exec captures, the process is announced at its first
    // event instead, which the sampling rates bound.
    if passes_filters(tgid) && rates().exec_announcements_paused == 0 {
        // In place before the event is sent: userspace may take it at once, and then finds
        // the walker pointed at the template it was told of.
        let from_template = walk::load_from_template(tgid);
        if !announce_process(tgid, current_life().0, told::AT_EXEC, from_template, &active_set()) && from_template {
            // Userspace must know of every process pointed at a template, which it frees
            // once no process it knows has it.
            forget_code(tgid);
        }
    }
    0
}

/// The kernel found room for a new mapping (mmap:vm_unmapped_area). Room over code that the
/// walks know of the process means that code was unmapped and something else goes there
/// (dlclose, then dlopen of another library): the old tables and names do not hold for it.
/// The process starts a new life, so that its samples from here on are told apart from those
/// its old mappings name; the walks forget its mappings (frame pointers, marked, until they
/// are loaded again); and it is announced, so that userspace reads them again. The mapping
/// is not made yet: userspace's read of the maps waits for it.
#[tracepoint]
pub fn area_placed(ctx: TracePointContext) -> u32 {
    let tgid = ctx.tgid();
    let area = || {
        let layout = config(&AREA_LAYOUT);
        let (start, length): (u64, u64) = (field(&ctx, layout.addr), field(&ctx, layout.length));
        // A failure is an error number, which is no page's address: an empty range.
        (start, if start & 0xfff == 0 { start.saturating_add(length) } else { start })
    };
    if !walk::maps_code_in(tgid, area) {
        return 0;
    }
    // Not `forget`, which drops the count: the new one is in place before the mappings go.
    let replaced = unsafe { CODE_REPLACEMENTS.get(&tgid) }.copied().unwrap_or(0).wrapping_add(1);
    let _ = CODE_REPLACEMENTS.insert(&tgid, &replaced, 0);
    bump_fields_epoch();
    let _ = KNOWN_TGIDS.remove(&tgid);
    walk::forget_process(tgid);
    let set = active_set();
    bump(&set, counter::CODE_REPLACED);
    if passes_filters(tgid) {
        announce_process(tgid, current_life().0, told::RUNNING, false, &set);
    }
    0
}
