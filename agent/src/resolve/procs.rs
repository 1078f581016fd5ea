//! Process table: what userspace knows of each sampled process. Mappings are captured when the
//! kernel first announces a process (or after it execs), and every mapped binary is held open,
//! so a process that exits before the drain, or whose binary is deleted, still symbolizes.
use std::{
    collections::{HashMap, HashSet},
    fs::{self, File},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Arc, Weak},
    time::{Duration, Instant},
};

use super::{
    binary::{elf_facts, Binary, BinaryOpened, ElfFacts},
    code_areas::{self, CodeArea},
    life::Life,
    open::{MappedId, Unopened, open_mapped},
    perf_map::{JitSymbol, PerfMap},
    proc_dir,
    untrusted::{self, Refused},
    vdso,
};
use agent_common::{ExeImage, ExeKey};

use crate::{
    ops::{memory, metrics},
    unwind::{MappedFile, TableKey},
};

#[derive(Debug, Clone)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    pub target: MappingTarget,
    /// Anonymous code that the perf map shows to be CPython's trampolines: unwound by their
    /// own rule.
    python_trampolines: bool,
}

#[derive(Debug, Clone)]
pub enum MappingTarget {
    File(Arc<Binary>),
    /// Anonymous or special ([vdso], [anon], JIT code): kept by name only.
    Special(String),
}

#[derive(Debug)]
pub struct Process {
    /// Executable name (/proc/<pid>/comm of the main thread).
    pub name: String,
    mappings: Vec<Mapping>,
    /// Names of its JIT-compiled code, read when an address outside its files needs one.
    perf_map: PerfMap,
    /// Marked gone at a sweep (or, for an earlier life, when the next life was read), and
    /// forgotten at the next: one interval of grace for samples still in flight.
    pub exited: bool,
    /// Which life of its pid this is (`SampleKey::process_tag`), if the kernel announced it;
    /// None when read without an announcement (at start-up).
    tag: Option<u16>,
    /// Its mappings are all it maps: a static executable taken at its exec. Its first event
    /// then reads nothing (a dynamic one's reads the libraries mapped since).
    whole: bool,
    /// What the kernel told at this life's exec (`capture_exec`), kept when its mappings are
    /// read again.
    exec: Option<ExecCapture>,
}

/// A process's executable, as the kernel told at its exec.
#[derive(Clone, Debug)]
pub struct ExecCapture {
    pub exe: ExeKey,
    /// Its code in the process.
    pub code: MappedFile,
    /// Whether the exec program pointed the walker at the executable's template.
    pub from_template: bool,
}

/// A process captured since the last `take_captured`, with its file-backed executable
/// mappings, and its executable as told at its exec, if it was.
pub struct Captured {
    pub tgid: u32,
    pub files: Vec<MappedFile>,
    pub exec: Option<ExecCapture>,
}

impl Process {
    /// Marks the anonymous code that its perf map shows to be CPython's trampolines, so that
    /// walks go on through them (checked when captured, which is at its first sample, and
    /// when a trampoline shows in a stack). True if some were found that were not known.
    fn find_python_trampolines(&mut self, tgid: u32) -> bool {
        let mut found = false;
        // Only anonymous code: every process has [vsyscall], and most have no perf map.
        let anonymous = |m: &Mapping| matches!(&m.target, MappingTarget::Special(name) if name == "[anon]" || name.starts_with("[anon:"));
        for mapping in self.mappings.iter_mut().filter(|m| anonymous(m) && !m.python_trampolines) {
            if self.perf_map.any_named_in(tgid, mapping.start..mapping.end, |name| name.starts_with("py::")) {
                mapping.python_trampolines = true;
                found = true;
            }
        }
        found
    }
}

/// A mapping as the unwinder sees it, if it has a table: a file's, or CPython's trampolines.
fn mapped_file(m: &Mapping) -> Option<MappedFile> {
    match &m.target {
        MappingTarget::File(binary) => Some(MappedFile { start: m.start, end: m.end, file_offset: m.file_offset, key: binary.table_key(), path: binary.open_path() }),
        MappingTarget::Special(_) if m.python_trampolines => Some(MappedFile {
            start: m.start,
            end: m.end,
            file_offset: 0,
            key: TableKey::PythonTrampolines(m.end - m.start),
            path: PathBuf::new(),
        }),
        MappingTarget::Special(_) => None,
    }
}

