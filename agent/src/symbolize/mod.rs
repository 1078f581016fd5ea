//! Symbolize: names every frame with blazesym. Kernel frames from kallsyms; user frames from
//! each binary's ELF symbols and DWARF (with inlined functions), or its separate debug file
//! (`debug_files`), looked up by file offset in the binary the process mapped. What blazesym
//! holds parsed is bounded by a budget: a binary whose symbols and DWARF exceed it is named
//! from a compact index of its symbol table (`symtab`) instead. Results are cached per (binary,
//! offset) and per kernel address. blazesym's Symbolizer is !Send, so this lives on the
//! pipeline thread.
mod cache;
mod debug_files;
mod debuginfod;
mod jit;
mod symtab;

use std::{
    collections::{HashMap, HashSet},
    panic::{catch_unwind, AssertUnwindSafe},
    path::PathBuf,
    sync::Arc,
};

use blazesym::symbolize::{
    evict::{self, Evict},
    source::{Elf, Kernel, Source},
    Input, Symbolized,
};

pub use debug_files::{prefetcher, start_debuginfod, SymbolSettings};
pub use debuginfod::{Debuginfod, DebuginfodSettings};
pub use jit::jit_frame;
#[cfg(fuzzing)]
pub(crate) use debug_files::examine_bytes;

use cache::FrameCache;
use debug_files::{DebugFiles, Source as DebugSource};
pub(crate) use symtab::SymbolIndex;

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

/// Named addresses, and intervals, a cache generation takes (each cache holds two): more
/// addresses than the busiest interval names, a few megabytes at most; and a minute at the
/// default interval, so that what a churning host ran once leaves within two.
const CACHE_GENERATION: (usize, u32) = (32_768, 6);
/// Symbol table indexes are dropped whole past this many bytes.
const INDEX_LIMIT: usize = 32 << 20;

/// A binary whose symbols blazesym holds parsed, weighed by the bytes it reads to name it.
/// `path` reaches the same file whichever process maps the binary (an fd of its own, or a
/// separate debug file), so that blazesym's cache serves them all.
struct Held {
    binary: (u64, u64),
    path: PathBuf,
    /// The binary opened by the symbolizer itself, when `path` is its fd.
    _file: Option<std::fs::File>,
    bytes: u64,
}

/// A binary that did not fit beside the ones in use is named from its symbol table for this
/// many intervals, then tried again: no binary is parsed anew every interval.
const RETRY_OVER_BUDGET: u64 = 30;
/// A binary not sampled for this many intervals gives back what naming it holds (its parsed
/// symbols, its symbol table index): two minutes at the default interval, as long as its
/// names stay in the frame caches. Without it, what a burst of host processes made the agent
/// parse stayed until the budget was needed (the soak's step of anonymous RSS).
const IDLE_INTERVALS: u64 = 12;

pub struct Symbolizer {
    blaze: blazesym::symbolize::Symbolizer,
    user: FrameCache<((u64, u64), u64)>,
    /// Binaries whose symbolization panicked: never parsed again (their frames keep
    /// module+offset).
    poisoned: HashSet<(u64, u64)>,
    kernel: FrameCache<u64>,
    debug_files: DebugFiles,
    /// Names given while the binary's debug info was on its way: dropped at the next
    /// interval, so that its addresses are named again once it is here.
    provisional: Vec<((u64, u64), u64)>,
    /// Files blazesym holds parsed, within `budget` bytes together, least recently used
    /// released first; and the symbol tables of binaries beyond the budget.
    held: Vec<Held>,
    budget: u64,
    /// Binaries that did not fit, and the interval from which to try them again.
    crowded_out: HashMap<(u64, u64), u64>,
    /// Binaries opened for blazesym, until they are held.
    own_files: HashMap<(u64, u64), std::fs::File>,
    /// Symbol table indexes, with the frames of their functions named so far (shared by
    /// every address in a function).
    indexes: HashMap<(u64, u64), Option<(SymbolIndex, HashMap<usize, Frames>)>>,
    /// The last interval each binary was sampled in, named from the caches or not.
    last_sampled: HashMap<(u64, u64), u64>,
    intervals: u64,
    /// Cache hits and misses since the pipeline last took them for the metrics.
    pub hits: u64,
    pub misses: u64,
}

