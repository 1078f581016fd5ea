//! Soak: the agent's footprint over a long run at 999 Hz with process churn, read from /proc
//! at regular times. Shared by `cargo xtask bench soak` (ten minutes) and its short version in
//! the tests, so that both judge growth the same way.
use std::{
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::{
    compile_c,
    usage::{bpf_usage, cpu_ns, status_kib},
};

/// What the agent holds at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Footprint {
    /// Since the measurement started (after the warm-up).
    pub at: Duration,
    pub rss_kib: u64,
    pub anon_kib: u64,
    pub open_files: usize,
    /// Memory mappings of the process.
    pub mappings: usize,
    /// Kernel memory charged to its BPF maps.
    pub bpf_map_kib: u64,
    pub threads: usize,
    /// CPU time of its threads so far.
    pub cpu_ns: u64,
}

impl Footprint {
    /// None once the process is gone.
    pub fn of(pid: u32, at: Duration) -> Option<Footprint> {
        let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        Some(Footprint {
            at,
            rss_kib: status_kib(&status, "VmRSS:"),
            anon_kib: status_kib(&status, "RssAnon:"),
            open_files: fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count(),
            mappings: fs::read_to_string(format!("/proc/{pid}/maps")).ok()?.lines().count(),
            bpf_map_kib: bpf_usage(pid).map_bytes / 1024,
            threads: fs::read_dir(format!("/proc/{pid}/task")).ok()?.count(),
            cpu_ns: cpu_ns(pid),
        })
    }
}

/// Waits for the agent's footprint to settle: at least `min`, then until its counts (open
/// files, mappings, threads) have gone `quiet` without a new highest, at most `max`. The agent
/// meets the host's processes in its first tens of seconds (more of them, and slower, on a fresh
/// machine): what it opens then is not growth. Returns how long it waited, None if the agent
/// exited.
pub fn settle(pid: u32, min: Duration, quiet: Duration, max: Duration) -> Option<Duration> {
    let started = std::time::Instant::now();
    let counts = |f: &Footprint| (f.open_files, f.mappings, f.threads);
    let mut highest = (0, 0, 0);
    let mut last_rise = started;
    loop {
        let now = counts(&Footprint::of(pid, started.elapsed())?);
        if now.0 > highest.0 || now.1 > highest.1 || now.2 > highest.2 {
            highest = (highest.0.max(now.0), highest.1.max(now.1), highest.2.max(now.2));
            last_rise = std::time::Instant::now();
        }
        let waited = started.elapsed();
        if waited >= max || (waited >= min && last_rise.elapsed() >= quiet) {
            return Some(waited);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The churn fixture, built into `dir`: (launcher, child). The launcher takes the child's path,
/// seconds, and processes a second; each child is busy for 20 to 200 ms.
pub fn build_churn(dir: &Path) -> (PathBuf, PathBuf) {
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/churn");
    let (churn, child) = (dir.join("churn"), dir.join("churn_child"));
    compile_c(&sources.join("churn.c"), &churn, &["-O2"]);
    compile_c(&sources.join("churn_child.c"), &child, &["-O2"]);
    (churn, child)
}

/// How each quantity moved from the first third of the samples to the last: the mean of
/// each third for RSS (it breathes with every interval), the lowest for counts (open files,
/// mappings, threads). Counts follow the processes alive at the moment (a burst of host
/// processes holds a few files for an interval or two, then gives them back); what leaks
/// raises the lowest.
#[derive(Debug)]
pub struct Growth {
    pub rss_kib: (u64, u64),
    pub anon_kib: (u64, u64),
    pub open_files: (usize, usize),
    pub mappings: (usize, usize),
    pub bpf_map_kib: (u64, u64),
    pub threads: (usize, usize),
}

impl Growth {
    pub fn of(samples: &[Footprint]) -> Growth {
        assert!(samples.len() >= 6, "{} samples are too few to judge growth", samples.len());
        let third = samples.len() / 3;
        let (first, last) = (&samples[..third], &samples[samples.len() - third..]);
        let mean = |part: &[Footprint], f: fn(&Footprint) -> u64| part.iter().map(f).sum::<u64>() / part.len() as u64;
        let min = |part: &[Footprint], f: fn(&Footprint) -> usize| part.iter().map(f).min().unwrap_or(0);
        Growth {
            rss_kib: (mean(first, |f| f.rss_kib), mean(last, |f| f.rss_kib)),
            anon_kib: (mean(first, |f| f.anon_kib), mean(last, |f| f.anon_kib)),
            open_files: (min(first, |f| f.open_files), min(last, |f| f.open_files)),
            mappings: (min(first, |f| f.mappings), min(last, |f| f.mappings)),
            bpf_map_kib: (mean(first, |f| f.bpf_map_kib), mean(last, |f| f.bpf_map_kib)),
            threads: (min(first, |f| f.threads), min(last, |f| f.threads)),
        }
    }

    /// What grew beyond noise, one line each; empty if the footprint is flat. RSS may move by
    /// 10% or 2 MiB, whichever is more (an interval's profile and names come and go); counts
    /// by a few.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut kib = |name: &str, (first, last): (u64, u64)| {
            if last > first + (first / 10).max(2048) {
                problems.push(format!("{name} grew from {} to {} MiB", first / 1024, last / 1024));
            }
        };
        kib("RSS", self.rss_kib);
        kib("anonymous RSS", self.anon_kib);
        kib("BPF map memory", self.bpf_map_kib);
        let mut count = |name: &str, (first, last): (usize, usize), slack: usize| {
            if last > first + slack {
                problems.push(format!("{name} grew from {first} to {last}"));
            }
        };
        count("open files", self.open_files, 8);
        count("memory mappings", self.mappings, 16);
        count("threads", self.threads, 0);
        problems
    }
}

/// One line per sample, for the bench's table and the test's log.
pub fn table(samples: &[Footprint]) -> String {
    let mut out = String::from("| time s | RSS MiB | anon MiB | open files | mappings | BPF map MiB | threads | CPU % since last |\n|---|---|---|---|---|---|---|---|\n");
    for pair in samples.windows(2) {
        let (before, now) = (pair[0], pair[1]);
        let cpu = (now.cpu_ns - before.cpu_ns) as f64 / (now.at - before.at).as_nanos() as f64 * 100.0;
        out += &format!(
            "| {:.0} | {:.1} | {:.1} | {} | {} | {:.1} | {} | {cpu:.2} |\n",
            now.at.as_secs_f64(),
            now.rss_kib as f64 / 1024.0,
            now.anon_kib as f64 / 1024.0,
            now.open_files,
            now.mappings,
            now.bpf_map_kib as f64 / 1024.0,
            now.threads
        );
    }
    out
}
