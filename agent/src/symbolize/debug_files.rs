//! Where a binary's names come from. A binary with its own DWARF is read as it is. A stripped
//! one is read from its separate debug file: found by build id in the debug directories
//! (`<dir>/.build-id/ab/cdef….debug`), or through its `.gnu_debuglink` (next to the binary, in
//! `.debug/` there, or under a debug directory), or fetched from debuginfod. Without one, its
//! own symbol table names its functions, without lines or inlined functions. Each source comes
//! with the size of its DWARF, which the symbolizer weighs against its budget.
use std::{
    collections::HashMap,
    fs::File,
    io::Read as _,
    path::{Path, PathBuf},
};

use object::{Object as _, ObjectSection as _};

use super::debuginfod::{Debuginfod, DebuginfodSettings, Fetched};
use crate::resolve::BinaryOpened;
use crate::{
    resolve::{build_id_of, Binary},
    unwind::{executable_segments, Segment},
};

/// Where to look for debug files, and how much DWARF to hold at once.
#[derive(Debug, Clone, PartialEq)]
pub struct SymbolSettings {
    pub debug_dirs: Vec<PathBuf>,
    pub debuginfod: Option<DebuginfodSettings>,
    /// DWARF held parsed at once, in bytes of debug sections; a binary with more is named
    /// from its symbol table only.
    pub debug_info_budget: u64,
}

impl Default for SymbolSettings {
    fn default() -> Self {
        SymbolSettings { debug_dirs: vec![PathBuf::from("/usr/lib/debug")], debuginfod: None, debug_info_budget: 8 << 20 }
    }
}

/// What to symbolize a binary's addresses from.
#[derive(Debug, Clone)]
pub struct Source {
    /// The separate debug file with its names, or None for the binary itself.
    pub debug_file: Option<PathBuf>,
    /// The binary's executable segments, to turn its file offsets into addresses.
    pub segments: Vec<Segment>,
    /// Bytes of DWARF and symbol table sections in the file read: what naming from it costs.
    pub parse_bytes: u64,
    /// Its debug file is on its way from debuginfod: its own symbols until then.
    pub pending: bool,
}

enum Known {
    Found(Source),
    /// Stripped, with no debug file here: debuginfod may have one for its build id.
    Fetchable { build_id: String, own: Source },
}

/// Decisions are kept per binary; past this many, they are made again.
const KNOWN_LIMIT: usize = 50_000;

pub struct DebugFiles {
    dirs: Vec<PathBuf>,
    debuginfod: Option<Debuginfod>,
    known: HashMap<(u64, u64), Known>,
}

impl DebugFiles {
    pub fn new(settings: &SymbolSettings, debuginfod: Option<Debuginfod>) -> DebugFiles {
        DebugFiles { dirs: settings.debug_dirs.clone(), debuginfod, known: HashMap::new() }
    }

    pub fn source(&mut self, binary: &Binary) -> Source {
        if self.known.len() > KNOWN_LIMIT {
            self.known.clear();
        }
        let fetchable = self.debuginfod.is_some();
        let known = self.known.entry(binary.id).or_insert_with(|| examine(binary, &self.dirs, fetchable));
        let Known::Fetchable { build_id, own } = known else {
            let Known::Found(source) = known else { unreachable!() };
            return source.clone();
        };
        match self.debuginfod.as_ref().map(|d| d.get(build_id)) {
            Some(Fetched::Ready(path)) => {
                let source = Source { parse_bytes: parse_bytes_of(&path).unwrap_or(0), debug_file: Some(path), ..own.clone() };
                *known = Known::Found(source.clone());
                source
            }
            Some(Fetched::Pending) => Source { pending: true, ..own.clone() },
            Some(Fetched::Unavailable) | None => own.clone(),
        }
    }
}

/// The debuginfod client the settings ask for, if any.
pub fn start_debuginfod(settings: &SymbolSettings) -> Option<Debuginfod> {
    settings.debuginfod.clone().filter(|d| !d.urls.is_empty()).map(Debuginfod::start)
}

/// What the resolve stage calls for each binary it opens: a stripped binary with no debug file
/// here has its debug info fetched from then on, so that it is here when its first samples
/// are named (the build id is known once the binary is open).
pub fn prefetcher(settings: &SymbolSettings, debuginfod: Debuginfod) -> BinaryOpened {
    let dirs = settings.debug_dirs.clone();
    Box::new(move |binary: &Binary| {
        if let Known::Fetchable { build_id, .. } = examine(binary, &dirs, true) {
            debuginfod.get(&build_id);
        }
    })
}

fn examine(binary: &Binary, dirs: &[PathBuf], fetchable: bool) -> Known {
    let unknown = Source { debug_file: None, segments: Vec::new(), parse_bytes: 0, pending: false };
    let Ok(file) = File::open(binary.open_path()) else { return Known::Found(unknown) };
    // SAFETY: read-only and private; only section headers and a small section are read.
    let Ok(data) = (unsafe { memmap2::Mmap::map(&file) }) else { return Known::Found(unknown) };
    let Ok(elf) = object::File::parse(&*data) else { return Known::Found(unknown) };
    let own = Source { segments: executable_segments(&elf), parse_bytes: parse_bytes(&elf), ..unknown };
    if elf.section_by_name(".debug_info").is_some() {
        return Known::Found(own);
    }
    let separate = binary.build_id.as_deref().and_then(|id| by_build_id(dirs, id)).or_else(|| {
        let (name, crc) = elf.section_by_name(".gnu_debuglink").and_then(|s| s.data().ok()).and_then(debuglink)?;
        linked_file(&binary.path, &name, crc, binary.build_id.as_deref(), dirs)
    });
    if let Some(path) = separate {
        return Known::Found(Source { parse_bytes: parse_bytes_of(&path).unwrap_or(0), debug_file: Some(path), ..own });
    }
    match (&binary.build_id, fetchable) {
        (Some(build_id), true) => Known::Fetchable { build_id: build_id.clone(), own },
        _ => Known::Found(own),
    }
}