impl Symbolizer {
    pub fn new(settings: &SymbolSettings, debuginfod: Option<Debuginfod>) -> Self {
        let debug_files = DebugFiles::new(settings, debuginfod);
        Symbolizer {
            blaze: blaze(),
            user: FrameCache::new(CACHE_GENERATION),
            poisoned: HashSet::new(),
            kernel: FrameCache::new(CACHE_GENERATION),
            debug_files,
            provisional: Vec::new(),
            held: Vec::new(),
            budget: settings.debug_info_budget,
            crowded_out: HashMap::new(),
            own_files: HashMap::new(),
            indexes: HashMap::new(),
            last_sampled: HashMap::new(),
            intervals: 0,
            hits: 0,
            misses: 0,
        }
    }

    /// Symbolizes, in one batch per binary and one for the kernel, every address of the
    /// interval that is not cached yet.
    pub fn prepare(&mut self, interval: &ResolvedInterval) {
        self.user.age();
        self.kernel.age();
        for key in self.provisional.drain(..) {
            self.user.remove(&key);
        }
        self.intervals += 1;
        self.crowded_out.retain(|_, until| *until > self.intervals);
        let mut user: HashMap<(u64, u64), (Arc<Binary>, Vec<u64>)> = HashMap::new();
        let mut kernel = Vec::new();
        for site in interval.samples.iter().flat_map(|s| &s.stack) {
            match site {
                Site::User(UserAddress::File { binary, file_offset }) => {
                    self.last_sampled.insert(binary.id, self.intervals);
                    if self.user.touch((binary.id, *file_offset)) {
                        self.hits += 1;
                    } else {
                        user.entry(binary.id).or_insert_with(|| (binary.clone(), Vec::new())).1.push(*file_offset);
                    }
                }
                Site::Kernel(addr) => {
                    if self.kernel.touch(*addr) {
                        self.hits += 1;
                    } else {
                        kernel.push(*addr);
                    }
                }
                _ => {}
            }
        }
        self.release_idle();
        for (binary, mut offsets) in user.into_values() {
            offsets.sort_unstable();
            offsets.dedup();
            self.misses += offsets.len() as u64;
            self.name_binary(&binary, &offsets);
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
            let frames = sym.and_then(to_frames).unwrap_or_else(|| Arc::from([Frame { function: format!("[kernel]+{addr:#x}"), file: String::new(), line: 0 }]));
            self.kernel.insert(*addr, frames);
        }
        drop(results);
        if panicked {
            self.blaze = blaze();
        }
    }

    /// Names `offsets` of `binary`: from its DWARF (lines, inlined functions) when what
    /// naming it reads fits the budget, else from its symbol table.
    fn name_binary(&mut self, binary: &Binary, offsets: &[u64]) {
        let source = self.debug_files.source(binary);
        if source.pending {
            metrics::add("ember_frames_awaiting_debuginfo_total", &[], offsets.len() as f64);
            self.provisional.extend(offsets.iter().map(|offset| (binary.id, *offset)));
        }
        let crowded_out = self.crowded_out.get(&binary.id).is_some_and(|until| self.intervals < *until);
        let names = if source.parse_bytes > self.budget || crowded_out || !self.make_room(binary.id, source.parse_bytes) {
            self.from_symbol_table(binary, &source, offsets)
        } else {
            self.from_dwarf(binary, &source, offsets)
        };
        for (offset, frames) in offsets.iter().zip(names) {
            let frames = frames.unwrap_or_else(|| Arc::from([Frame { function: format!("{}+{offset:#x}", binary.name()), file: String::new(), line: 0 }]));
            self.user.insert((binary.id, *offset), frames);
        }
    }

