//! JIT code named from perf maps. Runtimes that compile code while they run (Node with
//! `--perf-basic-prof`, Python 3.12+ with `-X perf`, the JVM through `jcmd Compiler.perfmap`)
//! append one "START SIZE NAME" line (hex, hex, text) per compiled function to
//! `/tmp/perf-<pid>.map`, where `<pid>` is the pid the process sees (in its own pid namespace)
//! and `/tmp` is its own. The file is opened once, inside the process's root, and kept open, so
//! it can still be read after the process exits; it is read on from where the last read ended.
use std::{
    collections::BTreeMap,
    fs::{self, File},
    io::{Read, Seek, SeekFrom},
    ops::Range,
    sync::Arc,
    time::{Duration, Instant},
};

use super::open::open_in_root;
use crate::ops::metrics;

/// Functions kept per process: about 100 bytes each, so a runtime that compiles without end
/// costs at most about 10 MB. Past it, new functions are counted and left unnamed.
const MAX_FUNCTIONS: usize = 100_000;
/// How often a process without a perf map (most have none) is looked at again.
const RETRY_OPEN: Duration = Duration::from_secs(1);
/// Longer names are cut (a V8 name holds the script's path).
const MAX_NAME: usize = 512;

/// A JIT-compiled function: where it starts and its name as the runtime wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitSymbol {
    pub start: u64,
    pub name: Arc<str>,
}

#[derive(Debug, Default)]
pub struct PerfMap {
    file: Option<File>,
    tried: Option<Instant>,
    /// Bytes of the file read so far, and the start of a line not yet complete.
    read: u64,
    partial: Vec<u8>,
    /// Functions by start address: (end, name). A later line for overlapping code (the
    /// runtime moved or recompiled it) replaces the earlier ones.
    functions: BTreeMap<u64, (u64, Arc<str>)>,
    /// An earlier life's map (`freeze`): neither opened nor read again.
    frozen: bool,
}

impl PerfMap {
    /// The function of process `tgid` that holds `addr`, reading what the runtime appended
    /// since the last read when the address is not known yet.
    pub fn lookup(&mut self, tgid: u32, addr: u64) -> Option<JitSymbol> {
        if let Some(found) = self.find(addr) {
            return Some(found);
        }
        self.open_and_read(tgid);
        self.find(addr)
    }

    /// Whether a function named as `named` says lies in `range`, reading what is new first.
    pub fn any_named_in(&mut self, tgid: u32, range: Range<u64>, named: impl Fn(&str) -> bool) -> bool {
        self.open_and_read(tgid);
        self.functions.range(range).any(|(_, (_, name))| named(name))
    }

    /// The pid's next life was read: the file is that life's from now on (a runtime it
    /// exec'd rewrites it; a new process with the pid writes its own). What this life
    /// appended is read one last time, and its names are kept for its samples.
    pub fn freeze(&mut self) {
        self.frozen = true;
        self.read_new();
    }

    fn open_and_read(&mut self, tgid: u32) {
        if self.frozen {
            return;
        }
        if self.file.is_none() && self.tried.is_none_or(|t| t.elapsed() >= RETRY_OPEN) {
            self.tried = Some(Instant::now());
            self.file = open(tgid);
        }
        self.read_new();
    }

    fn find(&self, addr: u64) -> Option<JitSymbol> {
        let (&start, (end, name)) = self.functions.range(..=addr).next_back()?;
        (addr < *end).then(|| JitSymbol { start, name: name.clone() })
    }

    fn read_new(&mut self) {
        let Some(file) = self.file.as_mut() else { return };
        let Ok(size) = file.metadata().map(|m| m.len()) else { return };
        if size < self.read {
            // Rewritten from the start (the pid exec'd another runtime): forget the old code,
            // unless the map is frozen, when the rewrite is the next life's.
            if self.frozen {
                return;
            }
            self.read = 0;
            self.partial.clear();
            self.functions.clear();
        }
        if size == self.read || file.seek(SeekFrom::Start(self.read)).is_err() {
            return;
        }
        let mut bytes = std::mem::take(&mut self.partial);
        let Ok(n) = file.take(size - self.read).read_to_end(&mut bytes) else { return };
        self.read += n as u64;
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        self.partial = bytes.split_off(complete);
        let mut dropped = 0;
        for line in String::from_utf8_lossy(&bytes).lines() {
            let Some((start, end, name)) = parse_line(line) else { continue };
            if self.functions.len() >= MAX_FUNCTIONS {
                dropped += 1;
                continue;
            }
            self.insert(start, end, name);
        }
        if dropped > 0 {
            metrics::add("ember_jit_functions_dropped_total", &[], dropped as f64);
        }
    }

    fn insert(&mut self, start: u64, end: u64, name: &str) {
        // An earlier function that runs into the new one ends where it starts.
        if let Some((_, (previous_end, _))) = self.functions.range_mut(..start).next_back() {
            *previous_end = (*previous_end).min(start);
        }
        let covered: Vec<u64> = self.functions.range(start..end).map(|(&s, _)| s).collect();
        for s in covered {
            self.functions.remove(&s);
        }
        let name = if name.len() > MAX_NAME { &name[..name.floor_char_boundary(MAX_NAME)] } else { name };
        self.functions.insert(start, (end, Arc::from(name)));
    }
}

