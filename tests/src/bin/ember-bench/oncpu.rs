//! `cargo xtask bench oncpu`: the same busy workload with no profiler, with `perf record`,
//! with bpftrace and with ember-agent, side by side, at each frequency.
use std::{
    fs,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result};
use ember_tests::Decoded;

use super::{opt, release_bin, Profiler as Running};

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
    end_rss_mib: f64,
    end_file_rss_mib: f64,
    map_mib: Option<f64>,
    throughput_ratio: f64,
    share_a: String,
}

pub fn run(seconds: u64, frequencies: &[u64]) -> Result<()> {
    let window = Duration::from_secs(seconds);
    println!("bench oncpu: {WORKERS} busy workers, {seconds}s measured per run after a {}s warm-up", WARM_UP.as_secs());
    let baseline = workload(window)?;
    println!("  no profiler: {baseline:.1} rounds/s");
    let mut rows = Vec::new();
    for &hz in frequencies {
        for profiler in [Profiler::Perf, Profiler::Bpftrace, Profiler::Ember] {
            let row = measure(profiler, hz, window, baseline)?;
            println!("  {:<17} {hz:>4} Hz: done", row.profiler);
            rows.push(row);
        }
    }
    println!();
    println!(
        "Command: cargo xtask bench oncpu --seconds {seconds} --frequencies {}",
        frequencies.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
    );
    println!("| profiler | Hz | BPF ns/sample | steady CPU % of one core | start-up CPU s | peak RSS MiB | RSS at end MiB (files) | BPF map MiB | throughput vs none | hot_a share (truth 0.70) |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.3} | {:.2} | {:.1} | {:.1} ({:.1}) | {} | {:.3} | {} |",
            r.profiler,
            r.hz,
            opt(r.bpf_ns_per_sample, 0),
            r.cpu_percent,
            r.startup_cpu_s,
            r.rss_mib,
            r.end_rss_mib,
            r.end_file_rss_mib,
            opt(r.map_mib, 1),
            r.throughput_ratio,
            r.share_a
        );
    }
    Ok(())
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
    let command = match profiler {
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
    let profiler_process = Running::start(profiler.name(), command)?;
    let started = std::time::Instant::now();
    workload(PRIMING)?;
    std::thread::sleep(WARM_UP.saturating_sub(started.elapsed()));
    let before = profiler_process.snapshot()?;
    let started = std::time::Instant::now();
    let throughput = workload(window)?;
    let elapsed = started.elapsed().as_secs_f64();
    let after = profiler_process.snapshot()?;
    profiler_process.stop()?;
    let row = Row {
        profiler: profiler.name(),
        hz,
        bpf_ns_per_sample: after.bpf_ns_per_run_since(&before),
        cpu_percent: after.cpu_percent_since(&before, elapsed),
        startup_cpu_s: before.cpu_ns as f64 / 1e9,
        rss_mib: after.peak_rss_mib,
        end_rss_mib: after.rss_mib,
        end_file_rss_mib: after.file_rss_mib,
        map_mib: after.map_mib(),
        throughput_ratio: throughput / baseline,
        share_a: split_share(profiler, &dir),
    };
    let _ = fs::remove_dir_all(&dir);
    Ok(row)
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
