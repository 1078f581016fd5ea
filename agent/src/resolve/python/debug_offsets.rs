//! The offsets CPython 3.13 publishes for debuggers and profilers: `_Py_DebugOffsets`, the
//! first member of `_PyRuntime`, initialised data and so read from the file. It begins with
//! the cookie "xdebugpy", the version (`PY_VERSION_HEX`) and whether the build is
//! free-threaded, then groups of 64-bit offsets, each group led by its structure's size.
use anyhow::{bail, ensure, Context as _, Result};
use agent_common::{entry_kind, position_kind, PythonLayout};

use super::{
    code::{code_layout, CodeLayout},
    versions::{self, Offsets},
};

/// Bytes read: up to the last group used (`str`).
pub const BYTES: usize = 8 + 8 * WORDS;
const WORDS: usize = 70;

/// Word indexes (after the cookie) of what is used, in 3.13's order of groups: runtime (3
/// words), interpreter (13), thread (9), frame (6), code (10), object (2), type (4), tuple (3),
/// list (3), dict (3), float (2), int (3), bytes (3), str (4).
mod word {
    pub const VERSION: usize = 0;
    pub const FREE_THREADED: usize = 1;
    pub const RUNTIME: usize = 2;
    pub const INTERPRETERS_HEAD: usize = 4;
    pub const INTERPRETER: usize = 5;
    pub const THREADS_HEAD: usize = 8;
    pub const THREAD: usize = 18;
    pub const THREAD_NEXT: usize = 20;
    pub const CURRENT_FRAME: usize = 22;
    pub const THREAD_ID: usize = 23;
    pub const FRAME: usize = 27;
    pub const PREVIOUS: usize = 28;
    pub const EXECUTABLE: usize = 29;
    pub const INSTR_PTR: usize = 30;
    pub const OWNER: usize = 32;
    pub const CODE: usize = 33;
    pub const FILENAME: usize = 34;
    pub const NAME: usize = 35;
    pub const QUALNAME: usize = 36;
    pub const LINETABLE: usize = 37;
    pub const FIRSTLINENO: usize = 38;
    pub const CODE_ADAPTIVE: usize = 42;
    pub const BYTES: usize = 63;
    pub const BYTES_SIZE: usize = 64;
    pub const BYTES_DATA: usize = 65;
    pub const STR: usize = 66;
    pub const STR_STATE: usize = 67;
    pub const STR_LENGTH: usize = 68;
    pub const STR_ASCII_SIZE: usize = 69;
}

