//! Naming a Python frame: read its code object (`PyCodeObject`) out of the target process and
//! turn (code address, instruction position) into (qualified name, file name, line).
//!
//! The BPF program records, per Python frame, the code object's address, the frame's position
//! (see [`super::lines`] for the convention per version) and the code object's `co_firstlineno`.
//! By the time userspace reads the address the code object may have been freed and the memory
//! reused, so [`read_code`] refuses one whose `co_firstlineno` differs from what BPF saw, and
//! everything read is bounded and checked: names and file names must be compact `str` objects
//! (NUL-terminated where CPython terminates them) of at most [`MAX_STRING_CHARS`] characters,
//! line tables `bytes` objects of at most [`MAX_LINE_TABLE_BYTES`].
//!
//! Offsets are those of the default (GIL) builds of CPython 3.6-3.13 on x86-64; the
//! free-threaded 3.13t build has a larger object header and is not described here.

use super::lines;
use crate::resolve::process_memory::{Fault, ProcessMemory};

/// Longest name or file name read, in characters.
pub const MAX_STRING_CHARS: usize = 4096;
/// Largest line table read, in bytes.
pub const MAX_LINE_TABLE_BYTES: usize = 1 << 20;

/// Where things are in a code object, its `str` and its `bytes` objects, for one CPython minor
/// version (offsets in bytes from the object's address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeLayout {
    /// Python 3.`minor`.
    pub minor: u8,
    /// `co_name` (`str*`).
    pub co_name: u64,
    /// `co_qualname` (`str*`), 3.11+.
    pub co_qualname: Option<u64>,
    /// `co_filename` (`str*`).
    pub co_filename: u64,
    /// `co_firstlineno` (`int`).
    pub co_firstlineno: u64,
    /// `co_lnotab` (<=3.9) or `co_linetable` (3.10+) (`bytes*`).
    pub co_linetable: u64,
    /// `str`: length in characters (`Py_ssize_t`).
    pub str_length: u64,
    /// `str`: the state bit field's first byte (interned:2, kind:3, compact:1, ascii:1, then
    /// ready:1 up to 3.11).
    pub str_state: u64,
    /// `str`: text of a compact ASCII string (`PyASCIIObject` + 1).
    pub str_ascii_data: u64,
    /// `str`: text of a compact non-ASCII string (`PyCompactUnicodeObject` + 1).
    pub str_compact_data: u64,
    /// `bytes`: length (`ob_size`).
    pub bytes_size: u64,
    /// `bytes`: data (`ob_sval`).
    pub bytes_data: u64,
}

/// The layout of CPython 3.`minor`'s code objects, for 3.6 to 3.13.
pub fn code_layout(minor: u8) -> Option<CodeLayout> {
    // (name, qualname, filename, firstlineno, line table)
    let (co_name, co_qualname, co_filename, co_firstlineno, co_linetable) = match minor {
        6 | 7 => (104, None, 96, 36, 112),
        8..=10 => (112, None, 104, 40, 120),
        11 => (120, Some(128), 112, 72, 136),
        12 | 13 => (120, Some(128), 112, 68, 136),
        _ => return None,
    };
    // 3.12 dropped PyASCIIObject's `wstr` pointer (48 -> 40 bytes) and PyCompactUnicodeObject's
    // `wstr_length` (72 -> 56 bytes).
    let (str_ascii_data, str_compact_data) = if minor <= 11 { (48, 72) } else { (40, 56) };
    Some(CodeLayout {
        minor,
        co_name,
        co_qualname,
        co_filename,
        co_firstlineno,
        co_linetable,
        str_length: 16,
        str_state: 32,
        str_ascii_data,
        str_compact_data,
        bytes_size: 16,
        bytes_data: 32,
    })
}

