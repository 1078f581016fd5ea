//! The walker's form of a table: 8-byte rows (`agent_common::UnwindRow`) with addresses
//! relative to the table's first row, and a page index into them. Rules that do not fit the
//! compact form (offsets beyond 16 bits, rbp saved off an 8-byte slot) become `UNSUPPORTED`
//! rows: a walk stops there rather than follow a wrong caller.
use agent_common::{row_kind, PageRows, UnwindRow, MAX_TABLE_ROWS, UNWIND_PAGE};
use anyhow::{ensure, Result};

use super::table::{Rule, Segment, UnwindTable};

pub struct CompactTable {
    pub rows: Vec<UnwindRow>,
    /// Per page of code, the rows that can cover it (`ExecMapping::first_page`).
    pub pages: Vec<PageRows>,
    pub placement: Placement,
}

/// Where a mapping of the file puts the rows' addresses: all the agent keeps of a table once
/// its rows are in the kernel.
pub struct Placement {
    /// Address of the first row: `UnwindRow::pc` is relative to it.
    base: u64,
    segments: Vec<Segment>,
}

/// Page index entries a table may have: a quarter of the walker's rows, as the kernel's index
/// for all tables is sized (a page of code has about ten rows). Checked before the index is
/// built: a crafted file with two rows 4 GiB apart would otherwise cost 64 MB here first.
const MAX_PAGES: u64 = MAX_TABLE_ROWS as u64 / 4;

impl CompactTable {
    pub fn of(table: UnwindTable) -> Result<CompactTable> {
        let base = table.rows.first().map_or(0, |row| row.address);
        let span = table.rows.last().map_or(0, |row| row.address - base);
        ensure!(span <= u32::MAX as u64, "its code spans {span} bytes, beyond the walker's 4 GiB");
        let pages = span / UNWIND_PAGE + 1;
        ensure!(pages <= MAX_PAGES, "its code spans {span} bytes: {pages} index pages, beyond the walker's {MAX_PAGES}");
        let mut rows: Vec<UnwindRow> = Vec::with_capacity(table.rows.len());
        for row in &table.rows {
            let compact = UnwindRow { pc: (row.address - base) as u32, ..compact_rule(row.rule) };
            // Rules that differed may be alike now (two kinds of unsupported).
            if rows.last().is_none_or(|last| UnwindRow { pc: last.pc, ..compact } != *last) {
                rows.push(compact);
            }
        }
        ensure!(rows.len() <= MAX_TABLE_ROWS as usize, "{} rows, beyond the walker's {MAX_TABLE_ROWS}", rows.len());
        let pages = page_index(&rows);
        Ok(CompactTable { rows, pages, placement: Placement { base, segments: table.segments } })
    }

    /// Kernel memory the table takes: its rows and page index.
    pub fn kernel_bytes(&self) -> usize {
        size_of_val(&self.rows[..]) + size_of_val(&self.pages[..])
    }
}

impl Placement {
    /// What to subtract from an address in a mapping of the file (starting at `start`, from
    /// `file_offset`) to get a row address; None if no segment is loaded from there.
    pub fn bias(&self, start: u64, file_offset: u64) -> Option<u64> {
        const PAGE: u64 = 4096;
        let segment = self
            .segments
            .iter()
            .find(|s| s.file_range.0 / PAGE * PAGE <= file_offset && file_offset < s.file_range.1)?;
        // address in file terms = pc - start + file_offset - segment offset + segment address
        Some(start.wrapping_sub(file_offset).wrapping_add(segment.file_range.0).wrapping_sub(segment.address).wrapping_add(self.base))
    }
}

/// For each page up to the last row's, the rows from the one that covers its first byte to
/// the one that covers the next page's (inclusive).
fn page_index(rows: &[UnwindRow]) -> Vec<PageRows> {
    let Some(last) = rows.last() else { return Vec::new() };
    // The row that covers `address`: the last that starts at or before it.
    let covering = |address: u64| rows.partition_point(|row| row.pc as u64 <= address).saturating_sub(1) as u32;
    let pages = last.pc as u64 / UNWIND_PAGE + 1;
    (0..pages).map(|page| PageRows { first: covering(page * UNWIND_PAGE), end: covering((page + 1) * UNWIND_PAGE) + 1 }).collect()
}

fn compact_rule(rule: Rule) -> UnwindRow {
    let kind = |kind| UnwindRow { kind, ..Default::default() };
    match rule {
        Rule::Frame { cfa_is_rbp, cfa_offset, rbp_offset } => {
            let (Ok(cfa_offset), true, Ok(rbp_offset)) =
                (u16::try_from(cfa_offset), rbp_offset % 8 == 0, i8::try_from(rbp_offset / 8))
            else {
                return kind(row_kind::UNSUPPORTED);
            };
            let kind = if cfa_is_rbp { row_kind::CFA_RBP } else { row_kind::CFA_RSP };
            UnwindRow { pc: 0, cfa_offset, kind, rbp_offset }
        }
        Rule::Outermost => kind(row_kind::OUTERMOST),
        Rule::Plt { threshold } => UnwindRow { cfa_offset: threshold.into(), ..kind(row_kind::PLT) },
        Rule::Signal => kind(row_kind::SIGNAL),
        Rule::NoInfo => kind(row_kind::NO_INFO),
        Rule::Unsupported(_) => kind(row_kind::UNSUPPORTED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every address's covering row (the last that starts at or before it) is among the rows
    /// its page lists, whatever the spacing of rows against page boundaries.
    #[test]
    fn each_page_lists_the_row_that_covers_each_of_its_addresses() {
        // Rows a byte apart, a page apart, several pages apart, and on and off boundaries.
        let starts = [0u32, 1, 2, 100, 511, 512, 513, 1024, 4000, 4096, 9000, 9001];
        let rows: Vec<UnwindRow> = starts.iter().map(|&pc| UnwindRow { pc, ..Default::default() }).collect();
        let pages = page_index(&rows);
        assert_eq!(pages.len() as u64, 9001 / UNWIND_PAGE + 1);
        for address in 0..=9001u32 {
            let covering = starts.iter().rposition(|&pc| pc <= address).unwrap() as u32;
            let page = pages[(address as u64 / UNWIND_PAGE) as usize];
            assert!(page.first <= covering && covering < page.end, "address {address}: row {covering} not in {page:?}");
            assert!(page.end as usize <= rows.len(), "address {address}: {page:?} runs past the table");
        }
    }

    /// Two rows 4 GiB apart would need an index entry per 512 bytes between them (64 MB): the
    /// table is refused before that is allocated.
    #[test]
    fn a_table_whose_rows_lie_far_apart_is_refused_before_its_index_is_built() {
        let row = |address| super::super::table::Row { address, rule: Rule::NoInfo };
        let table = UnwindTable { rows: vec![row(0), row(u32::MAX as u64)], source: "crafted", segments: Vec::new() };
        let error = CompactTable::of(table).err().expect("a crafted table is refused");
        assert!(error.to_string().contains("index pages"), "{error}");
    }
}
