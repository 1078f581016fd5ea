//! The user-stack walker's view: stacks it records, why a walk stopped, unwind table rows and
//! their page index, and each process's executable mappings.
/// Most frames Ember's walker records in a user stack (the kernel's default
/// `perf_event_max_stack`).
pub const MAX_USER_FRAMES: usize = 127;

/// A user stack walked by Ember's own unwinder, stored under a 31-bit hash of its frames.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserStack {
    /// A second hash of the frames, independent of the id: an id whose stored stack has
    /// another check is a hash collision.
    pub check: u64,
    /// Frames used in `frames`, leaf first.
    pub len: u32,
    /// One of `unwind_stop`: why the walk ended.
    pub stop: u32,
    /// Python frames, innermost first from the end of `frames` backwards (`python_frame`),
    /// and why their walk ended (`python_stop`).
    pub python: u32,
    pub python_stop: u32,
    pub frames: [u64; MAX_USER_FRAMES],
}

/// Why the user-stack walk ended. Anything but `END` is a truncated stack: it keeps the
/// frames it has, and the reason is counted (`counter::UNWIND_STOPS`) and shown at its root.
pub mod unwind_stop {
    /// The outermost frame was reached: the stack is complete.
    pub const END: u32 = 0;
    /// `MAX_USER_FRAMES` frames were recorded.
    pub const DEPTH: u32 = 1;
    /// Reading the stack failed (a bad pointer, or memory paged out).
    pub const READ_FAULT: u32 = 2;
    /// No unwind row covers the address (code without call frame information).
    pub const NO_INFO: u32 = 3;
    /// The row's rule is beyond the walker (a DWARF expression, another register).
    pub const UNSUPPORTED: u32 = 4;
    /// A signal handler's trampoline: the caller's registers are in a signal frame.
    pub const SIGNAL: u32 = 5;
    /// The caller's frame would not be above the callee's: a corrupt stack, or a frame
    /// pointer that is not one.
    pub const BAD_FRAME: u32 = 6;
    pub const COUNT: u32 = 7;
    /// Set beside the reason when the walk came before the process's tables were loaded: by
    /// frame pointers only, which skip the caller of a function that keeps none.
    pub const FRAME_POINTERS_ONLY: u32 = 1 << 8;

    /// Each reason's name, as counters and markers show it.
    pub const NAMES: [&str; COUNT as usize] =
        ["end", "depth", "read_fault", "no_info", "unsupported", "signal", "bad_frame"];
}

/// One row of an unwind table in the kernel: from `pc` (relative to the table's base) up to
/// the next row, how to find the caller (x86-64).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    pub pc: u32,
    /// CFA = rsp or rbp (by `kind`) + this.
    pub cfa_offset: u16,
    /// One of `row_kind`.
    pub kind: u8,
    /// Where the caller's rbp is saved, in 8-byte words from the CFA; 0: rbp unchanged.
    pub rbp_offset: i8,
}

/// What a row says; the first three find the caller, the rest end the walk with the
/// `unwind_stop` of that name.
pub mod row_kind {
    pub const CFA_RSP: u8 = 0;
    pub const CFA_RBP: u8 = 1;
    /// A PLT entry: CFA = rsp + 8, + 8 from byte `cfa_offset` of its 16-byte entry on.
    pub const PLT: u8 = 2;
    pub const OUTERMOST: u8 = 3;
    pub const SIGNAL: u8 = 4;
    pub const NO_INFO: u8 = 5;
    pub const UNSUPPORTED: u8 = 6;
}

/// Rows one table may have (64 MiB of rows): a binary with more is walked by frame pointers.
pub const MAX_TABLE_ROWS: u32 = 1 << 23;

/// An executable mapping of a process, as the walker sees it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ExecMapping {
    pub start: u64,
    pub end: u64,
    /// A pc in the mapping minus this is its address in the table's terms (`UnwindRow::pc`).
    pub bias: u64,
    /// The table's rows in the row array: `rows` from `first_row`. 0 rows: walk this
    /// mapping's code by frame pointers.
    pub first_row: u32,
    pub rows: u32,
    /// The table's page index in the page array: `pages` entries from `first_page`, one
    /// per `UNWIND_PAGE` bytes of code, so that a search starts among a page's few rows, not
    /// the whole table's.
    pub first_page: u32,
    pub pages: u32,
}

impl ExecMapping {
    pub fn covers(&self, pc: u64) -> bool {
        self.start <= pc && pc < self.end
    }
}

/// Bytes of code per page index entry: small, so that each frame's search is short (a page of
/// code has ten rows or so), but not below a few rows' worth of code, so that the page index
/// stays within a quarter of the rows' memory.
pub const UNWIND_PAGE: u64 = 512;

/// The rows (table-relative indices `first..end`) that can cover an address in one page: from
/// the row that covers the page's first byte to the one that covers the next page's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageRows {
    pub first: u32,
    pub end: u32,
}

/// Executable mappings (with tables) the walker can tell apart in one process.
pub const MAX_MAPPINGS: u32 = 1024;

/// Where a process's executable mappings are in the mapping array: `count` from `first`,
/// sorted by address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessMappings {
    pub first: u32,
    pub count: u32,
    /// Names these mappings while any process has them loaded: processes whose mappings are
    /// the same (workers forked from one parent) share them, and the rows the walker keeps
    /// under this generation. Never 0, and never given to other mappings.
    pub generation: u32,
    pub _pad: u32,
    /// How far this process's code lies from the addresses of the mappings (a multiple of
    /// the page size): the walker looks a pc up as `pc - slide`. Processes of one executable
    /// loaded at different places (address space randomisation) share its mappings so.
    pub slide: u64,
}

/// An executable as the kernel names it at exec (`ExeImage`): the key of its template.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ExeKey {
    pub inode: u64,
    pub dev: u32,
    pub _pad: u32,
}

/// The mappings of a process that maps only its executable, as userspace loaded them for
/// one, whose code started at `code_start`, and the interpreter the executable embeds if
/// `has_python`: the exec program points each new process of that executable at them (slid
/// by where its code starts), so that its first samples are walked with the executable's
/// table, and its Python frames, before userspace has heard of it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExeTemplate {
    pub mappings: ProcessMappings,
    pub code_start: u64,
    pub python: crate::PythonProcess,
    pub has_python: u32,
    pub _pad: u32,
}
