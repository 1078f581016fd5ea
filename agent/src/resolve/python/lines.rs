//! Line numbers from CPython code objects' line tables: one pure function per format.
//!
//! The tables come from the target process and are hostile input. Every function walks its
//! table once, front to back, one entry per step, so it ends after at most `table.len()` steps
//! whatever the bytes say; arithmetic is done in `i64` (checked where a table of gigabytes could
//! overflow it) and a line that does not fit a `u32` is `None`. None of them panics.
//!
//! Positions are what the BPF program records for a frame:
//! - 3.6-3.9: `f_lasti`, a byte offset into `co_code`; -1 before the frame starts.
//! - 3.10: `f_lasti`, an index in code units (2 bytes each); -1 before the frame starts.
//! - 3.11+: an index in code units into the bytecode, 0-based. A negative index (3.11/3.12's
//!   `prev_instr` of a frame that has not started points one unit before the bytecode) is taken
//!   as "not started".
//!
//! A frame that has not started is on its code object's first line, as in CPython's
//! `PyCode_Addr2Line` for negative offsets.

/// CPython 3.6-3.9 `co_lnotab`: byte pairs (bytecode offset increment, line increment), the line
/// increment signed since 3.6. Starting at offset 0 on `firstlineno`, each pair first moves the
/// offset; once the offset passes `lasti_bytes` the current line is the answer, else the line
/// moves. Same walk as CPython's `PyCode_Addr2Line` (3.6-3.9).
///
/// An offset past the last pair is on the last line (as in CPython). `None` for a table of odd
/// length (malformed) or a line outside `u32`.
pub fn lnotab_line(lnotab: &[u8], firstlineno: u32, lasti_bytes: i64) -> Option<u32> {
    if !lnotab.len().is_multiple_of(2) {
        return None;
    }
    let mut line = i64::from(firstlineno);
    let mut addr: i64 = 0;
    for pair in lnotab.chunks_exact(2) {
        addr += i64::from(pair[0]);
        if addr > lasti_bytes {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    u32::try_from(line).ok()
}

/// CPython 3.10 `co_linetable`: byte pairs (range length in bytes, signed line delta). Each pair
/// covers the next `length` bytes of bytecode; its delta is added to the running line (which
/// starts at `firstlineno`) and the range has that line, except that a delta of -128 means "no
/// line" for the range and leaves the running line alone. Zero-length ranges only move the line.
///
/// `lasti_units` is the frame's `f_lasti` in code units; negative means the frame has not
/// started (first line). `None` for "no line", an offset past the table, a table of odd length,
/// or a line outside `u32`.
pub fn linetable_310_line(table: &[u8], firstlineno: u32, lasti_units: i64) -> Option<u32> {
    if lasti_units < 0 {
        return Some(firstlineno);
    }
    if !table.len().is_multiple_of(2) {
        return None;
    }
    let target = lasti_units.checked_mul(2)?;
    let mut line = i64::from(firstlineno);
    let mut end: i64 = 0;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += i64::from(pair[0]);
        let delta = pair[1] as i8;
        let range_line = if delta == -128 {
            None
        } else {
            line += i64::from(delta);
            Some(line)
        };
        if start <= target && target < end {
            return range_line.and_then(|l| u32::try_from(l).ok());
        }
    }
    None
}

/// Location-table entry codes of CPython 3.11+ (`Include/internal/pycore_code.h`).
const CODE_NONE: u8 = 15;
const CODE_LONG: u8 = 14;
const CODE_NO_COLUMNS: u8 = 13;
const CODE_ONE_LINE0: u8 = 10;
const CODE_ONE_LINE2: u8 = 12;

/// Chunks of 6 bits a varint may have: 36 bits, more than any line or column CPython writes
/// (an `int` line delta, doubled for the sign, is 33 bits).
const MAX_VARINT_CHUNKS: u32 = 6;

/// CPython 3.11+ location table (`co_linetable`). Entries start with a byte `1 code(4) len-1(3)`
/// (length in code units) followed by the entry's data, whose bytes all have bit 7 clear:
/// - 15: no location; no data.
/// - 14 (long): svarint line delta, varint end-line delta, varint column+1, varint end-column+1.
/// - 13 (no columns): svarint line delta.
/// - 10-12 (one line): line delta = code - 10; two column bytes.
/// - 0-9 (short): line delta 0; one column byte.
///
/// varint: 6-bit chunks, least significant first, 0x40 = more follow; svarint: a varint whose
/// low bit is the sign. The line starts at `firstlineno`; the entry covering `unit` gives it.
///
/// `unit` is a 0-based index in code units; negative means the frame has not started (first
/// line). `None` for a "no location" entry, a unit past the table, a malformed table up to the
/// covering entry (data byte with bit 7 set, entry head without it, truncated entry, varint of
/// more than 6 chunks), or a line outside `u32`.
pub fn location_table_line(table: &[u8], firstlineno: u32, unit: i64) -> Option<u32> {
    if unit < 0 {
        return Some(firstlineno);
    }
    let mut line = i64::from(firstlineno);
    let mut end: i64 = 0;
    let mut i = 0usize;
    while i < table.len() {
        let head = table[i];
        if head & 0x80 == 0 {
            return None;
        }
        i += 1;
        let code = (head >> 3) & 15;
        let (delta, has_line) = match code {
            CODE_NONE => (0, false),
            CODE_LONG => {
                let delta = read_svarint(table, &mut i)?;
                for _ in 0..3 {
                    read_varint(table, &mut i)?;
                }
                (delta, true)
            }
            CODE_NO_COLUMNS => (read_svarint(table, &mut i)?, true),
            CODE_ONE_LINE0..=CODE_ONE_LINE2 => {
                skip_data(table, &mut i, 2)?;
                (i64::from(code - CODE_ONE_LINE0), true)
            }
            _ => {
                skip_data(table, &mut i, 1)?;
                (0, true)
            }
        };
        line = line.checked_add(delta)?;
        let start = end;
        end += i64::from(head & 7) + 1;
        if start <= unit && unit < end {
            return if has_line {
                u32::try_from(line).ok()
            } else {
                None
            };
        }
    }
    None
}

/// Steps over `n` data bytes of an entry, each of which must have bit 7 clear.
fn skip_data(table: &[u8], i: &mut usize, n: usize) -> Option<()> {
    let end = i.checked_add(n)?;
    let data = table.get(*i..end)?;
    if data.iter().any(|b| b & 0x80 != 0) {
        return None;
    }
    *i = end;
    Some(())
}

fn read_varint(table: &[u8], i: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for chunk in 0..MAX_VARINT_CHUNKS {
        let b = *table.get(*i)?;
        if b & 0x80 != 0 {
            return None;
        }
        *i += 1;
        value |= u64::from(b & 63) << (6 * chunk);
        if b & 64 == 0 {
            return Some(value);
        }
    }
    None
}

fn read_svarint(table: &[u8], i: &mut usize) -> Option<i64> {
    let v = read_varint(table, i)?;
    // v < 2^36: both casts are exact.
    let magnitude = (v >> 1) as i64;
    Some(if v & 1 != 0 { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;

    // ---- 3.6-3.9 lnotab ----

    #[test]
    fn lnotab_walk() {
        // offsets 0..6 line 10, 6..10 line 11, 10..300 line 9 (signed step), 300.. line 129.
        let t = [0, 0, 6, 1, 4, 0xfe, 0xff, 0, 35, 120];
        assert_eq!(lnotab_line(&t, 10, -1), Some(10));
        assert_eq!(lnotab_line(&t, 10, 0), Some(10));
        assert_eq!(lnotab_line(&t, 10, 4), Some(10));
        assert_eq!(lnotab_line(&t, 10, 6), Some(11));
        assert_eq!(lnotab_line(&t, 10, 8), Some(11));
        assert_eq!(lnotab_line(&t, 10, 10), Some(9));
        assert_eq!(lnotab_line(&t, 10, 264), Some(9));
        assert_eq!(lnotab_line(&t, 10, 298), Some(9));
        assert_eq!(lnotab_line(&t, 10, 300), Some(129));
        assert_eq!(lnotab_line(&[], 7, 1000), Some(7));
        assert_eq!(lnotab_line(&[], 7, -1), Some(7));
    }

    #[test]
    fn lnotab_malformed() {
        assert_eq!(lnotab_line(&[2], 1, 0), None);
        assert_eq!(lnotab_line(&[2, 1, 2], 1, 0), None);
        // The line goes below zero.
        assert_eq!(lnotab_line(&[0, 0x80, 0, 0x80], 100, 0), None);
        // Lines past u32.
        let big = [0u8, 127].repeat(1 << 16);
        assert_eq!(lnotab_line(&big, u32::MAX - 10, i64::MAX), None);
        // Extreme positions.
        let t = [2u8, 1].repeat(1000);
        assert_eq!(lnotab_line(&t, 1, i64::MAX), Some(1001));
        assert_eq!(lnotab_line(&t, 1, i64::MIN), Some(1));
        // A large table of junk ends.
        let junk: Vec<u8> = (0..(1u32 << 20))
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let _ = lnotab_line(&junk, 1, i64::MAX);
    }

    // ---- 3.10 linetable ----

    #[test]
    fn linetable_310_walk() {
        // bytes 0..6 line 5; 6..8 no line; 8..8 (empty) +2; 8..12 line 8 (+1); 12..262 line 6;
        // 262..264 line 6.
        let t = [6, 0, 2, 0x80, 0, 2, 4, 1, 250, 0xfe, 2, 0];
        let l = |u| linetable_310_line(&t, 5, u);
        assert_eq!(l(-1), Some(5));
        assert_eq!(l(0), Some(5));
        assert_eq!(l(2), Some(5));
        assert_eq!(l(3), None);
        assert_eq!(l(4), Some(8));
        assert_eq!(l(5), Some(8));
        assert_eq!(l(6), Some(6));
        assert_eq!(l(130), Some(6));
        assert_eq!(l(131), Some(6));
        assert_eq!(l(132), None); // past the table
        assert_eq!(linetable_310_line(&[], 5, 0), None);
        assert_eq!(linetable_310_line(&[], 5, -1), Some(5));
    }

    #[test]
    fn linetable_310_malformed() {
        assert_eq!(linetable_310_line(&[6], 1, 0), None);
        assert_eq!(linetable_310_line(&[6, 0, 2], 1, 0), None);
        assert_eq!(linetable_310_line(&[6, 0], 1, i64::MAX), None);
        assert_eq!(linetable_310_line(&[6, 0], 1, i64::MIN), Some(1));
        // Negative line.
        assert_eq!(linetable_310_line(&[2, 0x81, 2, 0x81], 200, 1), None);
        // Zero-length ranges only: nothing covers anything.
        let zeros = [0u8, 1].repeat(1 << 19);
        assert_eq!(linetable_310_line(&zeros, 1, 0), None);
        let junk: Vec<u8> = (0..(1u32 << 20))
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        let _ = linetable_310_line(&junk, 1, 1 << 40);
    }

    // ---- 3.11+ location table ----

    fn head(code: u8, units: u8) -> u8 {
        assert!((1..=8).contains(&units));
        0x80 | (code << 3) | (units - 1)
    }

    #[test]
    fn location_table_walk() {
        let t = [
            vec![head(0, 1), 0x05],  // unit 0: line 20 (delta 0, short form)
            vec![head(13, 2), 6],    // units 1-2: +3 -> 23 (svarint 6)
            vec![head(15, 1)],       // unit 3: no location
            vec![head(11, 3), 4, 9], // units 4-6: +1 -> 24
            // units 7-14: -2 -> 22 (svarint 5), end-line 0, col 3, end col 10
            vec![head(14, 8), 5, 0, 4, 11],
            // unit 15: +1000 -> 1022: svarint 2000 = 31 << 6 | 16, then varints 64, 1, 1
            vec![head(14, 1), 0x40 | 16, 31, 0x40, 0x01, 1, 1],
            vec![head(12, 1), 0, 1], // unit 16: +2 -> 1024
            vec![head(9, 2), 0x7f],  // units 17-18: 1024
        ]
        .concat();
        let l = |u| location_table_line(&t, 20, u);
        assert_eq!(l(-1), Some(20));
        assert_eq!(l(0), Some(20));
        assert_eq!(l(1), Some(23));
        assert_eq!(l(2), Some(23));
        assert_eq!(l(3), None);
        assert_eq!(l(4), Some(24));
        assert_eq!(l(6), Some(24));
        assert_eq!(l(7), Some(22));
        assert_eq!(l(14), Some(22));
        assert_eq!(l(15), Some(1022));
        assert_eq!(l(16), Some(1024));
        assert_eq!(l(17), Some(1024));
        assert_eq!(l(18), Some(1024));
        assert_eq!(l(19), None);
        assert_eq!(l(i64::MAX), None);
        assert_eq!(location_table_line(&[], 1, 0), None);
        // A malformed tail after the covering entry does not matter.
        let mut tail = t.clone();
        tail.push(0x01);
        assert_eq!(location_table_line(&tail, 20, 18), Some(1024));
        assert_eq!(location_table_line(&tail, 20, 19), None);
    }

    #[test]
    fn location_table_malformed() {
        let l = location_table_line;
        // Head without bit 7.
        assert_eq!(l(&[0x05], 1, 0), None);
        // Truncated entries.
        assert_eq!(l(&[head(0, 1)], 1, 0), None);
        assert_eq!(l(&[head(10, 1), 1], 1, 0), None);
        assert_eq!(l(&[head(13, 1)], 1, 0), None);
        assert_eq!(l(&[head(14, 1), 2, 0, 1], 1, 0), None);
        assert_eq!(l(&[head(13, 1), 0x40], 1, 0), None);
        // Data bytes with bit 7 set.
        assert_eq!(l(&[head(0, 1), 0x85], 1, 0), None);
        assert_eq!(l(&[head(11, 1), 0x01, 0x85], 1, 0), None);
        assert_eq!(l(&[head(13, 1), 0xc1], 1, 0), None);
        // Endless varint: continuation chunks all the way to the end of a big table.
        let mut endless = vec![head(13, 1)];
        endless.extend(std::iter::repeat_n(0x7f, 1 << 20));
        assert_eq!(l(&endless, 1, 0), None);
        // Seven chunks: one too many.
        assert_eq!(
            l(
                &[head(13, 1), 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x00],
                1,
                0
            ),
            None
        );
        // Six chunks: fine (delta 0).
        assert_eq!(
            l(&[head(13, 1), 0x40, 0x40, 0x40, 0x40, 0x40, 0x00], 1, 0),
            Some(1)
        );
        // Huge deltas: lines past u32 or below 0.
        let huge = [head(13, 1), 0x7e, 0x7f, 0x7f, 0x7f, 0x7f, 0x3f]; // + (2^35 - 1)
        assert_eq!(l(&huge, 1, 0), None);
        let neg = [head(13, 1), 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x3f]; // - (2^35 - 1)
        assert_eq!(l(&neg, 1, 0), None);
        // Many huge deltas in a row: the sum stays in i64 (2^35 * 2^20 entries < 2^63).
        let many = huge.repeat(1 << 17);
        assert_eq!(l(&many, 1, (1 << 17) - 1), None);
        // Junk of every kind ends without panicking.
        let junk: Vec<u8> = (0..(1u32 << 20))
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 9) as u8)
            .collect();
        for u in [0, 1, 100, 1 << 30, i64::MAX] {
            let _ = l(&junk, 1, u);
        }
        for len in 0..64 {
            for u in 0..40 {
                let _ = l(&junk[..len], u32::MAX, u);
            }
        }
    }

    #[test]
    fn varints() {
        let mut i = 0;
        assert_eq!(read_varint(&[0x41, 0x02], &mut i), Some(1 | (2 << 6)));
        assert_eq!(i, 2);
        let mut i = 0;
        assert_eq!(read_svarint(&[0x03], &mut i), Some(-1));
        let mut i = 0;
        assert_eq!(read_svarint(&[0x04], &mut i), Some(2));
        let mut i = 5;
        assert_eq!(read_varint(&[0x04], &mut i), None);
        let mut i = usize::MAX;
        assert_eq!(skip_data(&[0x04], &mut i, 2), None);
    }
}