    /// blazesym over the binary, or its separate debug file by virtual address. The file stays
    /// parsed while the budget allows: the least recently used are released first.
    fn from_dwarf(&mut self, binary: &Binary, source: &DebugSource, offsets: &[u64]) -> Vec<Option<Frames>> {
        // Each offset's place among the addresses asked for (an offset outside code has none).
        let (path, places, addresses, by_address): (PathBuf, Vec<Option<usize>>, Vec<u64>, bool) = match &source.debug_file {
            Some(path) => {
                let mut addresses = Vec::new();
                let places = offsets
                    .iter()
                    .map(|offset| {
                        source.segments.iter().find_map(|s| s.address_of(*offset)).map(|address| {
                            addresses.push(address);
                            addresses.len() - 1
                        })
                    })
                    .collect();
                (path.clone(), places, addresses, true)
            }
            None => (self.held_path(binary), (0..offsets.len()).map(Some).collect(), offsets.to_vec(), false),
        };
        if self.poisoned.contains(&binary.id) {
            return vec![None; offsets.len()];
        }
        let input = if by_address { Input::VirtOffset(&addresses[..]) } else { Input::FileOffset(&addresses[..]) };
        let results = isolated(binary.name(), || self.blaze.symbolize(&Source::Elf(Elf::new(&path)), input));
        let Some(results) = results else {
            // What a panic left half-built in blazesym's caches must not be reused.
            self.poisoned.insert(binary.id);
            self.blaze = blaze();
            self.held.clear();
            return vec![None; offsets.len()];
        };
        let results = results.ok();
        let names = places.iter().map(|place| results.as_ref().zip(*place).and_then(|(r, i)| r.get(i)).and_then(to_frames)).collect();
        drop(results);
        if !self.held.iter().any(|h| h.binary == binary.id) {
            let _file = (source.debug_file.is_none()).then(|| self.own_files.remove(&binary.id)).flatten();
            tracing::debug!(binary = binary.name(), bytes = source.parse_bytes, "symbols parsed and held");
            self.held.push(Held { binary: binary.id, path, _file, bytes: source.parse_bytes });
        }
        metrics::set("ember_debug_info_held_bytes", &[], self.held.iter().map(|h| h.bytes).sum::<u64>() as f64);
        names
    }

    /// A path to the binary that stays the same for as long as it is held.
    fn held_path(&mut self, binary: &Binary) -> PathBuf {
        if let Some(held) = self.held.iter().find(|h| h.binary == binary.id) {
            return held.path.clone();
        }
        match std::fs::File::open(binary.open_path()) {
            Ok(file) => {
                let path = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file)));
                self.own_files.insert(binary.id, file);
                path
            }
            Err(_) => binary.open_path(),
        }
    }

    /// Whether `binary`'s symbols (`bytes`) can be held: it is held already, or fits once
    /// binaries not used this interval are released (the least recently used first). A binary
    /// that does not fit is crowded out for a while, and named from its symbol table.
    fn make_room(&mut self, binary: (u64, u64), bytes: u64) -> bool {
        if self.held.iter().any(|h| h.binary == binary) {
            return true;
        }
        loop {
            if self.held.iter().map(|h| h.bytes).sum::<u64>() + bytes <= self.budget {
                return true;
            }
            let sampled = |h: &Held| self.last_sampled.get(&h.binary).copied().unwrap_or(0);
            let idle = self.held.iter().enumerate().filter(|(_, h)| sampled(h) < self.intervals).min_by_key(|(_, h)| sampled(h)).map(|(i, _)| i);
            let Some(oldest) = idle else {
                self.crowded_out.insert(binary, self.intervals + RETRY_OVER_BUDGET);
                metrics::add("ember_debug_info_crowded_out_total", &[], 1.0);
                return false;
            };
            let released = self.held.swap_remove(oldest);
            tracing::debug!(path = %released.path.display(), bytes = released.bytes, "symbols released for another binary");
            let _ = self.blaze.evict(&Evict::Elf(evict::Elf::new(&released.path)));
        }
    }

    /// Releases the parsed symbols and symbol table indexes of binaries not sampled for
    /// IDLE_INTERVALS.
    fn release_idle(&mut self) {
        let now = self.intervals;
        self.last_sampled.retain(|_, last| now - *last <= IDLE_INTERVALS);
        let sampled = &self.last_sampled;
        let (idle, kept) = std::mem::take(&mut self.held).into_iter().partition(|h| !sampled.contains_key(&h.binary));
        self.held = kept;
        for released in idle {
            tracing::debug!(path = %released.path.display(), bytes = released.bytes, "symbols of an idle binary released");
            let _ = self.blaze.evict(&Evict::Elf(evict::Elf::new(&released.path)));
        }
        self.indexes.retain(|binary, _| sampled.contains_key(binary));
    }

    /// Function names only, from the binary's (or its debug file's) symbol table, indexed once.
    fn from_symbol_table(&mut self, binary: &Binary, source: &DebugSource, offsets: &[u64]) -> Vec<Option<Frames>> {
        if self.indexes.values().flatten().map(|(index, named)| index.bytes() + named.len() * 64).sum::<usize>() > INDEX_LIMIT {
            self.indexes.clear();
        }
        let over_budget = self.indexes.len() + usize::from(!self.indexes.contains_key(&binary.id));
        metrics::set("ember_binaries_over_debug_info_budget", &[], over_budget as f64);
        let index = self.indexes.entry(binary.id).or_insert_with(|| {
            tracing::info!(binary = binary.name(), bytes = source.parse_bytes, "symbols and DWARF beyond the debug-info budget: named from the symbol table only, without lines or inlined functions");
            SymbolIndex::build(source.debug_file.as_deref().unwrap_or(&binary.open_path())).map(|index| (index, HashMap::new()))
        });
        let Some((index, named)) = index else { return vec![None; offsets.len()] };
        let mut name = |offset: &u64| {
            let function = index.function_at(source.segments.iter().find_map(|s| s.address_of(*offset))?)?;
            if let Some(frames) = named.get(&function) {
                return Some(frames.clone());
            }
            let frames: Frames = Arc::from([Frame { function: index.name(function)?, file: String::new(), line: 0 }]);
            named.insert(function, frames.clone());
            Some(frames)
        };
        offsets.iter().map(&mut name).collect()
    }

    /// Frames of a user address symbolized by `prepare`.
    pub fn user(&self, binary: &Binary, file_offset: u64) -> Option<&Frames> {
        self.user.get(&(binary.id, file_offset))
    }

    pub fn kernel(&self, addr: u64) -> Option<&Frames> {
        self.kernel.get(&addr)
    }
}

