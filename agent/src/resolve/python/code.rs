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
use super::memory::{Fault, ProcessMemory};

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
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};

    // ---- layouts ----

    #[test]
    fn layouts() {
        for minor in 0..=255u8 {
            assert_eq!(
                code_layout(minor).is_some(),
                (6..=13).contains(&minor),
                "3.{minor}"
            );
        }
        let l = code_layout(12).unwrap();
        assert_eq!(
            (
                l.co_qualname,
                l.co_firstlineno,
                l.str_ascii_data,
                l.str_compact_data
            ),
            (Some(128), 68, 40, 56)
        );
        let l = code_layout(11).unwrap();
        assert_eq!(
            (l.co_firstlineno, l.str_ascii_data, l.str_compact_data),
            (72, 48, 72)
        );
        assert_eq!(code_layout(9).unwrap().co_qualname, None);
    }

    #[test]
    fn line_dispatch() {
        let info = |minor, table: &[u8]| CodeInfo {
            name: String::new(),
            filename: String::new(),
            firstlineno: 10,
            line_table: table.to_vec(),
            minor,
        };
        // lnotab: bytes 0..4 line 10, then line 11.
        assert_eq!(info(9, &[4, 1]).line(4), Some(11));
        assert_eq!(info(9, &[4, 1]).line(-1), Some(10));
        // 3.10: units 0..2 line 10, 2..4 line 11.
        assert_eq!(info(10, &[4, 0, 4, 1]).line(2), Some(11));
        assert_eq!(info(10, &[4, 0, 4, 1]).line(4), None);
        // 3.11+: unit 0 line 10, unit 1 line 12.
        let t = [0x80, 0x00, 0x80 | (12 << 3), 0, 1];
        assert_eq!(info(13, &t).line(1), Some(12));
        assert_eq!(info(11, &t).line(2), None);
    }

    // ---- hand-made objects in this process's own memory ----

    /// An 8-byte aligned buffer standing for the target's memory.
    struct Fake(Vec<u64>);

    impl Fake {
        fn new(bytes: usize) -> Self {
            Fake(vec![0; bytes.div_ceil(8)])
        }
        fn addr(&self) -> u64 {
            self.0.as_ptr() as u64
        }
        fn bytes(&mut self) -> &mut [u8] {
            let len = self.0.len() * 8;
            // SAFETY: the Vec<u64> owns `len` initialised bytes; u8 has no alignment needs.
            unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), len) }
        }
        fn put(&mut self, off: usize, data: &[u8]) {
            self.bytes()[off..off + data.len()].copy_from_slice(data);
        }
    }

    fn own() -> ProcessMemory {
        ProcessMemory::new(std::process::id() as i32)
    }

    /// A str object as `layout` describes it: `state` byte, `len` chars of `kind` bytes.
    fn fake_str(layout: &CodeLayout, len: i64, state: u8, data: &[u8]) -> Fake {
        let mut f = Fake::new(128 + data.len() + 8);
        f.put(layout.str_length as usize, &len.to_le_bytes());
        f.put(layout.str_state as usize, &[state]);
        let ascii = state & 0x40 != 0;
        let off = if ascii {
            layout.str_ascii_data
        } else {
            layout.str_compact_data
        } as usize;
        f.put(off, data);
        f
    }

    const READY: u8 = 0x80;
    const COMPACT: u8 = 0x20;
    const ASCII: u8 = 0x40;

    #[test]
    fn fake_strings() {
        let mem = own();
        for minor in 6..=13 {
            let l = code_layout(minor).unwrap();
            let r = if minor <= 11 { READY } else { 0 };
            let ok = |len, state, data: &[u8]| {
                read_str(&mem, &l, fake_str(&l, len, state, data).addr(), "t")
            };
            assert_eq!(ok(3, r | COMPACT | ASCII | 4, b"abc\0"), Ok("abc".into()));
            assert_eq!(ok(0, r | COMPACT | ASCII | 4, b"\0"), Ok(String::new()));
            assert_eq!(
                ok(2, r | COMPACT | 4, b"\xe9\xff\0"),
                Ok("\u{e9}\u{ff}".into())
            );
            assert_eq!(
                ok(2, r | COMPACT | 8, b"\xe5\x65\x2c\x67\0\0"),
                Ok("\u{65e5}\u{672c}".into())
            );
            assert_eq!(
                ok(1, r | COMPACT | 8, b"\xff\xdc\0\0"),
                Ok("\u{fffd}".into())
            );
            assert_eq!(
                ok(1, r | COMPACT | 16, b"\x0d\xf4\x01\0\0\0\0\0"),
                Ok("\u{1f40d}".into())
            );
            let refused = |len, state, data: &[u8]| ok(len, state, data).is_err();
            // Negative and huge lengths.
            assert!(refused(-1, r | COMPACT | ASCII | 4, b"\0"));
            assert!(refused(i64::MIN, r | COMPACT | ASCII | 4, b"\0"));
            assert!(matches!(
                ok(4097, r | COMPACT | ASCII | 4, b"\0"),
                Err(CodeError::StringTooLong { .. })
            ));
            assert!(matches!(
                ok(i64::MAX, r | COMPACT | 16, b"\0"),
                Err(CodeError::StringTooLong { .. })
            ));
            // Bad state: not compact, kind 0/3/5/7, ASCII with a wide kind.
            assert!(refused(3, r | ASCII | 4, b"abc\0"));
            for kind in [0u8, 3, 5, 6, 7] {
                assert!(refused(1, r | COMPACT | (kind << 2), b"a\0\0\0\0\0\0\0"));
            }
            assert!(refused(1, r | COMPACT | ASCII | 8, b"a\0\0\0"));
            // No NUL after the text; a non-ASCII byte in an ASCII string; past U+10FFFF.
            assert!(refused(3, r | COMPACT | ASCII | 4, b"abcd"));
            assert!(refused(1, r | COMPACT | 8, b"\x41\0\x42\0"));
            assert!(refused(2, r | COMPACT | ASCII | 4, b"a\xe9\0"));
            assert!(refused(1, r | COMPACT | 16, b"\0\0\x11\0\0\0\0\0"));
            // Bad pointers.
            assert!(read_str(&mem, &l, 0, "t").is_err());
            assert!(read_str(&mem, &l, 0x1003, "t").is_err());
            assert!(read_str(&mem, &l, u64::MAX - 7, "t").is_err());
        }
        // Up to 3.11 compact strings are "ready".
        let l = code_layout(11).unwrap();
        assert!(read_str(
            &mem,
            &l,
            fake_str(&l, 1, COMPACT | ASCII | 4, b"a\0").addr(),
            "t"
        )
        .is_err());
        let l = code_layout(12).unwrap();
        assert!(read_str(
            &mem,
            &l,
            fake_str(&l, 1, COMPACT | ASCII | 4, b"a\0").addr(),
            "t"
        )
        .is_ok());
    }

    /// A code object with the given firstlineno, name, filename and line table objects.
    fn fake_code(l: &CodeLayout, first: i32, name: u64, file: u64, table: u64) -> Fake {
        let mut f = Fake::new(256);
        f.put(l.co_firstlineno as usize, &first.to_le_bytes());
        f.put(
            l.co_qualname.unwrap_or(l.co_name) as usize,
            &name.to_le_bytes(),
        );
        f.put(l.co_filename as usize, &file.to_le_bytes());
        f.put(l.co_linetable as usize, &table.to_le_bytes());
        f
    }

    fn fake_bytes(len: i64, data: &[u8]) -> Fake {
        let mut f = Fake::new(32 + data.len() + 8);
        f.put(16, &len.to_le_bytes());
        f.put(32, data);
        f
    }

    #[test]
    fn fake_code_objects() {
        let mem = own();
        for minor in 6..=13 {
            let l = code_layout(minor).unwrap();
            let r = if minor <= 11 { READY } else { 0 };
            let name = fake_str(&l, 1, r | COMPACT | ASCII | 4, b"f\0");
            let file = fake_str(&l, 4, r | COMPACT | 4, b"\xe9.py\0");
            let table = fake_bytes(2, b"\x80\x00\0");
            let code = fake_code(&l, 7, name.addr(), file.addr(), table.addr());
            let info = read_code(&mem, &l, code.addr(), Some(7)).unwrap();
            assert_eq!(
                (info.name.as_str(), info.filename.as_str(), info.firstlineno),
                ("f", "\u{e9}.py", 7)
            );
            assert_eq!(info.line(-1), Some(7));
            assert!(matches!(
                read_code(&mem, &l, code.addr(), Some(8)),
                Err(CodeError::FirstLineMismatch {
                    expected: 8,
                    found: 7
                })
            ));
            // Negative co_firstlineno never matches.
            let neg = fake_code(&l, -1, name.addr(), file.addr(), table.addr());
            assert!(matches!(
                read_code(&mem, &l, neg.addr(), Some(u32::MAX)),
                Err(CodeError::FirstLineMismatch { .. })
            ));
            // Line tables: too large, negative, without the NUL; NULL pointers.
            for (len, data) in [
                (1 << 21, &b"\0"[..]),
                (i64::MAX, b"\0"),
                (-5, b"\0"),
                (2, b"\x80\x00\x01"),
            ] {
                let t = fake_bytes(len, data);
                let c = fake_code(&l, 7, name.addr(), file.addr(), t.addr());
                assert!(
                    read_code(&mem, &l, c.addr(), Some(7)).is_err(),
                    "3.{minor} table {len}"
                );
            }
            for (n, f, t) in [
                (0, file.addr(), table.addr()),
                (name.addr(), 0, table.addr()),
                (name.addr(), file.addr(), 0),
            ] {
                let c = fake_code(&l, 7, n, f, t);
                assert!(matches!(
                    read_code(&mem, &l, c.addr(), Some(7)),
                    Err(CodeError::BadPointer { .. })
                ));
            }
            // An unmapped pointer: a fault.
            let c = fake_code(&l, 7, name.addr(), 0x10, table.addr());
            assert!(matches!(
                read_code(&mem, &l, c.addr(), Some(7)),
                Err(CodeError::Fault(_))
            ));
        }
        // Layouts whose offsets are too far apart or overflow are refused, not allocated.
        let mut l = code_layout(13).unwrap();
        let code = Fake::new(256);
        l.co_linetable = 1 << 40;
        assert_eq!(
            read_code(&mem, &l, code.addr(), Some(0)),
            Err(CodeError::BadLayout)
        );
        l.co_linetable = u64::MAX - 3;
        assert_eq!(
            read_code(&mem, &l, code.addr(), Some(0)),
            Err(CodeError::BadLayout)
        );
    }

    // ---- the interpreters on this machine ----

    /// Run by every interpreter under test: compiles and runs known code, prints one JSON line
    /// per code object (address, firstlineno, expected name and file name, (position, line)
    /// pairs computed by Python in the BPF convention, and the same lines from the C API
    /// `PyCode_Addr2Line`), then strings and non-strings, then `ready`, and waits for stdin to
    /// close. ASCII only: non-ASCII text is written with escapes.
    const SCRIPT: &str = r##"
