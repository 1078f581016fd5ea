//! Loads unwind tables into the kernel for the processes the resolve stage captures. A table
//! is built once per executable (by build id, else by device and inode), whatever number of
//! processes map it. Tables share a fixed row budget (the kernel's arrays are preallocated at
//! that size): a table no process maps any more stays loaded, idle, until its space is needed,
//! so that a binary run again and again (cron jobs, shells, health checks) is parsed once. A
//! table that does not fit even after the idle ones are evicted is left out, and its code is
//! walked by frame pointers (counted in metrics) until room for it appears: then the processes
//! that map it are loaded again, with it.
//!
//! Processes whose mappings are the same (a server's workers, forked from one parent) share
//! one copy of them in the kernel, and with it the rows the walker keeps per CPU: two such
//! processes taking turns on a CPU then find each other's rows. So do processes that map
//! only their executable, taken at exec, wherever its code went: their copy is the
//! executable's template, at the addresses of the first such process, and each is slid to
//! it. While a process the agent knows maps the executable's table, the exec program points
//! every new process of it at the template itself, and userspace hears of it without being
//! woken: a host that starts many short processes costs no wake-up or map write per process.
use std::{collections::HashMap, path::PathBuf, sync::Arc, time::Instant};

use agent_common::{ExeKey, ExeTemplate, ExecMapping, ProcessMappings, PythonProcess, MAX_MAPPINGS};
use anyhow::{Context as _, Result};

use super::{
    compact::{CompactTable, Placement},
    space::Space,
    table_of_file, UnwindTable,
};
use crate::{
    kernel::UnwindMaps,
    ops::{memory, metrics},
};

/// What identifies an executable's table across processes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TableKey {
    BuildId(String),
    /// (device, inode), for files without a build id.
    File(u64, u64),
    /// An anonymous mapping of this size filled with CPython's perf trampolines.
    PythonTrampolines(u64),
}

/// An executable mapping of a process that has a table: a file's, or CPython's trampolines.
#[derive(Clone, Debug)]
pub struct MappedFile {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    pub key: TableKey,
    /// A path that opens the mapped file from the agent (empty for trampolines).
    pub path: PathBuf,
}

enum Table {
    /// In the kernel: `rows` rows from `first_row`, `pages` page index entries from
    /// `first_page`. `idle_since`: the interval (`Unwinder::intervals`) from which no process
    /// maps it.
    Loaded { first_row: u32, rows: u32, first_page: u32, pages: u32, placement: Placement, idle_since: Option<u64> },
    /// Walked by frame pointers: the file has no usable table (`needs` is None), or its table
    /// of `needs` (rows, page index entries) did not fit in the `room` there was.
    FramePointers { needs: Option<(u32, u32)>, room: (u32, u32) },
}

pub struct Unwinder {
    maps: UnwindMaps,
    rows: Space,
    pages: Space,
    tables: HashMap<TableKey, Table>,
    /// Slots of the mapping array, each range holding the mappings of one layout.
    slots: Space,
    layouts: HashMap<Layout, Shared>,
    /// Each loaded process's layout.
    processes: HashMap<u32, Layout>,
    /// Executables whose new processes the exec program points at a layout (each holds one
    /// of the layout's processes).
    templates: HashMap<ExeKey, Template>,
    /// The most `processes` and `layouts` held since the last `retain` (exited processes
    /// are forgotten just before it).
    peaks: (usize, usize),
    /// The last `ProcessMappings::generation` handed out.
    generation: u32,
    /// Intervals ended (`retain` calls).
    intervals: u64,
}

/// A process's executable mappings with tables, as the walker sees them, sorted by address.
/// Equal layouts unwind every pc alike: they name the same tables at the same addresses.
type Layout = Arc<[ExecMapping]>;

/// An executable's template: the layout of its first process taken at exec, whose code
/// started at `code_start`, with the table it names.
struct Template {
    layout: Layout,
    entry: ProcessMappings,
    code_start: u64,
    table: TableKey,
}

/// A layout loaded in the mapping array, and how many processes it serves.
struct Shared {
    entry: ProcessMappings,
    processes: u32,
}

impl Unwinder {
    pub fn new(maps: UnwindMaps) -> Unwinder {
        metrics::set("ember_unwind_rows_capacity", &[], maps.row_capacity() as f64);
        Unwinder {
            rows: Space::new(maps.row_capacity()),
            pages: Space::new(maps.page_capacity()),
            slots: Space::new(maps.mapping_capacity()),
            maps,
            tables: HashMap::new(),
            layouts: HashMap::new(),
            processes: HashMap::new(),
            templates: HashMap::new(),
            peaks: (0, 0),
            generation: 0,
            intervals: 0,
        }
    }

