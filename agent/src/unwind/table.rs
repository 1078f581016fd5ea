//! Builds an executable's unwind table from its call frame information (`.eh_frame`, or
//! `.debug_frame` where that is all there is): one row per address where the rule to find the
//! caller changes, sorted by address. Each row reduces DWARF's general rules to what a BPF
//! walker can apply on x86-64 (CFA = rsp or rbp + offset, return address at CFA - 8, rbp
//! unchanged or saved at CFA + offset) and marks everything else with why the walk stops there.
use std::ops::Range;

use anyhow::{Context as _, Result};
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, Register, RegisterRule,
    UnwindContext, UnwindSection,
};

/// DWARF register numbers on x86-64.
const RBP: Register = Register(6);
const RSP: Register = Register(7);
const RETURN_ADDRESS: Register = Register(16);

/// How to find the caller from an address, or why that cannot be done there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// CFA = rsp + `cfa_offset` (or rbp + `cfa_offset` when `cfa_is_rbp`); the return address
    /// is at CFA - 8; rbp is unchanged (`rbp_offset` 0) or saved at CFA + `rbp_offset`.
    /// (8 bytes in all, so that a row is 16: a large binary builds half a million of them.)
    Frame { cfa_is_rbp: bool, cfa_offset: i32, rbp_offset: i16 },
    /// The return address is undefined: the outermost frame (`_start`, a thread's start).
    Outermost,
    /// A PLT stub with the linkers' usual rule: CFA = rsp + 8, plus 8 more from the
    /// `threshold`th byte of each 16-byte entry on (after its `push`).
    Plt { threshold: u8 },
    /// A signal trampoline: the caller's registers are in a signal frame on the stack.
    Signal,
    /// No call frame information covers this address.
    NoInfo,
    /// A rule the walker cannot apply.
    Unsupported(Unsupported),
}

/// Why a row's rule is beyond the walker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unsupported {
    /// The CFA is a DWARF expression.
    CfaExpression,
    /// The CFA is based on a register other than rsp or rbp.
    CfaRegister,
    /// The return address is not at CFA - 8.
    ReturnAddress,
    /// rbp is restored by a rule other than "unchanged" or "saved at CFA + offset".
    Rbp,
    /// A CFA offset beyond 32 bits or an rbp slot beyond 16 (no stack frame is that large).
    LargeOffset,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// Virtual address in the ELF file (as `readelf` shows it), where the rule starts.
    pub address: u64,
    pub rule: Rule,
}
const _: () = assert!(size_of::<Row>() == 16);

/// An executable's rows, sorted by address, with no two neighbours alike.
#[derive(Debug, Default)]
pub struct UnwindTable {
    pub rows: Vec<Row>,
    /// Which section the rows came from.
    pub source: &'static str,
    /// The file's loadable segments: where a mapping of the file puts the rows' addresses.
    pub segments: Vec<Segment>,
}

/// An executable loadable segment (PT_LOAD with PF_X): `file_range` of the file is loaded at
/// `address`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub address: u64,
    pub file_range: (u64, u64),
}

impl UnwindTable {
    /// The table of CPython's perf trampolines (3.12+, `-X perf`): copies of one stub,
    /// `sub $8,%rsp; call *%rcx; add $8,%rsp; ret`, filling an anonymous mapping, each named
    /// in the perf map after the Python function it enters. The stub has no call frame
    /// information and does not touch rbp; at its return address the CFA is rsp + 16. Rows
    /// are relative to the mapping's start, which `Segment` places at file offset 0.
    pub fn python_trampolines(mapping_size: u64) -> UnwindTable {
        UnwindTable {
            rows: vec![
                Row { address: 0, rule: Rule::Frame { cfa_is_rbp: false, cfa_offset: 16, rbp_offset: 0 } },
                Row { address: mapping_size, rule: Rule::NoInfo },
            ],
            source: "CPython's perf trampolines",
            segments: vec![Segment { address: 0, file_range: (0, mapping_size) }],
        }
    }