import sys, os, json, dis, types, binascii
# ASCII only: non-ASCII text is written with escapes, so that no locale can change it.
MINOR = sys.version_info[1]
try:
    import ctypes
    addr2line = ctypes.pythonapi.PyCode_Addr2Line
    addr2line.argtypes = [ctypes.py_object, ctypes.c_int]
    addr2line.restype = ctypes.c_int
except Exception:
    addr2line = None

KEEP = []

def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")

SRC_MAIN = '''
def plain(a, b):
    x = a + b
    y = x * 2

    z = [i for i in range(y)]
    for i in z:
        if i % 3:
            x += i
        else:
            x -= 1
    try:
        q = x // (a - a)
    except ZeroDivisionError:
        q = -1
    finally:
        x += 1
    with open("/dev/null") as f:
        f.read()
    return (x,
            y,
            q)

class Outer:
    def method(self, n):
        total = 0
        while n > 0:
            total += n
            n -= 1
        return total

    class Inner:
        def deep(self):
            return {k: k for k in "ab"}

def outer(k):
    def inner(m):
        def innermost():
            return k + m
        return innermost
    return inner

async def coro(x):
    await x
    return 1

def gen():
    yield 1
    yield 2

lam = lambda v: (v,
                 v + 1)

def wide(v):
    return [''' + "v, " * 400 + ''']

def gap():
    a = 1
''' + "\n" * 300 + '''    b = 2
''' + "\n" * 70000 + '''    c = 3
    return (a,
            b,
            c)
'''

