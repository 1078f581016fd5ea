//! Python frames: what userspace tells the walker of a CPython process (where its threads'
//! states are, and its version's offsets), and how a walked Python frame is recorded.

/// Python frames a walk records at most (behind the native frames, from the end of
/// `UserStack::frames`): each takes a slot a native frame could have had.
pub const MAX_PYTHON_FRAMES: u32 = 64;

/// Threads of one interpreter searched for the sampled one's state at most.
pub const MAX_PYTHON_THREADS: u32 = 64;

/// Offsets into one CPython version's structures, in bytes. `ABSENT` marks what a version
/// does not have. (Aligned as a word: the programs copy it a word at a time, where a copy of
/// a less aligned value is a byte loop the verifier refuses.)
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonLayout {
    /// `PyInterpreterState`: its first thread state.
    pub interp_threads: u16,
    /// `PyThreadState`: the next thread, the thread's `pthread_self()` (the thread pointer,
    /// fsbase, on x86-64 glibc and musl), and where its current frame is found: at
    /// `tstate_frame`, or through the pointer there and then `cframe_frame` (3.11, 3.12).
    pub tstate_next: u16,
    pub tstate_thread_id: u16,
    pub tstate_frame: u16,
    pub cframe_frame: u16,
    /// The frame (`PyFrameObject` to 3.10, `_PyInterpreterFrame` from 3.11): its caller,
    /// its code object, its position (`position_kind`), and what marks the last frame of
    /// one evaluation loop's run (`entry_kind`).
    pub frame_back: u16,
    pub frame_code: u16,
    pub frame_position: u16,
    pub frame_entry: u16,
    /// `PyCodeObject`: where its bytecode starts (3.11+: inline, `co_code_adaptive`).
    pub code_bytecode: u16,
    pub position_kind: u8,
    pub entry_kind: u8,
    /// 1 where a thread's frames lie one after another in its data stack, each caller below
    /// its callee (3.11+), 0 where each is an object of its own.
    pub stacked_frames: u8,
    pub _pad: u8,
}

impl PythonLayout {
    pub const ABSENT: u16 = u16::MAX;
}

/// How a frame says where it is.
pub mod position_kind {
    /// `f_lasti`, an `int` (bytes to 3.9, code units in 3.10; -1 before the first).
    pub const LASTI: u8 = 0;
    /// A pointer to an instruction in the code object's inline bytecode (3.11+): recorded
    /// as its code unit index.
    pub const INSTRUCTION_POINTER: u8 = 1;
}

/// Which frames end one run of the evaluation loop (one native `_PyEval_EvalFrameDefault`
/// frame): their Python frames go where that native frame is.
pub mod entry_kind {
    /// Every frame (to 3.10: the loop runs one frame).
    pub const EVERY_FRAME: u8 = 0;
    /// Frames whose byte at `frame_entry` is not 0 (3.11's `is_entry`).
    pub const FLAG: u8 = 1;
    /// The frame before a shim, a frame whose owner byte at `frame_entry` is
    /// `FRAME_OWNED_BY_CSTACK` (3.12+): the shim itself is not shown.
    pub const BEFORE_SHIM: u8 = 2;
    pub const OWNED_BY_CSTACK: u8 = 3;
}

/// A CPython process as the walker needs it, by tgid.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonProcess {
    /// Where the pointer to the first interpreter is (`_PyRuntime.interpreters.head`, or
    /// 3.6's `interp_head`).
    pub interp_head: u64,
    /// Where the evaluation loop's code (`_PyEval_EvalFrameDefault`) is in the process: the
    /// native walk keeps the frames below its outermost run (see the kernel side's `tails`).
    pub eval_start: u64,
    pub eval_end: u64,
    pub layout: PythonLayout,
}

/// Why a Python walk ended: counted (`counter::PYTHON_STOPS`) and shown at its root.
pub mod python_stop {
    /// The thread's first frame was reached (or it runs no Python now).
    pub const END: u32 = 0;
    /// The thread's state was not among its interpreter's threads.
    pub const NO_THREAD: u32 = 1;
    /// Reading the interpreter's memory failed.
    pub const READ_FAULT: u32 = 2;
    /// `MAX_PYTHON_FRAMES` frames were recorded.
    pub const DEPTH: u32 = 3;
    pub const COUNT: u32 = 4;
    /// Each reason's name, as counters and markers show it.
    pub const NAMES: [&str; COUNT as usize] = ["end", "no_thread", "read_fault", "depth"];
}

/// A Python frame as one word: the code object's address (user addresses fit 47 bits), the
/// position plus one (0: before the first instruction), saturated at 16 bits, and whether
/// the frame ends its evaluation loop's run.
pub mod python_frame {
    const ADDRESS_BITS: u32 = 47;
    const ENTRY: u64 = 1 << 63;
    const POSITION_MAX: u64 = 0xffff;

    #[inline(always)]
    pub fn encode(code: u64, position: i64, entry: bool) -> u64 {
        let position = (position.saturating_add(1).max(0) as u64).min(POSITION_MAX);
        (code & ((1 << ADDRESS_BITS) - 1)) | position << ADDRESS_BITS | if entry { ENTRY } else { 0 }
    }

    /// (code address, position (-1: before the first instruction), ends its run).
    pub fn decode(word: u64) -> (u64, i64, bool) {
        let position = ((word >> ADDRESS_BITS) & POSITION_MAX) as i64 - 1;
        (word & ((1 << ADDRESS_BITS) - 1), position, word & ENTRY != 0)
    }

    /// Marks the frame as the last of its run.
    #[inline(always)]
    pub fn with_entry(word: u64) -> u64 {
        word | ENTRY
    }
}