    /// Builds the table of an ELF file's bytes.
    pub fn from_elf(data: &[u8]) -> Result<UnwindTable> {
        use object::{Object as _, ObjectSection as _};
        let file = object::File::parse(data).context("not an ELF file")?;
        let segments = executable_segments(&file);
        let section = |name: &str| file.section_by_name(name).and_then(|s| Some((s.address(), s.data().ok()?)));
        let plt: Vec<Range<u64>> = file
            .sections()
            .filter(|s| s.name().is_ok_and(|n| n.starts_with(".plt")))
            .map(|s| s.address()..s.address().saturating_add(s.size()))
            .collect();
        let text = file.section_by_name(".text").map_or(0, |s| s.address());
        let functions = functions(&file);
        let mut builder = Builder { rows: Vec::new(), in_order: true, plt };
        if let Some((address, bytes)) = section(".eh_frame") {
            let eh_frame = EhFrame::new(bytes, LittleEndian);
            let bases = BaseAddresses::default().set_eh_frame(address).set_text(text);
            let bases = match section(".got") {
                Some((got, _)) => bases.set_got(got),
                None => bases,
            };
            builder.add_section(&eh_frame, &bases).context("reading .eh_frame")?;
            return Ok(UnwindTable { rows: builder.finish(&functions), source: ".eh_frame", segments });
        }
        if let Some((_, bytes)) = section(".debug_frame") {
            let mut debug_frame = DebugFrame::new(bytes, LittleEndian);
            debug_frame.set_address_size(8);
            builder.add_section(&debug_frame, &BaseAddresses::default()).context("reading .debug_frame")?;
            return Ok(UnwindTable { rows: builder.finish(&functions), source: ".debug_frame", segments });
        }
        Ok(UnwindTable { rows: Vec::new(), source: "none", segments })
    }
}

struct Builder {
    /// Rows of every FDE, each FDE's range closed by a `NoInfo` row at its end; merged as
    /// they come (see `push`) while they come in order.
    rows: Vec<Row>,
    in_order: bool,
    /// Address ranges of the PLT sections.
    plt: Vec<Range<u64>>,
}

type Slice<'a> = EndianSlice<'a, LittleEndian>;

impl Builder {
    fn add_section<'a, S: UnwindSection<Slice<'a>>>(&mut self, section: &S, bases: &BaseAddresses) -> gimli::Result<()> {
        let mut context = Box::new(UnwindContext::new());
        let mut entries = section.entries(bases);
        while let Some(entry) = entries.next()? {
            let CieOrFde::Fde(partial) = entry else { continue };
            let fde = partial.parse(|section, bases, offset| section.cie_from_offset(bases, offset))?;
            let range = fde.initial_address()..fde.end_address();
            if range.is_empty() {
                continue;
            }
            let in_plt = self.plt.iter().any(|plt| plt.contains(&range.start));
            let signal = fde.is_signal_trampoline();
            let mut table = fde.rows(section, bases, &mut context)?;
            while let Some(row) = table.next_row()? {
                let rule = match (signal, row.cfa()) {
                    (true, _) => Rule::Signal,
                    (false, CfaRule::Expression(expression)) if in_plt => {
                        plt_threshold(expression.get(section)?.0.slice()).map_or(Rule::Unsupported(Unsupported::CfaExpression), |threshold| Rule::Plt { threshold })
                    }
                    (false, _) => rule_of(row),
                };
                self.push(Row { address: row.start_address(), rule });
            }
            self.push(Row { address: range.end, rule: Rule::NoInfo });
        }
        Ok(())
    }

