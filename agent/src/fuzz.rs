//! Entry points for the fuzz targets (`cargo xtask fuzz`, built with `--cfg fuzzing`): each
//! feeds arbitrary bytes to one surface where the agent reads input it does not control, and
//! checks what must hold for any input. A panic, a hang or a failed check is a crash.
use crate::{
    duration::parse_duration,
    kernel::{tracefs::Format, Btf},
    resolve::{from_cgroup_path, relabel::Relabeler, MapsLine},
    settings::FileConfig,
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

fn split_at_nul(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[]),
    }
}
