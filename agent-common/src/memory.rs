//! The memory kinds' shared facts: which call asked the kernel for memory, where the
//! syscall tracepoints keep what it asked for, and the `alloc` group's sampling and live
//! table.

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

/// Which allocator function an `alloc` probe is on (its attach cookie): where its size is.
pub mod allocator_call {
    /// `malloc(size)`, `valloc(size)`, C++ `operator new(size)` and its array and aligned forms.
    pub const MALLOC: u64 = 1;
    /// `calloc(count, size)`.
    pub const CALLOC: u64 = 2;
    /// `realloc(old, size)`: `old` is freed when it succeeds (or when `size` is 0).
    pub const REALLOC: u64 = 3;
    /// `memalign(alignment, size)`, `aligned_alloc(alignment, size)`.
    pub const MEMALIGN: u64 = 4;
    /// `posix_memalign(&out, alignment, size)`: the address is written to `out`.
    pub const POSIX_MEMALIGN: u64 = 5;
    /// Set beside the call (alone on a free probe, beside the list head on a sampled-path
    /// probe) where the kernel steps the probed instruction out of line, a second trap:
    /// counted as `counter::PROBE_STEPS`. Above any user address.
    pub const STEPPED: u64 = 1 << 63;
}

/// gperftools tcmalloc's `Span` (2.x, span.h), as the `alloc` group reads a sampled one on
/// tcmalloc's own sampled path.
pub mod tcmalloc_span {
    /// `PageID start`: the span's first page; a sampled allocation's address is its start.
    pub const START: u64 = 0;
    /// `void* objects`: a sampled span's `StackTrace`, whose first field is the size asked for.
    pub const OBJECTS: u64 = 0x20;
    /// The byte of the span's bitfields that holds `sample` (bit 2).
    pub const FLAGS: u64 = 0x2b;
    pub const SAMPLED: u8 = 1 << 2;
    /// tcmalloc's page: 8 KiB (`kPageShift` of the default build).
    pub const PAGE_SHIFT: u64 = 13;
    /// What the cookie of the sampled-allocation probe holds beside `allocator_call::STEPPED`:
    /// the address of the process's list of sampled objects.
    pub const HEAD_MASK: u64 = !super::allocator_call::STEPPED;
}

/// Exponential gaps (bytes) between sampled allocations, drawn from this table at random:
/// the quantiles of an exponential distribution with the configured mean, so that sampling is
/// a Poisson process over the bytes allocated (as tcmalloc's and Go's are).
pub const ALLOC_GAPS: usize = 1024;

/// A sampled allocation's entry in the live table: the process and the address returned.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LiveKey {
    pub tgid: u32,
    pub _pad: u32,
    pub address: u64,
}

/// A sampled allocation not yet freed: its key (the stacks and task that allocated it), size,
/// and when (`bpf_ktime_get_ns`, CLOCK_MONOTONIC).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LiveAllocation {
    pub key: crate::SampleKey,
    pub size: u64,
    pub at_ns: u64,
}
