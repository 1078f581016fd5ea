//! What the walk and the namer need of each CPython version (3.6 to 3.13): offsets in its
//! structures, and where its runtime keeps the pointer to the first interpreter. For 3.6 to
//! 3.12, taken from CPython's headers and each interpreter's debug info, and checked against
//! the live interpreters; 3.13 publishes its own (`debug_offsets`).
use agent_common::{entry_kind, position_kind, PythonLayout};

use super::code::{code_layout, CodeLayout};

/// Versions (minor, of 3.x) the walk knows; any other is reported and not walked.
pub const KNOWN: std::ops::RangeInclusive<u8> = 6..=13;

/// Whether `hex` (`PY_VERSION_HEX`, as `Py_Version` and `_Py_DebugOffsets` carry it) is of
/// CPython 3.`minor`.
pub fn is_minor(hex: u64, minor: u8) -> bool {
    hex >> 24 == 3 && (hex >> 16) & 0xff == u64::from(minor)
}

/// The first version whose offsets are read from the interpreter (`_Py_DebugOffsets`).
pub const PUBLISHES_OFFSETS: u8 = 13;

/// One interpreter's offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offsets {
    /// What the walk needs.
    pub walk: PythonLayout,
    /// What naming a frame needs.
    pub code: CodeLayout,
    /// The offset of the first interpreter's pointer in `_PyRuntime` (3.6 has no runtime: the
    /// pointer is the static `interp_head`, offset 0).
    pub head: u64,
}

/// The offsets of a version that does not publish its own (3.6 to 3.12).
pub fn from_tables(minor: u8) -> Option<Offsets> {
    const ABSENT: u16 = PythonLayout::ABSENT;
    // Frames to 3.10 (`PyFrameObject`): f_back 24, f_code 32, f_lasti by version.
    let frame_object = |thread_id, lasti| PythonLayout {
        interp_threads: 8,
        tstate_next: 8,
        tstate_thread_id: thread_id,
        tstate_frame: 24,
        cframe_frame: ABSENT,
        frame_back: 24,
        frame_code: 32,
        frame_position: lasti,
        frame_entry: ABSENT,
        code_bytecode: 0,
        position_kind: position_kind::LASTI,
        entry_kind: entry_kind::EVERY_FRAME,
        stacked_frames: 0,
        _pad: 0,
    };
    let (walk, head) = match minor {
        6 => (frame_object(152, 120), 0),
        7 => (frame_object(176, 104), 24),
        8 | 9 => (frame_object(176, 104), 32),
        10 => (frame_object(176, 96), 32),
        11 => (interpreter_frame(16, 152, 56, 8, 48, 32, 68, entry_kind::FLAG, 184), 40),
        12 => (interpreter_frame(72, 136, 56, 0, 8, 0, 70, entry_kind::BEFORE_SHIM, 192), 40),
        _ => return None,
    };
    Some(Offsets { walk, code: code_layout(minor)?, head })
}

/// A layout with `_PyInterpreterFrame`s (3.11, 3.12): the instruction pointer at 56.
#[allow(clippy::too_many_arguments)]
fn interpreter_frame(
    interp_threads: u16,
    thread_id: u16,
    tstate_frame: u16,
    cframe_frame: u16,
    back: u16,
    code: u16,
    entry: u16,
    entry_kind: u8,
    bytecode: u16,
) -> PythonLayout {
    PythonLayout {
        interp_threads,
        tstate_next: 8,
        tstate_thread_id: thread_id,
        tstate_frame,
        cframe_frame,
        frame_back: back,
        frame_code: code,
        frame_position: 56,
        frame_entry: entry,
        code_bytecode: bytecode,
        position_kind: position_kind::INSTRUCTION_POINTER,
        entry_kind,
        stacked_frames: 1,
        _pad: 0,
    }
}