/// Why a code object was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodeError {
    #[error(transparent)]
    Fault(#[from] Fault),
    /// Not the code object BPF sampled: freed, and its address reused.
    #[error("co_firstlineno is {found}, expected {expected}: not the code object sampled")]
    FirstLineMismatch { expected: u32, found: i32 },
    #[error("{field} is not a valid object pointer ({addr:#x})")]
    BadPointer { field: &'static str, addr: u64 },
    #[error("{field}: string of {len} characters (limit {MAX_STRING_CHARS})")]
    StringTooLong { field: &'static str, len: i64 },
    #[error("{field}: not a compact str object: {reason}")]
    NotCompactStr {
        field: &'static str,
        reason: &'static str,
    },
    #[error("line table of {len} bytes (limit {MAX_LINE_TABLE_BYTES})")]
    LineTableTooLarge { len: i64 },
    #[error("line table is not a bytes object: {reason}")]
    BadLineTable { reason: &'static str },
    /// A [`CodeLayout`] with fields too far apart or of odd sizes.
    #[error("bad code layout")]
    BadLayout,
}

impl CodeError {
    /// Whether the process is gone (exited): its memory can no longer be read.
    pub fn gone(&self) -> bool {
        matches!(self, CodeError::Fault(fault) if fault.errno == libc::ESRCH)
    }
}

/// What names a frame of one code object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeInfo {
    /// `co_qualname` where the version has it (3.11+, e.g. `Outer.method`,
    /// `outer.<locals>.inner`), else `co_name`.
    pub name: String,
    pub filename: String,
    pub firstlineno: u32,
    line_table: Vec<u8>,
    minor: u8,
}

impl CodeInfo {
    /// The source line of `position`, in the convention the BPF program records for this
    /// version: 3.6-3.9 `f_lasti` in bytes, 3.10 `f_lasti` in code units (-1 before the frame
    /// starts, which is on the first line), 3.11+ a 0-based code-unit index (negative taken as
    /// not started). `None` where the table has no line for it or is malformed.
    pub fn line(&self, position: i64) -> Option<u32> {
        match self.minor {
            ..=9 => lines::lnotab_line(&self.line_table, self.firstlineno, position),
            10 => lines::linetable_310_line(&self.line_table, self.firstlineno, position),
            _ => lines::location_table_line(&self.line_table, self.firstlineno, position),
        }
    }
}

/// Reads the code object at `addr` in `mem`'s process. Refuses one whose `co_firstlineno` is not
/// `expected_firstlineno` where one is given (what an earlier reading found: a mismatch
/// means the code object was freed and the address reused), names or file names that are not compact `str`
/// objects of at most [`MAX_STRING_CHARS`] characters, and line tables that are not `bytes`
/// objects of at most [`MAX_LINE_TABLE_BYTES`].
pub fn read_code(
    mem: &ProcessMemory,
    layout: &CodeLayout,
    addr: u64,
    expected_firstlineno: Option<u32>,
) -> Result<CodeInfo, CodeError> {
    check_pointer("code object", addr)?;
    let name_field = if layout.co_qualname.is_some() {
        "co_qualname"
    } else {
        "co_name"
    };
    let name_off = layout.co_qualname.unwrap_or(layout.co_name);

    // One read for the fixed fields, all within the first couple of hundred bytes.
    let [first, name_ptr, filename_ptr, table_ptr] = read_fields(
        mem,
        addr,
        [
            (layout.co_firstlineno, 4),
            (name_off, 8),
            (layout.co_filename, 8),
            (layout.co_linetable, 8),
        ],
    )?;
    let found = first as u32 as i32;
    let firstlineno = match u32::try_from(found) {
        Ok(line) if expected_firstlineno.is_none_or(|expected| expected == line) => line,
        _ => {
            return Err(CodeError::FirstLineMismatch {
                expected: expected_firstlineno.unwrap_or(0),
                found,
            })
        }
    };
    let name = read_str(mem, layout, name_ptr, name_field)?;
    let filename = read_str(mem, layout, filename_ptr, "co_filename")?;
    let line_table = read_bytes(mem, layout, table_ptr)?;
    Ok(CodeInfo {
        name,
        filename,
        firstlineno,
        line_table,
        minor: layout.minor,
    })
}

/// Objects are at least 8-byte aligned; NULL and anything else is not an object.
fn check_pointer(field: &'static str, addr: u64) -> Result<(), CodeError> {
    if addr == 0 || !addr.is_multiple_of(8) {
        return Err(CodeError::BadPointer { field, addr });
    }
    Ok(())
}

/// Largest span of fields [`read_fields`] reads at once. The layout's offsets are ours today,
/// but 3.13+ offsets may come from the target's `_Py_DebugOffsets`: bounded all the same.
const MAX_FIELDS_SPAN: u64 = 4096;

/// Little-endian unsigned fields of 1, 2, 4 or 8 bytes at (offset, size) from `addr`, zero
/// extended, read with a single read from the lowest offset to the end of the highest field.
fn read_fields<const N: usize>(
    mem: &ProcessMemory,
    addr: u64,
    fields: [(u64, u64); N],
) -> Result<[u64; N], CodeError> {
    let mut lo = u64::MAX;
    let mut hi = 0u64;
    for &(off, size) in &fields {
        let end = off
            .checked_add(size)
            .filter(|_| matches!(size, 1 | 2 | 4 | 8));
        let Some(end) = end else {
            return Err(CodeError::BadLayout);
        };
        lo = lo.min(off);
        hi = hi.max(end);
    }
    if N == 0 || hi - lo > MAX_FIELDS_SPAN {
        return Err(CodeError::BadLayout);
    }
    let mut block = vec![0u8; (hi - lo) as usize];
    mem.read(offset(mem, addr, lo)?, &mut block)?;
    let mut out = [0u64; N];
    for (value, &(off, size)) in out.iter_mut().zip(&fields) {
        let start = (off - lo) as usize;
        let mut le = [0u8; 8];
        le[..size as usize].copy_from_slice(&block[start..start + size as usize]);
        *value = u64::from_le_bytes(le);
    }
    Ok(out)
}

/// `addr + off`, or a fault for an address that wraps.
fn offset(mem: &ProcessMemory, addr: u64, off: u64) -> Result<u64, Fault> {
    addr.checked_add(off).ok_or(Fault {
        pid: mem.pid(),
        addr,
        len: 0,
        errno: 0,
    })
}

/// The text of the compact `str` object at `addr`, as UTF-8. Lone surrogates (valid in a Python
/// `str`, e.g. from undecodable file names) become U+FFFD.
pub fn read_str(
    mem: &ProcessMemory,
    layout: &CodeLayout,
    addr: u64,
    field: &'static str,
) -> Result<String, CodeError> {
    let bad = |reason| CodeError::NotCompactStr { field, reason };
    check_pointer(field, addr)?;
    let [len, state] = read_fields(mem, addr, [(layout.str_length, 8), (layout.str_state, 1)])?;
    let len = len as i64;
    let state = state as u8;
    let chars = match usize::try_from(len) {
        Ok(n) if n <= MAX_STRING_CHARS => n,
        Ok(_) => return Err(CodeError::StringTooLong { field, len }),
        Err(_) => return Err(bad("negative length")),
    };
    let kind = usize::from((state >> 2) & 7);
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    // Up to 3.11 bit 7 is `ready`, always set on compact strings (3.12+: statically_allocated).
    if layout.minor <= 11 && state & (1 << 7) == 0 {
        return Err(bad("not ready"));
    }
    if !compact {
        return Err(bad("not compact"));
    }
    if !matches!(kind, 1 | 2 | 4) {
        return Err(bad("bad kind"));
    }
    if ascii && kind != 1 {
        return Err(bad("ascii with a wide kind"));
    }
    let data_off = if ascii {
        layout.str_ascii_data
    } else {
        layout.str_compact_data
    };
    // The text and CPython's terminating NUL character: at most (4096 + 1) * 4 bytes.
    let mut raw = vec![0u8; (chars + 1) * kind];
    mem.read(offset(mem, addr, data_off)?, &mut raw)?;
    let (text, nul) = raw.split_at(chars * kind);
    if nul.iter().any(|&b| b != 0) {
        return Err(bad("no terminating NUL"));
    }
    let out = match kind {
        1 if ascii => {
            if !text.is_ascii() {
                return Err(bad("non-ASCII byte in an ASCII string"));
            }
            text.iter().map(|&b| char::from(b)).collect()
        }
        1 => text.iter().map(|&b| char::from(b)).collect(),
        2 => text
            .chunks_exact(2)
            .map(|c| {
                char::from_u32(u32::from(u16::from_le_bytes([c[0], c[1]]))).unwrap_or('\u{fffd}')
            })
            .collect(),
        _ => {
            let mut s = String::with_capacity(chars);
            for c in text.chunks_exact(4) {
                let v = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                if v > 0x10_ffff {
                    return Err(bad("character past U+10FFFF"));
                }
                s.push(char::from_u32(v).unwrap_or('\u{fffd}'));
            }
            s
        }
    };
    Ok(out)
}

/// The contents of the line table, a `bytes` object at `addr`.
fn read_bytes(mem: &ProcessMemory, layout: &CodeLayout, addr: u64) -> Result<Vec<u8>, CodeError> {
    check_pointer("line table", addr)?;
    let len = mem.read_i64(offset(mem, addr, layout.bytes_size)?)?;
    let n = match usize::try_from(len) {
        Ok(n) if n <= MAX_LINE_TABLE_BYTES => n,
        Ok(_) => return Err(CodeError::LineTableTooLarge { len }),
        Err(_) => {
            return Err(CodeError::BadLineTable {
                reason: "negative length",
            })
        }
    };
    // The data and the NUL byte CPython keeps after every bytes object's data.
    let mut data = mem.read_vec(
        offset(mem, addr, layout.bytes_data)?,
        n + 1,
        MAX_LINE_TABLE_BYTES + 1,
    )?;
    if data.pop() != Some(0) {
        return Err(CodeError::BadLineTable {
            reason: "no terminating NUL",
        });
    }
    Ok(data)
}

#[cfg(test)]
mod real_interpreters;
#[cfg(test)]
mod tests;
