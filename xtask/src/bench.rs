//! `cargo xtask bench oncpu`: the same busy workload with no profiler, with `perf record`,
//! with bpftrace and with ember-agent, side by side, at each frequency. Every profiler is
//! measured the same way, from /proc: CPU over the steady-state window, peak RSS, and (via
//! kernel.bpf_stats_enabled) the run time of its BPF programs and the memory of its maps.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use ember_tests::Decoded;

use crate::{cargo, run, workspace_root};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Which benchmark.
    #[arg(value_parser = ["oncpu"])]
    which: String,
    /// Length of the measured window per run.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Sampling frequencies to compare (Hz).
    #[arg(long, value_delimiter = ',', default_value = "99,999")]
    frequencies: Vec<u64>,
}

/// Before measuring, each profiler attaches (bpftrace compiles its script), sees the workload
/// binaries once (a short priming run), and Ember completes its first 10 s interval, whose
/// symbolization starts with cold caches. The window after it is the steady state a host
/// running the profiler all the time pays; the warm-up's cost is reported as start-up CPU.
const WARM_UP: Duration = Duration::from_secs(12);
const PRIMING: Duration = Duration::from_secs(2);
/// Busy workload processes: one per CPU of the 2-core reference machine.
const WORKERS: usize = 2;

#[derive(Clone, Copy, PartialEq)]
enum Profiler {
    Perf,
    Bpftrace,
    Ember,
}

impl Profiler {
    fn name(self) -> &'static str {
        match self {
            Profiler::Perf => "perf record -g",
            Profiler::Bpftrace => "bpftrace profile",
            Profiler::Ember => "ember-agent",
        }
    }
}

struct Row {
    profiler: &'static str,
    hz: u64,
    bpf_ns_per_sample: Option<f64>,
    cpu_percent: f64,
    startup_cpu_s: f64,
    rss_mib: f64,
    map_mib: Option<f64>,
    throughput_ratio: f64,
    share_a: String,
}

pub fn bench(args: BenchArgs) -> Result<()> {
    if args.which != "oncpu" {
        bail!("unknown benchmark {}", args.which);
    }
    run(cargo().args(["build", "--release", "-p", "ember-agent", "-p", "ember-tests"]))?;
    let stats = BpfStatsEnabled::enable()?;
    let window = Duration::from_secs(args.seconds);
    println!("bench oncpu: {WORKERS} busy workers, {}s measured per run after a {}s warm-up", args.seconds, WARM_UP.as_secs());
    let baseline = workload(window)?;
    println!("  no profiler: {baseline:.1} rounds/s");
    let mut rows = Vec::new();
    for &hz in &args.frequencies {
        for profiler in [Profiler::Perf, Profiler::Bpftrace, Profiler::Ember] {
            let row = measure(profiler, hz, window, baseline)?;
            println!("  {:<17} {hz:>4} Hz: done", row.profiler);
            rows.push(row);
        }
    }
    drop(stats);
    print_table(&args, &rows);
    Ok(())
}

fn release_bin(name: &str) -> PathBuf {
    workspace_root().join("target/release").join(name)
}

/// Runs the fixture's 70/30 split on every worker; returns completed rounds per second.
fn workload(window: Duration) -> Result<f64> {
    let workers: Vec<Child> = (0..WORKERS)
        .map(|_| {
            Command::new(release_bin("fixture"))
                .args(["split", &window.as_secs_f64().to_string()])
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()
        .context("starting fixture")?;
    let mut rounds = 0u64;
    for worker in workers {
        let out = worker.wait_with_output()?;
        // "<units> <a units>": the first number is the work done.
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        rounds += text.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()).context("fixture output")?;
    }
    Ok(rounds as f64 / window.as_secs_f64())
}

fn measure(profiler: Profiler, hz: u64, window: Duration, baseline: f64) -> Result<Row> {
    let dir = std::env::temp_dir().join(format!("ember-bench-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let mut command = match profiler {
        Profiler::Perf => {
            let mut c = Command::new("perf");
            c.args(["record", "-F", &hz.to_string(), "-g", "-a", "-o"]).arg(dir.join("perf.data"));
            c
        }
        Profiler::Bpftrace => {
            let mut c = Command::new("bpftrace");
            c.args(["-e", &format!("profile:hz:{hz} {{ @[kstack, ustack, comm] = count(); }}")]);
            c.stdout(fs::File::create(dir.join("bpftrace.out"))?);
            c
        }
        Profiler::Ember => {
            let mut c = Command::new(release_bin("ember-agent"));
            c.args(["run", "-F", &hz.to_string(), "--output-dir"]).arg(dir.join("profiles"));
            c
        }
    };
    let mut child = command.stderr(Stdio::null()).spawn().with_context(|| format!("starting {}", profiler.name()))?;
    let pid = child.id();
    let started = Instant::now();
    workload(PRIMING)?;
    std::thread::sleep(WARM_UP.saturating_sub(started.elapsed()));
    if let Some(status) = child.try_wait()? {
        bail!("{} exited during warm-up ({status})", profiler.name());
    }
    let (cpu_before, bpf_before) = (cpu_ns(pid), bpf_usage(pid));
    let started = Instant::now();
    let throughput = workload(window)?;
    let elapsed = started.elapsed().as_secs_f64();
    let (cpu_after, bpf_after) = (cpu_ns(pid), bpf_usage(pid));
    let rss_mib = peak_rss_kib(pid) as f64 / 1024.0;
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("{} did not stop within 120 s of SIGINT", profiler.name());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let runs = bpf_after.prog_runs.saturating_sub(bpf_before.prog_runs);
    let row = Row {
        profiler: profiler.name(),
        hz,
        bpf_ns_per_sample: (runs > 0).then(|| (bpf_after.prog_run_ns - bpf_before.prog_run_ns) as f64 / runs as f64),
        cpu_percent: (cpu_after - cpu_before) as f64 / 1e9 / elapsed * 100.0,
        startup_cpu_s: cpu_before as f64 / 1e9,
        rss_mib,
        map_mib: (bpf_after.map_bytes > 0).then(|| bpf_after.map_bytes as f64 / (1 << 20) as f64),
        throughput_ratio: throughput / baseline,
        share_a: split_share(profiler, &dir),
    };
    let _ = fs::remove_dir_all(&dir);
    Ok(row)
}

/// CPU time of all live threads of a process, in ns (schedstat is ns-precise, unlike stat).
fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()))
        .sum()
}

