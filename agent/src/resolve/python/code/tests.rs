//! The code object reader on hand-made objects in this process's own memory.
use super::*;

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