/// Which of a pid's lives (`ProcessTable::which`).
#[derive(Clone, Copy)]
enum Which {
    Latest,
    Earlier(usize),
}

/// Where a user address points.
#[derive(Debug, Clone)]
pub enum UserAddress {
    File { binary: Arc<Binary>, file_offset: u64 },
    Special { name: String, offset: u64 },
    /// JIT-compiled code, named by the process's perf map.
    Jit(JitSymbol),
    /// No known mapping covers the address (or the process was never captured).
    Unmapped(u64),
}


/// Every process running now, by tgid.
pub fn running_processes() -> Vec<u32> {
    let entries = fs::read_dir("/proc").into_iter().flatten().flatten();
    entries.filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
}

#[derive(Default)]
pub struct ProcessTable {
    /// Each pid's latest life.
    processes: HashMap<u32, Process>,
    /// Earlier lives of pids whose next life (after an exec, or a new process that took the
    /// pid) has been read, oldest first: their samples may still be drained.
    earlier: HashMap<u32, Vec<Process>>,
    /// Binaries by (device, inode), shared between processes.
    binaries: HashMap<(u64, u64), Weak<Binary>>,
    /// The same binaries by the identity maps lines give them, where it is their own (not on
    /// overlayfs or btrfs, whose maps show another device): found again without opening
    /// anything. An inode cannot be reused while the binary holds it open.
    by_mapped: HashMap<MappedId, Weak<Binary>>,
    /// Binaries of processes that exited, kept open a while after (KEEP_IDLE, MAX_IDLE of
    /// them): one that short processes run again and again (shells, cron jobs, probes) is
    /// opened, examined and captured from the exec once, not once per interval.
    idle: HashMap<(u64, u64), (Arc<Binary>, Instant)>,
    /// Sampled processes of this interval whose mappings were never read: they exited first,
    /// their frames stay unnamed, and they are counted. (A process that exited unread and
    /// unsampled lost nothing.)
    unread: HashSet<u32>,
    /// Processes captured since the last `take_captured`: their unwind mappings are due.
    captured: Vec<u32>,
    /// Mapped files refused as hostile (`untrusted`): not tried again while mapped.
    refused: HashSet<MappedId>,
    opened: Option<BinaryOpened>,
}

/// Refused files remembered at most.
const MAX_REFUSED: usize = 4096;
/// How long, and how many, binaries no process maps stay open. Each holds a descriptor (and,
/// if deleted, its disk space).
const KEEP_IDLE: Duration = Duration::from_secs(300);
const MAX_IDLE: usize = 256;

impl ProcessTable {
    pub fn new(opened: Option<BinaryOpened>) -> ProcessTable {
        ProcessTable { opened, ..ProcessTable::default() }
    }

    /// Reads (or re-reads) a process's mappings, as those of `life` (None: a process not
    /// announced, read at start-up), `at_exec` if it has just exec'd. Returns false if it is
    /// gone.
    pub fn capture(&mut self, tgid: u32, life: Option<Life>, at_exec: bool) -> bool {
        // A process that has exited but is not reaped yet reads as no mappings at all: that
        // is not its mappings, and must not replace the ones captured while it ran (it may be
        // announced again while it exits).
        // A file already open needs no path: only its identity is asked for.
        let known = |file: &MappedId| self.by_mapped.get(file).is_some_and(|b| b.strong_count() > 0);
        let shown = proc_dir::first_showing(tgid, |dir| {
            let areas = code_areas::read(dir, |file| !known(file)).ok()?;
            (!areas.is_empty()).then(|| (dir.to_path_buf(), areas))
        });
        let Some((dir, areas)) = shown else { return false };
        // Announced, then gone before it was read, and its pid taken by a new process: these
        // are not its mappings.
        if life.is_some_and(|life| !life.still_holds(tgid)) {
            return false;
        }
        let name = untrusted::read_proc(Path::new(&format!("/proc/{tgid}/comm")), 64).unwrap_or_default().trim().to_string();
        let mappings: Vec<Mapping> = areas.into_iter().map(|area| self.mapping(&dir, area)).collect();
        // Read at exec, a static executable (and the vDSO) is all it will map: its first
        // sample needs no second read.
        let whole = at_exec && mappings.iter().all(|m| matches!(&m.target, MappingTarget::File(b) if !b.loads_libraries));
        self.install(tgid, life.map(|life| life.tag), name, mappings, whole, None);
        metrics::add("ember_processes_captured_total", &[("from", "proc")], 1.0);
        true
    }