    /// Tells the walker where `tgid`'s code is and how to unwind it, building and loading the
    /// tables of files it maps that are not loaded yet. `files` are sorted by address.
    pub fn load_process(&mut self, tgid: u32, files: &[MappedFile]) -> Result<()> {
        let layout = self.layout_of(tgid, files);
        let entry = self.share(&layout)?;
        self.point(tgid, layout, entry, true)
    }

    /// Loads a process taken at exec, whose only mapping is its executable's code (`file`),
    /// with `python`, the interpreter the executable embeds: slid to the executable's
    /// template, and made its template if it has none. `from_template`: the exec program
    /// pointed it at the template already. Whether it did so with this template, which then
    /// told the walk of its interpreter too.
    pub fn load_exec(&mut self, tgid: u32, file: &MappedFile, exe: ExeKey, from_template: bool, python: Option<PythonProcess>) -> Result<bool> {
        let template = self.template_for(tgid, exe, file, python)?;
        let slide = template.map_or(0, |(code_start, _)| file.start.wrapping_sub(code_start));
        let slid = MappedFile { start: file.start.wrapping_sub(slide), end: file.end.wrapping_sub(slide), ..file.clone() };
        let layout = self.layout_of(tgid, std::slice::from_ref(&slid));
        let entry = ProcessMappings { slide, ..self.share(&layout)? };
        // What the exec program wrote, if the template is the one it read.
        let written = from_template && template.is_some_and(|(_, t)| t.generation == entry.generation);
        self.point(tgid, layout, entry, !written)?;
        Ok(written)
    }

    /// The template of executable `exe` (where its code started, and its mappings), made
    /// from `code`, where the code of process `tgid` lies, if it has none. None if its code
    /// has no table loaded.
    pub fn template_for(&mut self, tgid: u32, exe: ExeKey, code: &MappedFile, python: Option<PythonProcess>) -> Result<Option<(u64, ProcessMappings)>> {
        match self.templates.get(&exe) {
            Some(template) if template.table == code.key => return Ok(Some((template.code_start, template.entry))),
            // The same file with another table: rewritten in place since.
            Some(_) => self.drop_template(&exe),
            None => {}
        }
        let layout = self.layout_of(tgid, std::slice::from_ref(code));
        if layout.len() != 1 {
            return Ok(None);
        }
        let entry = self.share(&layout)?;
        let template = ExeTemplate { mappings: entry, code_start: code.start, python: python.unwrap_or_default(), has_python: python.is_some() as u32, _pad: 0 };
        if let Err(e) = self.maps.set_template(exe, template) {
            self.release(&layout);
            return Err(e);
        }
        self.templates.insert(exe, Template { layout, entry, code_start: code.start, table: code.key.clone() });
        Ok(Some((code.start, entry)))
    }

    /// The walker's view of a process's files: those with a loaded table, as many as fit.
    fn layout_of(&mut self, tgid: u32, files: &[MappedFile]) -> Layout {
        let mut mappings = Vec::new();
        for file in files {
            let &Table::Loaded { first_row, rows, first_page, pages, ref placement, .. } = self.table(file) else { continue };
            let Some(bias) = placement.bias(file.start, file.file_offset) else { continue };
            mappings.push(ExecMapping { start: file.start, end: file.end, bias, first_row, rows, first_page, pages });
        }
        if mappings.len() > MAX_MAPPINGS as usize {
            metrics::add("ember_unwind_mappings_dropped_total", &[], (mappings.len() - MAX_MAPPINGS as usize) as f64);
            tracing::warn!(tgid, "more than {MAX_MAPPINGS} executable mappings: the rest are walked by frame pointers");
            mappings.truncate(MAX_MAPPINGS as usize);
        }
        mappings.into()
    }

    /// Points `tgid` at `layout` (one of whose processes it now is, as `entry`), writing
    /// the kernel's entry if `write`.
    fn point(&mut self, tgid: u32, layout: Layout, entry: ProcessMappings, write: bool) -> Result<()> {
        if write {
            if let Err(e) = self.maps.set_process(tgid, entry) {
                self.release(&layout);
                return Err(e);
            }
        }
        // A process loaded before (exec, dlopen) lets go of its old layout.
        if let Some(old) = self.processes.insert(tgid, layout) {
            self.release(&old);
        }
        self.peaks = (self.peaks.0.max(self.processes.len()), self.peaks.1.max(self.layouts.len()));
        Ok(())
    }

