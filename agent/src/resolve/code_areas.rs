//! A process's executable mappings, the only ones a stack can show. Where the kernel answers
//! PROCMAP_QUERY (6.11 on), it is asked for them one by one, and for a file's path only where
//! the caller needs it: /proc/<pid>/maps formats a line for every mapping, with its path,
//! which was most of what capturing a process cost. Elsewhere the maps text is read (bounded)
//! and parsed.
use std::{fs::File, io, os::fd::AsRawFd as _, path::Path};

use super::{open::MappedId, untrusted};
use crate::maps_line::MapsLine;
use crate::ops::metrics;

/// One executable mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeArea {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    /// The mapped file's device and inode; None for anonymous or special memory.
    pub file: Option<MappedId>,
    /// The file's path, or the name of special memory ("[vdso]", "[anon:…]", "" when
    /// anonymous); None where the caller did not need it.
    pub name: Option<String>,
}

impl CodeArea {
    /// The mapping's name under /proc/<pid>/map_files (no leading zeros: the kernel
    /// refuses them there, though maps pads to eight digits).
    pub fn range(&self) -> String {
        format!("{:x}-{:x}", self.start, self.end)
    }
}

/// Bytes of /proc/<pid>/maps read at most: 65,530 mappings (the kernel's default limit) with
/// short paths; past it, the mappings listed last are left out and counted.
const MAX_MAPS_BYTES: usize = 16 << 20;
/// Executable mappings asked for at most (the walker takes 1,024 of a process).
const MAX_AREAS: usize = 65_536;

/// The executable mappings /proc shows at `dir` (a process's or a thread's directory), in
/// address order; empty when it shows no memory (the process exited). `named(file)` says
/// whether a file's path is needed; special memory is always named.
pub fn read(dir: &Path, named: impl Fn(&MappedId) -> bool) -> io::Result<Vec<CodeArea>> {
    let maps = dir.join("maps");
    let file = untrusted::open_nonblocking(&maps)?;
    match query(&file, named) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) => from_text(&maps),
        // No memory to ask about: exited, or a kernel thread.
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(Vec::new()),
        answer => answer,
    }
}

/// struct procmap_query (linux/fs.h).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// _IOWR('f', 17, struct procmap_query).
const PROCMAP_QUERY: libc::c_ulong = (3 << 30) | ((size_of::<ProcmapQuery>() as libc::c_ulong) << 16) | ((b'f' as libc::c_ulong) << 8) | 17;
const QUERY_EXECUTABLE: u64 = 0x04;
const QUERY_COVERING_OR_NEXT: u64 = 0x10;
/// A path is at most PATH_MAX bytes with its terminating zero.
const NAME_BYTES: usize = 4096;

fn query(maps: &File, named: impl Fn(&MappedId) -> bool) -> io::Result<Vec<CodeArea>> {
    let ask = |addr: u64, name: Option<&mut [u8]>| {
        let mut q = ProcmapQuery { size: size_of::<ProcmapQuery>() as u64, query_flags: QUERY_EXECUTABLE | QUERY_COVERING_OR_NEXT, query_addr: addr, ..Default::default() };
        if let Some(name) = name {
            (q.vma_name_addr, q.vma_name_size) = (name.as_mut_ptr() as u64, name.len() as u32);
        }
        // SAFETY: the kernel writes `q` (of the size it says) and at most vma_name_size bytes
        // at vma_name_addr, a live buffer of that length.
        match unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY, &mut q) } {
            0 => Ok(Some(q)),
            _ => match io::Error::last_os_error() {
                e if e.raw_os_error() == Some(libc::ENOENT) => Ok(None), // none at or after addr
                e => Err(e),
            },
        }
    };
    let mut areas = Vec::new();
    let mut addr = 0;
    let mut name_buffer = Vec::new();
    while let Some(q) = ask(addr, None)? {
        if areas.len() == MAX_AREAS {
            metrics::add("ember_untrusted_reads_capped_total", &[("file", "proc")], 1.0);
            break;
        }
        let file = (q.inode != 0).then_some(MappedId { major: q.dev_major, minor: q.dev_minor, inode: q.inode });
        let name = match file {
            Some(id) if !named(&id) => None,
            _ => {
                name_buffer.resize(NAME_BYTES, 0);
                // Asked again at its start: the same mapping unless it changed meanwhile.
                match ask(q.vma_start, Some(&mut name_buffer)) {
                    Ok(Some(again)) if (again.vma_start, again.vma_end, again.inode) == (q.vma_start, q.vma_end, q.inode) => {
                        let length = (again.vma_name_size as usize).saturating_sub(1).min(NAME_BYTES);
                        Some(String::from_utf8_lossy(&name_buffer[..length]).into_owned())
                    }
                    Ok(_) => None,
                    Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => None,
                    Err(e) => return Err(e),
                }
            }
        };
        // Special memory the process changed before it could be named is left out.
        if file.is_some() || name.is_some() {
            areas.push(CodeArea { start: q.vma_start, end: q.vma_end, file_offset: q.vma_offset, file, name });
        }
        if q.vma_end <= addr {
            break; // the kernel's answers go up; never ask the same again
        }
        addr = q.vma_end;
    }
    Ok(areas)
}

/// The same from the maps text, where PROCMAP_QUERY is not known.
fn from_text(maps: &Path) -> io::Result<Vec<CodeArea>> {
    let text = untrusted::read_proc(maps, MAX_MAPS_BYTES)?;
    let areas = text.lines().filter_map(MapsLine::parse).filter(MapsLine::executable).map(|line| CodeArea {
        start: line.start,
        end: line.end,
        file_offset: line.file_offset,
        file: if line.inode == 0 { None } else { MappedId::parse(line.device, line.inode) },
        name: Some(line.path.to_string()),
    });
    Ok(areas.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ways of reading give the same mappings, for this process (a PIE with libraries
    /// and the vDSO) and for a non-PIE executable below 4 GiB (Debian's python3 is one), whose
    /// map_files name has no padding. The test runs where the kernel knows PROCMAP_QUERY.
    #[test]
    fn the_query_and_the_maps_text_agree() {
        let dir = Path::new("/proc/self");
        let queried = read(dir, |_| true).expect("the query");
        let mut text = from_text(&dir.join("maps")).expect("the maps text");
        // Not one of the process's mappings (maps adds it; its calls trap and are emulated).
        text.retain(|a| a.name.as_deref() != Some("[vsyscall]"));
        assert!(queried.iter().any(|a| a.name.as_deref() == Some("[vdso]")), "{queried:?}");
        assert_eq!(queried, text);
        let unnamed = read(dir, |_| false).expect("the query without paths");
        assert!(unnamed.iter().all(|a| a.name.is_none() == a.file.is_some()), "{unnamed:?}");
        assert_eq!(unnamed.iter().map(|a| (a.start, a.end, a.file)).collect::<Vec<_>>(), text.iter().map(|a| (a.start, a.end, a.file)).collect::<Vec<_>>());
        let low = CodeArea { start: 0x400000, end: 0x401000, file_offset: 0, file: None, name: None };
        assert_eq!(low.range(), "400000-401000");
    }

    #[test]
    fn a_process_that_shows_no_memory_has_no_code() {
        // A kernel thread (kthreadd) has no memory.
        assert_eq!(read(Path::new("/proc/2"), |_| true).expect("kthreadd"), Vec::new());
    }
}