    /// Takes a process's mappings at its exec from what the kernel told of it, reading
    /// nothing: its executable's code, if another process has mapped that file before (it is
    /// open, and its table loaded). Its libraries are read when it is first sampled (it is
    /// announced again then). False if the executable is not known: read /proc then.
    /// `from_template`: the exec program pointed the walker at the executable's template.
    pub fn capture_exec(&mut self, tgid: u32, tag: u16, exe: &ExeImage, comm: &[u8], from_template: bool) -> bool {
        let file = MappedId { major: exe.dev >> 20, minor: exe.dev & 0xf_ffff, inode: exe.inode };
        let Some(binary) = self.by_mapped.get(&file).and_then(Weak::upgrade) else { return false };
        let Some((_, file_offset)) = binary.code_segment.filter(|_| exe.code_start < exe.code_end) else { return false };
        let name = String::from_utf8_lossy(comm.split(|&b| b == 0).next().unwrap_or_default()).into_owned();
        // The kernel's start_code is where the lowest executable segment's first byte went.
        let whole = !binary.loads_libraries;
        let code = Mapping { start: exe.code_start, end: exe.code_end, file_offset, target: MappingTarget::File(binary), python_trampolines: false };
        let Some(code_file) = mapped_file(&code) else { return false };
        let exec = ExecCapture { exe: exe.key(), code: code_file, from_template };
        self.install(tgid, Some(tag), name, vec![code], whole, Some(exec));
        metrics::add("ember_processes_captured_total", &[("from", "exec")], 1.0);
        if from_template {
            metrics::add("ember_exec_templates_used_total", &[], 1.0);
        }
        true
    }

    /// Makes `mappings` those of `tgid`'s life `tag` (None: read at start-up, unannounced),
    /// `whole` if they are all it maps.
    fn install(&mut self, tgid: u32, tag: Option<u16>, name: String, mappings: Vec<Mapping>, whole: bool, mut exec: Option<ExecCapture>) {
        // Read after all (a read can fail while the process execs): not a loss.
        self.unread.remove(&tgid);
        let perf_map = match self.processes.remove(&tgid) {
            // The same life read again (it mapped code since), or the first announcement of
            // one read at start-up: its perf map, read so far, stays, and so does what the
            // kernel told at its exec.
            Some(same) if same.tag == tag || same.tag.is_none() => {
                exec = exec.or(same.exec.filter(|_| same.tag == tag));
                same.perf_map
            }
            Some(mut earlier) => {
                earlier.exited = false;
                earlier.perf_map.freeze(tgid);
                self.earlier.entry(tgid).or_default().push(earlier);
                PerfMap::default()
            }
            None => PerfMap::default(),
        };
        let mut process = Process { name, mappings, perf_map, exited: false, tag, whole, exec };
        process.find_python_trampolines(tgid);
        self.processes.insert(tgid, process);
        self.captured.push(tgid);
    }

    /// Whether `tgid`'s life `tag` was taken whole: nothing is mapped that was not read.
    pub fn whole(&self, tgid: u32, tag: u16) -> bool {
        self.processes.get(&tgid).is_some_and(|p| p.tag == Some(tag) && p.whole)
    }

    /// Whether a code mapping of `tgid`'s life `tag` read so far holds `addr`. (Not its data
    /// mappings: a library loaded later may take the place of one, as the first dlopen takes
    /// that of ld.so.cache, which the loader unmaps once the program starts.)
    pub fn holds(&self, tgid: u32, tag: u16, addr: u64) -> bool {
        self.lookup(tgid, tag, addr).is_some()
    }

    /// Processes captured since the last call, each once, in the order they were last
    /// captured in.
    pub fn take_captured(&mut self) -> Vec<Captured> {
        let mut captured = std::mem::take(&mut self.captured);
        let mut seen = HashSet::new();
        captured.reverse();
        captured.retain(|tgid| seen.insert(*tgid));
        captured.reverse();
        captured
            .into_iter()
            .filter_map(|tgid| {
                let files = self.mapped_files(tgid)?;
                // The template the kernel pointed it at is told once: a load after this one
                // is userspace's own.
                let exec = self.processes.get_mut(&tgid)?.exec.as_mut().map(|exec| {
                    let told = exec.clone();
                    exec.from_template = false;
                    told
                });
                Some(Captured { tgid, files, exec })
            })
            .collect()
    }

