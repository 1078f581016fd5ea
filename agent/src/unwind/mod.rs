//! Unwind tables: for each executable, the rules that find a caller's frame from any address
//! in it, built from its call frame information (`table`), so that stacks through code
//! without frame pointers can be walked. Depends on no other stage; `ember-agent unwind-table`
//! prints them, and the kernel stage's walker will load them.
mod table;

use std::{fs::File, path::Path};

use anyhow::{Context as _, Result};

pub use table::{Rule, UnwindTable};

/// Builds the table of the ELF file at `path`.
pub fn table_of_file(path: &Path) -> Result<UnwindTable> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: the map is read-only and private; a file truncated underneath would fault, which
    // executables that processes map do not do.
    let data = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))?;
    UnwindTable::from_elf(&data).with_context(|| format!("unwind table of {}", path.display()))
}
