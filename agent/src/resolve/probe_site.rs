//! Where in a function a uprobe costs least. At a trap the kernel either emulates the probed
//! instruction (x86-64: `push` of a register, jumps, calls, conditional branches, `nop`s) or
//! copies it out of line and single-steps it. The step is a second trap; on a VM it is most of
//! the cost: 10.4 µs a hit against 0.6 µs, measured with tracefs uprobes on this kind of host
//! (kernel 6.18 in a VM). So a probe goes on the first instruction the kernel emulates, as long
//! as every call passes it once and nothing before it changes the registers the probe reads:
//! the arguments, and for a return probe the stack pointer (the kernel swaps the return
//! address at the top of the stack at the hit). The decoder knows the few instructions prologues open with;
//! anything else leaves the probe at the function's entry.

/// Where a probe goes, from the function's start, and whether the kernel steps it there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeSite {
    pub offset: u64,
    pub stepped: bool,
}

/// Bytes of a function read to place its probe: some 16 short instructions.
pub const CODE_BYTES: usize = 64;

/// x86-64 registers, as `kept` masks (`1 << number`).
pub const RDX: u16 = 1 << 2;
pub const RSP: u16 = 1 << 4;
pub const RSI: u16 = 1 << 6;
pub const RDI: u16 = 1 << 7;

/// The first instruction of `code` (a function's first bytes) that the kernel emulates, if
/// only straight-line instructions that write none of the `kept` registers come before it;
/// else the entry.
pub fn place(code: &[u8], kept: u16) -> ProbeSite {
    let mut at = 0;
    while at < code.len() {
        match decode(&code[at..]) {
            Some(Instruction::Emulated) => return ProbeSite { offset: at as u64, stepped: false },
            Some(Instruction::Straight { len, writes }) if writes & kept == 0 => at += len,
            _ => break,
        }
    }
    ProbeSite { offset: 0, stepped: true }
}

enum Instruction {
    /// The kernel runs it without a step, and it is where the straight line ends (a branch)
    /// or may go on.
    Emulated,
    /// Stepped, falls through to the next instruction, writes the registers in `writes`.
    Straight { len: usize, writes: u16 },
}

/// One instruction at the start of `code`, if it is one of those known here.
fn decode(code: &[u8]) -> Option<Instruction> {
    if code.starts_with(&[0xf3, 0x0f, 0x1e, 0xfa]) {
        return Some(Instruction::Straight { len: 4, writes: 0 }); // endbr64
    }
    let mut at = 0;
    let mut operand16 = false;
    let mut legacy = false;
    while let Some(&prefix @ (0x66 | 0x64 | 0x65)) = code.get(at) {
        operand16 |= prefix == 0x66;
        legacy = true;
        at += 1;
    }
    let rex = match code.get(at) {
        Some(&byte @ 0x40..=0x4f) => {
            at += 1;
            byte
        }
        _ => 0,
    };
    let opcode = *code.get(at)?;
    at += 1;
    let plain = !legacy && rex == 0;
    match opcode {
        // push r64, with REX.B for r8-r15 and no other prefix.
        0x50..=0x57 if !legacy && (rex == 0 || rex == 0x41) => return Some(Instruction::Emulated),
        0x70..=0x7f | 0xe8 | 0xe9 | 0xeb | 0x90 if plain => return Some(Instruction::Emulated),
        0x0f => {
            return match *code.get(at)? {
                0x80..=0x8f if plain => Some(Instruction::Emulated),
                0x1f if plain => Some(Instruction::Emulated), // nopl
                _ => None,
            };
        }
        _ => {}
    }
    let reg_field = |modrm: u8| u16::from((modrm >> 3) & 7) | (u16::from(rex & 4) << 1);
    let rm_field = |modrm: u8| u16::from(modrm & 7) | (u16::from(rex & 1) << 3);
    let imm32 = if operand16 { 2 } else { 4 };
    // (has a ModRM byte, immediate bytes, which operand it writes)
    let (immediate, writes) = match opcode {
        // mov imm to a register: no ModRM.
        0xb8..=0xbf => {
            let len = at + if rex & 8 != 0 { 8 } else { imm32 };
            let register = u16::from(opcode & 7) | (u16::from(rex & 1) << 3);
            return (len <= code.len()).then_some(Instruction::Straight { len, writes: 1 << register });
        }
        // add/or/and/sub/xor eax, imm; cmp and test eax, imm write no register.
        0x05 | 0x0d | 0x25 | 0x2d | 0x35 | 0x3d | 0xa9 => {
            let len = at + imm32;
            let writes = if matches!(opcode, 0x3d | 0xa9) { 0 } else { 1 };
            return (len <= code.len()).then_some(Instruction::Straight { len, writes });
        }
        // op r/m, r: the r/m operand is written.
        0x01 | 0x09 | 0x21 | 0x29 | 0x31 | 0x89 => (0, Writes::Rm),
        // op r, r/m and lea: the register is written.
        0x03 | 0x0b | 0x23 | 0x2b | 0x33 | 0x8b | 0x8d => (0, Writes::Reg),
        // cmp and test: flags only.
        0x38 | 0x39 | 0x3a | 0x3b | 0x84 | 0x85 => (0, Writes::Nothing),
        // group 1 with an immediate: /7 is cmp.
        0x80 | 0x83 => (1, Writes::RmUnlessCmp),
        0x81 => (imm32, Writes::RmUnlessCmp),
        // shifts by an immediate or by one.
        0xc1 => (1, Writes::Rm),
        0xd1 => (0, Writes::Rm),
        // mov imm to r/m (/0 only).
        0xc7 => (imm32, Writes::Rm),
        _ => return None,
    };
    let modrm = *code.get(at)?;
    at += 1;
    let (mode, rm) = (modrm >> 6, modrm & 7);
    if opcode == 0xc7 && (modrm >> 3) & 7 != 0 {
        return None;
    }
    if mode != 3 && rm == 4 {
        let sib = *code.get(at)?;
        at += 1;
        if mode == 0 && sib & 7 == 5 {
            at += 4;
        }
    }
    at += match (mode, rm) {
        (0, 5) => 4, // rip-relative
        (1, _) => 1,
        (2, _) => 4,
        _ => 0,
    };
    let len = at + immediate;
    if len > code.len() {
        return None;
    }
    let register_written = |number: u16| 1u16 << number;
    let writes = match writes {
        Writes::Nothing => 0,
        Writes::Reg => register_written(reg_field(modrm)),
        Writes::Rm | Writes::RmUnlessCmp if mode != 3 => 0, // memory
        Writes::RmUnlessCmp if (modrm >> 3) & 7 == 7 => 0,
        Writes::Rm | Writes::RmUnlessCmp => register_written(rm_field(modrm)),
    };
    Some(Instruction::Straight { len, writes })
}

