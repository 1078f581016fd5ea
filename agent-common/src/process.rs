//! What the programs tell userspace of a process through the ring buffer.
/// Sent through the ring buffer the first time a process is sampled (and again after it
/// execs), so that userspace captures its memory mappings while it still runs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessEvent {
    pub tgid: u32,
    /// The life of the pid announced (`SampleKey::process_tag`).
    pub tag: u16,
    /// 1 when sent at exec, before the loader has mapped the libraries; else 0.
    pub at_exec: u8,
    /// 1 when the exec program pointed the process at its executable's template
    /// (`ExeTemplate`): the walker has its mappings already, and the event was sent without
    /// waking userspace.
    pub from_template: u8,
    /// 0 for a process seen for the first time or after exec. Else a pc where a user-stack
    /// walk ended outside every mapping userspace gave the walker: code mapped since they
    /// were read (a library loaded with dlopen) if no mapping userspace knows holds it.
    pub pc: u64,
    /// The process's start (ns since boot, its leader's `start_boottime`, which /proc shows
    /// in clock ticks), or 0 when announced from another task's context: userspace checks it
    /// to not read another process's mappings for it after its pid was reused.
    pub start_ns: u64,
    /// Where the process's stack starts (`mm->start_stack`, /proc's stat field 28), or 0 when
    /// announced from another task's context. An exec maps a new stack, at a random place:
    /// userspace checks it to not read the mappings of a program exec'd since for this life.
    pub start_stack: u64,
    /// The executable the process runs and where its code is, or zeros when announced from
    /// another task's context.
    pub exe: ExeImage,
    /// The process's name, or zeros when announced from another task's context.
    pub comm: [u8; crate::COMM_LEN],
}

/// The executable a process runs, as the kernel loaded it: enough to tell the walker where
/// its code is before any of /proc is read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExeImage {
    /// `mm->start_code`: the load address of the lowest executable segment's first byte.
    pub code_start: u64,
    /// `mm->end_code`: the end of the highest executable segment's file bytes.
    pub code_end: u64,
    pub inode: u64,
    /// The file system's device, as the kernel encodes it (major << 20 | minor).
    pub dev: u32,
    pub _pad: u32,
}

impl ExeImage {
    /// The key of the executable's template, as the exec program and userspace both name it.
    pub fn key(&self) -> crate::ExeKey {
        crate::ExeKey { inode: self.inode, dev: self.dev, _pad: 0 }
    }
}

/// The walker's key for the megabyte of `pc` in process `tgid`, where it told userspace of
/// unknown code (`names::UNMAPPED_TOLD`).
#[inline(always)]
pub fn unmapped_region(tgid: u32, pc: u64) -> u64 {
    ((tgid as u64) << 32) | (pc >> 20)
}
