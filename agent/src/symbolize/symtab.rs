//! Function names from an ELF symbol table alone, for binaries whose DWARF is beyond the
//! debug-info budget: an index of 16 bytes a function (address, size, where its name is),
//! built once, while names stay in the file and are read when an address needs one. No lines,
//! no inlined functions: those need the DWARF that did not fit.
use std::{
    fs::File,
    os::unix::fs::FileExt,
    path::Path,
};

use object::{
    elf,
    read::elf::{ElfFile64, SectionHeader as _, Sym as _},
    Endianness,
};

/// Names longer than this are cut (C++ templates can run to kilobytes).
const MAX_NAME: usize = 1024;

struct Function {
    address: u64,
    size: u32,
    /// Offset of its name in the string table.
    name: u32,
}

pub struct SymbolIndex {
    file: File,
    /// The string table's offset in the file, and its size.
    strings: (u64, u64),
    /// Sorted by address.
    functions: Vec<Function>,
}

impl SymbolIndex {
    /// The index of the ELF file at `path`: its full symbol table, else its dynamic one. None
    /// if it has neither, or is not a 64-bit ELF file.
    pub fn build(path: &Path) -> Option<SymbolIndex> {
        let file = File::open(path).ok()?;
        // SAFETY: read-only and private; only the symbol tables are read, and the map is
        // dropped before this returns.
        let data = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        let elf = ElfFile64::<Endianness>::parse(&*data).ok()?;
        let endian = elf.endian();
        let table = if elf.elf_symbol_table().is_empty() { elf.elf_dynamic_symbol_table() } else { elf.elf_symbol_table() };
        let strings = elf.elf_section_table().section(table.string_section()).ok()?;
        let strings = (strings.sh_offset(endian), strings.sh_size(endian));
        let mut functions: Vec<Function> = table
            .symbols()
            .iter()
            .filter(|s| s.st_type() == elf::STT_FUNC && s.st_size(endian) > 0 && s.st_value(endian) > 0)
            .map(|s| Function { address: s.st_value(endian), size: s.st_size(endian).min(u32::MAX as u64) as u32, name: s.st_name(endian) })
            .collect();
        if functions.is_empty() {
            return None;
        }
        functions.sort_by_key(|f| f.address);
        functions.dedup_by_key(|f| f.address);
        functions.shrink_to_fit();
        Some(SymbolIndex { file, strings, functions })
    }

    /// The function that holds `address` (a virtual address of the file): its index, the same
    /// for every address in it.
    pub fn function_at(&self, address: u64) -> Option<usize> {
        let index = self.functions.partition_point(|f| f.address <= address).checked_sub(1)?;
        let function = &self.functions[index];
        (address < function.address.saturating_add(function.size as u64)).then_some(index)
    }

    /// The demangled name of function `index`, read from the file.
    pub fn name(&self, index: usize) -> Option<String> {
        let function = self.functions.get(index)?;
        if function.name as u64 >= self.strings.1 {
            return None;
        }
        let mut buffer = vec![0u8; MAX_NAME.min((self.strings.1 - function.name as u64) as usize)];
        let read = self.file.read_at(&mut buffer, self.strings.0 + function.name as u64).ok()?;
        buffer.truncate(read);
        let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
        let mangled = String::from_utf8_lossy(&buffer[..end]);
        (!mangled.is_empty()).then(|| demangle(&mangled))
    }

    /// Memory the index holds.
    pub fn bytes(&self) -> usize {
        self.functions.capacity() * size_of::<Function>()
    }
}

/// Rust's and C++'s mangling undone, as blazesym does for the names it gives.
fn demangle(name: &str) -> String {
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        return format!("{rust:#}");
    }
    cpp_demangle::Symbol::new(name).ok().and_then(|s| s.demangle().ok()).unwrap_or_else(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent's own binary: its symbol table names one of its functions by any address in
    /// it, demangled.
    #[test]
    fn names_functions_of_a_real_binary_by_address() {
        let exe = std::env::current_exe().unwrap();
        let index = SymbolIndex::build(&exe).expect("the test binary has a symbol table");
        assert!(index.functions.len() > 1000, "{} functions", index.functions.len());
        let at = index.functions.iter().position(|f| f.size > 16).unwrap();
        let function = &index.functions[at];
        assert_eq!(index.function_at(function.address), Some(at));
        assert_eq!(index.function_at(function.address + function.size as u64 - 1), Some(at));
        let name = index.name(at).unwrap();
        assert!(!name.starts_with("_ZN"), "not demangled: {name}");
        assert_eq!(index.function_at(0), None);
    }
}