/// "START SIZE NAME", START and SIZE in hex (with or without 0x); None for anything else.
pub fn parse_line(line: &str) -> Option<(u64, u64, &str)> {
    let mut fields = line.splitn(3, ' ');
    let hex = |field: &str| u64::from_str_radix(field.trim_start_matches("0x"), 16).ok();
    let start = hex(fields.next()?)?;
    let size = hex(fields.next()?)?;
    let name = fields.next()?.trim();
    let end = start.checked_add(size)?;
    (size > 0 && !name.is_empty()).then_some((start, end, name))
}

/// The process's perf map, opened inside its root under the pid it knows itself by.
fn open(tgid: u32) -> Option<File> {
    let status = fs::read_to_string(format!("/proc/{tgid}/status")).ok()?;
    let own_pid = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.to_string();
    let root = super::proc_dir::first_showing(tgid, |dir| File::open(dir.join("root")).ok())?;
    open_in_root(&root, &format!("/tmp/perf-{own_pid}.map")).ok()
}

#[cfg(test)]
mod tests {
    use std::{io::Write, path::PathBuf};

    use super::*;

    #[test]
    fn parses_lines_and_refuses_the_rest() {
        assert_eq!(parse_line("7fbb44024300 378 JS:~hot_a /tmp/split.js:3:15"), Some((0x7fbb44024300, 0x7fbb44024678, "JS:~hot_a /tmp/split.js:3:15")));
        assert_eq!(parse_line("0x1000 0x10 py::f:/x.py"), Some((0x1000, 0x1010, "py::f:/x.py")));
        for bad in ["", "1000", "1000 10", "1000 10 ", "zz 10 f", "1000 0 f", "ffffffffffffffff 10 f"] {
            assert_eq!(parse_line(bad), None, "{bad:?}");
        }
    }

    /// A new temporary file, a writer to it, and a map that reads it.
    fn temp_map(name: &str) -> (PathBuf, File, PerfMap) {
        let path = std::env::temp_dir().join(format!("ember-{name}-{}", std::process::id()));
        let writer = File::create(&path).unwrap();
        let map = PerfMap { file: Some(File::open(&path).unwrap()), ..PerfMap::default() };
        (path, writer, map)
    }

    /// A map as a runtime writes it: appended in pieces (a line may be cut between two reads),
    /// with code recompiled over older code.
    #[test]
    fn reads_appended_lines_and_later_code_replaces_earlier() {
        let (path, mut writer, mut map) = temp_map("perf-map-test");
        writer.write_all(b"1000 100 old\n2000 10 whole\n3000 1").unwrap();
        assert_eq!(map.lookup(0, 0x1080).map(|s| s.name), Some("old".into()));
        assert_eq!(map.lookup(0, 0x3000), None, "a line not complete yet");
        writer.write_all(b"0 cut\n1040 20 new\n").unwrap();
        assert_eq!(map.lookup(0, 0x3005).map(|s| (s.start, s.name)), Some((0x3000, "cut".into())));
        assert_eq!(map.lookup(0, 0x1050).map(|s| (s.start, s.name)), Some((0x1040, "new".into())));
        assert_eq!(map.lookup(0, 0x1080), None, "the old function ends where the new one starts");
        assert_eq!(map.lookup(0, 0x1020).map(|s| s.name), Some("old".into()));
        assert_eq!(map.lookup(0, 0x2010), None, "past the end");
        // Rewritten from the start, as after an exec.
        File::create(&path).unwrap().write_all(b"5000 10 fresh\n").unwrap();
        assert_eq!(map.lookup(0, 0x5000).map(|s| s.name), Some("fresh".into()));
        assert_eq!(map.lookup(0, 0x2000), None, "the old code is forgotten");
        let _ = fs::remove_file(&path);
    }

    /// An earlier life keeps the names its runtime wrote: the file, rewritten by the pid's
    /// next life, is not read again, and a life that never opened it does not open it.
    #[test]
    fn a_frozen_map_keeps_its_life_names_and_opens_nothing() {
        let (path, mut writer, mut map) = temp_map("perf-map-frozen");
        writer.write_all(b"1000 100 old\n").unwrap();
        assert_eq!(map.lookup(0, 0x1000).map(|s| s.name), Some("old".into()));
        writer.write_all(b"2000 10 last\n").unwrap();
        map.freeze();
        assert_eq!(map.lookup(0, 0x2000).map(|s| s.name), Some("last".into()), "appended before the freeze");
        // Rewritten by the next life (shorter: a live map would start again from its start).
        File::create(&path).unwrap().write_all(b"3000 10 new\n").unwrap();
        assert_eq!(map.lookup(0, 0x3000), None, "the next life's code");
        assert_eq!(map.lookup(0, 0x1000).map(|s| s.name), Some("old".into()));
        let _ = fs::remove_file(&path);

        // This process's own perf map: found by a live map, not by a frozen one.
        let pid = std::process::id();
        let own = PathBuf::from(format!("/tmp/perf-{pid}.map"));
        fs::write(&own, "4000 10 next_life\n").unwrap();
        let live = PerfMap::default().lookup(pid, 0x4000).map(|s| s.name);
        let mut frozen = PerfMap::default();
        frozen.freeze();
        let unopened = frozen.lookup(pid, 0x4000);
        let _ = fs::remove_file(&own);
        assert_eq!(live, Some("next_life".into()));
        assert_eq!(unopened, None);
    }
}