    fn mapped_files(&self, tgid: u32) -> Option<Vec<MappedFile>> {
        Some(self.processes.get(&tgid)?.mappings.iter().filter_map(mapped_file).collect())
    }

    /// Makes the processes that map one of `tables` due for loading again (`take_captured`).
    pub fn reload_mapping(&mut self, tables: &[TableKey]) {
        for (tgid, process) in &self.processes {
            let maps = |m: &Mapping| matches!(&m.target, MappingTarget::File(binary) if tables.contains(&binary.table_key()));
            if !process.exited && process.mappings.iter().any(maps) && !self.captured.contains(tgid) {
                self.captured.push(*tgid);
            }
        }
    }

    /// Unwind tables some known process still maps. (Not those of binaries only kept open
    /// after their processes, `idle`: their tables are idle, to be evicted when room is needed.)
    pub fn live_tables(&self) -> HashSet<TableKey> {
        let lives = self.processes.values().chain(self.earlier.values().flatten());
        let binaries = lives.flat_map(|p| &p.mappings).filter_map(|m| match &m.target {
            MappingTarget::File(binary) => Some(binary.table_key()),
            MappingTarget::Special(_) => None,
        });
        binaries.collect()
    }

    /// An executable mapping (only code can appear in a stack), read from /proc directory `dir`.
    fn mapping(&mut self, dir: &Path, area: CodeArea) -> Mapping {
        let (start, end, file_offset) = (area.start, area.end, area.file_offset);
        let path = area.name.as_deref().unwrap_or_default();
        let target = match area.file {
            None if path == "[vdso]" => {
                let vdso = vdso::image(end - start).and_then(|image| self.shared(path, (image, false), |image| Ok(elf_facts(image))).ok());
                vdso.map_or_else(|| MappingTarget::Special(path.to_string()), MappingTarget::File)
            }
            None => MappingTarget::Special(if path.is_empty() { "[anon]".into() } else { path.to_string() }),
            Some(mapped) => match self.mapped_binary(dir, &area.range(), path, mapped) {
                Some(binary) => MappingTarget::File(binary),
                None => MappingTarget::Special(path.to_string()),
            },
        };
        Mapping { start, end, file_offset, target, python_trampolines: false }
    }

    /// The binary a maps line names: one already open, or the file opened now.
    fn mapped_binary(&mut self, dir: &Path, range: &str, path: &str, mapped: MappedId) -> Option<Arc<Binary>> {
        if let Some(binary) = self.by_mapped.get(&mapped).and_then(Weak::upgrade) {
            return Some(binary);
        }
        if self.refused.contains(&mapped) {
            return None;
        }
        let binary = self.open_binary(dir, range, path, mapped)?;
        if binary.id == (libc::makedev(mapped.major, mapped.minor), mapped.inode) {
            self.by_mapped.insert(mapped, Arc::downgrade(&binary));
        }
        Some(binary)
    }

    /// Opens the mapped file (see `open`) on a worker and, if it is new, reads its build id (on
    /// a worker too if a process serves the file), or counts why it could not.
    fn open_binary(&mut self, dir: &Path, range: &str, path: &str, mapped: MappedId) -> Option<Arc<Binary>> {
        let (dir_owned, range_owned, path_owned) = (dir.to_path_buf(), range.to_string(), path.to_string());
        let opened = untrusted::with_deadline(move || {
            let file = open_mapped(&dir_owned, &range_owned, &path_owned, mapped)?;
            let served = untrusted::served_by_a_process(&file);
            Ok((file, served))
        });
        let binary = opened.unwrap_or_else(|refused| Err(Unopened::Refused(refused))).and_then(|(file, served)| {
            let read_elf = |file: &File| {
                let file = file.try_clone()?;
                untrusted::read_with(served, move || elf_facts(&file))
            };
            self.shared(path.trim_end_matches(" (deleted)"), (file, served), read_elf).map_err(Unopened::Refused)
        });
        match binary {
            Ok(binary) => Some(binary),
            Err(Unopened::Exited) => None,
            Err(why) => {
                tracing::debug!(process = %dir.display(), path, reason = why.reason(), "mapped file not opened: its frames keep module+offset");
                metrics::add("ember_binaries_unopened_total", &[("reason", why.reason())], 1.0);
                if let Unopened::Refused(refused) = why {
                    if refused.is_hostile() {
                        self.refused.insert(mapped);
                    }
                }
                None
            }
        }
    }

