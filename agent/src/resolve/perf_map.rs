//! JIT code named from perf maps. Runtimes that compile code while they run (Node with
//! `--perf-basic-prof`, Python 3.12+ with `-X perf`, the JVM through `jcmd Compiler.perfmap`)
//! append one "START SIZE NAME" line (hex, hex, text) per compiled function to
//! `/tmp/perf-<pid>.map`, where `<pid>` is the pid the process sees (in its own pid namespace)
//! and `/tmp` is its own. The file is opened once, inside the process's root, and kept open, so
//! it can still be read after the process exits; it is read on from where the last read ended,
//! at most once an interval. The file is the process's to shape (see `untrusted`).
use std::{
    collections::BTreeMap,
    fs::File,
    ops::Range,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use super::{open::open_in_root, untrusted::{self, Refused}};
use crate::ops::metrics;

/// Functions kept per process: about 100 bytes each, so a runtime that compiles without end
/// costs at most about 10 MB. Past it, new functions are counted and left unnamed.
const MAX_FUNCTIONS: usize = 100_000;
/// How often a process without a perf map (most have none) is looked at again.
const RETRY_OPEN: Duration = Duration::from_secs(1);
/// Longer names are cut (a V8 name holds the script's path).
const MAX_NAME: usize = 512;
/// Longer lines are skipped (no runtime writes one; a file without newlines is one line).
const MAX_LINE: usize = 4096;
/// Bytes read from one map at a time (what is left is read at the next interval).
const MAX_READ: usize = 4 << 20;

/// A JIT-compiled function: where it starts and its name as the runtime wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitSymbol {
    pub start: u64,
    pub name: Arc<str>,
}

#[derive(Debug, Default)]
pub struct PerfMap {
    file: Option<Arc<File>>,
    /// Whether a process serves the file (`untrusted::served_by_a_process`).
    served: bool,
    tried: Option<Instant>,
    /// The interval it was last read in (`untrusted::interval`).
    read_in: Option<u64>,
    /// Bytes of the file read so far, and the start of a line not yet complete (or, past
    /// `MAX_LINE`, skipped to its end).
    read: u64,
    partial: Vec<u8>,
    skipping: bool,
    /// Shown hostile (not a regular file, a read that did not return): never read again.
    refused: bool,
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
    /// appended is read one last time, and its names are kept for its samples. A life that
    /// looked for its map and found none yet (its code was seen before the runtime wrote
    /// the file) looks once more: this is its last chance.
    pub fn freeze(&mut self, tgid: u32) {
        if self.file.is_none() && self.tried.is_some() && !self.refused {
            match open(tgid) {
                Ok((file, served)) => (self.file, self.served) = (Some(Arc::new(file)), served),
                Err(refused) => self.refuse(refused, tgid),
            }
        }
        self.frozen = true;
        let _ = self.read_new(); // (a refused map has no file left to read)
    }

    fn open_and_read(&mut self, tgid: u32) {
        if self.frozen || self.refused || self.read_in == Some(untrusted::interval()) {
            return;
        }
        if self.file.is_none() && self.tried.is_none_or(|t| t.elapsed() >= RETRY_OPEN) {
            self.tried = Some(Instant::now());
            match open(tgid) {
                Ok((file, served)) => (self.file, self.served) = (Some(Arc::new(file)), served),
                Err(refused) => self.refuse(refused, tgid),
            }
        }
        if let Err(refused) = self.read_new() {
            self.refuse(refused, tgid);
        }
    }

    fn refuse(&mut self, refused: Refused, tgid: u32) {
        if refused.is_hostile() {
            refused.count("perf_map", tgid);
            self.refused = true;
            self.file = None;
        }
    }

    fn find(&self, addr: u64) -> Option<JitSymbol> {
        let (&start, (end, name)) = self.functions.range(..=addr).next_back()?;
        (addr < *end).then(|| JitSymbol { start, name: name.clone() })
    }

