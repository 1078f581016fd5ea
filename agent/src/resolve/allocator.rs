//! Finding a process's allocator for the `alloc` group: the file among its mappings whose
//! symbols define `malloc` (a preloaded jemalloc or tcmalloc, an allocator linked into the
//! executable, else libc), and where in its file its allocation and free functions are probed.
use std::{collections::HashMap, fs::File, os::unix::fs::FileExt as _, sync::Arc};

use agent_common::allocator_call;
use object::{Object as _, ObjectSymbol as _, SymbolKind};

use super::{
    probe_site::{self, CODE_BYTES, RDI, RDX, RSI, RSP},
    tcmalloc::{self, SampledPath},
    untrusted::read_with,
    Binary,
};
use crate::{
    kernel::{AllocProbe, AllocSite},
    unwind::executable_segments,
};

/// A process's allocator: the file to probe and where its functions are in it.
#[derive(Debug)]
pub struct Allocator {
    pub binary: Arc<Binary>,
    pub functions: Functions,
}

/// What a file that defines `malloc` offers the `alloc` group.
#[derive(Debug, PartialEq, Eq)]
pub struct Functions {
    /// One per distinct function (glibc's `aligned_alloc` is `memalign`).
    pub sites: Vec<AllocSite>,
    /// gperftools tcmalloc's own sampled path, where the file has one.
    pub sampled_path: Option<SampledPath>,
    /// jemalloc's (it defines `mallctl`), whose own sampling Ember cannot use.
    pub is_jemalloc: bool,
}

/// The functions probed, by symbol. C++'s `new` and `delete` count where the allocator defines
/// them (tcmalloc, jemalloc); libstdc++'s call `malloc` and `free`, which are probed.
const FUNCTIONS: &[(&str, AllocProbe)] = &[
    ("malloc", AllocProbe::Allocates(allocator_call::MALLOC)),
    ("calloc", AllocProbe::Allocates(allocator_call::CALLOC)),
    ("realloc", AllocProbe::Allocates(allocator_call::REALLOC)),
    ("memalign", AllocProbe::Allocates(allocator_call::MEMALIGN)),
    ("aligned_alloc", AllocProbe::Allocates(allocator_call::MEMALIGN)),
    ("posix_memalign", AllocProbe::Allocates(allocator_call::POSIX_MEMALIGN)),
    ("valloc", AllocProbe::Allocates(allocator_call::MALLOC)),
    ("_Znwm", AllocProbe::Allocates(allocator_call::MALLOC)),
    ("_Znam", AllocProbe::Allocates(allocator_call::MALLOC)),
    ("_ZnwmSt11align_val_t", AllocProbe::Allocates(allocator_call::MALLOC)),
    ("_ZnamSt11align_val_t", AllocProbe::Allocates(allocator_call::MALLOC)),
    ("free", AllocProbe::Frees),
    ("cfree", AllocProbe::Frees),
    ("_ZdlPv", AllocProbe::Frees),
    ("_ZdaPv", AllocProbe::Frees),
    ("_ZdlPvm", AllocProbe::Frees),
    ("_ZdaPvm", AllocProbe::Frees),
    ("_ZdlPvSt11align_val_t", AllocProbe::Frees),
    ("_ZdaPvSt11align_val_t", AllocProbe::Frees),
];

/// The allocator among `binaries` (a process's mapped files, its executable first). The
/// dynamic linker binds `malloc` to the executable's own, then to a preloaded library's, then
/// to libc's: the same order here, with libc last whatever its place.
pub fn find(binaries: &[Arc<Binary>]) -> Option<Allocator> {
    let is_libc = |b: &Binary| b.name().starts_with("libc.so") || b.name().starts_with("libc-");
    let ordered = binaries.iter().filter(|b| !is_libc(b)).chain(binaries.iter().filter(|b| is_libc(b)));
    for binary in ordered {
        let Ok(file) = binary.file.try_clone() else { continue };
        // libstdc++ defines `operator new` over libc's malloc: an allocator defines malloc.
        if let Ok(Some(functions)) = read_with(binary.served, move || functions_in(&file)) {
            return Some(Allocator { binary: binary.clone(), functions });
        }
    }
    None
}

/// The probed functions that `file` defines, each function once, and its sampled path if it
/// has one, if it defines `malloc`. Only bounded reads of the file: its symbol tables and
/// headers, offsets checked by `object`, and functions' first bytes.
pub(crate) fn functions_in(file: &File) -> Option<Functions> {
    let cache = object::read::ReadCache::new(file);
    let elf = object::File::parse(&cache).ok()?;
    let segments = executable_segments(&elf);
    let file_offset = |address: u64| segments.iter().find_map(|s| s.file_offset_of(address));
    let mut found: Vec<AllocSite> = Vec::new();
    let mut starts: Vec<u64> = Vec::new();
    let (mut malloc, mut is_jemalloc) = (false, false);
    let mut sampled_path_symbols: HashMap<&str, u64> = HashMap::new();
    for symbol in elf.dynamic_symbols().chain(elf.symbols()) {
        if symbol.is_undefined() || symbol.address() == 0 {
            continue;
        }
        let Ok(name) = symbol.name() else { continue };
        if let Some(known) = tcmalloc::SYMBOLS.iter().find(|n| **n == name) {
            sampled_path_symbols.insert(known, symbol.address());
        }
        if symbol.kind() != SymbolKind::Text {
            continue;
        }
        is_jemalloc |= name == "mallctl";
        let Some(&(function, probe)) = FUNCTIONS.iter().find(|(n, _)| *n == name) else { continue };
        let Some(offset) = file_offset(symbol.address()) else { continue };
        malloc |= name == "malloc";
        if !starts.contains(&offset) {
            starts.push(offset);
            found.push(site(file, function, probe, offset));
        }
    }
    // Only an allocator's code is searched for a sampled path.
    malloc.then(|| {
        let sampled_path = SampledPath::find(&elf, file, &sampled_path_symbols, file_offset, |function, probe, offset| site(file, function, probe, offset));
        Functions { sites: found, sampled_path, is_jemalloc }
    })
}

