//! Symbolize: names every frame with blazesym. Kernel frames from kallsyms; user frames from
//! each binary's ELF symbols and DWARF (with inlined functions), or its separate debug file
//! (`debug_files`), looked up by file offset in the binary the process mapped. Results are
//! cached per (binary, offset) and per kernel address. blazesym's Symbolizer is !Send, so this
//! lives on the pipeline thread.
mod debug_files;
mod debuginfod;
mod jit;

use std::{
    collections::{HashMap, HashSet},
    panic::{catch_unwind, AssertUnwindSafe},
    sync::Arc,
};

use blazesym::symbolize::{
    evict::{self, Evict},
    source::{Elf, Kernel, Source},
    Input, Symbolized,
};

pub use debug_files::SymbolSettings;
pub use debuginfod::DebuginfodSettings;
pub use jit::jit_frame;

use debug_files::{DebugFiles, Source as DebugSource};

use crate::{
    ops::metrics,
    resolve::{Binary, ResolvedInterval, Site, UserAddress},
};

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
    /// Binaries whose symbolization panicked: never parsed again (their frames keep
    /// module+offset).
    poisoned: HashSet<(u64, u64)>,
    kernel: HashMap<u64, Frames>,
    debug_files: DebugFiles,
    /// Names given while the binary's debug info was on its way: dropped at the next
    /// interval, so that its addresses are named again once it is here.
    provisional: Vec<((u64, u64), u64)>,
    /// Cache hits and misses since the pipeline last took them for the metrics.
    pub hits: u64,
    pub misses: u64,
}

impl Symbolizer {
    pub fn new(settings: &SymbolSettings) -> Self {
        let debug_files = DebugFiles::new(settings);
        Symbolizer {
            blaze: blaze(debug_files.dirs()),
            user: HashMap::new(),
            poisoned: HashSet::new(),
            kernel: HashMap::new(),
            debug_files,
            provisional: Vec::new(),
            hits: 0,
            misses: 0,
        }
    }

    /// Symbolizes, in one batch per binary and one for the kernel, every address of the
    /// interval that is not cached yet.
    pub fn prepare(&mut self, interval: &ResolvedInterval) {
        if self.user.len() + self.kernel.len() > CACHE_LIMIT {
            self.user.clear();
            self.kernel.clear();
        }
        for key in self.provisional.drain(..) {
            self.user.remove(&key);
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
            // What to read, and each offset's place in the addresses asked for (a separate
            // debug file is asked by virtual address; an offset outside code has none).
            let debug_source = self.debug_files.source(&binary);
            let (path, places, addresses, virtual_addresses) = match &debug_source {
                DebugSource::Separate { path, segments } => {
                    let virtual_of = |offset: &u64| segments.iter().find_map(|s| s.address_of(*offset));
                    let mut addresses = Vec::new();
                    let places = offsets
                        .iter()
                        .map(|offset| {
                            virtual_of(offset).map(|address| {
                                addresses.push(address);
                                addresses.len() - 1
                            })
                        })
                        .collect();
                    (path.clone(), places, addresses, true)
                }
                DebugSource::Own | DebugSource::Pending => (binary.open_path(), (0..offsets.len()).map(Some).collect::<Vec<_>>(), offsets.clone(), false),
            };
            if matches!(debug_source, DebugSource::Pending) {
                metrics::add("ember_frames_awaiting_debuginfo_total", &[], offsets.len() as f64);
                self.provisional.extend(offsets.iter().map(|offset| (id, *offset)));
            }
            let source = Source::Elf(Elf::new(&path));
            let input = if virtual_addresses { Input::VirtOffset(&addresses[..]) } else { Input::FileOffset(&addresses[..]) };
            let poisoned = self.poisoned.contains(&id);
            let results = if poisoned { None } else { isolated(&binary.name(), || self.blaze.symbolize(&source, input)) };
            let panicked = !poisoned && results.is_none();
            let results = results.and_then(Result::ok);
            for (offset, place) in offsets.iter().zip(places) {
                let sym = results.as_ref().zip(place).and_then(|(r, i)| r.get(i));
                let frames = to_frames(sym, || format!("{}+{:#x}", binary.name(), offset));
                self.user.insert((id, *offset), frames);
            }
            drop(results);
            if panicked {
                // What a panic left half-built in blazesym's caches must not be reused.
                self.poisoned.insert(id);
                self.blaze = blaze(self.debug_files.dirs());
            } else {
                // A binary's parsed symbols and DWARF (and its mapped file) are the agent's
                // largest memory. Its addresses are named and cached above, so release them
                // now: memory then holds one binary's debug info at a time, and a binary is
                // parsed again only when new addresses in it appear.
                let _ = self.blaze.evict(&Evict::Elf(evict::Elf::new(&path)));
            }
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
        let results = isolated("[kernel]", || self.blaze.symbolize(&source, Input::AbsAddr(&kernel)));
        let panicked = results.is_none();
        let results = results.and_then(Result::ok);
        for (i, addr) in kernel.iter().enumerate() {
            let sym = results.as_ref().and_then(|r| r.get(i));
            self.kernel.insert(*addr, to_frames(sym, || format!("[kernel]+{addr:#x}")));
        }
        drop(results);
        if panicked {
            self.blaze = blaze(self.debug_files.dirs());
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

/// blazesym follows debug links in `debug_dirs` (and next to the binary).
fn blaze(debug_dirs: &[std::path::PathBuf]) -> blazesym::symbolize::Symbolizer {
    let builder = blazesym::symbolize::Symbolizer::builder().enable_code_info(true).enable_inlined_fns(true).enable_demangling(true);
    builder.set_debug_dirs(Some(debug_dirs)).build()
}

/// Runs one binary's symbolization. A panic in it (a hostile or broken binary, a parser bug)
/// is caught, logged and counted, and leaves that binary's frames unnamed, instead of taking
/// the pipeline thread, and the agent, down with it.
fn isolated<T>(binary: &str, symbolize: impl FnOnce() -> T) -> Option<T> {
    match catch_unwind(AssertUnwindSafe(symbolize)) {
        Ok(value) => Some(value),
        Err(panic) => {
            let message = panic.downcast_ref::<&str>().copied().or(panic.downcast_ref::<String>().map(String::as_str));
            metrics::add("ember_symbolizer_panics_total", &[], 1.0);
            tracing::error!(binary, "symbolizing panicked, its frames stay unnamed: {}", message.unwrap_or("(no message)"));
            None
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn panics() -> f64 {
        metrics::value("ember_symbolizer_panics_total", &[])
    }

    #[test]
    fn a_panic_while_symbolizing_is_caught_counted_and_the_thread_goes_on() {
        let before = panics();
        assert_eq!(isolated("hostile", || -> u32 { panic!("a parser bug") }), None);
        assert_eq!(panics(), before + 1.0);
        assert_eq!(isolated("next", || 7), Some(7));
        assert_eq!(panics(), before + 1.0);
    }
}