    /// The binary `file` is, shared with every process that maps the same file; a new one's
    /// headers are read with `read_elf`.
    fn shared(&mut self, path: &str, (file, served): (File, bool), read_elf: impl FnOnce(&File) -> Result<ElfFacts, Refused>) -> Result<Arc<Binary>, Refused> {
        let meta = file.metadata()?;
        let id = (meta.dev(), meta.ino());
        if let Some(binary) = self.binaries.get(&id).and_then(Weak::upgrade) {
            return Ok(binary);
        }
        let ElfFacts { build_id, code_segment, loads_libraries } = read_elf(&file)?;
        let binary = Arc::new(Binary { path: path.to_string(), build_id, code_segment, loads_libraries, id, size: meta.len(), file, served });
        self.binaries.insert(id, Arc::downgrade(&binary));
        if let Some(opened) = self.opened.as_mut() {
            opened(&binary);
        }
        Ok(binary)
    }

    /// Where a process (its latest life) maps `file_offset` of `binary`, if it maps it as code.
    pub fn address_of(&self, tgid: u32, binary: &Binary, file_offset: u64) -> Option<u64> {
        let process = self.processes.get(&tgid)?;
        process.mappings.iter().find_map(|m| match &m.target {
            MappingTarget::File(file) if file.id == binary.id && (m.file_offset..m.file_offset + (m.end - m.start)).contains(&file_offset) => {
                Some(m.start + (file_offset - m.file_offset))
            }
            _ => None,
        })
    }

    /// The files a process (its latest life) maps code from, each once, by address: its
    /// executable first where it is mapped lowest, as usual.
    pub fn code_files(&self, tgid: u32) -> Vec<Arc<Binary>> {
        let Some(process) = self.processes.get(&tgid) else { return Vec::new() };
        let mut files: Vec<Arc<Binary>> = Vec::new();
        for mapping in &process.mappings {
            if let MappingTarget::File(binary) = &mapping.target {
                if !files.iter().any(|f| f.id == binary.id) {
                    files.push(binary.clone());
                }
            }
        }
        files
    }

    /// The files of a process (its latest life) that may hold a CPython interpreter, by
    /// name: each, where it is mapped, and from which file offset.
    pub fn interpreter_candidates(&self, tgid: u32) -> Vec<(Arc<Binary>, u64, u64)> {
        let Some(process) = self.processes.get(&tgid) else { return Vec::new() };
        let candidates = process.mappings.iter().filter_map(|m| match &m.target {
            MappingTarget::File(binary) if binary.name().starts_with("python") || binary.name().starts_with("libpython") => {
                Some((binary.clone(), m.start, m.file_offset))
            }
            _ => None,
        });
        candidates.collect()
    }

    /// How many processes exited before their mappings could be read, since the last call.
    pub fn take_unread(&mut self) -> u64 {
        std::mem::take(&mut self.unread).len() as u64
    }

    pub fn len(&self) -> usize {
        self.processes.len()
    }

    /// The life of `tgid` that samples tagged `tag` were taken in.
    pub fn get(&self, tgid: u32, tag: u16) -> Option<&Process> {
        match self.which(tgid, tag)? {
            Which::Latest => self.processes.get(&tgid),
            Which::Earlier(i) => self.earlier.get(&tgid)?.get(i),
        }
    }

    fn get_mut(&mut self, tgid: u32, tag: u16) -> Option<&mut Process> {
        match self.which(tgid, tag)? {
            Which::Latest => self.processes.get_mut(&tgid),
            Which::Earlier(i) => self.earlier.get_mut(&tgid)?.get_mut(i),
        }
    }

    /// Where the life of `tgid` tagged `tag` is: the one announced with that tag, else the
    /// latest one read without an announcement. None if that life was never read (counted
    /// with the processes that exited unread).
    fn which(&self, tgid: u32, tag: u16) -> Option<Which> {
        let earlier = self.earlier.get(&tgid).map_or(&[][..], Vec::as_slice);
        let lives = || {
            let latest = self.processes.get(&tgid).map(|p| (Which::Latest, p));
            latest.into_iter().chain(earlier.iter().enumerate().rev().map(|(i, p)| (Which::Earlier(i), p)))
        };
        let found = lives().find(|(_, p)| p.tag == Some(tag)).or_else(|| lives().find(|(_, p)| p.tag.is_none()));
        found.map(|(which, _)| which)
    }