/// Bytes of the sections blazesym reads to name an ELF file's addresses: DWARF and symbol
/// tables, compressed ones at their uncompressed size (blazesym inflates them in memory).
fn parse_bytes(elf: &object::File) -> u64 {
    let read = |s: &object::Section| {
        s.name().is_ok_and(|n| n.starts_with(".debug_") || n.starts_with(".zdebug_") || [".symtab", ".strtab", ".dynsym", ".dynstr"].contains(&n))
    };
    let size = |s: object::Section| s.compressed_file_range().map_or(s.size(), |range| range.uncompressed_size.max(s.size()));
    elf.sections().filter(read).map(size).fold(0, u64::saturating_add)
}

/// What the agent reads of a debug file (a debuginfod server's answer, a file a debug link
/// names) before the symbolizer has it: the bytes naming from it will parse, its debug link.
#[cfg(fuzzing)]
pub fn examine_bytes(data: &[u8]) -> Option<(u64, Option<(String, u32)>)> {
    let elf = object::File::parse(data).ok()?;
    let link = elf.section_by_name(".gnu_debuglink").and_then(|s| s.data().ok()).and_then(debuglink);
    Some((parse_bytes(&elf), link))
}

fn parse_bytes_of(path: &Path) -> Option<u64> {
    let file = File::open(path).ok()?;
    // SAFETY: read-only and private; only section headers are read.
    let data = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    Some(parse_bytes(&object::File::parse(&*data).ok()?))
}

/// `<dir>/.build-id/<first two hex digits>/<the rest>.debug`, in the first dir that has it.
fn by_build_id(dirs: &[PathBuf], build_id: &str) -> Option<PathBuf> {
    if build_id.len() < 3 || !build_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let (head, tail) = build_id.split_at(2);
    dirs.iter().map(|dir| dir.join(".build-id").join(head).join(format!("{tail}.debug"))).find(|p| p.is_file())
}

/// A `.gnu_debuglink` section: a file name (NUL-terminated, padded to 4 bytes), then the
/// CRC-32 of that file.
fn debuglink(section: &[u8]) -> Option<(String, u32)> {
    let end = section.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&section[..end]).ok()?;
    let crc_at = (end + 1).next_multiple_of(4);
    let crc = u32::from_le_bytes(section.get(crc_at..crc_at + 4)?.try_into().ok()?);
    (!name.is_empty() && !name.contains('/')).then(|| (name.to_string(), crc))
}

/// The debug link's file where debuggers look for it (next to the binary, in `.debug/`
/// there, under a debug directory at the binary's own directory), if it is the binary's: the
/// same build id, or without one, the CRC the link records.
fn linked_file(binary_path: &str, link: &str, crc: u32, build_id: Option<&str>, dirs: &[PathBuf]) -> Option<PathBuf> {
    let dir = Path::new(binary_path).parent().unwrap_or(Path::new("/"));
    let relative = dir.strip_prefix("/").unwrap_or(dir);
    let mut candidates = vec![dir.join(link), dir.join(".debug").join(link)];
    candidates.extend(dirs.iter().map(|d| d.join(relative).join(link)));
    candidates.into_iter().filter(|p| p.is_file()).find(|p| match build_id {
        Some(id) => File::open(p).ok().and_then(|file| build_id_of(&file)).is_some_and(|found| found == id),
        None => crc32_of(p) == Some(crc),
    })
}

fn crc32_of(path: &Path) -> Option<u32> {
    let mut file = File::open(path).ok()?;
    let (mut hasher, mut buffer) = (crc32fast::Hasher::new(), vec![0u8; 1 << 16]);
    loop {
        match file.read(&mut buffer).ok()? {
            0 => return Some(hasher.finalize()),
            n => hasher.update(&buffer[..n]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_links_and_build_ids_are_read_and_checked() {
        assert_eq!(debuglink(b"app.debug\0\0\0\x78\x56\x34\x12"), Some(("app.debug".to_string(), 0x12345678)));
        assert_eq!(debuglink(b"ab\0\0\x01\0\0\0"), Some(("ab".to_string(), 1)), "padded to 4 bytes");
        assert_eq!(debuglink(b"../../etc/passwd\0\0\0\0\0\0\0"), None, "a link is a file name, not a path");
        assert_eq!(debuglink(b"\0\0\0\0\0\0\0\0"), None);
        assert_eq!(debuglink(b"app.debug\0\0"), None, "no CRC");
        let dir = std::env::temp_dir().join(format!("ember-debug-dirs-{}", std::process::id()));
        let file = dir.join(".build-id/ab/cdef01.debug");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, b"debug").unwrap();
        let dirs = [PathBuf::from("/nonexistent"), dir.clone()];
        assert_eq!(by_build_id(&dirs, "abcdef01"), Some(file.clone()));
        assert_eq!(by_build_id(&dirs, "abcdef02"), None);
        assert_eq!(by_build_id(&dirs, "../../x"), None, "a build id is hex");
        // A link without build ids is taken only with the CRC it records.
        let binary = dir.join(".build-id/ab/app");
        let crc = crc32fast::hash(b"debug");
        assert_eq!(linked_file(binary.to_str().unwrap(), "cdef01.debug", crc, None, &dirs), Some(file.clone()));
        assert_eq!(linked_file(binary.to_str().unwrap(), "cdef01.debug", crc ^ 1, None, &dirs), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
