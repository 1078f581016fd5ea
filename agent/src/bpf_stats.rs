//! What BPF costs a process, read from /proc/<pid>/fdinfo: memory charged to its maps, and the
//! run time of its programs (counted while kernel.bpf_stats_enabled is 1). Works for any
//! process, so benchmarks measure peers the same way as Ember.
use std::fs;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BpfUsage {
    pub map_bytes: u64,
    pub prog_run_ns: u64,
    pub prog_runs: u64,
}

pub fn usage(pid: u32) -> BpfUsage {
    let mut usage = BpfUsage::default();
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return usage };
    for entry in fds.flatten() {
        let Ok(info) = fs::read_to_string(entry.path()) else { continue };
        let field = |name: &str| {
            info.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<u64>().ok())
        };
        if info.contains("\nmap_type:") {
            usage.map_bytes += field("memlock:").unwrap_or(0);
        } else if info.contains("\nprog_type:") {
            usage.prog_run_ns += field("run_time_ns:").unwrap_or(0);
            usage.prog_runs += field("run_cnt:").unwrap_or(0);
        }
    }
    usage
}
