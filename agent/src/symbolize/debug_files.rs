//! Where a binary's names come from. A binary with its own DWARF is read as it is. A stripped
//! one is read from its separate debug file: found by build id in the debug directories
//! (`<dir>/.build-id/ab/cdef….debug`), or through its `.gnu_debuglink` (next to the binary,
//! in `.debug/` there, or under a debug directory: blazesym follows the link itself), or
//! fetched from debuginfod. Without one, its own symbol table names its functions, without
//! lines or inlined functions.
use std::{
    collections::HashMap,
    fs::File,
    path::{Path, PathBuf},
};

use super::debuginfod::{Debuginfod, DebuginfodSettings, Fetched};
use crate::{
    resolve::Binary,
    unwind::{executable_segments, Segment},
};

/// Where to look for debug files.
#[derive(Debug, Clone, PartialEq)]
pub struct SymbolSettings {
    pub debug_dirs: Vec<PathBuf>,
    pub debuginfod: Option<DebuginfodSettings>,
}

impl Default for SymbolSettings {
    fn default() -> Self {
        SymbolSettings { debug_dirs: vec![PathBuf::from("/usr/lib/debug")], debuginfod: None }
    }
}

/// What to symbolize a binary's addresses from.
pub enum Source {
    /// The binary (with what its debug link names).
    Own,
    /// A separate debug file, addressed by virtual address: `segments` are the binary's, to
    /// turn its file offsets into addresses.
    Separate { path: PathBuf, segments: Vec<Segment> },
    /// Its debug file is on its way from debuginfod: the binary's own symbols until then.
    Pending,
}

enum Known {
    Own,
    Separate { path: PathBuf, segments: Vec<Segment> },
    /// Stripped, with no debug file here: debuginfod may have one for its build id.
    Fetchable { build_id: String, segments: Vec<Segment> },
}

/// Decisions are kept per binary; past this many, they are made again.
const KNOWN_LIMIT: usize = 50_000;

pub struct DebugFiles {
    dirs: Vec<PathBuf>,
    debuginfod: Option<Debuginfod>,
    known: HashMap<(u64, u64), Known>,
}

impl DebugFiles {
    pub fn new(settings: &SymbolSettings) -> DebugFiles {
        let debuginfod = settings.debuginfod.clone().filter(|d| !d.urls.is_empty()).map(Debuginfod::start);
        DebugFiles { dirs: settings.debug_dirs.clone(), debuginfod, known: HashMap::new() }
    }

    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    pub fn source(&mut self, binary: &Binary) -> Source {
        if self.known.len() > KNOWN_LIMIT {
            self.known.clear();
        }
        let fetchable = self.debuginfod.is_some();
        let known = self.known.entry(binary.id).or_insert_with(|| examine(binary, &self.dirs, fetchable));
        match known {
            Known::Own => Source::Own,
            Known::Separate { path, segments } => Source::Separate { path: path.clone(), segments: segments.clone() },
            Known::Fetchable { build_id, segments } => match self.debuginfod.as_ref().map(|d| d.get(build_id)) {
                Some(Fetched::Ready(path)) => {
                    let segments = std::mem::take(segments);
                    *known = Known::Separate { path: path.clone(), segments: segments.clone() };
                    Source::Separate { path, segments }
                }
                Some(Fetched::Pending) => Source::Pending,
                Some(Fetched::Unavailable) | None => Source::Own,
            },
        }
    }
}

fn examine(binary: &Binary, dirs: &[PathBuf], fetchable: bool) -> Known {
    use object::{Object as _, ObjectSection as _};
    let Ok(file) = File::open(binary.open_path()) else { return Known::Own };
    // SAFETY: read-only and private; only section headers and a small section are read.
    let Ok(data) = (unsafe { memmap2::Mmap::map(&file) }) else { return Known::Own };
    let Ok(elf) = object::File::parse(&*data) else { return Known::Own };
    if elf.section_by_name(".debug_info").is_some() {
        return Known::Own;
    }
    let segments = executable_segments(&elf);
    if let Some(path) = binary.build_id.as_deref().and_then(|id| by_build_id(dirs, id)) {
        return Known::Separate { path, segments };
    }
    let link = elf.section_by_name(".gnu_debuglink").and_then(|s| s.data().ok()).and_then(debuglink_name);
    if link.is_some_and(|link| linked_file_exists(&binary.path, &link, dirs)) {
        return Known::Own;
    }
    match (&binary.build_id, fetchable) {
        (Some(build_id), true) => Known::Fetchable { build_id: build_id.clone(), segments },
        _ => Known::Own,
    }
}

/// `<dir>/.build-id/<first two hex digits>/<the rest>.debug`, in the first dir that has it.
fn by_build_id(dirs: &[PathBuf], build_id: &str) -> Option<PathBuf> {
    if build_id.len() < 3 || !build_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let (head, tail) = build_id.split_at(2);
    dirs.iter().map(|dir| dir.join(".build-id").join(head).join(format!("{tail}.debug"))).find(|p| p.is_file())
}

/// The file name a `.gnu_debuglink` section holds (NUL-terminated, then padding and a CRC).
fn debuglink_name(section: &[u8]) -> Option<String> {
    let name = &section[..section.iter().position(|&b| b == 0)?];
    let name = std::str::from_utf8(name).ok()?;
    (!name.is_empty() && !name.contains('/')).then(|| name.to_string())
}

/// Whether the debug link's file is where debuggers look: next to the binary, in `.debug/`
/// there, or under a debug directory at the binary's own directory.
fn linked_file_exists(binary_path: &str, link: &str, dirs: &[PathBuf]) -> bool {
    let dir = Path::new(binary_path).parent().unwrap_or(Path::new("/"));
    let relative = dir.strip_prefix("/").unwrap_or(dir);
    let mut candidates = vec![dir.join(link), dir.join(".debug").join(link)];
    candidates.extend(dirs.iter().map(|d| d.join(relative).join(link)));
    candidates.iter().any(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_links_and_build_ids_are_read_and_checked() {
        assert_eq!(debuglink_name(b"app.debug\0\0\0\x12\x34\x56\x78").as_deref(), Some("app.debug"));
        assert_eq!(debuglink_name(b"../../etc/passwd\0"), None, "a link is a file name, not a path");
        assert_eq!(debuglink_name(b"\0"), None);
        assert_eq!(debuglink_name(b"no terminator"), None);
        let dir = std::env::temp_dir().join(format!("ember-debug-dirs-{}", std::process::id()));
        let file = dir.join(".build-id/ab/cdef01.debug");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, b"").unwrap();
        let dirs = [PathBuf::from("/nonexistent"), dir.clone()];
        assert_eq!(by_build_id(&dirs, "abcdef01"), Some(file));
        assert_eq!(by_build_id(&dirs, "abcdef02"), None);
        assert_eq!(by_build_id(&dirs, "../../x"), None, "a build id is hex");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
