//! Offsets the loader reads from tracefs and BTF and writes into the programs' globals: the
//! kernel's structures differ between versions, the programs' code does not.
/// Byte offsets of a tracepoint's fields, read from its format file at start-up.
/// `ABSENT` marks a field the tracepoint does not have.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldLayout {
    /// Packet length (u32).
    pub len: u32,
    /// `__data_loc char[] name`: the device name.
    pub name: u32,
    /// kfree_skb's `enum skb_drop_reason reason` (u32).
    pub reason: u32,
    /// The skb pointer.
    pub skbaddr: u32,
}

impl FieldLayout {
    pub const ABSENT: u32 = u32::MAX;
    pub const NONE: FieldLayout =
        FieldLayout { len: Self::ABSENT, name: Self::ABSENT, reason: Self::ABSENT, skbaddr: Self::ABSENT };
}

/// sched_switch field offsets and sizes, from its format file.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchLayout {
    pub prev_pid: u32,
    pub prev_state: u32,
    /// 4 or 8 (`long prev_state` since 5.x, `int` before).
    pub prev_state_size: u32,
    pub next_pid: u32,
}

/// mmap:vm_unmapped_area field offsets (where the kernel found room for a new mapping), from
/// its format file.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AreaLayout {
    pub addr: u32,
    pub length: u32,
}

/// Where a sample's process life is told apart (`SampleKey::process_tag`): offsets in
/// `struct task_struct`, from kernel BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskLayout {
    /// `group_leader`: the process's first thread (it keeps the process's start time).
    pub group_leader: u32,
    /// `start_boottime` (u64 ns): set when the task is created, kept through exec.
    pub start_boottime: u32,
    /// `self_exec_id` (u64): counts the execs of the task and its ancestors.
    pub self_exec_id: u32,
    /// `comm` (COMM_LEN bytes): the thread's name.
    pub comm: u32,
    /// `mm`: the process's memory; and in `struct mm_struct`, `start_stack` (u64).
    pub mm: u32,
    pub start_stack: u32,
    /// `thread.fsbase`: the user thread pointer (x86-64), which `pthread_self()` returns.
    pub fsbase: u32,
    /// In `struct mm_struct`: `start_code` and `end_code` (the executable's code as loaded)
    /// and `exe_file`; in `struct file`, `f_inode`; in `struct inode`, `i_ino` and `i_sb`; in
    /// `struct super_block`, `s_dev`: which file the process runs, and where its code is.
    pub start_code: u32,
    pub end_code: u32,
    pub exe_file: u32,
    pub f_inode: u32,
    pub i_ino: u32,
    pub i_sb: u32,
    pub s_dev: u32,
    /// In `struct mm_struct`, `brk`: the heap's end, from which a brk call grows it.
    pub brk: u32,
    /// `se.sum_exec_runtime` (u64 ns): the thread's run time so far.
    pub sum_exec_runtime: u32,
}