    /// Adds a row, merging it as `merged` would while the rows come sorted, as linkers
    /// usually emit FDEs: what is built then is the table itself, not several times it.
    /// Once a row comes out of order, the rest is merged by `merged` at the end.
    fn push(&mut self, row: Row) {
        let rows = &mut self.rows;
        self.in_order &= rows.last().is_none_or(|last| last.address <= row.address);
        if !self.in_order {
            rows.push(row);
            return;
        }
        if rows.last().is_some_and(|last| last.address == row.address) {
            // One range's end and the next one's start: the start wins.
            if row.rule == Rule::NoInfo {
                return;
            }
            rows.pop();
        }
        if rows.last().is_none_or(|last| last.rule != row.rule) {
            rows.push(row);
        }
    }

    /// The rows in order (see `merged`), where `functions` that no FDE covers at all get the
    /// frame-pointer rule: code with a symbol but no call frame information was not made by a
    /// C compiler (V8's builtins, Go, hand-written assembly), and such code keeps rbp as a
    /// frame pointer far more often than not. Partly covered functions keep `NoInfo`.
    fn finish(self, functions: &[Range<u64>]) -> Vec<Row> {
        let mut rows = merged(self.rows);
        let uncovered = functions.iter().filter(|f| {
            let first_after = rows.partition_point(|row| row.address <= f.start);
            let before = first_after.checked_sub(1).map(|i| rows[i].rule);
            matches!(before, None | Some(Rule::NoInfo)) && rows.get(first_after).is_none_or(|next| next.address >= f.end)
        });
        let extra: Vec<Row> = uncovered.flat_map(|f| [Row { address: f.start, rule: FRAME_POINTER }, Row { address: f.end, rule: Rule::NoInfo }]).collect();
        if !extra.is_empty() {
            rows.extend(extra);
            rows = merged(rows);
        }
        rows
    }
}

/// The file's executable segments. Only code is walked or named. (A read-only segment may
/// share the code's first page, and with it the file offset of the code's mapping.)
pub fn executable_segments<'data, R: object::ReadRef<'data>>(file: &object::File<'data, R>) -> Vec<Segment> {
    use object::{Object as _, ObjectSegment as _};
    let executable = |s: &object::Segment<'data, '_, R>| matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0);
    let segments = file.segments().filter(executable).map(|s| {
        let (offset, size) = s.file_range();
        Segment { address: s.address(), file_range: (offset, offset.saturating_add(size)) }
    });
    segments.collect()
}

impl Segment {
    /// The virtual address (as in the file) of the byte at `file_offset`, if this segment
    /// holds it.
    pub fn address_of(&self, file_offset: u64) -> Option<u64> {
        (self.file_range.0..self.file_range.1).contains(&file_offset).then(|| (file_offset - self.file_range.0).wrapping_add(self.address))
    }

    /// Where in the file the byte at virtual address `address` (as in the file) is, if this
    /// segment holds it.
    pub fn file_offset_of(&self, address: u64) -> Option<u64> {
        let offset = self.file_range.0.checked_add(address.checked_sub(self.address)?)?;
        (offset < self.file_range.1).then_some(offset)
    }
}

/// The frame-pointer rule as a row: CFA = rbp + 16, rbp saved at CFA - 16.
const FRAME_POINTER: Rule = Rule::Frame { cfa_is_rbp: true, cfa_offset: 16, rbp_offset: -16 };

/// Sorted by address; where a range starts at another's end, its first row replaces the
/// other's `NoInfo`; rows that repeat the rule before them are dropped.
fn merged(mut rows: Vec<Row>) -> Vec<Row> {
    // At equal addresses a `NoInfo` end comes before the next range's first row, and the later
    // row wins. In place, without a stable sort's scratch space (megabytes for a large binary):
    // rows alike in the key are alike in rule, but for FDEs that overlap, a malformed case in
    // which either may win.
    rows.sort_unstable_by_key(|row| (row.address, row.rule != Rule::NoInfo));
    // In place: a large binary has hundreds of thousands of rows.
    rows.dedup_by(|next, previous| {
        let same_address = next.address == previous.address;
        if same_address {
            *previous = *next;
        }
        same_address
    });
    rows.dedup_by(|next, previous| next.rule == previous.rule);
    rows.shrink_to_fit();
    rows
}