SRC_LATIN = u'''
def gr\u00f6\u00dfe(x):
    return x + 1

class K\u00e4se:
    def m\u00e9thode(self):
        return 2
'''

SRC_UCS2 = u'''
def \u51fd\u6570(y):
    z = y
    return z
'''

SRC_UCS4 = u'''
def \U00020000():
    return 3

def f():
    return 4
'''

SOURCES = [
    (SRC_MAIN, "/tmp/ember test/main.py"),
    (SRC_LATIN, u"/tmp/caf\u00e9/na\u00efve.py"),
    (SRC_UCS2, u"/srv/\u65e5\u672c/\u30b3\u30fc\u30c9.py"),
    (SRC_UCS4, u"/home/\U0001f40d/snake.py"),
    (SRC_UCS2, u"/odd/\udcff-surrogate.py"),
]

def expected_pairs(code):
    n = len(code.co_code)
    pairs = [[-1, code.co_firstlineno]]
    if MINOR <= 9:
        starts = list(dis.findlinestarts(code))
        for off in range(0, n, 2):
            line = None
            for s, l in starts:
                if s <= off:
                    line = l
                else:
                    break
            pairs.append([off, line])
    elif MINOR == 10:
        lines = {}
        for start, end, line in code.co_lines():
            for b in range(start, end, 2):
                lines[b // 2] = line
        for u in range(n // 2):
            pairs.append([u, lines.get(u)])
    else:
        for u, pos in enumerate(code.co_positions()):
            pairs.append([u, pos[0]])
    return pairs

def capi_lines(code, pairs):
    if addr2line is None:
        return None
    out = []
    for pos, _ in pairs:
        b = pos if MINOR <= 9 else pos * 2
        l = addr2line(code, b)
        out.append(None if l < 0 else l)
    return out

def walk(code, seen):
    if id(code) in seen:
        return
    seen.add(id(code))
    KEEP.append(code)
    name = code.co_qualname if MINOR >= 11 else code.co_name
    pairs = expected_pairs(code)
    emit({"kind": "code", "id": id(code), "firstlineno": code.co_firstlineno, "name": name,
          "filename": code.co_filename, "pairs": pairs, "capi": capi_lines(code, pairs)})
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            walk(c, seen)

emit({"kind": "version", "version": list(sys.version_info[:3])})
seen = set()
for src, filename in SOURCES:
    code = compile(src, filename, "exec")
    ns = {}
    exec(code, ns)
    KEEP.append(ns)
    walk(code, seen)

# A module imported from a file, in a directory with a non-ASCII name (hex of its UTF-8 path).
if len(sys.argv) > 1:
    moddir = os.fsdecode(binascii.unhexlify(sys.argv[1]))
    sys.path.insert(0, moddir)
    import pyread_test_module as m
    KEEP.append(m)
    for obj in (m.top, m.Klass.meth, m.Klass.meth2):
        walk(obj.__code__, seen)

# Strings, for read_str directly, and objects that are not strings.
STRS = ["", "a", "plain_ascii", "x" * 4096, u"caf\u00e9", u"\u00ff" * 10, u"\u65e5\u672c\u8a9e",
        u"\U0001f40d snake", u"mix \u00e9 \u0100 \U00010000", u"lone \udcff", u"\u0100" * 4096]
for s in STRS:
    KEEP.append(s)
    emit({"kind": "str", "id": id(s), "value": s})
TOO_LONG = ["y" * 4097, u"\u00e9" * 5000]
NOT_STR = [b"\x00" * 64, b"\xff" * 64, 12345678901234567890, (1, 2, 3), 1.5]
for o in TOO_LONG:
    KEEP.append(o)
    emit({"kind": "toolong", "id": id(o)})
for o in NOT_STR:
    KEEP.append(o)
    emit({"kind": "notstr", "id": id(o)})

emit({"kind": "ready"})
sys.stdout.flush()
sys.stdin.read()
"##;

    /// The module the script imports from a directory with a non-ASCII name.
    const MODULE: &str = "def top():
    return 1

class Klass:
    def meth(self):
        x = 1
        return x

    @staticmethod
    def meth2():
        return 2
";

    /// Interpreters to test: pyenv's 3.6-3.13 and the system's.
    fn interpreters() -> Vec<PathBuf> {
        let mut found = Vec::new();
        if let Some(home) = std::env::var_os("HOME") {
            let versions = Path::new(&home).join(".pyenv/versions");
            let mut dirs: Vec<(u32, u32, PathBuf)> = std::fs::read_dir(&versions)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    let mut parts = name.split('.');
                    let major: u32 = parts.next()?.parse().ok()?;
                    let minor: u32 = parts.next()?.parse().ok()?;
                    let _patch: u32 = parts.next()?.parse().ok()?;
                    if major != 3 || !(6..=13).contains(&minor) {
                        return None;
                    }
                    let exe = e.path().join(format!("bin/python3.{minor}"));
                    exe.is_file().then_some((major, minor, exe))
                })
                .collect();
            dirs.sort();
            found.extend(dirs.into_iter().map(|(_, _, p)| p));
        }
        for minor in 6..=13 {
            let exe = PathBuf::from(format!("/usr/bin/python3.{minor}"));
            if exe.is_file() {
                found.push(exe);
            }
        }
        found
    }

    /// The interpreter process, killed and reaped when dropped.
    struct Interpreter(Child);

    impl Drop for Interpreter {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    struct Run {
        version: String,
        codes: usize,
        positions: usize,
        no_line: usize,
        failures: Vec<String>,
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn run_interpreter(exe: &Path, moddir: &Path) -> Result<Run, String> {
        use std::os::unix::ffi::OsStrExt;
        let child = Command::new(exe)
            .arg("-c")
            .arg(SCRIPT)
            .arg(hex(moddir.as_os_str().as_bytes()))
            .env("LC_ALL", "C.UTF-8")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn: {e}"))?;
        let mut child = Interpreter(child);
        let stdout = child.0.stdout.take().ok_or("no stdout")?;
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.map_err(|e| format!("reading output: {e}"))?;
            let v = Json::parse(&line).map_err(|e| format!("bad JSON ({e}): {line}"))?;
            if v.get("kind").and_then(Json::as_str) == Some("ready") {
                break;
            }
            lines.push(v);
        }
        let version_line = lines.first().ok_or("no output")?;
        if version_line.get("kind").and_then(Json::as_str) != Some("version") {
            return Err("no version line (did the script fail?)".into());
        }
        let v: Vec<i64> = version_line
            .get("version")
            .and_then(Json::as_arr)
            .ok_or("bad version")?
            .iter()
            .filter_map(Json::as_int)
            .collect();
        let version = v
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(".");
        let minor = u8::try_from(v[1]).map_err(|_| "bad minor")?;
        let layout = code_layout(minor).ok_or_else(|| format!("no layout for {version}"))?;
        let mem = ProcessMemory::new(child.0.id() as i32);
        let mut failures = Vec::new();
        let mut fail = |msg: String| failures.push(msg);
        let mut codes = 0;
        let mut positions = 0;
        let mut no_line = 0;
        for obj in &lines[1..] {
            let kind = obj.get("kind").and_then(Json::as_str).unwrap_or("");
            let id = obj.get("id").and_then(Json::as_int).unwrap_or(0) as u64;
            match kind {
                "code" => {
                    codes += 1;
                    let first = obj.get("firstlineno").and_then(Json::as_int).unwrap_or(-1) as u32;
                    let want_name = obj.get("name").and_then(Json::as_str).unwrap_or("?");
                    let want_file = obj.get("filename").and_then(Json::as_str).unwrap_or("?");
                    let info = match read_code(&mem, &layout, id, Some(first)) {
                        Ok(info) => info,
                        Err(e) => {
                            fail(format!("{want_name}: read_code: {e}"));
                            continue;
                        }
                    };
                    if info.name != want_name {
                        fail(format!("name {:?}, expected {want_name:?}", info.name));
                    }
                    if info.filename != want_file {
                        fail(format!(
                            "{want_name}: filename {:?}, expected {want_file:?}",
                            info.filename
                        ));
                    }
                    if info.firstlineno != first {
                        fail(format!("{want_name}: firstlineno {}", info.firstlineno));
                    }
                    let pairs = obj
                        .get("pairs")
                        .and_then(Json::as_arr)
                        .cloned()
                        .unwrap_or_default();
                    if pairs.len() < 2 {
                        fail(format!("{want_name}: no positions"));
                    }
                    let capi = obj.get("capi").and_then(Json::as_arr);
                    for (i, pair) in pairs.iter().enumerate() {
                        let p = pair.as_arr().map(|p| p.as_slice()).unwrap_or(&[]);
                        let (Some(pos), Some(want)) = (p.first().and_then(Json::as_int), p.get(1))
                        else {
                            fail(format!("{want_name}: bad pair {pair:?}"));
                            continue;
                        };
                        let want = want.as_int().map(|l| l as u32);
                        positions += 1;
                        no_line += usize::from(want.is_none());
                        let got = info.line(pos);
                        if got != want {
                            fail(format!(
                                "{want_name}: position {pos}: line {got:?}, expected {want:?}"
                            ));
                        }
                        if let Some(c) = capi.and_then(|c| c.get(i)) {
                            let c = c.as_int().map(|l| l as u32);
                            if got != c {
                                fail(format!(
                                    "{want_name}: position {pos}: line {got:?}, C API says {c:?}"
                                ));
                            }
                        }
                    }
                    // A reused address: same object, other firstlineno.
                    for wrong in [first.wrapping_add(1), first.wrapping_sub(1), 0, u32::MAX] {
                        match read_code(&mem, &layout, id, Some(wrong)) {
                            Err(CodeError::FirstLineMismatch { expected, found }) => {
                                if expected != wrong || found as u32 != first {
                                    fail(format!(
                                        "{want_name}: mismatch reported as {expected}/{found}"
                                    ));
                                }
                            }
                            other => fail(format!(
                                "{want_name}: firstlineno {wrong} not refused: {other:?}"
                            )),
                        }
                    }
                }
                "str" => {
                    let want = obj.get("value").and_then(Json::as_str).unwrap_or("?");
                    match read_str(&mem, &layout, id, "test") {
                        Ok(s) if s == want => {}
                        other => fail(format!("str {want:?}: {other:?}")),
                    }
                }
                "toolong" => match read_str(&mem, &layout, id, "test") {
                    Err(CodeError::StringTooLong { .. }) => {}
                    other => fail(format!("too long str at {id:#x}: {other:?}")),
                },
                "notstr" => {
                    // Bytes objects are refused for sure; other objects must at least not panic.
                    let r = read_str(&mem, &layout, id, "test");
                    if r.is_ok() && id == lines_first_bytes(&lines) {
                        fail(format!("bytes object read as a str: {r:?}"));
                    }
                    // Not a code object: firstlineno 0 does not match, or the strings are bad.
                    let _ = read_code(&mem, &layout, id, Some(0));
                }
                _ => fail(format!("unexpected line {obj:?}")),
            }
        }
        // Addresses that are not objects.
        for addr in [0u64, 8, 0x1001, u64::MAX - 7, 0xffff_ffff_ffff_f000] {
            if read_code(&mem, &layout, addr, Some(1)).is_ok() {
                fail(format!("read_code at {addr:#x} succeeded"));
            }
        }
        if codes < 20 {
            fail(format!("only {codes} code objects"));
        }
        let mut run = Run {
            version,
            codes,
            positions,
            no_line,
            failures,
        };
        drop(child);
        // The process is gone: reads fault.
        if let Some(obj) = lines
            .iter()
            .find(|o| o.get("kind").and_then(Json::as_str) == Some("code"))
        {
            let id = obj.get("id").and_then(Json::as_int).unwrap_or(0) as u64;
            let first = obj.get("firstlineno").and_then(Json::as_int).unwrap_or(0) as u32;
            match read_code(&mem, &layout, id, Some(first)) {
                Err(CodeError::Fault(_)) => {}
                other => run.failures.push(format!("read after exit: {other:?}")),
            }
        }
        Ok(run)
    }

    /// The address of the first non-string object (a bytes object of zeros).
    fn lines_first_bytes(lines: &[Json]) -> u64 {
        lines
            .iter()
            .find(|o| o.get("kind").and_then(Json::as_str) == Some("notstr"))
            .and_then(|o| o.get("id"))
            .and_then(Json::as_int)
            .unwrap_or(0) as u64
    }

    #[test]
    fn real_interpreters() {
        let exes = interpreters();
        assert!(
            !exes.is_empty(),
            "no Python interpreter found (~/.pyenv/versions/3.*, /usr/bin/python3.*)"
        );
        let base = std::env::temp_dir().join(format!("pyread-test-{}", std::process::id()));
        let moddir = base.join("d\u{e9}j\u{e0} \u{65e5}\u{672c}");
        std::fs::create_dir_all(&moddir).unwrap();
        std::fs::write(moddir.join("pyread_test_module.py"), MODULE).unwrap();
        let mut report = Vec::new();
        let mut failed = false;
        for exe in &exes {
            match run_interpreter(exe, &moddir) {
                Ok(run) => {
                    report.push(format!(
                        "{} ({}): {} code objects, {} positions ({} without a line): {}",
                        run.version,
                        exe.display(),
                        run.codes,
                        run.positions,
                        run.no_line,
                        if run.failures.is_empty() {
                            "ok".to_string()
                        } else {
                            format!("{} FAILURES", run.failures.len())
                        }
                    ));
                    for f in run.failures.iter().take(20) {
                        report.push(format!("    {f}"));
                    }
                    failed |= !run.failures.is_empty();
                }
                Err(e) => {
                    report.push(format!("{}: ERROR {e}", exe.display()));
                    failed = true;
                }
            }
        }
        let _ = std::fs::remove_dir_all(&base);
        let report = report.join("\n");
        println!("{report}");
        assert!(!failed, "{report}");
    }

    // ---- a JSON reader for the script's output (no dependencies) ----

    #[derive(Debug, Clone, PartialEq)]
    enum Json {
        Null,
        Bool(bool),
        Int(i64),
        Float,
        Str(String),
        Arr(Vec<Json>),
        Obj(Vec<(String, Json)>),
    }

    impl Json {
        fn parse(s: &str) -> Result<Json, String> {
            let mut p = Parser {
                s: s.as_bytes(),
                i: 0,
            };
            let v = p.value()?;
            p.ws();
            if p.i != p.s.len() {
                return Err(format!("trailing text at {}", p.i));
            }
            Ok(v)
        }
        fn get(&self, key: &str) -> Option<&Json> {
            match self {
                Json::Obj(kv) => kv.iter().find(|(k, _)| k == key).map(|(_, v)| v),
                _ => None,
            }
        }
        fn as_str(&self) -> Option<&str> {
            match self {
                Json::Str(s) => Some(s),
                _ => None,
            }
        }
        fn as_int(&self) -> Option<i64> {
            match self {
                Json::Int(n) => Some(*n),
                _ => None,
            }
        }
        fn as_arr(&self) -> Option<&Vec<Json>> {
            match self {
                Json::Arr(a) => Some(a),
                _ => None,
            }
        }
    }

    struct Parser<'a> {
        s: &'a [u8],
        i: usize,
    }

    impl Parser<'_> {
        fn ws(&mut self) {
            while self.s.get(self.i).is_some_and(|b| b.is_ascii_whitespace()) {
                self.i += 1;
            }
        }
        fn eat(&mut self, b: u8) -> Result<(), String> {
            self.ws();
            if self.s.get(self.i) == Some(&b) {
                self.i += 1;
                Ok(())
            } else {
                Err(format!("expected {:?} at {}", b as char, self.i))
            }
        }
        fn lit(&mut self, word: &str, v: Json) -> Result<Json, String> {
            if self.s[self.i..].starts_with(word.as_bytes()) {
                self.i += word.len();
                Ok(v)
            } else {
                Err(format!("bad literal at {}", self.i))
            }
        }
        fn value(&mut self) -> Result<Json, String> {
            self.ws();
            match self.s.get(self.i).copied().ok_or("end of input")? {
                b'n' => self.lit("null", Json::Null),
                b't' => self.lit("true", Json::Bool(true)),
                b'f' => self.lit("false", Json::Bool(false)),
                b'"' => self.string().map(Json::Str),
                b'[' => {
                    self.i += 1;
                    let mut a = Vec::new();
                    self.ws();
                    if self.s.get(self.i) == Some(&b']') {
                        self.i += 1;
                        return Ok(Json::Arr(a));
                    }
                    loop {
                        a.push(self.value()?);
                        self.ws();
                        match self.s.get(self.i) {
                            Some(b',') => self.i += 1,
                            Some(b']') => {
                                self.i += 1;
                                return Ok(Json::Arr(a));
                            }
                            _ => return Err(format!("bad array at {}", self.i)),
                        }
                    }
                }
                b'{' => {
                    self.i += 1;
                    let mut kv = Vec::new();
                    self.ws();
                    if self.s.get(self.i) == Some(&b'}') {
                        self.i += 1;
                        return Ok(Json::Obj(kv));
                    }
                    loop {
                        self.ws();
                        let k = self.string()?;
                        self.eat(b':')?;
                        kv.push((k, self.value()?));
                        self.ws();
                        match self.s.get(self.i) {
                            Some(b',') => self.i += 1,
                            Some(b'}') => {
                                self.i += 1;
                                return Ok(Json::Obj(kv));
                            }
                            _ => return Err(format!("bad object at {}", self.i)),
                        }
                    }
                }
                _ => {
                    let start = self.i;
                    while self
                        .s
                        .get(self.i)
                        .is_some_and(|b| b"+-0123456789.eE".contains(b))
                    {
                        self.i += 1;
                    }
                    let t =
                        std::str::from_utf8(&self.s[start..self.i]).map_err(|e| e.to_string())?;
                    if t.is_empty() {
                        return Err(format!("unexpected byte at {start}"));
                    }
                    Ok(t.parse().map(Json::Int).unwrap_or(Json::Float))
                }
            }
        }
        fn hex4(&mut self) -> Result<u32, String> {
            let h = self.s.get(self.i..self.i + 4).ok_or("short \\u escape")?;
            self.i += 4;
            u32::from_str_radix(std::str::from_utf8(h).map_err(|e| e.to_string())?, 16)
                .map_err(|e| e.to_string())
        }
        /// A string; lone surrogates become U+FFFD, as in `read_str`.
        fn string(&mut self) -> Result<String, String> {
            self.eat(b'"')?;
            let mut out = String::new();
            loop {
                let b = *self.s.get(self.i).ok_or("unterminated string")?;
                self.i += 1;
                match b {
                    b'"' => return Ok(out),
                    b'\\' => {
                        let e = *self.s.get(self.i).ok_or("bad escape")?;
                        self.i += 1;
                        match e {
                            b'n' => out.push('\n'),
                            b't' => out.push('\t'),
                            b'r' => out.push('\r'),
                            b'b' => out.push('\u{8}'),
                            b'f' => out.push('\u{c}'),
                            b'u' => {
                                let u = self.hex4()?;
                                if (0xd800..0xdc00).contains(&u)
                                    && self.s[self.i..].starts_with(b"\\u")
                                {
                                    let save = self.i;
                                    self.i += 2;
                                    let lo = self.hex4()?;
                                    if (0xdc00..0xe000).contains(&lo) {
                                        let c = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
                                        out.push(char::from_u32(c).ok_or("bad pair")?);
                                        continue;
                                    }
                                    self.i = save;
                                }
                                out.push(char::from_u32(u).unwrap_or('\u{fffd}'));
                            }
                            other => out.push(other as char),
                        }
                    }
                    _ => {
                        // Raw UTF-8 (json.dumps escapes everything non-ASCII, but accept it).
                        let start = self.i - 1;
                        let len = match b {
                            0..=0x7f => 1,
                            0xc0..=0xdf => 2,
                            0xe0..=0xef => 3,
                            _ => 4,
                        };
                        let chunk = self.s.get(start..start + len).ok_or("bad UTF-8")?;
                        out.push_str(std::str::from_utf8(chunk).map_err(|e| e.to_string())?);
                        self.i = start + len;
                    }
                }
            }
        }
    }

    #[test]
    fn json_reader() {
        let v = Json::parse(
            r#"{"a": [1, -2, null, "x\u00e9\ud83d\udc0d\udcff"], "b": {}, "c": 1.5, "d": true}"#,
        )
        .unwrap();
        assert_eq!(v.get("a").unwrap().as_arr().unwrap()[1], Json::Int(-2));
        assert_eq!(
            v.get("a").unwrap().as_arr().unwrap()[3].as_str(),
            Some("x\u{e9}\u{1f40d}\u{fffd}")
        );
        assert_eq!(v.get("c"), Some(&Json::Float));
        assert!(Json::parse("[1,").is_err());
    }
}