/// Where `probe` goes in the function at `offset` (`probe_site`): a free's reads its argument;
/// an allocation's reads its arguments and, with its return probe at the same place, the stack
/// pointer; a sampled-path probe reads its arguments.
fn site(file: &File, function: &'static str, probe: AllocProbe, offset: u64) -> AllocSite {
    let mut code = [0u8; CODE_BYTES];
    let read = file.read_at(&mut code, offset).unwrap_or(0);
    let kept = match probe {
        AllocProbe::Frees | AllocProbe::SampledFree => RDI,
        AllocProbe::Allocates(_) => RDI | RSI | RDX | RSP,
        AllocProbe::SampledAllocation(_) => RDI | RSI,
    };
    let site = probe_site::place(&code[..read], kept);
    AllocSite { function, probe, offset: offset + site.offset, stepped: site.stepped }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// The libc this agent runs with: the one every test process maps.
    fn own_libc() -> String {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("/libc.so")).expect("libc mapped").to_string()
    }

    #[test]
    fn glibc_defines_each_allocation_function_once_by_offset() {
        let Functions { sites: functions, sampled_path, is_jemalloc } = functions_in(&File::open(own_libc()).unwrap()).expect("libc defines malloc");
        assert_eq!((sampled_path, is_jemalloc), (None, false));
        let count = |probe| functions.iter().filter(|f| f.probe == probe).count();
        assert_eq!(count(AllocProbe::Allocates(allocator_call::MALLOC)), 2, "malloc and valloc: {functions:?}");
        assert_eq!(count(AllocProbe::Allocates(allocator_call::CALLOC)), 1);
        assert_eq!(count(AllocProbe::Allocates(allocator_call::REALLOC)), 1);
        assert_eq!(count(AllocProbe::Allocates(allocator_call::POSIX_MEMALIGN)), 1);
        // glibc's aligned_alloc is memalign under another name: one probe.
        assert_eq!(count(AllocProbe::Allocates(allocator_call::MEMALIGN)), 1);
        assert!(count(AllocProbe::Frees) >= 1);
        let mut offsets: Vec<u64> = functions.iter().map(|f| f.offset).collect();
        offsets.dedup();
        assert_eq!(offsets.len(), functions.len());
    }

    #[test]
    fn glibcs_malloc_and_free_are_probed_where_the_kernel_need_not_step() {
        let functions = functions_in(&File::open(own_libc()).unwrap()).expect("libc defines malloc").sites;
        // glibc 2.36's malloc opens with a push; its free with `test %rdi,%rdi`, which is
        // stepped, and a `je`, which is not.
        let probed = |probe| functions.iter().filter(|f| f.probe == probe).collect::<Vec<_>>();
        for probe in [AllocProbe::Frees, AllocProbe::Allocates(allocator_call::MALLOC)] {
            assert!(probed(probe).iter().all(|f| !f.stepped), "{functions:?}");
        }
    }

    #[test]
    fn libc_is_the_allocator_only_when_nothing_else_defines_malloc() {
        let libc = Arc::new(Binary::open(&own_libc()));
        let found = find(&[libc.clone()]).expect("libc allocates");
        assert!(Arc::ptr_eq(&found.binary, &libc));
        // The agent's own executable defines no malloc: libc stays the allocator.
        let agent = Arc::new(Binary::open(std::env::current_exe().unwrap().to_str().unwrap()));
        let found = find(&[agent, libc.clone()]).expect("libc allocates");
        assert!(Arc::ptr_eq(&found.binary, &libc));
    }

    #[test]
    fn libstdcxx_which_defines_operator_new_over_malloc_is_not_an_allocator() {
        let dir = Path::new("/usr/lib").join(format!("{}-linux-gnu", std::env::consts::ARCH));
        let libstdcxx = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).find(|p| p.to_string_lossy().contains("libstdc++.so.6.")).expect("libstdc++ installed");
        assert_eq!(functions_in(&File::open(&libstdcxx).unwrap()), None, "{}", libstdcxx.display());
        let libstdcxx = Arc::new(Binary::open(libstdcxx.to_str().unwrap()));
        let libc = Arc::new(Binary::open(&own_libc()));
        let found = find(&[libstdcxx, libc.clone()]).expect("libc allocates");
        assert!(Arc::ptr_eq(&found.binary, &libc));
    }
}
