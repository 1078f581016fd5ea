//! The memory kinds' shared facts: which call asked the kernel for memory, and where the
//! syscall tracepoints keep what it asked for.

/// Which call a `kind::MEMORY_REQUEST` event is (`SampleKey::aux`).
pub mod memory_call {
    /// `brk`: the heap's end moved up.
    pub const BRK: u32 = 1;
    /// `mmap` of anonymous memory.
    pub const MMAP: u32 = 2;
}

/// syscalls:sys_enter_brk and sys_enter_mmap field offsets, from their format files: the new
/// break asked for; a mapping's length and flags.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLayout {
    pub brk: u32,
    pub mmap_len: u32,
    pub mmap_flags: u32,
}