    /// Reads what was appended since the last read (on a worker if the process serves the file
    /// itself), within this interval's cap.
    fn read_new(&mut self) -> Result<(), Refused> {
        let Some(file) = self.file.clone() else { return Ok(()) };
        self.read_in = Some(untrusted::interval());
        let start = self.read;
        let cap = untrusted::take_perf_map_bytes(MAX_READ);
        let (size, bytes) = untrusted::read_with(self.served, move || untrusted::read_from(&file, start, cap))??;
        if size < self.read {
            // Rewritten from the start (the pid exec'd another runtime): forget the old code,
            // unless the map is frozen, when the rewrite is the next life's.
            if self.frozen {
                return Ok(());
            }
            (self.read, self.skipping) = (0, false);
            self.partial.clear();
            self.functions.clear();
            return self.read_new();
        }
        self.read += bytes.len() as u64;
        self.parse(&bytes);
        Ok(())
    }

    /// Takes the complete lines of `bytes` (after what was left of the last read), keeps the
    /// rest for the next read unless it is already too long to be a line.
    fn parse(&mut self, bytes: &[u8]) {
        let mut bytes = bytes;
        if self.skipping {
            let Some(end) = bytes.iter().position(|&b| b == b'\n') else { return };
            (bytes, self.skipping) = (&bytes[end + 1..], false);
        }
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let mut lines = std::mem::take(&mut self.partial);
        lines.extend_from_slice(&bytes[..complete]);
        let rest = &bytes[complete..];
        if complete == 0 {
            // No line ended: what was left and this read are one unfinished line.
            (self.partial, lines) = (lines, Vec::new());
        }
        if self.partial.len() + rest.len() > MAX_LINE {
            self.partial.clear();
            self.skipping = true;
            metrics::add("ember_untrusted_reads_capped_total", &[("file", "perf_map_line")], 1.0);
        } else {
            self.partial.extend_from_slice(rest);
        }
        let mut dropped = 0;
        for line in lines.split(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(line);
            let Some((start, end, name)) = parse_line(&line) else { continue };
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

/// The pid a process knows itself by (the last of /proc/<pid>/status's NSpid: its own pid
/// namespace's), which names its perf map.
pub fn own_pid(status: &str) -> Option<u32> {
    status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}

/// The process's perf map, opened inside its root under the pid it knows itself by, on a
/// worker (the process may serve its /tmp itself), and whether a process serves it.
fn open(tgid: u32) -> Result<(File, bool), Refused> {
    let missing = Refused::Failed(std::io::ErrorKind::NotFound);
    let status = untrusted::read_proc(Path::new(&format!("/proc/{tgid}/status")), 64 << 10)?;
    let own_pid = own_pid(&status).ok_or(missing)?;
    let root = super::proc_dir::first_showing(tgid, |dir| File::open(dir.join("root")).ok()).ok_or(missing)?;
    let path = format!("/tmp/perf-{own_pid}.map");
    untrusted::with_deadline(move || {
        let file = untrusted::regular(open_in_root(&root, &path)?, u64::MAX)?;
        let served = untrusted::served_by_a_process(&file);
        Ok((file, served))
    })?
}

#[cfg(fuzzing)]
impl PerfMap {
    /// The functions (start, end) a map holds once `reads` were read from it, in that order.
    pub fn functions_after(reads: &[&[u8]]) -> Vec<(u64, u64)> {
        let mut map = PerfMap::default();
        for bytes in reads {
            map.parse(bytes);
        }
        map.functions.iter().map(|(&start, &(end, _))| (start, end)).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, io::Write, path::PathBuf};

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
        let map = PerfMap { file: Some(Arc::new(File::open(&path).unwrap())), ..PerfMap::default() };
        (path, writer, map)
    }

    /// A drain: a map is read again at most once an interval.
    fn drained() {
        untrusted::new_interval();
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
        assert_eq!(map.lookup(0, 0x3005), None, "read once an interval");
        drained();
        assert_eq!(map.lookup(0, 0x3005).map(|s| (s.start, s.name)), Some((0x3000, "cut".into())));
        assert_eq!(map.lookup(0, 0x1050).map(|s| (s.start, s.name)), Some((0x1040, "new".into())));
        assert_eq!(map.lookup(0, 0x1080), None, "the old function ends where the new one starts");
        assert_eq!(map.lookup(0, 0x1020).map(|s| s.name), Some("old".into()));
        assert_eq!(map.lookup(0, 0x2010), None, "past the end");
        // Rewritten from the start, as after an exec.
        File::create(&path).unwrap().write_all(b"5000 10 fresh\n").unwrap();
        drained();
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
        drained();
        map.freeze(0);
        assert_eq!(map.lookup(0, 0x2000).map(|s| s.name), Some("last".into()), "appended before the freeze");
        // Rewritten by the next life (shorter: a live map would start again from its start).
        File::create(&path).unwrap().write_all(b"3000 10 new\n").unwrap();
        drained();
        assert_eq!(map.lookup(0, 0x3000), None, "the next life's code");
        assert_eq!(map.lookup(0, 0x1000).map(|s| s.name), Some("old".into()));
        let _ = fs::remove_file(&path);

        // This process's own perf map: found by a live map, not by a frozen one.
        let pid = std::process::id();
        let own = PathBuf::from(format!("/tmp/perf-{pid}.map"));
        fs::write(&own, "4000 10 next_life\n").unwrap();
        let live = PerfMap::default().lookup(pid, 0x4000).map(|s| s.name);
        let mut frozen = PerfMap::default();
        frozen.freeze(pid);
        let unopened = frozen.lookup(pid, 0x4000);
        let _ = fs::remove_file(&own);
        assert_eq!(live, Some("next_life".into()));
        assert_eq!(unopened, None);
    }

    /// A life whose code was seen before its runtime wrote the map (it looked, and found no
    /// file) looks once more when its next life is read, however soon after.
    #[test]
    fn a_map_written_after_the_first_look_is_read_when_the_life_ends() {
        // A process of its own: the other tests use this one's map.
        let mut runtime = std::process::Command::new("sleep").arg("10").spawn().unwrap();
        let pid = runtime.id();
        let path = PathBuf::from(format!("/tmp/perf-{pid}.map"));
        let mut map = PerfMap::default();
        let before = map.lookup(pid, 0x6000);
        fs::write(&path, "6000 10 written_late\n").unwrap();
        map.freeze(pid);
        let found = map.lookup(pid, 0x6000).map(|s| s.name);
        let _ = fs::remove_file(&path);
        let _ = runtime.kill();
        let _ = runtime.wait();
        assert_eq!(before, None, "no map yet");
        assert_eq!(found, Some("written_late".into()));
    }

    /// A line too long to be one is skipped, in whichever read it ends, and the lines after
    /// it are read; a map without newlines is read in bounded pieces and keeps nothing.
    #[test]
    fn lines_past_the_longest_are_skipped_and_reads_are_bounded() {
        let (path, mut writer, mut map) = temp_map("perf-map-long");
        writer.write_all(b"1000 10 before\n2000 10 ").unwrap();
        writer.write_all(&vec![b'x'; MAX_LINE]).unwrap();
        assert_eq!(map.lookup(0, 0x1000).map(|s| s.name), Some("before".into()));
        assert!(map.partial.is_empty() && map.skipping, "the long line is dropped as it is read");
        writer.write_all(b"xxx\n3000 10 after\n").unwrap();
        drained();
        assert_eq!(map.lookup(0, 0x3000).map(|s| s.name), Some("after".into()));
        assert_eq!(map.lookup(0, 0x2000), None);
        let _ = fs::remove_file(&path);

        let (path, writer, mut map) = temp_map("perf-map-sparse");
        writer.set_len(20 << 30).unwrap();
        for _ in 0..3 {
            drained();
            assert_eq!(map.lookup(0, 0x1000), None);
            assert!(map.partial.len() <= MAX_LINE);
        }
        assert_eq!(map.read, 3 * MAX_READ as u64, "one bounded read an interval");
        let _ = fs::remove_file(&path);
    }

    /// A process's perf map that is a FIFO is refused at once, and never opened again.
    #[test]
    fn a_perf_map_that_is_a_fifo_is_refused() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let fifo = PathBuf::from(format!("/tmp/perf-{}.map", child.id()));
        let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0);
        let started = Instant::now();
        let mut map = PerfMap::default();
        let found = map.lookup(child.id(), 0x1000);
        let (refused, waited) = (map.refused, started.elapsed());
        let _ = fs::remove_file(&fifo);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found, None);
        assert!(refused, "a FIFO is not read");
        assert!(waited < Duration::from_millis(400), "refused in {waited:?}");
    }
}