/// Reads the offsets of CPython 3.`minor` from the first `BYTES` of its `_PyRuntime`.
pub fn parse(bytes: &[u8], minor: u8) -> Result<Offsets> {
    ensure!(bytes.len() >= BYTES, "_Py_DebugOffsets: {} bytes, {BYTES} expected", bytes.len());
    ensure!(&bytes[..8] == b"xdebugpy", "_PyRuntime does not start with _Py_DebugOffsets");
    let words: Vec<u64> = bytes[8..BYTES].chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))).collect();
    let version = words[word::VERSION];
    if !versions::is_minor(version, minor) {
        bail!("named for CPython 3.{minor}, but its _Py_DebugOffsets are for version {version:#x}");
    }
    ensure!(words[word::FREE_THREADED] == 0, "a free-threaded build: its objects are not laid out as the walk reads them");
    // An offset into the group led by `group`'s size: within it, and small (the walk keeps
    // offsets in 16 bits).
    let at = |group: usize, field: usize| -> Result<u16> {
        let (size, offset) = (words[group], words[field]);
        ensure!(offset < size, "_Py_DebugOffsets: offset {offset} at word {field} outside its structure of {size} bytes");
        u16::try_from(offset).with_context(|| format!("_Py_DebugOffsets: offset {offset} at word {field} is too large"))
    };
    let walk = PythonLayout {
        interp_threads: at(word::INTERPRETER, word::THREADS_HEAD)?,
        tstate_next: at(word::THREAD, word::THREAD_NEXT)?,
        tstate_thread_id: at(word::THREAD, word::THREAD_ID)?,
        tstate_frame: at(word::THREAD, word::CURRENT_FRAME)?,
        cframe_frame: PythonLayout::ABSENT,
        frame_back: at(word::FRAME, word::PREVIOUS)?,
        frame_code: at(word::FRAME, word::EXECUTABLE)?,
        frame_position: at(word::FRAME, word::INSTR_PTR)?,
        frame_entry: at(word::FRAME, word::OWNER)?,
        code_bytecode: at(word::CODE, word::CODE_ADAPTIVE)?,
        position_kind: position_kind::INSTRUCTION_POINTER,
        entry_kind: entry_kind::BEFORE_SHIM,
        stacked_frames: 1,
        _pad: 0,
    };
    let code_field = |field| at(word::CODE, field).map(u64::from);
    // Where a compact non-ASCII string's text starts is not published: that comes from the
    // table of the version's objects.
    let known = code_layout(minor).with_context(|| format!("no layout of CPython 3.{minor}'s strings"))?;
    let code = CodeLayout {
        co_name: code_field(word::NAME)?,
        co_qualname: Some(code_field(word::QUALNAME)?),
        co_filename: code_field(word::FILENAME)?,
        co_firstlineno: code_field(word::FIRSTLINENO)?,
        co_linetable: code_field(word::LINETABLE)?,
        str_length: u64::from(at(word::STR, word::STR_LENGTH)?),
        str_state: u64::from(at(word::STR, word::STR_STATE)?),
        str_ascii_data: u64::from(at(word::STR, word::STR_ASCII_SIZE)?),
        bytes_size: u64::from(at(word::BYTES, word::BYTES_SIZE)?),
        bytes_data: u64::from(at(word::BYTES, word::BYTES_DATA)?),
        ..known
    };
    let head = words[word::INTERPRETERS_HEAD];
    ensure!(head < words[word::RUNTIME], "_Py_DebugOffsets: interpreters head {head} outside the runtime");
    Ok(Offsets { walk, code, head })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPython 3.13.0's `_Py_DebugOffsets` (pyenv's build), after the cookie.
    const PYTHON_3_13_0: [u64; WORDS] = [
        0x030d00f0, 0, 283320, 608, 632, 194968, 7272, 7264, 7344, 7400, 7656, 7640, 7648, 16, 7752, 0, 7768, 7760, 304, 0, 8,
        16, 72, 152, 160, 232, 32, 80, 8, 0, 56, 72, 70, 208, 112, 120, 128, 136, 68, 52, 96, 104, 200, 16, 8, 416, 24, 88, 168,
        32, 24, 16, 40, 24, 16, 48, 32, 40, 24, 16, 32, 16, 24, 40, 16, 32, 64, 32, 16, 40,
    ];

    fn blob(words: &[u64]) -> Vec<u8> {
        b"xdebugpy".iter().copied().chain(words.iter().flat_map(|w| w.to_le_bytes())).collect()
    }

    #[test]
    fn offsets_of_3_13_0_are_its_layout() {
        let offsets = parse(&blob(&PYTHON_3_13_0), 13).unwrap();
        assert_eq!(offsets.head, 632);
        let w = offsets.walk;
        assert_eq!((w.interp_threads, w.tstate_next, w.tstate_thread_id, w.tstate_frame), (7344, 8, 152, 72));
        assert_eq!((w.frame_back, w.frame_code, w.frame_position, w.frame_entry, w.code_bytecode), (8, 0, 56, 70, 200));
        // What the namer's tests check against the live interpreter.
        assert_eq!(offsets.code, code_layout(13).unwrap());
    }

    #[test]
    fn what_is_not_3_13_offsets_is_refused() {
        let good = blob(&PYTHON_3_13_0);
        let refused = |bytes: &[u8], minor| parse(bytes, minor).unwrap_err().to_string();
        assert!(refused(&good, 12).contains("version 0x30d00f0"));
        assert!(refused(&good[..100], 13).contains("bytes"));
        let mut cookie = good.clone();
        cookie[0] = b'y';
        assert!(refused(&cookie, 13).contains("does not start"));
        let mut threaded = PYTHON_3_13_0;
        threaded[word::FREE_THREADED] = 1;
        assert!(refused(&blob(&threaded), 13).contains("free-threaded"));
        let mut outside = PYTHON_3_13_0;
        outside[word::THREAD_ID] = 400;
        assert!(refused(&blob(&outside), 13).contains("outside its structure"));
        let mut huge = PYTHON_3_13_0;
        huge[word::INTERPRETER] = 1 << 40;
        huge[word::THREADS_HEAD] = 1 << 20;
        assert!(refused(&blob(&huge), 13).contains("too large"));
    }
}
