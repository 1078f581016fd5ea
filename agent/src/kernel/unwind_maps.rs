//! The walker's inputs in the kernel: the array every loaded unwind table's rows live in, the
//! array of processes' executable mappings, where each process's mappings are, and each
//! CPython process's interpreter. The unwind stage decides what goes where; this only writes.
//! The arrays are written through shared mappings (one copy, not one syscall per entry): the
//! mappings array, written for every process loaded, through one kept for good (a mapping
//! made and unmade per write cost more than the copy, its unmap an interrupt to every CPU
//! running the agent); the row and page arrays, written once per table and far larger,
//! through one made per write, so that their pages do not stay in the agent's memory.
use std::os::fd::{AsFd as _, AsRawFd as _};

use agent_common::{ExeKey, ExeTemplate, ExecMapping, PageRows, ProcessMappings, PythonProcess, UnwindRow};
use anyhow::{bail, Context as _, Result};
use memmap2::{MmapOptions, MmapRaw};
use aya::{
    maps::{Array, HashMap as BpfHashMap, IterableMap as _, MapData},
    Pod,
};

pub struct UnwindMaps {
    rows: Array<MapData, UnwindRow>,
    pages: Array<MapData, PageRows>,
    mappings: Array<MapData, ExecMapping>,
    /// The whole mappings array, mapped shared.
    mappings_window: MmapRaw,
    processes: BpfHashMap<MapData, u32, ProcessMappings>,
    templates: BpfHashMap<MapData, ExeKey, ExeTemplate>,
    pythons: BpfHashMap<MapData, u32, PythonProcess>,
}

impl UnwindMaps {
    pub(super) fn new(
        rows: Array<MapData, UnwindRow>,
        pages: Array<MapData, PageRows>,
        mappings: Array<MapData, ExecMapping>,
        processes: BpfHashMap<MapData, u32, ProcessMappings>,
        templates: BpfHashMap<MapData, ExeKey, ExeTemplate>,
        pythons: BpfHashMap<MapData, u32, PythonProcess>,
    ) -> Result<UnwindMaps> {
        let bytes = (mappings.len() as usize * size_of::<ExecMapping>()).div_ceil(page_size()) * page_size();
        let fd = mappings.map().fd().as_fd().as_raw_fd();
        let mappings_window = MmapOptions::new().len(bytes).map_raw(fd).context("mapping the process mappings array")?;
        Ok(UnwindMaps { rows, pages, mappings, mappings_window, processes, templates, pythons })
    }

    /// Rows the row array holds (the table memory budget).
    pub fn row_capacity(&self) -> u32 {
        self.rows.len()
    }

    pub fn page_capacity(&self) -> u32 {
        self.pages.len()
    }

    pub fn mapping_capacity(&self) -> u32 {
        self.mappings.len()
    }

    /// Writes a table's rows and page index from the indices given. Programs must not read
    /// these yet (the caller publishes them afterwards, with a process's mappings).
    pub fn write_table(&mut self, (first_row, rows): (u32, &[UnwindRow]), (first_page, pages): (u32, &[PageRows])) -> Result<()> {
        write(&self.rows, first_row, rows).context("writing unwind rows")?;
        write(&self.pages, first_page, pages).context("writing an unwind page index")
    }

    /// Writes mappings from index `first`. Programs must not read these yet (the caller
    /// points processes at them afterwards).
    pub fn write_mappings(&mut self, first: u32, mappings: &[ExecMapping]) -> Result<()> {
        const { assert!(size_of::<ExecMapping>() % 8 == 0) };
        check_room(&self.mappings, first, mappings.len())?;
        // SAFETY: within the array (checked), which the window maps whole; ExecMapping is
        // plain data, 8-byte aligned as the kernel lays the elements out.
        unsafe {
            let destination = self.mappings_window.as_mut_ptr().cast::<ExecMapping>().add(first as usize);
            std::ptr::copy_nonoverlapping(mappings.as_ptr(), destination, mappings.len());
        }
        Ok(())
    }

    /// Points a process at its mappings.
    pub fn set_process(&mut self, tgid: u32, entry: ProcessMappings) -> Result<()> {
        self.processes.insert(tgid, entry, 0).with_context(|| format!("loading the mappings of process {tgid}"))
    }

    /// The mappings a process is pointed at, as the programs read them.
    #[cfg(test)]
    pub fn process(&self, tgid: u32) -> Option<ProcessMappings> {
        self.processes.get(&tgid, 0).ok()
    }

    /// Has the exec program point new processes of `exe` at `template`.
    pub fn set_template(&mut self, exe: ExeKey, template: ExeTemplate) -> Result<()> {
        self.templates.insert(exe, template, 0).context("loading an executable's template")
    }

    pub fn remove_template(&mut self, exe: &ExeKey) {
        let _ = self.templates.remove(exe);
    }

    /// The template new processes of `exe` are pointed at.
    #[cfg(test)]
    pub fn template(&self, exe: &ExeKey) -> Option<ExeTemplate> {
        self.templates.get(exe, 0).ok()
    }

    /// The interpreter the walk was told of in a process.
    #[cfg(test)]
    pub fn python(&self, tgid: u32) -> Option<PythonProcess> {
        self.pythons.get(&tgid, 0).ok()
    }

    /// Forgets a process (the kernel also does when it exits; a miss is fine).
    pub fn remove_process(&mut self, tgid: u32) {
        let _ = self.processes.remove(&tgid);
    }

    /// Tells the walk of a process's interpreter (None: it runs none).
    pub fn set_python(&mut self, tgid: u32, python: Option<PythonProcess>) -> Result<()> {
        match python {
            Some(python) => self.pythons.insert(tgid, python, 0).with_context(|| format!("telling the walk of process {tgid}'s interpreter")),
            None => {
                let _ = self.pythons.remove(&tgid);
                Ok(())
            }
        }
    }
}

/// Copies `items` into a BPF_F_MMAPABLE array from index `first`.
fn write<T: Pod>(array: &Array<MapData, T>, first: u32, items: &[T]) -> Result<()> {
    // The kernel lays array elements out 8-byte aligned: only then is this the element stride.
    const { assert!(size_of::<T>() % 8 == 0) };
    let size = size_of::<T>();
    check_room(array, first, items.len())?;
    if items.is_empty() {
        return Ok(());
    }
    let page = page_size();
    let start = first as usize * size;
    let window_start = start / page * page;
    let window_len = (start + items.len() * size - window_start).div_ceil(page) * page;
    let fd = array.map().fd().as_fd().as_raw_fd();
    // SAFETY: a shared mapping of the array's pages (BPF_F_MMAPABLE), inside the array,
    // unmapped below; nothing else in this process maps them.
    let window = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            window_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            window_start as libc::off_t,
        )
    };
    if window == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error()).context("mapping the array");
    }
    // SAFETY: the destination lies within the window just mapped (checked above), and T is
    // plain data.
    unsafe {
        std::ptr::copy_nonoverlapping(items.as_ptr().cast::<u8>(), window.cast::<u8>().add(start - window_start), items.len() * size);
        libc::munmap(window, window_len);
    }
    Ok(())
}

fn check_room<T: Pod>(array: &Array<MapData, T>, first: u32, count: usize) -> Result<()> {
    if first as usize + count > array.len() as usize {
        bail!("entries {first}+{count} are beyond the array's {}", array.len());
    }
    Ok(())
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}