enum Writes {
    Nothing,
    Reg,
    Rm,
    RmUnlessCmp,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset: u64) -> ProbeSite {
        ProbeSite { offset, stepped: false }
    }

    const ENTRY: ProbeSite = ProbeSite { offset: 0, stepped: true };

    #[test]
    fn a_push_or_a_branch_is_the_site_once_the_argument_is_unchanged() {
        // glibc 2.36's free: test %rdi,%rdi; je ...
        assert_eq!(place(&[0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0, 0, 0, 0x55], RDI), at(3));
        // glibc's malloc opens with push %r12.
        assert_eq!(place(&[0x41, 0x54, 0x55, 0x53], RDI), at(0));
        // tcmalloc's free: mov 0x1bb159(%rip),%rax; test %rax,%rax; jne ...
        let tcmalloc = [0x48, 0x8b, 0x05, 0x59, 0xb1, 0x1b, 0x00, 0x48, 0x85, 0xc0, 0x0f, 0x85, 0x90, 0, 0, 0];
        assert_eq!(place(&tcmalloc, RDI), at(10));
        // endbr64; push %rbx
        assert_eq!(place(&[0xf3, 0x0f, 0x1e, 0xfa, 0x53], RDI), at(4));
    }

    #[test]
    fn a_return_probe_stays_before_the_stack_pointer_moves() {
        // sub $8,%rsp; push %rbx: fine for a free, not for an allocation's return probe.
        let code = [0x48, 0x83, 0xec, 0x08, 0x53];
        assert_eq!(place(&code, RDI), at(4));
        assert_eq!(place(&code, RDI | RSI | RDX | RSP), ENTRY);
        // jemalloc's malloc: cmp $0x1000,%rdi; ja ...
        let jemalloc = [0x48, 0x81, 0xff, 0x00, 0x10, 0x00, 0x00, 0x0f, 0x87, 0x93, 0, 0, 0];
        assert_eq!(place(&jemalloc, RDI | RSI | RDX | RSP), at(7));
    }

    #[test]
    fn jemallocs_free_is_decoded_to_its_first_branch() {
        let code = [
            0x48, 0x89, 0xf8, // mov %rdi,%rax
            0x48, 0x8b, 0x15, 0x0e, 0x53, 0x0a, 0x00, // mov 0xa530e(%rip),%rdx
            0x48, 0x89, 0xf9, // mov %rdi,%rcx
            0x48, 0xc1, 0xe8, 0x1a, // shr $0x1a,%rax
            0x48, 0x81, 0xe1, 0x00, 0x00, 0x00, 0xc0, // and $0xffffffffc0000000,%rcx
            0x25, 0xf0, 0x00, 0x00, 0x00, // and $0xf0,%eax
            0x64, 0x48, 0x03, 0x04, 0x25, 0x00, 0x00, 0x00, 0x00, // add %fs:0x0,%rax
            0x48, 0x01, 0xd0, // add %rdx,%rax
            0x48, 0x3b, 0x88, 0xb0, 0x01, 0x00, 0x00, // cmp 0x1b0(%rax),%rcx
            0x0f, 0x85, 0x8a, 0x00, 0x00, 0x00, // jne
        ];
        assert_eq!(place(&code, RDI), at(0x30));
    }

    #[test]
    fn the_entry_is_kept_when_the_argument_changes_or_an_instruction_is_unknown() {
        // mov %rsi,%rdi; push %rbx
        assert_eq!(place(&[0x48, 0x89, 0xf7, 0x53], RDI), ENTRY);
        // lea 0x8(%rdi),%rdi; ret
        assert_eq!(place(&[0x48, 0x8d, 0x7f, 0x08, 0xc3], RDI), ENTRY);
        // mov $1,%edi; push %rbx
        assert_eq!(place(&[0xbf, 1, 0, 0, 0, 0x53], RDI), ENTRY);
        // ret: not straight, not emulated here.
        assert_eq!(place(&[0xc3, 0x90], RDI), ENTRY);
        // a cut instruction, and nothing at all.
        assert_eq!(place(&[0x48, 0x8b], RDI), ENTRY);
        assert_eq!(place(&[], RDI), ENTRY);
        // Writing a register that is not read is fine: mov %rdi,%rax; push %rbx.
        assert_eq!(place(&[0x48, 0x89, 0xf8, 0x53], RDI), at(3));
    }
}
