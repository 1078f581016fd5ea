//! The current task as a sample key sees it: which life of its pid its process is in, where
//! its stack starts, its name. Read through typed (BTF) pointers at offsets the loader sets.
use agent_common::{ExeImage, TaskLayout, COMM_LEN};
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, generated::bpf_get_current_task_btf},
    macros::map,
    maps::HashMap,
};

use crate::config::config;

#[no_mangle]
pub static TASK_LAYOUT: TaskLayout = TaskLayout {
    group_leader: 0,
    start_boottime: 0,
    self_exec_id: 0,
    comm: 0,
    mm: 0,
    start_stack: 0,
    fsbase: 0,
    start_code: 0,
    end_code: 0,
    exe_file: 0,
    f_inode: 0,
    i_ino: 0,
    i_sb: 0,
    s_dev: 0,
    brk: 0,
    sum_exec_runtime: 0,
};

/// Per tgid, how many times the process mapped something where its code was since its exec
/// (`area_placed`): each time starts a life of its own. Few processes do. (Preallocated, as
/// kernels before 6.1 require of maps that perf_event programs read.)
#[map]
pub static CODE_REPLACEMENTS: HashMap<u32, u16> = HashMap::with_max_entries(4096, 0);

/// Which life of its pid the current process is in (`SampleKey::process_tag`), and when it
/// started (ns since boot).
#[inline(always)]
pub fn current_life() -> (u16, u64) {
    let layout = config(&TASK_LAYOUT);
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let replaced = unsafe { CODE_REPLACEMENTS.get(&tgid) }.copied().unwrap_or(0);
    // Typed (BTF) pointers: plain loads, which the verifier checks against the kernel's
    // types (the offsets are constants to it), with no helper call.
    unsafe {
        let task = bpf_get_current_task_btf() as *const u8;
        let leader = *(task.add(layout.group_leader as usize) as *const *const u8);
        let start = *(leader.add(layout.start_boottime as usize) as *const u64);
        let execs = *(task.add(layout.self_exec_id as usize) as *const u64);
        (process_tag(start, execs, replaced), start)
    }
}

/// A u64 of the current process's `mm_struct`, at the offset `field` picks from the layout (0
/// for a kernel thread, which has no memory of its own: the load of a null typed pointer
/// reads 0).
#[inline(always)]
fn current_mm_u64(field: impl Fn(&TaskLayout) -> u32) -> u64 {
    let layout = config(&TASK_LAYOUT);
    unsafe {
        let task = bpf_get_current_task_btf() as *const u8;
        let mm = *(task.add(layout.mm as usize) as *const *const u8);
        *(mm.add(field(&layout) as usize) as *const u64)
    }
}

/// Where the current process's stack starts.
#[inline(always)]
pub fn current_stack_start() -> u64 {
    current_mm_u64(|layout| layout.start_stack)
}

/// Where the current process's code starts: 0 while an exec builds its new memory (the
/// loader sets it once the executable is mapped), or for a task without memory.
#[inline(always)]
pub fn current_code_start() -> u64 {
    current_mm_u64(|layout| layout.start_code)
}

/// The current thread's run time so far (ns), as the scheduler accounts it.
#[inline(always)]
pub fn current_run_time() -> u64 {
    let layout = config(&TASK_LAYOUT);
    unsafe { *((bpf_get_current_task_btf() as *const u8).add(layout.sum_exec_runtime as usize) as *const u64) }
}

/// The current process's heap end (`mm->brk`).
#[inline(always)]
pub fn current_brk() -> u64 {
    current_mm_u64(|layout| layout.brk)
}

/// The executable the current process runs, and where its code is (zeros for a kernel
/// thread: loads through a null typed pointer read 0).
#[inline(always)]
pub fn current_exe() -> ExeImage {
    let layout = config(&TASK_LAYOUT);
    unsafe {
        let task = bpf_get_current_task_btf() as *const u8;
        let mm = *(task.add(layout.mm as usize) as *const *const u8);
        let file = *(mm.add(layout.exe_file as usize) as *const *const u8);
        let inode = *(file.add(layout.f_inode as usize) as *const *const u8);
        let sb = *(inode.add(layout.i_sb as usize) as *const *const u8);
        ExeImage {
            code_start: *(mm.add(layout.start_code as usize) as *const u64),
            code_end: *(mm.add(layout.end_code as usize) as *const u64),
            inode: *(inode.add(layout.i_ino as usize) as *const u64),
            dev: *(sb.add(layout.s_dev as usize) as *const u32),
            _pad: 0,
        }
    }
}

/// The 16 bits that tell a process's lives apart: its start time mixed, and its count of
/// execs and of code replacements. Each exec adds 1 and each replacement 257: any 256 lives
/// in a row differ. A new process with a reused pid differs but for 1 in 65,536.
#[inline(always)]
fn process_tag(start_ns: u64, exec_id: u64, replaced: u16) -> u16 {
    ((start_ns.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 48) as u16) ^ (exec_id as u16).wrapping_add(replaced.wrapping_mul(257))
}

/// The current task's name: loaded from the task (the verifier knows its type), which costs
/// less than the helper's copy.
#[inline(always)]
pub fn current_comm() -> [u8; COMM_LEN] {
    unsafe {
        let comm = (bpf_get_current_task_btf() as *const u8).add(config(&TASK_LAYOUT).comm as usize) as *const u64;
        let words = [*comm, *comm.add(1)];
        core::mem::transmute::<[u64; 2], [u8; COMM_LEN]>(words)
    }
}

/// The current thread's user thread pointer (fsbase), which `pthread_self()` returns.
#[inline(always)]
pub fn current_thread_pointer() -> u64 {
    unsafe { *((bpf_get_current_task_btf() as *const u8).add(config(&TASK_LAYOUT).fsbase as usize) as *const u64) }
}
