//! What a process uses, read from /proc: CPU time, status fields (RSS), and what its BPF
//! objects cost. Shared by the benchmarks and the soak, so that all measure the same way.
use std::fs;

use anyhow::Context as _;

/// CPU time of all live threads of a process, in ns (schedstat is ns-precise, unlike stat).
pub fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()))
        .sum()
}

/// CPU time of a whole process, in s, including threads that have exited (a collector's
/// blocking-pool threads come and go; `cpu_ns` misses the gone ones), at clock-tick precision.
pub fn process_cpu_seconds(pid: u32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces), from the state: utime and stime are
    // the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// The host's CPU time so far, from /proc/stat's "cpu" line (clock ticks): what its CPUs ran
/// (user, nice, system, irq, softirq) and what the hypervisor took from them while they had
/// work (steal).
#[derive(Clone, Copy, Debug)]
pub struct HostTimes {
    ran: u64,
    stolen: u64,
}

impl HostTimes {
    pub fn now() -> HostTimes {
        let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
        let ticks: Vec<u64> = stat.lines().next().unwrap_or("").split_whitespace().skip(1).map(|t| t.parse().unwrap_or(0)).collect();
        let tick = |i: usize| ticks.get(i).copied().unwrap_or(0);
        HostTimes { ran: tick(0) + tick(1) + tick(2) + tick(5) + tick(6), stolen: tick(7) }
    }

    /// Of the time the CPUs had work since `earlier`, the share the hypervisor took.
    pub fn steal_since(&self, earlier: &HostTimes) -> f64 {
        let (ran, stolen) = (self.ran.saturating_sub(earlier.ran), self.stolen.saturating_sub(earlier.stolen));
        if ran + stolen == 0 { 0.0 } else { stolen as f64 / (ran + stolen) as f64 }
    }
}

/// The on-CPU time (ns) a clock sampler (Ember, perf) may see of a thread that was busy
/// `busy_ns` of wall time and used `cpu_ns` of CPU, on a host whose busy time had the share
/// `steal` stolen: at least the lower of the two, at most the higher over (1 - steal). Stolen
/// time is charged to the thread that is current when the virtual CPU gets it back: to a
/// thread stolen mid-turn (its busy wall time has that), and to one woken on a virtual CPU
/// the hypervisor was slow to run, which it never used (in neither measure). A ping-pong of
/// thousands of wake-ups a second showed 19.1 s sampled for 15.1 s busy and 15.6 s of CPU
/// with 19.6% stolen; a thread waking 50 times a second, 0.487 of its wall time sampled for
/// 0.499 busy and 0.413 of CPU with 23.5% stolen. With no steal, both bounds are its time.
pub fn sampled_range(busy_ns: f64, cpu_ns: f64, steal: f64) -> (f64, f64) {
    (busy_ns.min(cpu_ns), busy_ns.max(cpu_ns) / (1.0 - steal))
}

/// Context switches of all live threads of a process, voluntary or not.
pub fn context_switches(pid: u32) -> u64 {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    let switches = |status: String| -> u64 {
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
        field("voluntary_ctxt_switches:") + field("nonvoluntary_ctxt_switches:")
    };
    tasks.flatten().filter_map(|t| fs::read_to_string(t.path().join("status")).ok()).map(switches).sum()
}

/// A `kB` field of `/proc/<pid>/status` (`"VmRSS:"`, ...), 0 if absent.
pub fn status_kib(status: &str, field: &str) -> u64 {
    status.lines().find_map(|l| l.strip_prefix(field)).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap_or(0)
}

#[derive(Debug, Default, Clone, Copy)]
pub struct BpfUsage {
    pub map_bytes: u64,
    pub prog_run_ns: u64,
    pub prog_runs: u64,
}

/// What a process's BPF objects cost, from its fdinfo: memory charged to its maps, and the
/// run time of its programs (counted while kernel.bpf_stats_enabled is 1).
pub fn bpf_usage(pid: u32) -> BpfUsage {
    let mut usage = BpfUsage::default();
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return usage };
    for entry in fds.flatten() {
        let Ok(info) = fs::read_to_string(entry.path()) else { continue };
        let field = |name: &str| info.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<u64>().ok());
        if info.contains("\nmap_type:") {
            usage.map_bytes += field("memlock:").unwrap_or(0);
        } else if info.contains("\nprog_type:") {
            usage.prog_run_ns += field("run_time_ns:").unwrap_or(0);
            usage.prog_runs += field("run_cnt:").unwrap_or(0);
        }
    }
    usage
}

/// The kernel's BPF run-time accounting (what `bpf_usage` reads), turned on or off; the old
/// value is restored when dropped.
pub struct BpfStats(String);

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    pub fn enable() -> anyhow::Result<BpfStats> {
        Self::set("1")
    }

    /// Off, as on a host where nothing asked for it (each program run then costs less).
    pub fn disable() -> anyhow::Result<BpfStats> {
        Self::set("0")
    }

    fn set(value: &str) -> anyhow::Result<BpfStats> {
        let old = fs::read_to_string(BPF_STATS).context("reading kernel.bpf_stats_enabled")?;
        fs::write(BPF_STATS, value).context("setting kernel.bpf_stats_enabled (needs root)")?;
        Ok(BpfStats(old))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = fs::write(BPF_STATS, self.0.trim());
    }
}
