//! Binaries mapped by sampled processes, each held open once per host (by device and inode),
//! so that a process that exits before the drain, or whose binary is deleted, still
//! symbolizes.
use std::{fs::File, os::fd::AsRawFd, path::PathBuf};

use crate::unwind::{executable_segments, TableKey};

/// An executable file mapped by some process, kept open for symbolization.
#[derive(Debug)]
pub struct Binary {
    /// Path as the process saw it (for display and pprof mapping names).
    pub path: String,
    pub build_id: Option<String>,
    /// The lowest executable segment's (virtual address, file offset): where a process that
    /// runs the file has its code, from where the kernel says it loaded it.
    pub code_segment: Option<(u64, u64)>,
    /// Whether a process that runs it has libraries mapped after its exec: it names a
    /// loader (PT_INTERP). A static executable's code is all in place at exec.
    pub loads_libraries: bool,
    /// (device, inode): identifies the file across processes.
    pub id: (u64, u64),
    pub size: u64,
    pub(super) file: File,
    /// Whether a process serves the file (FUSE): its reads run where a read that never
    /// returns costs a worker, not the stage (`untrusted::read_with`).
    pub(super) served: bool,
}

impl Binary {
    /// The file at `path`, opened outside any process (for tests of what names binaries).
    #[cfg(test)]
    pub fn open(path: &str) -> Binary {
        use std::os::unix::fs::MetadataExt;
        let file = File::open(path).expect("opening a test binary");
        let meta = file.metadata().expect("its metadata");
        Binary { path: path.to_string(), build_id: None, code_segment: None, loads_libraries: true, id: (meta.dev(), meta.ino()), size: meta.len(), file, served: false }
    }

    /// A path that reaches this exact file from the agent, whatever happens to the original.
    pub fn open_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    pub fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    /// Its unwind table's identity: copies of one build share it.
    pub fn table_key(&self) -> TableKey {
        match &self.build_id {
            Some(id) => TableKey::BuildId(id.clone()),
            None => TableKey::File(self.id.0, self.id.1),
        }
    }
}

/// Called for each binary when it is first opened (the symbolize stage starts fetching its
/// debug info then).
pub type BinaryOpened = Box<dyn FnMut(&Binary) + Send>;

/// What Ember keeps of a binary's ELF headers.
#[derive(Debug, PartialEq, Eq)]
pub struct ElfFacts {
    pub build_id: Option<String>,
    pub code_segment: Option<(u64, u64)>,
    /// See `Binary::loads_libraries`; true where the headers do not tell.
    pub loads_libraries: bool,
}

impl Default for ElfFacts {
    fn default() -> ElfFacts {
        ElfFacts { build_id: None, code_segment: None, loads_libraries: true }
    }
}

/// The GNU build id (in hex), lowest executable segment and loader of the ELF file `file`:
/// read through bounded reads of the file (a crafted file's offsets are checked, never
/// trusted).
pub fn elf_facts(file: &File) -> ElfFacts {
    use object::{read::elf::ProgramHeader as _, Object as _};
    let cache = object::read::ReadCache::new(file);
    let Ok(elf) = object::File::parse(&cache) else { return ElfFacts::default() };
    let id = elf.build_id().ok().flatten().filter(|id| !id.is_empty());
    let build_id = id.map(|id| id.iter().map(|b| format!("{b:02x}")).collect());
    let code_segment = executable_segments(&elf).iter().min_by_key(|s| s.address).map(|s| (s.address, s.file_range.0));
    let loads_libraries = match &elf {
        object::File::Elf64(f) => f.elf_program_headers().iter().any(|h| h.p_type(f.endian()) == object::elf::PT_INTERP),
        object::File::Elf32(f) => f.elf_program_headers().iter().any(|h| h.p_type(f.endian()) == object::elf::PT_INTERP),
        _ => true,
    };
    ElfFacts { build_id, code_segment, loads_libraries }
}

/// The GNU build id of the ELF file `file`, in hex (`elf_facts`).
pub fn build_id_of(file: &File) -> Option<String> {
    elf_facts(file).build_id
}

/// Raises the open-file limit to its hard limit: the table keeps every mapped binary open, and
/// the usual soft limit (1024) is too few on a busy host.
pub fn raise_open_file_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_executable_loads_libraries_and_a_static_one_does_not() {
        let facts = |path: &str| elf_facts(&File::open(path).expect("a system binary"));
        assert!(facts("/bin/true").loads_libraries);
        // Debian's ldconfig is static-pie: no loader named.
        assert!(!facts("/sbin/ldconfig").loads_libraries);
        assert!(facts("/proc/self/status").loads_libraries, "what is not ELF tells nothing: read as before");
    }
}