/// Debug links are followed by `debug_files`, which weighs what they lead to: blazesym is
/// told of no debug directory.
fn blaze() -> blazesym::symbolize::Symbolizer {
    let builder = blazesym::symbolize::Symbolizer::builder().enable_code_info(true).enable_inlined_fns(true).enable_demangling(true);
    builder.set_debug_dirs(Some::<[&std::path::Path; 0]>([])).build()
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

/// A symbol's frames, innermost inlined function first (None: not named; the caller keeps
/// module + offset, never a bare address).
fn to_frames(sym: &Symbolized) -> Option<Frames> {
    let Symbolized::Sym(sym) = sym else { return None };
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
    Some(Arc::from(frames))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::ResolvedSample;

    fn panics() -> f64 {
        metrics::value("ember_symbolizer_panics_total", &[])
    }

    /// An interval with one sample at `file_offset` of `binary`.
    fn sampled(binary: &Arc<Binary>, file_offset: u64) -> ResolvedInterval {
        let sample = ResolvedSample {
            kind: 0,
            tgid: 1,
            pid: 1,
            comm: String::new(),
            process: String::new(),
            labels: Arc::default(),
            device: String::new(),
            state: 0,
            reason: None,
            stack: vec![Site::User(UserAddress::File { binary: binary.clone(), file_offset })],
            value: Default::default(),
        };
        ResolvedInterval { samples: vec![sample], ..Default::default() }
    }

    #[test]
    fn a_binary_not_sampled_for_a_while_gives_back_its_symbols_and_index() {
        // This test's own executable: within a large budget blazesym holds it parsed; with
        // none, it is named from a symbol table index.
        let binary = Arc::new(Binary::open("/proc/self/exe"));
        for (budget, holds) in [(1 << 40, "held"), (0, "indexed")] {
            let mut symbolizer = Symbolizer::new(&SymbolSettings { debug_info_budget: budget, ..Default::default() }, None);
            let kept = |s: &Symbolizer| if budget == 0 { s.indexes.contains_key(&binary.id) } else { s.held.iter().any(|h| h.binary == binary.id) };
            symbolizer.prepare(&sampled(&binary, 0x1000));
            assert!(kept(&symbolizer), "{holds} once sampled");
            for _ in 0..IDLE_INTERVALS {
                symbolizer.prepare(&ResolvedInterval::default());
            }
            assert!(kept(&symbolizer), "still {holds} after {IDLE_INTERVALS} idle intervals");
            symbolizer.prepare(&ResolvedInterval::default());
            assert!(!kept(&symbolizer), "{holds} no longer, one interval later");
            // Sampled again, it is named again.
            symbolizer.prepare(&sampled(&binary, 0x1000));
            assert!(kept(&symbolizer), "{holds} again once sampled again");
        }
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