    /// Tells the walk of a process's interpreter (None: it runs none).
    pub fn set_python(&mut self, tgid: u32, python: Option<PythonProcess>) -> Result<()> {
        self.maps.set_python(tgid, python)
    }

    pub fn forget_process(&mut self, tgid: u32) {
        self.maps.remove_process(tgid);
        if let Some(layout) = self.processes.remove(&tgid) {
            self.release(&layout);
        }
    }

    /// The layout's entry for one more process: the loaded copy, or a new one.
    fn share(&mut self, layout: &Layout) -> Result<ProcessMappings> {
        if let Some(shared) = self.layouts.get_mut(layout) {
            shared.processes += 1;
            return Ok(shared.entry);
        }
        let count = layout.len() as u32;
        let first = if count == 0 { 0 } else { self.slots.take(count).context("the mapping array is full")? };
        if let Err(e) = self.maps.write_mappings(first, layout) {
            // No process was pointed at them: free at once.
            self.slots.give_back_now(first, count);
            return Err(e);
        }
        // A new number for every layout loaded, even one equal to a layout loaded before
        // (whose tables may have been evicted and others loaded at their rows since): rows
        // kept under an old number never hold again. Wraps after 4 billion; 0 means none.
        self.generation = self.generation.checked_add(1).unwrap_or(1);
        let entry = ProcessMappings { first, count, generation: self.generation, _pad: 0, slide: 0 };
        self.layouts.insert(layout.clone(), Shared { entry, processes: 1 });
        Ok(entry)
    }

    fn drop_template(&mut self, exe: &ExeKey) {
        if let Some(template) = self.templates.remove(exe) {
            self.maps.remove_template(exe);
            self.release(&template.layout);
        }
    }

    /// One process less on the layout; the last one gives its slots back.
    fn release(&mut self, layout: &Layout) {
        let Some(shared) = self.layouts.get_mut(layout) else { return };
        shared.processes -= 1;
        if shared.processes == 0 {
            let entry = shared.entry;
            self.layouts.remove(layout);
            if entry.count > 0 {
                self.slots.give_back(entry.first, entry.count);
            }
        }
    }

    /// Marks the tables of executables no process maps any more as idle, and forgets the
    /// files walked by frame pointers that none maps (a binary left out of the budget is
    /// tried again). Call once per interval, after the drain and after forgetting exited
    /// processes. Returns the tables left out of the budget that may fit now: the processes
    /// that map them are due to be loaded again (`load_process`), which builds them.
    pub fn retain(&mut self, live: impl Fn(&TableKey) -> bool) -> Vec<TableKey> {
        self.rows.release();
        self.pages.release();
        self.slots.release();
        memory::fit(&mut self.processes, self.peaks.0);
        memory::fit(&mut self.layouts, self.peaks.1);
        self.peaks = (self.processes.len(), self.layouts.len());
        self.intervals += 1;
        let now = self.intervals;
        // A template goes with the last known process that maps its table, so that the
        // table can go idle: a process the exec program points at it from here on was not
        // taken yet, and is before its slots are freed (at the next call) or its table
        // evicted (idle since before the last drain).
        let unused: Vec<ExeKey> = self.templates.iter().filter(|(_, t)| !live(&t.table)).map(|(exe, _)| *exe).collect();
        for exe in unused {
            self.drop_template(&exe);
        }
        self.tables.retain(|key, table| match table {
            Table::Loaded { idle_since, .. } => {
                *idle_since = if live(key) { None } else { idle_since.or(Some(now)) };
                true
            }
            Table::FramePointers { .. } => live(key),
        });
        // Only where the room grew since the table did not fit: a table that cannot fit is
        // not parsed again every interval.
        let room = self.room();
        let readmit: Vec<TableKey> = self
            .tables
            .iter()
            .filter_map(|(key, table)| match *table {
                Table::FramePointers { needs: Some(needs), room: then } if fits(needs, room) && (room.0 > then.0 || room.1 > then.1) => Some(key.clone()),
                _ => None,
            })
            .collect();
        for key in &readmit {
            self.tables.remove(key);
            metrics::add("ember_unwind_tables_readmitted_total", &[], 1.0);
        }
        self.publish();
        readmit
    }