    /// Maps a user address of `tgid`'s life `tag` to a binary and file offset. A miss in a
    /// live process's latest life re-reads its mappings once (it may have loaded a library
    /// since it was captured).
    pub fn resolve(&mut self, tgid: u32, tag: u16, addr: u64) -> UserAddress {
        let mut found = self.lookup(tgid, tag, addr);
        if found.is_none() {
            let reread = match (self.processes.get(&tgid), self.which(tgid, tag)) {
                // Never read (its announcement was lost): read now.
                (None, _) => Some(None),
                (Some(latest), Some(Which::Latest)) if !latest.exited => Some(latest.tag.map(Life::unknown)),
                (Some(_), None) => {
                    self.unread.insert(tgid); // a life never read
                    None
                }
                _ => None,
            };
            if let Some(life) = reread {
                if self.capture(tgid, life, false) {
                    found = self.lookup(tgid, tag, addr);
                } else if self.which(tgid, tag).is_none() {
                    self.unread.insert(tgid);
                }
            }
        }
        match found {
            Some(file @ UserAddress::File { .. }) => file,
            // Code outside the process's files may be JIT code its runtime named.
            other => match self.get_mut(tgid, tag).and_then(|p| p.perf_map.lookup(tgid, addr)) {
                Some(symbol) => {
                    let process = self.get_mut(tgid, tag).expect("looked up above");
                    if symbol.name.starts_with("py::") && process.find_python_trampolines(tgid) && !self.captured.contains(&tgid) {
                        self.captured.push(tgid); // due for loading again, with them
                    }
                    UserAddress::Jit(symbol)
                }
                None => other.unwrap_or(UserAddress::Unmapped(addr)),
            },
        }
    }

    fn lookup(&self, tgid: u32, tag: u16, addr: u64) -> Option<UserAddress> {
        let mapping = self.get(tgid, tag)?.mappings.iter().find(|m| m.start <= addr && addr < m.end)?;
        let offset = addr - mapping.start + mapping.file_offset;
        Some(match &mapping.target {
            MappingTarget::File(binary) => UserAddress::File { binary: binary.clone(), file_offset: offset },
            MappingTarget::Special(name) => UserAddress::Special { name: name.clone(), offset: addr - mapping.start },
        })
    }

    /// Marks processes that are gone, and forgets those that were already marked at the
    /// previous sweep (one interval of grace for samples still in flight). Returns those.
    pub fn sweep(&mut self) -> Vec<u32> {
        // Only sweeps take entries out: what the tables hold now is the most since the last.
        let peaks = (self.processes.len(), self.earlier.len(), self.binaries.len(), self.by_mapped.len());
        let forgotten: Vec<u32> = self.processes.iter().filter(|(_, p)| p.exited).map(|(tgid, _)| *tgid).collect();
        let now = Instant::now();
        for mapping in self.processes.values().filter(|p| p.exited).flat_map(|p| &p.mappings) {
            if let MappingTarget::File(binary) = &mapping.target {
                self.idle.insert(binary.id, (binary.clone(), now));
            }
        }
        self.idle.retain(|_, (_, since)| now.duration_since(*since) < KEEP_IDLE);
        if self.idle.len() > MAX_IDLE {
            let mut by_age: Vec<((u64, u64), Instant)> = self.idle.iter().map(|(id, (_, since))| (*id, *since)).collect();
            by_age.sort_by_key(|(_, since)| *since);
            by_age.iter().take(self.idle.len() - MAX_IDLE).for_each(|(id, _)| drop(self.idle.remove(id)));
        }
        self.processes.retain(|_, p| !p.exited);
        self.earlier.retain(|_, lives| {
            lives.retain_mut(|p| !std::mem::replace(&mut p.exited, true));
            !lives.is_empty()
        });
        for (tgid, process) in self.processes.iter_mut() {
            process.exited = !fs::exists(format!("/proc/{tgid}")).unwrap_or(true);
        }
        self.binaries.retain(|_, b| b.strong_count() > 0);
        self.by_mapped.retain(|_, b| b.strong_count() > 0);
        if self.refused.len() > MAX_REFUSED {
            self.refused.clear(); // tried once more each
        }
        memory::fit(&mut self.processes, peaks.0);
        memory::fit(&mut self.earlier, peaks.1);
        memory::fit(&mut self.binaries, peaks.2);
        memory::fit(&mut self.by_mapped, peaks.3);
        forgotten
    }
}