fn peak_rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[derive(Debug, Default, Clone, Copy)]
struct BpfUsage {
    map_bytes: u64,
    prog_run_ns: u64,
    prog_runs: u64,
}

/// What a process's BPF objects cost, from its fdinfo: memory charged to its maps, and the
/// run time of its programs (counted while kernel.bpf_stats_enabled is 1).
fn bpf_usage(pid: u32) -> BpfUsage {
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

/// Turns on BPF run-time accounting for the benchmark and restores the old value after.
struct BpfStatsEnabled(String);

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStatsEnabled {
    fn enable() -> Result<BpfStatsEnabled> {
        let old = fs::read_to_string(BPF_STATS).context("reading kernel.bpf_stats_enabled")?;
        fs::write(BPF_STATS, "1").context("enabling kernel.bpf_stats_enabled (needs root)")?;
        Ok(BpfStatsEnabled(old))
    }
}

impl Drop for BpfStatsEnabled {
    fn drop(&mut self) {
        let _ = fs::write(BPF_STATS, self.0.trim());
    }
}

/// hot_a's share of the fixture's hot_a + hot_b samples, from each profiler's own output
/// (truth: 0.70), or why there is none.
fn split_share(profiler: Profiler, dir: &Path) -> String {
    let (mut a, mut b, mut fixture) = (0u64, 0u64, 0u64);
    let mut count = |text: &str, n: u64| {
        fixture += n;
        if text.contains("hot_a") {
            a += n;
        } else if text.contains("hot_b") {
            b += n;
        }
    };
    match profiler {
        Profiler::Ember => {
            for entry in fs::read_dir(dir.join("profiles")).into_iter().flatten().flatten() {
                let profile = Decoded::read(&entry.path());
                for sample in profile.samples.iter().filter(|s| s.labels.get("comm").is_some_and(|c| c == "fixture")) {
                    let names: Vec<&str> = sample.frames.iter().map(|f| f.function.as_str()).collect();
                    count(&names.join(";"), sample.values[0] as u64);
                }
            }
        }
        Profiler::Perf => {
            let out = Command::new("perf")
                .args(["script", "-F", "comm,ip,sym", "-i"])
                .arg(dir.join("perf.data"))
                .stderr(Stdio::null())
                .output();
            let stdout = out.map(|o| o.stdout).unwrap_or_default();
            for block in String::from_utf8_lossy(&stdout).split("\n\n") {
                if block.trim_start().starts_with("fixture") {
                    count(block, 1);
                }
            }
        }
        Profiler::Bpftrace => {
            let text = fs::read_to_string(dir.join("bpftrace.out")).unwrap_or_default();
            for block in text.split("@[").skip(1) {
                let Some((key, n)) = block.rsplit_once("]: ") else { continue };
                if key.trim_end().ends_with("fixture") {
                    count(key, n.trim().parse().unwrap_or(0));
                }
            }
        }
    }
    match (a + b, fixture) {
        (0, 0) => "no fixture samples".into(),
        // bpftrace names user frames when it prints, after the workload has exited.
        (0, _) => "frames unnamed".into(),
        (named, _) => format!("{:.3}", a as f64 / named as f64),
    }
}

fn print_table(args: &BenchArgs, rows: &[Row]) {
    let opt = |v: Option<f64>, digits: usize| v.map_or("n/a".to_string(), |v| format!("{v:.digits$}"));
    println!();
    println!("Command: cargo xtask bench oncpu --seconds {} --frequencies {}", args.seconds, args.frequencies.iter().map(u64::to_string).collect::<Vec<_>>().join(","));
    println!("| profiler | Hz | BPF ns/sample | steady CPU % of one core | start-up CPU s | peak RSS MiB | BPF map MiB | throughput vs none | hot_a share (truth 0.70) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.3} | {:.2} | {:.1} | {} | {:.3} | {} |",
            r.profiler,
            r.hz,
            opt(r.bpf_ns_per_sample, 0),
            r.cpu_percent,
            r.startup_cpu_s,
            r.rss_mib,
            opt(r.map_mib, 1),
            r.throughput_ratio,
            r.share_a
        );
    }
}