    /// Rows and page index entries free, or held by tables evictable now.
    fn room(&self) -> (u32, u32) {
        let evictable = self.tables.values().filter_map(|table| match *table {
            Table::Loaded { rows, pages, idle_since: Some(since), .. } if since < self.intervals => Some((rows, pages)),
            _ => None,
        });
        evictable.fold((self.rows.free(), self.pages.free()), |(r, p), (rows, pages)| (r + rows, p + pages))
    }

    /// The file's table, built and loaded on first use.
    fn table(&mut self, file: &MappedFile) -> &Table {
        if !self.tables.contains_key(&file.key) {
            let table = self.build(file);
            self.tables.insert(file.key.clone(), table);
            self.publish();
        }
        let table = self.tables.get_mut(&file.key).expect("inserted above");
        if let Table::Loaded { idle_since, .. } = table {
            *idle_since = None;
        }
        table
    }

    /// Space for a table: `rows` rows and `pages` index entries, evicting idle tables (the
    /// longest idle first) while it does not fit. Only tables idle since before the last
    /// drain are evicted: no walk can still be reading them.
    fn space_for(&mut self, rows: u32, pages: u32) -> Option<(u32, u32)> {
        loop {
            if let Some(first_row) = self.rows.take(rows) {
                match self.pages.take(pages) {
                    Some(first_page) => return Some((first_row, first_page)),
                    None => self.rows.give_back_now(first_row, rows),
                }
            }
            let evictable = self
                .tables
                .iter()
                .filter_map(|(key, table)| match table {
                    Table::Loaded { idle_since: Some(since), .. } if *since < self.intervals => Some((*since, key.clone())),
                    _ => None,
                })
                .min_by_key(|(since, _)| *since)?;
            if let Some(Table::Loaded { first_row, rows, first_page, pages, .. }) = self.tables.remove(&evictable.1) {
                tracing::debug!(key = ?evictable.1, "evicting an idle unwind table to make room");
                metrics::add("ember_unwind_tables_evicted_total", &[], 1.0);
                self.rows.give_back_now(first_row, rows);
                self.pages.give_back_now(first_page, pages);
            }
        }
    }

    fn build(&mut self, file: &MappedFile) -> Table {
        tracing::debug!(path = %file.path.display(), key = ?file.key, "building an unwind table");
        let started = Instant::now();
        let table = match &file.key {
            TableKey::PythonTrampolines(size) => CompactTable::of(UnwindTable::python_trampolines(*size)),
            _ => table_of_file(&file.path).and_then(CompactTable::of),
        };
        let table = match table {
            Ok(table) if !table.rows.is_empty() => table,
            Ok(_) => return Table::FramePointers { needs: None, room: (0, 0) },
            Err(e) => {
                tracing::debug!(path = %file.path.display(), "no unwind table: {e:#}");
                return Table::FramePointers { needs: None, room: (0, 0) };
            }
        };
        metrics::add("ember_unwind_build_seconds_total", &[], started.elapsed().as_secs_f64());
        metrics::add("ember_unwind_tables_built_total", &[], 1.0);
        let (rows, pages) = (table.rows.len() as u32, table.pages.len() as u32);
        let Some((first_row, first_page)) = self.space_for(rows, pages) else {
            tracing::warn!(path = %file.path.display(), rows, "unwind table budget exhausted: walked by frame pointers until room appears (raise unwind_table_mib)");
            return Table::FramePointers { needs: Some((rows, pages)), room: self.room() };
        };
        if let Err(e) = self.maps.write_table((first_row, &table.rows), (first_page, &table.pages)) {
            tracing::warn!(path = %file.path.display(), "loading an unwind table failed: {e:#}");
            self.rows.give_back(first_row, rows);
            self.pages.give_back(first_page, pages);
            return Table::FramePointers { needs: None, room: (0, 0) };
        }
        Table::Loaded { first_row, rows, first_page, pages, placement: table.placement, idle_since: None }
    }

    fn publish(&self) {
        let loaded = self.tables.values().filter(|t| matches!(t, Table::Loaded { .. })).count();
        let idle = self.tables.values().filter(|t| matches!(t, Table::Loaded { idle_since: Some(_), .. })).count();
        metrics::set("ember_unwind_tables_idle", &[], idle as f64);
        let over_budget = self.tables.values().filter(|t| matches!(t, Table::FramePointers { needs: Some(_), .. })).count();
        metrics::set("ember_unwind_tables", &[], loaded as f64);
        metrics::set("ember_unwind_over_budget", &[], over_budget as f64);
        metrics::set("ember_unwind_rows_used", &[], self.rows.used() as f64);
        metrics::set("ember_unwind_mappings_loaded", &[], self.slots.used() as f64);
        metrics::set("ember_unwind_layouts", &[], self.layouts.len() as f64);
    }
}

