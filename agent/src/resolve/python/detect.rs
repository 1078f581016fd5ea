//! Finding CPython in a process's files: which mapped file is the interpreter (a `python3.X`
//! executable with the interpreter linked in, or `libpython3.X.so`), its version, where its
//! runtime is, its structures' offsets, and where its evaluation loop's code is. Read from the
//! file (its symbols, segments and, from 3.13, the offsets it publishes, through bounded
//! reads), never from the process.
use std::{fs::File, ops::Range};

use anyhow::{bail, Context as _, Result};
use object::{read::ReadCache, Object, ObjectSegment, ObjectSymbol, ReadRef as _};

use super::{
    debug_offsets,
    versions::{self, Offsets},
};

/// Files larger than this are not examined (the largest libpython here, with its debug
/// info, is 31 MB).
const MAX_INTERPRETER_BYTES: u64 = 256 << 20;

/// A file that holds a CPython interpreter.
#[derive(Debug)]
pub struct Interpreter {
    pub offsets: Offsets,
    /// Where the pointer to the first interpreter is, in the file's own addresses.
    interp_head: u64,
    /// File offsets of the evaluation loop's code (`_PyEval_EvalFrameDefault`, and its cold
    /// part where the compiler split one off).
    pub eval: Vec<Range<u64>>,
    /// Loadable segments: (address, file offset, bytes in the file).
    segments: Vec<(u64, u64, u64)>,
}

/// The file offset of a file address, if a loadable segment (address, file offset, bytes in
/// the file) holds it in the file.
fn file_offset(segments: &[(u64, u64, u64)], address: u64) -> Option<u64> {
    let &(start, offset, _) = segments.iter().find(|&&(start, _, size)| (start..start.saturating_add(size)).contains(&address))?;
    offset.checked_add(address - start)
}

/// The minor version (of 3.x) a file's name says: `python3.11`, `libpython3.9.so.1.0`,
/// `libpython3.7m.so.1.0`.
pub fn minor_from_name(name: &str) -> Option<u8> {
    let rest = name.strip_prefix("lib").unwrap_or(name).strip_prefix("python3.")?;
    let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let after = &rest[digits..];
    let plausible = after.is_empty() || after.starts_with(['m', 'd', '.']);
    if digits == 0 || !plausible {
        return None;
    }
    rest[..digits].parse().ok()
}

impl Interpreter {
    /// Examines a file named for CPython 3.`minor`: None if it holds no interpreter (the
    /// small `python3.X` executable that links libpython).
    pub fn examine(file: &File, minor: u8) -> Result<Option<Interpreter>> {
        if file.metadata()?.len() > MAX_INTERPRETER_BYTES {
            bail!("larger than {} MiB", MAX_INTERPRETER_BYTES >> 20);
        }
        if !versions::KNOWN.contains(&minor) {
            bail!("CPython 3.{minor} is not a version Ember knows");
        }
        let runtime_symbol = if minor == 6 { "interp_head" } else { "_PyRuntime" };
        let cache = ReadCache::new(file);
        let elf = object::File::parse(&cache).context("not an ELF file")?;
        let (mut runtime, mut version, mut eval) = (None, None, Vec::new());
        for symbol in elf.symbols().chain(elf.dynamic_symbols()) {
            match symbol.name() {
                Ok(name) if name == runtime_symbol => runtime = Some(symbol.address()),
                Ok("Py_Version") => version = Some(symbol.address()),
                Ok("_PyEval_EvalFrameDefault" | "_PyEval_EvalFrameDefault.cold") if symbol.size() > 0 => {
                    eval.push(symbol.address()..symbol.address().saturating_add(symbol.size()))
                }
                _ => {}
            }
        }
        let Some(runtime) = runtime else { return Ok(None) };
        let segments: Vec<(u64, u64, u64)> = elf
            .segments()
            .map(|s| (s.address(), s.file_range().0, s.file_range().1))
            .collect();
        let file_offset = |address| file_offset(&segments, address);
        // 3.11+ says its version: a file named for one version must be it.
        if let Some(offset) = version.and_then(file_offset) {
            let bytes = cache.read_bytes_at(offset, 4).ok().context("reading Py_Version")?;
            let hex = u32::from_le_bytes(bytes.try_into().context("reading Py_Version")?);
            if !versions::is_minor(hex.into(), minor) {
                bail!("named for CPython 3.{minor}, but its Py_Version is {hex:#x}");
            }
        }
        let offsets = if minor >= versions::PUBLISHES_OFFSETS {
            let offset = file_offset(runtime).context("_PyRuntime is not in the file")?;
            let bytes = cache.read_bytes_at(offset, debug_offsets::BYTES as u64).ok().context("reading _Py_DebugOffsets")?;
            debug_offsets::parse(bytes, minor)?
        } else {
            versions::from_tables(minor).with_context(|| format!("no offsets of CPython 3.{minor}"))?
        };
        let mut eval: Vec<Range<u64>> = eval
            .into_iter()
            .filter_map(|range| {
                let start = file_offset(range.start)?;
                Some(start..start.saturating_add(range.end - range.start))
            })
            .collect();
        eval.sort_by_key(|r| r.start);
        eval.dedup();
        if eval.is_empty() {
            bail!("no _PyEval_EvalFrameDefault symbol: its Python frames could not be placed");
        }
        Ok(Some(Interpreter { interp_head: runtime.saturating_add(offsets.head), offsets, eval, segments }))
    }

    /// Where the pointer to the first interpreter is in a process that maps the file's byte
    /// `file_offset` at `start`.
    pub fn interp_head_in(&self, start: u64, file_offset: u64) -> Option<u64> {
        Some(self.bias(start, file_offset)?.wrapping_add(self.interp_head))
    }

    /// Where the evaluation loop's main code (the largest of its ranges: a cold part is
    /// smaller) is in a process that maps the file's byte `file_offset` at `start`.
    pub fn eval_in(&self, start: u64, file_offset: u64) -> Option<Range<u64>> {
        let eval = self.eval.iter().max_by_key(|range| range.end - range.start)?;
        let eval_start = self.bias(start, file_offset)?.wrapping_add(self.address(eval.start)?);
        Some(eval_start..eval_start.wrapping_add(eval.end - eval.start))
    }

    /// What a process that maps the file's byte `file_offset` at `start` adds to the file's
    /// own addresses.
    fn bias(&self, start: u64, file_offset: u64) -> Option<u64> {
        Some(start.wrapping_sub(self.address(file_offset)?))
    }

    /// The file address of a file offset, if a loadable segment holds it.
    fn address(&self, file_offset: u64) -> Option<u64> {
        let &(address, offset, _) = self.segments.iter().find(|&&(_, offset, size)| (offset..offset.saturating_add(size)).contains(&file_offset))?;
        Some(address.wrapping_add(file_offset - offset))
    }

    /// Whether the file offset is in the evaluation loop's code.
    pub fn evaluates(&self, file_offset: u64) -> bool {
        self.eval.iter().any(|range| range.contains(&file_offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_file_names() {
        assert_eq!(minor_from_name("python3.11"), Some(11));
        assert_eq!(minor_from_name("libpython3.9.so.1.0"), Some(9));
        assert_eq!(minor_from_name("libpython3.7m.so.1.0"), Some(7));
        assert_eq!(minor_from_name("python3"), None);
        assert_eq!(minor_from_name("python3.11-config"), None);
        assert_eq!(minor_from_name("libpython3.so"), None);
        assert_eq!(minor_from_name("python2.7"), None);
    }
}
