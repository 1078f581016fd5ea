//! Unwind tables: for each executable, the rules that find a caller's frame from any address
//! in it, built from its call frame information (`table`), put in the kernel walker's compact
//! form (`compact`) and loaded for the processes that map it (`loader`, in the `space` of a
//! shared budget), so that stacks through code without frame pointers can be walked.
//! `ember-agent unwind-table` prints them.
mod compact;
mod loader;
mod space;
mod table;

use std::{fs::File, path::Path};

use anyhow::{Context as _, Result};

pub use compact::CompactTable;
pub use loader::{MappedFile, TableKey, Unwinder};
pub use table::{executable_segments, Rule, Segment, UnwindTable};

/// Builds the table of the ELF file at `path`.
pub fn table_of_file(path: &Path) -> Result<UnwindTable> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: the map is read-only and private; a file truncated underneath would fault, which
    // executables that processes map do not do.
    let data = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))?;
    UnwindTable::from_elf(&data).with_context(|| format!("unwind table of {}", path.display()))
}