fn fits(needs: (u32, u32), room: (u32, u32)) -> bool {
    needs.0 <= room.0 && needs.1 <= room.1
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use agent_common::{ExeKey, ExeTemplate, ProcessMappings, PythonProcess};

    use super::{MappedFile, TableKey, Unwinder};
    use crate::kernel::{KernelSettings, Sampler};

    /// Fields 26 and 27 of `/proc/<pid>/stat`: where its code starts and ends.
    fn code_of(pid: u32) -> (u64, u64) {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
        (fields[23].parse().unwrap(), fields[24].parse().unwrap())
    }

    /// This test binary's executable file mappings, keyed by device and inode.
    fn own_files() -> Vec<MappedFile> {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let lines = maps.lines().map(|line| line.split_whitespace().collect::<Vec<_>>());
        lines
            .filter(|f| f.len() >= 6 && f[1].contains('x') && f[5].starts_with('/'))
            .map(|f| {
                let (start, end) = f[0].split_once('-').unwrap();
                let meta = std::fs::metadata(f[5]).unwrap();
                MappedFile {
                    start: u64::from_str_radix(start, 16).unwrap(),
                    end: u64::from_str_radix(end, 16).unwrap(),
                    file_offset: u64::from_str_radix(f[2], 16).unwrap(),
                    key: TableKey::File(meta.dev(), meta.ino()),
                    path: f[5].into(),
                }
            })
            .collect()
    }

    #[test]
    fn processes_with_the_same_mappings_share_one_copy_and_its_kept_rows() {
        assert_eq!(unsafe { libc::geteuid() }, 0, "this test loads BPF programs: run it as root");
        // Large enough for the tables of this binary and libc.
        let settings = KernelSettings { unwind_rows: 1 << 20, ..KernelSettings::for_tests() };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _entered = runtime.enter();
        let (_sampler, _announcements, maps) = Sampler::start(&settings).expect("starting the sampler");
        let mut unwinder = Unwinder::new(maps);
        let files = own_files();
        // Tgids above the kernel's pid limit: no process's samples read these entries.
        let (a, b, c, d) = (1 << 23, (1 << 23) + 1, (1 << 23) + 2, (1 << 23) + 3);
        let entry = |unwinder: &Unwinder, tgid| unwinder.maps.process(tgid);

        unwinder.load_process(a, &files).unwrap();
        unwinder.load_process(b, &files).unwrap();
        let shared = entry(&unwinder, a).expect("a is loaded");
        assert!(shared.count > 0, "this binary's code has a table");
        assert_eq!(entry(&unwinder, b), Some(shared), "equal mappings share one copy and its generation");
        assert_eq!(unwinder.slots.used(), shared.count);

        // One mapping fewer (a library not loaded yet): another layout.
        unwinder.load_process(c, &files[..files.len() - 1]).unwrap();
        let other = entry(&unwinder, c).expect("c is loaded");
        assert_ne!(other.first, shared.first);
        assert_ne!(other.generation, shared.generation);
        assert_eq!(unwinder.slots.used(), shared.count + other.count);

        // The layout stays while a process has it; the last one gives it back.
        unwinder.forget_process(a);
        assert_eq!(entry(&unwinder, a), None);
        assert_eq!(entry(&unwinder, b), Some(shared));
        unwinder.forget_process(b);
        assert_eq!(unwinder.layouts.len(), 1, "only c's layout is left");

        // The same mappings loaded again get a new generation: rows kept under the old one
        // may be of tables evicted since, and must never hold again.
        unwinder.load_process(d, &files).unwrap();
        let again = entry(&unwinder, d).expect("d is loaded");
        assert!(again.generation != shared.generation && again.generation != other.generation);

        // A process loaded again with another layout lets go of its old one.
        unwinder.load_process(c, &files).unwrap();
        assert_eq!(entry(&unwinder, c), Some(again));
        assert_eq!(unwinder.layouts.len(), 1);
    }

    /// Processes that map only their executable share its template wherever their code
    /// went; the exec program points each new process of it at the template, and at the
    /// interpreter it embeds, slid to its code; the agent does not write a process the exec
    /// program pointed at it again; and the template goes once no process the agent knows
    /// maps its table.
    #[test]
    fn processes_of_one_executable_share_its_template_which_the_exec_program_points_new_ones_at() {
        assert_eq!(unsafe { libc::geteuid() }, 0, "this test loads BPF programs: run it as root");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _entered = runtime.enter();
        let settings = KernelSettings { unwind_rows: 1 << 16, ..KernelSettings::for_tests() };
        let (_sampler, _announcements, maps) = Sampler::start(&settings).expect("starting the sampler");
        let mut unwinder = Unwinder::new(maps);
        let path = std::path::Path::new("/usr/bin/sleep");
        let meta = std::fs::metadata(path).unwrap();
        let exe = ExeKey { inode: meta.ino(), dev: (libc::major(meta.dev()) << 20) | libc::minor(meta.dev()), _pad: 0 };
        let key = TableKey::File(meta.dev(), meta.ino());
        let spawn = || std::process::Command::new(path).arg("5").spawn().unwrap();
        // The first process of it is loaded as the agent loads one taken at exec.
        let mut first = spawn();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let (start, end) = code_of(first.id());
        let maps_text = std::fs::read_to_string(format!("/proc/{}/maps", first.id())).unwrap();
        let code = maps_text.lines().find(|l| l.split_whitespace().nth(1) == Some("r-xp")).unwrap();
        let file_offset = u64::from_str_radix(code.split_whitespace().nth(2).unwrap(), 16).unwrap();
        let at = |start: u64, end: u64| MappedFile { start, end, file_offset, key: key.clone(), path: path.into() };
        // As if it embedded an interpreter, whose addresses are in its executable.
        let python = PythonProcess { interp_head: start + 0x1000, eval_start: start + 0x2000, eval_end: start + 0x3000, ..PythonProcess::default() };
        assert!(!unwinder.load_exec(first.id(), &at(start, end), exe, false, Some(python)).unwrap());
        let entry = unwinder.maps.process(first.id()).expect("the first process is loaded");
        assert_eq!((entry.count, entry.slide), (1, 0), "sleep's code has a table, at the first process's addresses");
        assert_eq!(unwinder.maps.template(&exe), Some(ExeTemplate { mappings: entry, code_start: start, python, has_python: 1, _pad: 0 }));

        // The exec program points the next one at it, slid to where its code went.
        let mut second = spawn();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let (second_start, second_end) = code_of(second.id());
        let pointed = unwinder.maps.process(second.id()).expect("the exec program pointed the second process at the template");
        let slide = second_start.wrapping_sub(start);
        assert_eq!(pointed, ProcessMappings { slide, ..entry });
        assert_ne!(slide, 0, "both processes' code at one address: address space randomisation is off");
        let slid = |address: u64| address.wrapping_add(slide);
        let interpreter = PythonProcess { interp_head: slid(python.interp_head), eval_start: slid(python.eval_start), eval_end: slid(python.eval_end), ..python };
        assert_eq!(unwinder.maps.python(second.id()), Some(interpreter), "the exec program told the walk of the template's interpreter, slid");
        // The agent, taking it, shares the same copy and does not write it again: removed
        // here, its entry stays away.
        unwinder.maps.remove_process(second.id());
        assert!(unwinder.load_exec(second.id(), &at(second_start, second_end), exe, true, Some(interpreter)).unwrap());
        assert_eq!(unwinder.maps.process(second.id()), None, "the agent wrote again what the exec program had");
        // One it loads on its own is written, slid.
        let elsewhere = 1 << 23;
        assert!(!unwinder.load_exec(elsewhere, &at(start + 0x10_0000, end + 0x10_0000), exe, false, None).unwrap());
        assert_eq!(unwinder.maps.process(elsewhere), Some(ProcessMappings { slide: 0x10_0000, ..entry }));
        assert_eq!(unwinder.layouts.len(), 1, "one copy for every process of the executable");

        // With no process of it left, the template goes, and so does the copy.
        for tgid in [first.id(), second.id(), elsewhere] {
            unwinder.forget_process(tgid);
        }
        for child in [&mut first, &mut second] {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert_eq!(unwinder.layouts.len(), 1, "the template holds its copy");
        unwinder.retain(|_| false);
        assert_eq!(unwinder.maps.template(&exe), None, "the template stayed with no process mapping its table");
        assert!(unwinder.layouts.is_empty() && unwinder.templates.is_empty());
        let mut third = spawn();
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(unwinder.maps.process(third.id()), None, "the exec program used a template that was gone");
        let _ = third.kill();
        let _ = third.wait();
    }
}