/// Address ranges of the file's functions, from its symbol table (or, stripped, its dynamic
/// symbols).
fn functions(file: &object::File) -> Vec<Range<u64>> {
    use object::{Object as _, ObjectSymbol as _};
    let range = |s: object::Symbol| (s.kind() == object::SymbolKind::Text && s.size() > 0).then(|| s.address()..s.address().saturating_add(s.size()));
    let mut ranges: Vec<Range<u64>> =
        if file.symbols().next().is_some() { file.symbols().filter_map(range).collect() } else { file.dynamic_symbols().filter_map(range).collect() };
    ranges.sort_by_key(|r| r.start);
    ranges.dedup();
    ranges
}

/// The threshold of the PLT's usual CFA expression, `rsp + 8 + ((rip & 15) >= N) << 3`
/// (DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_litN; DW_OP_ge; DW_OP_lit3;
/// DW_OP_shl; DW_OP_plus), or None for any other expression.
fn plt_threshold(expression: &[u8]) -> Option<u8> {
    const LIT0: u8 = 0x30;
    match expression {
        [0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, lit, 0x2a, 0x33, 0x24, 0x22] if (LIT0..=LIT0 + 15).contains(lit) => Some(lit - LIT0),
        _ => None,
    }
}

fn rule_of(row: &gimli::UnwindTableRow<usize>) -> Rule {
    let (cfa_is_rbp, cfa_offset) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if *register == RSP => (false, *offset),
        CfaRule::RegisterAndOffset { register, offset } if *register == RBP => (true, *offset),
        CfaRule::RegisterAndOffset { .. } => return Rule::Unsupported(Unsupported::CfaRegister),
        CfaRule::Expression(_) => return Rule::Unsupported(Unsupported::CfaExpression),
    };
    match row.register(RETURN_ADDRESS) {
        Some(RegisterRule::Offset(-8)) => {}
        Some(RegisterRule::Undefined) => return Rule::Outermost,
        _ => return Rule::Unsupported(Unsupported::ReturnAddress),
    }
    let rbp_offset = match row.register(RBP) {
        None | Some(RegisterRule::SameValue) => 0,
        Some(RegisterRule::Offset(offset)) => offset,
        Some(_) => return Rule::Unsupported(Unsupported::Rbp),
    };
    match (i32::try_from(cfa_offset), i16::try_from(rbp_offset)) {
        (Ok(cfa_offset), Ok(rbp_offset)) => Rule::Frame { cfa_is_rbp, cfa_offset, rbp_offset },
        _ => Rule::Unsupported(Unsupported::LargeOffset),
    }
}

#[cfg(test)]
mod tests {
    use super::Segment;

    #[test]
    fn a_segment_maps_file_offsets_and_addresses_both_ways_within_its_bytes() {
        let code = Segment { address: 0x40_1000, file_range: (0x1000, 0x3000) };
        assert_eq!(code.address_of(0x1010), Some(0x40_1010));
        assert_eq!(code.file_offset_of(0x40_1010), Some(0x1010));
        assert_eq!(code.file_offset_of(0x40_0fff), None, "before the segment");
        assert_eq!(code.file_offset_of(0x40_3000), None, "past its bytes in the file");
        assert_eq!(code.address_of(0x3000), None);
        assert_eq!(code.file_offset_of(0x40_2fff), Some(0x2fff), "its last byte");
        // Crafted: a file range near the top of u64, where offset + distance would wrap.
        let crafted = Segment { address: 0, file_range: (u64::MAX - 1, u64::MAX) };
        assert_eq!(crafted.file_offset_of(10), None, "no wrap on a crafted segment");
    }
}
