//! Entry points for the fuzz targets (`cargo xtask fuzz`, built with `--cfg fuzzing`): each
//! feeds arbitrary bytes to one surface where the agent reads input it does not control, and
//! checks what must hold for any input. A panic, a hang or a failed check is a crash.
use std::{os::fd::AsRawFd as _, path::Path};

use crate::{
    duration::parse_duration,
    maps_line::MapsLine,
    kernel::{tracefs::Format, Btf},
    resolve::{
        allocator_sites, build_id_of, from_cgroup_path, jemalloc_profiling_in, memory_file,
        probe_site::{self, RDI}, own_pid, parse_stat, pods::Pods, python_parsers as python, relabel::Relabeler, PerfMap,
    },
    settings::FileConfig,
    symbolize::{examine_bytes, SymbolIndex},
    unwind::{CompactTable, UnwindTable},
};

/// The agent's config file (TOML), its durations and its relabel rules, applied to labels
/// read from a cgroup path in the same input (after the first NUL, if any).
pub fn config(data: &[u8]) {
    let (config, path) = split_at_nul(data);
    let Ok(text) = std::str::from_utf8(config) else { return };
    let Ok(config) = FileConfig::parse(text, "fuzz") else { return };
    if let Some(interval) = &config.interval {
        if let Ok(duration) = parse_duration(interval) {
            assert!(duration.as_nanos() >= 1000, "{interval:?} parsed to {duration:?}");
        }
    }
    let Ok(relabeler) = Relabeler::new(config.relabel.as_deref().unwrap_or_default()) else { return };
    let mut labels = from_cgroup_path(&String::from_utf8_lossy(path));
    relabeler.apply(&mut labels);
}

/// A tracepoint's format file, and the lookups the agent makes in it.
pub fn tracefs_format(data: &[u8]) {
    let format = Format::parse("fuzz:fuzz".into(), &String::from_utf8_lossy(data));
    for field in ["prev_pid", "next_pid", "len", "reason", "skbaddr"] {
        assert_eq!(format.optional(field), format.offset(field).ok());
        format.symbols(field);
    }
}

/// Lines of /proc/<pid>/maps: whatever parses is a range that ends after it starts, and its
/// path is the line's tail.
pub fn maps_lines(data: &[u8]) {
    for line in String::from_utf8_lossy(data).lines() {
        if let Some(parsed) = MapsLine::parse(line) {
            assert!(parsed.start <= parsed.end, "{line:?}");
            assert!(line.ends_with(parsed.path), "{line:?}");
        }
    }
}

/// Cgroup paths, as the kernel names a sample's cgroup: every label is non-empty.
pub fn cgroup_path(data: &[u8]) {
    for (key, value) in from_cgroup_path(&String::from_utf8_lossy(data)) {
        assert!(!key.is_empty() && !value.is_empty(), "{key:?}={value:?}");
    }
}

/// A kernel BTF blob, and member lookups in each of its structs (through anonymous members,
/// as the agent's lookups go).
pub fn btf(data: &[u8]) {
    let Ok(btf) = Btf::parse(data) else { return };
    for name in btf.struct_names().take(64) {
        for member in ["pid", "len", "sk_protocol", "x"] {
            let _ = btf.member_offset(name, member);
        }
    }
}

/// An ELF file's call frame information, as a process may map it: its rows in order, and
/// its compact form within the walker's limits, every page of the index within the rows.
pub fn unwind_table(data: &[u8]) {
    let Ok(table) = UnwindTable::from_elf(data) else { return };
    assert!(table.rows.windows(2).all(|w| w[0].address <= w[1].address), "rows out of order");
    let Ok(compact) = CompactTable::of(table) else { return };
    let rows = compact.rows.len() as u32;
    assert!(compact.pages.iter().all(|page| page.first < page.end && page.end <= rows), "a page's rows outside the table");
}

/// An ELF file as a process maps it or a debuginfod server sends it: its build id, its
/// symbols looked up at addresses from the input, what naming from it would parse, its
/// debug link, whether it holds a CPython interpreter, where its allocator would be probed,
/// and its first bytes taken as a function's code: a free's probe site is within them.
pub fn elf_file(data: &[u8]) {
    let file = memory_file(c"fuzz", data).expect("a memory file");
    let _ = build_id_of(&file);
    let _ = allocator_sites(&file);
    let code = &data[..data.len().min(probe_site::CODE_BYTES)];
    let site = probe_site::place(code, RDI);
    assert!(site.offset == 0 || (site.offset as usize) < code.len(), "a site past the code: {site:?}");
    if let Some(index) = SymbolIndex::build(Path::new(&format!("/proc/self/fd/{}", file.as_raw_fd()))) {
        let probes = data.chunks_exact(8).take(16).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
        for address in probes.chain([0, u64::MAX]) {
            if let Some(function) = index.function_at(address) {
                let _ = index.name(function);
            }
        }
    }
    let _ = examine_bytes(data);
    for minor in [6, 11, 13] {
        let _ = python::examine(&file, minor);
    }
}

/// A perf map, as the process writes it, read in the pieces its NULs cut it into: every
/// function it names starts before it ends, and none overlaps the next.
pub fn perf_map(data: &[u8]) {
    let reads: Vec<&[u8]> = data.split(|&b| b == 0).collect();
    let functions = PerfMap::functions_after(&reads);
    assert!(functions.iter().all(|&(start, end)| start < end), "an empty function");
    assert!(functions.windows(2).all(|w| w[0].1 <= w[1].0), "overlapping functions");
}

/// /proc/<pid>/stat and status, whose command name the process chooses, and environ, which
/// it writes.
pub fn proc_files(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = parse_stat(&text);
    let _ = own_pid(&text);
    let _ = jemalloc_profiling_in(data);
}

/// What a Python process's memory holds for the namer: line tables of each version at any
/// position, and 3.13's published offsets (input: a selector byte, the first line and the
/// position, then the bytes).
pub fn python(data: &[u8]) {
    let [selector, rest @ ..] = data else { return };
    let (Some(first), Some(position)) = (rest.get(..4), rest.get(4..12)) else { return };
    let (first, position) = (u32::from_le_bytes(first.try_into().expect("4")), i64::from_le_bytes(position.try_into().expect("8")));
    let table = &rest[12..];
    let _ = match selector % 4 {
        0 => python::lnotab_line(table, first, position),
        1 => python::linetable_310_line(table, first, position),
        2 => python::location_table_line(table, first, position),
        _ => python::debug_offsets(table, 13).ok().map(|_| 0),
    };
}

/// A pod as the Kubernetes API server sends it: the labels its containers' samples get are
/// named as Prometheus and pprof labels may be.
pub fn kubernetes_pod(data: &[u8]) {
    for labels in Pods::labels_from_json(data) {
        for key in labels.keys() {
            assert!(!key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "label {key:?}");
        }
    }
}

fn split_at_nul(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[]),
    }
}
