//! Symbolize: names every frame with blazesym. Kernel frames from kallsyms; user frames from
//! each binary's ELF symbols and DWARF (with inlined functions), looked up by file offset in
//! the binary the process mapped. Results are cached per (binary, offset) and per kernel
//! address. blazesym's Symbolizer is !Send, so this lives on the pipeline thread.
use std::{collections::HashMap, sync::Arc};

use blazesym::symbolize::{
    evict::{self, Evict},
    source::{Elf, Kernel, Source},
    Input, Symbolized,
};

use crate::resolve::{Binary, ResolvedInterval, Site, UserAddress};

/// One function at one location. A location has several when functions were inlined.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    pub function: String,
    pub file: String,
    pub line: u32,
}

/// Innermost inlined function first; the last frame is the function that owns the code.
pub type Frames = Arc<[Frame]>;

/// Caches are dropped whole past this many entries, to bound memory on long runs.
const CACHE_LIMIT: usize = 500_000;

pub struct Symbolizer {
    blaze: blazesym::symbolize::Symbolizer,
    user: HashMap<((u64, u64), u64), Frames>,
    kernel: HashMap<u64, Frames>,
    pub hits: u64,
    pub misses: u64,
}

impl Symbolizer {
    pub fn new() -> Self {
        let blaze = blazesym::symbolize::Symbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(true)
            .build();
        Symbolizer { blaze, user: HashMap::new(), kernel: HashMap::new(), hits: 0, misses: 0 }
    }

    /// Symbolizes, in one batch per binary and one for the kernel, every address of the
    /// interval that is not cached yet.
    pub fn prepare(&mut self, interval: &ResolvedInterval) {
        if self.user.len() + self.kernel.len() > CACHE_LIMIT {
            self.user.clear();
            self.kernel.clear();
        }
        let mut user: HashMap<(u64, u64), (Arc<Binary>, Vec<u64>)> = HashMap::new();
        let mut kernel = Vec::new();
        for site in interval.samples.iter().flat_map(|s| &s.stack) {
            match site {
                Site::User(UserAddress::File { binary, file_offset }) => {
                    if self.user.contains_key(&(binary.id, *file_offset)) {
                        self.hits += 1;
                    } else {
                        user.entry(binary.id).or_insert_with(|| (binary.clone(), Vec::new())).1.push(*file_offset);
                    }
                }
                Site::Kernel(addr) => {
                    if self.kernel.contains_key(addr) {
                        self.hits += 1;
                    } else {
                        kernel.push(*addr);
                    }
                }
                _ => {}
            }
        }
        for (id, (binary, mut offsets)) in user {
            offsets.sort_unstable();
            offsets.dedup();
            self.misses += offsets.len() as u64;
            let source = Source::Elf(Elf::new(binary.open_path()));
            let results = self.blaze.symbolize(&source, Input::FileOffset(&offsets));
            for (i, offset) in offsets.iter().enumerate() {
                let sym = results.as_ref().ok().and_then(|r| r.get(i));
                let frames = to_frames(sym, || format!("{}+{:#x}", binary.name(), offset));
                self.user.insert((id, *offset), frames);
            }
            drop(results);
            // A binary's parsed symbols and DWARF (and its mapped file) are the agent's largest
            // memory. Its addresses are named and cached above, so release them now: memory then
            // holds one binary's debug info at a time, and a binary is parsed again only when
            // new addresses in it appear.
            let _ = self.blaze.evict(&Evict::Elf(evict::Elf::new(binary.open_path())));
        }
        kernel.sort_unstable();
        kernel.dedup();
        if kernel.is_empty() {
            return; // do not make blazesym load kallsyms for nothing
        }
        self.misses += kernel.len() as u64;
        let source = Source::Kernel(Kernel {
            // No vmlinux on most hosts; kallsyms names every kernel function.
            vmlinux: blazesym::MaybeDefault::None,
            ..Default::default()
        });
        let results = self.blaze.symbolize(&source, Input::AbsAddr(&kernel));
        for (i, addr) in kernel.iter().enumerate() {
            let sym = results.as_ref().ok().and_then(|r| r.get(i));
            self.kernel.insert(*addr, to_frames(sym, || format!("[kernel]+{addr:#x}")));
        }
    }

    /// Frames of a user address symbolized by `prepare`.
    pub fn user(&self, binary: &Binary, file_offset: u64) -> Option<&Frames> {
        self.user.get(&(binary.id, file_offset))
    }

    pub fn kernel(&self, addr: u64) -> Option<&Frames> {
        self.kernel.get(&addr)
    }
}

/// Unresolvable addresses keep module + offset, never a bare address.
fn to_frames(sym: Option<&Symbolized>, fallback: impl FnOnce() -> String) -> Frames {
    let Some(Symbolized::Sym(sym)) = sym else {
        return Arc::from([Frame { function: fallback(), file: String::new(), line: 0 }]);
    };
    let file_of = |info: Option<&blazesym::symbolize::CodeInfo>| {
        info.map(|c| (c.to_path().display().to_string(), c.line.unwrap_or(0))).unwrap_or_default()
    };
    // blazesym lists inlined functions outermost first, each with its own location; the
    // symbol's location is in the outermost function. pprof wants the innermost first.
    let mut frames: Vec<Frame> = sym
        .inlined
        .iter()
        .rev()
        .map(|f| {
            let (file, line) = file_of(f.code_info.as_ref());
            Frame { function: f.name.to_string(), file, line }
        })
        .collect();
    let (file, line) = file_of(sym.code_info.as_deref());
    frames.push(Frame { function: sym.name.to_string(), file, line });
    Arc::from(frames)
}
