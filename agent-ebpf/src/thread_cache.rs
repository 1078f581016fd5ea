//! Each CPU keeps the fields of the last threads it saw (cgroup, life): read from the task
//! they are several cold pointers away, and most samples repeat a recent thread. Also the key
//! every event starts from.
use agent_common::{stack_status, SampleKey, IFNAMSIZ};
use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, generated::bpf_get_current_task_btf},
    macros::map,
    maps::{Array, PerCpuArray},
};

use crate::{
    buffers::BufferSet,
    config::config,
    task::{current_comm, current_life, TASK_LAYOUT},
};

/// What the key says of the thread besides its ids, as last read on this CPU.
#[repr(C)]
#[derive(Clone, Copy)]
struct ThreadFields {
    /// Which thread: its ids, its start time (for a later thread with its pid) and its exec
    /// count (an exec starts a new life).
    pid_tgid: u64,
    start_ns: u64,
    exec_id: u64,
    /// `FIELDS_EPOCH` when the cgroup and the life were read.
    epoch: u64,
    cgroup_id: u64,
    process_tag: u16,
    _pad: [u16; 3],
}

/// Threads whose fields each CPU keeps, by pid: the two ends of a pipe, taking turns on a
/// CPU, keep theirs.
const THREAD_SLOTS: usize = 8;

/// Per CPU, the fields of the last threads seen here. Read from the task, they cost about a
/// twentieth of a sample: the cgroup's id is four pointers away and the life's start time
/// two, and after the workload had the CPU to itself each is a cold line.
#[map]
static THREAD_FIELDS: PerCpuArray<[ThreadFields; THREAD_SLOTS]> = PerCpuArray::with_max_entries(1, 0);

/// Counts moves of tasks between cgroups (`cgroup_moved`) and code replacements
/// (`area_placed`): kept fields of an earlier count are read again.
#[map]
static FIELDS_EPOCH: Array<u64> = Array::with_max_entries(1, 0);

/// Some thread's kept fields may no longer hold.
#[inline(always)]
pub fn bump_fields_epoch() {
    if let Some(epoch) = FIELDS_EPOCH.get_ptr_mut(0) {
        // An atomic add (core has no atomic read-modify-write for BPF): two moves at once on
        // two CPUs must count twice.
        unsafe { core::arch::asm!("lock *(u64 *)({p} + 0) += {one}", p = in(reg) epoch, one = in(reg) 1u64, options(nostack)) };
    }
}

#[inline(always)]
fn thread_fields(pid_tgid: u64) -> ThreadFields {
    // Read before the cgroup: a move after this read counts after it.
    let epoch = FIELDS_EPOCH.get_ptr(0).map_or(0, |epoch| unsafe { core::ptr::read_volatile(epoch) });
    let layout = config(&TASK_LAYOUT);
    let (start_ns, exec_id) = unsafe {
        let task = bpf_get_current_task_btf() as *const u8;
        (*(task.add(layout.start_boottime as usize) as *const u64), *(task.add(layout.self_exec_id as usize) as *const u64))
    };
    let read = || ThreadFields {
        pid_tgid,
        start_ns,
        exec_id,
        epoch,
        process_tag: current_life().0,
        _pad: [0; 3],
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
    };
    let Some(kept) = THREAD_FIELDS.get_ptr_mut(0).and_then(|slots| unsafe { (*slots).get_mut(pid_tgid as usize & (THREAD_SLOTS - 1)) })
    else {
        return read();
    };
    if kept.pid_tgid != pid_tgid || kept.start_ns != start_ns || kept.exec_id != exec_id || kept.epoch != epoch {
        *kept = read();
    }
    // Loaded from the map either way: the verifier then follows one path on from here (with
    // the fields just read on the stack, it followed both, twice the instructions).
    unsafe { core::ptr::read_volatile(kept) }
}

/// Key of an event on the current task (stacks filled in by the caller).
#[inline(always)]
pub fn current_key(event_kind: u8, set: &BufferSet) -> SampleKey {
    let pid_tgid = bpf_get_current_pid_tgid();
    let thread = thread_fields(pid_tgid);
    SampleKey {
        tgid: (pid_tgid >> 32) as u32,
        pid: pid_tgid as u32,
        cgroup_id: thread.cgroup_id,
        user_stack_id: stack_status::NONE,
        kernel_stack_id: stack_status::NONE,
        comm: current_comm(),
        device: [0; IFNAMSIZ],
        kind: event_kind,
        stack_set: set.index,
        process_tag: thread.process_tag,
        aux: 0,
        user_stack_check: 0,
    }
}
