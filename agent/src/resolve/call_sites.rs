//! The instructions in a file's code that call a function: `call rel32` whose target is the
//! function itself or its PLT stub (the `jmp *slot(%rip)` through the GOT slot that the
//! dynamic linker fills with the function's address, named by the slot's relocation). A `call`
//! is an instruction the kernel emulates at a uprobe, so a probe there costs no step. The
//! code is scanned byte by byte, so a match may lie inside another instruction: callers keep
//! only a call that the bytes before it show the set-up of, since a probe inside an
//! instruction would corrupt the process.
use object::{Object, ObjectSection as _, ObjectSymbol as _, ObjectSymbolTable as _, RelocationTarget, SectionKind};

/// Code scanned at most, per file: large enough for any allocator's text (tcmalloc's is
/// 134 KiB), small enough to read without a second thought.
const MAX_CODE: u64 = 16 << 20;
/// Bytes kept before each call, for the caller's check of its set-up.
pub const BEFORE: usize = 24;

/// One `call` of the function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// Link-time address of the call instruction.
    pub address: u64,
    /// The `BEFORE` bytes before it (fewer at a section's start), ending at `address`.
    pub before: Vec<u8>,
}

/// The calls in `elf`'s executable sections of the function `name` defined at link-time
/// address `function`.
pub fn calls_to<'data, R: object::ReadRef<'data>>(elf: &object::File<'data, R>, name: &str, function: u64) -> Vec<Call> {
    let mut targets = vec![function];
    if let Some(slot) = got_slot(elf, name) {
        targets.extend(plt_stubs(elf, slot));
    }
    let mut calls = Vec::new();
    for section in elf.sections().filter(|s| s.kind() == SectionKind::Text && !is_plt(s.name().unwrap_or_default())) {
        let Some(code) = bounded_data(&section) else { continue };
        let start = section.address();
        for at in 0..code.len().saturating_sub(4) {
            if code[at] != 0xe8 {
                continue;
            }
            let target = rip_relative(start, at, &code[at + 1..at + 5], 5);
            if targets.contains(&target) {
                calls.push(Call { address: start + at as u64, before: code[at.saturating_sub(BEFORE)..at].to_vec() });
            }
        }
    }
    calls
}

/// The GOT slot whose jump-slot relocation names `name`.
fn got_slot<'data, R: object::ReadRef<'data>>(elf: &object::File<'data, R>, name: &str) -> Option<u64> {
    let symbols = elf.dynamic_symbol_table()?;
    elf.dynamic_relocations()?.find_map(|(slot, relocation)| {
        let RelocationTarget::Symbol(index) = relocation.target() else { return None };
        (symbols.symbol_by_index(index).ok()?.name().ok()? == name).then_some(slot)
    })
}

/// The starts of the PLT stubs that jump through `slot`: `[endbr64] [bnd] jmp *disp(%rip)`.
fn plt_stubs<'data, R: object::ReadRef<'data>>(elf: &object::File<'data, R>, slot: u64) -> Vec<u64> {
    let mut stubs = Vec::new();
    for section in elf.sections().filter(|s| is_plt(s.name().unwrap_or_default())) {
        let Some(code) = bounded_data(&section) else { continue };
        for at in 0..code.len().saturating_sub(5) {
            if code[at..at + 2] != [0xff, 0x25] || rip_relative(section.address(), at, &code[at + 2..at + 6], 6) != slot {
                continue;
            }
            let mut start = at;
            if start >= 1 && code[start - 1] == 0xf2 {
                start -= 1;
            }
            if start >= 4 && code[start - 4..start] == [0xf3, 0x0f, 0x1e, 0xfa] {
                start -= 4;
            }
            stubs.push(section.address() + start as u64);
        }
    }
    stubs
}

fn is_plt(name: &str) -> bool {
    name.starts_with(".plt")
}

/// A section's bytes, if it has no more than `MAX_CODE` of them.
fn bounded_data<'data, R: object::ReadRef<'data>>(section: &object::Section<'data, '_, R>) -> Option<&'data [u8]> {
    (section.size() <= MAX_CODE).then(|| section.data().ok()).flatten()
}

/// The target of a rip-relative `displacement` in the instruction of `length` bytes at `at` in
/// code that starts at `start`.
pub fn rip_relative(start: u64, at: usize, displacement: &[u8], length: u64) -> u64 {
    let displacement = i32::from_le_bytes(displacement.try_into().unwrap_or_default());
    start.wrapping_add(at as u64).wrapping_add(length).wrapping_add_signed(i64::from(displacement))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rip_relative_target_counts_from_the_instructions_end() {
        // Debian's libtcmalloc.so.4 2.10: `call 152c0` at 0x18496 is e8 25 ce ff ff.
        assert_eq!(rip_relative(0x18000, 0x496, &[0x25, 0xce, 0xff, 0xff], 5), 0x152c0);
        // and its stub `jmp *0x36e9a(%rip)` at 0x152c0 goes through the slot at 0x4c160.
        assert_eq!(rip_relative(0x15000, 0x2c0, &[0x9a, 0x6e, 0x03, 0x00], 6), 0x4c160);
    }
}
