//! `cargo xtask bench faults`: what the `faults` group costs a fault-heavy workload (the
//! fixture's `fault-loop`: map 64 MiB, touch every page, unmap, again; both CPUs, one
//! process each) and its profiler, side by side: Ember's `--events faults` at its default
//! period (one fault in 1,000), and at every fault under a 1% CPU budget, `perf record -e
//! page-faults -c 1000 -g -a`, bpftrace counting user stacks every 1,000 faults, and `perf
//! stat` counting the event alone.
//! Throughput is pages touched a second, against runs without a profiler before and after;
//! cost is the profiler's CPU plus its BPF run time, as a share of one core, over the workload.
use std::{
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result};

use super::{empty_dir, release_bin, Profiler};

/// What perf and bpftrace take to attach, and Ember to read the host's processes.
const ATTACH: Duration = Duration::from_secs(3);
/// Seconds of workload before the measure under a CPU budget: the governor's two warm-up
/// intervals and a cut.
const LEAD: u64 = 8;

/// Runs one fault-loop per CPU for `seconds`; returns pages touched a second, all together.
fn fault_loops(seconds: u64) -> Result<f64> {
    let cpus = std::thread::available_parallelism()?.get();
    let children: Vec<_> = (0..cpus)
        .map(|_| Command::new(release_bin("fixture")).args(["fault-loop", &seconds.to_string()]).stdout(Stdio::piped()).spawn())
        .collect::<std::io::Result<_>>()
        .context("starting the fault loops")?;
    let mut pages = 0u64;
    for child in children {
        let out = child.wait_with_output()?;
        pages += String::from_utf8_lossy(&out.stdout).trim().parse::<u64>().context("a fault loop's output")?;
    }
    Ok(pages as f64 / seconds as f64)
}

pub fn run(seconds: u64) -> Result<()> {
    println!("bench faults: fixture fault-loop on every CPU, {seconds}s per run; no profiler before and after each");
    let dir = empty_dir("faults")?;
    let mut ember = Command::new(release_bin("ember-agent"));
    ember.args(["run", "--events", "faults", "--output-dir"]).arg(dir.join("ember"));
    // Every fault sampled would cost a quarter of a core here: the budget narrows it. Its
    // 2 s intervals and the workload's lead let the governor settle before the measure.
    let mut governed = Command::new(release_bin("ember-agent"));
    governed.args(["run", "--events", "faults", "--fault-period", "1", "--cpu-budget", "1%", "--interval", "2s", "--output-dir"]).arg(dir.join("governed"));
    let mut perf = Command::new("perf");
    perf.args(["record", "-e", "page-faults", "-c", "1000", "-g", "-a", "-o"]).arg(dir.join("perf.data")).stdout(Stdio::null());
    // The event counting alone, no sampling and no program: what opening it costs the faults.
    let mut counting = Command::new("perf");
    counting.args(["stat", "-e", "page-faults", "-a", "-o"]).arg(dir.join("perf-stat.txt"));
    let mut bpftrace = Command::new("bpftrace");
    bpftrace.args(["-e", "software:page-faults:1000 { @[ustack, comm] = count(); }"]).stdout(Stdio::null());
    let profilers = [
        ("ember-agent --events faults", ember, 0),
        ("ember-agent --events faults --fault-period 1 --cpu-budget 1%", governed, LEAD),
        ("perf record -e page-faults -c 1000 -g -a", perf, 0),
        ("bpftrace software:page-faults:1000", bpftrace, 0),
        ("perf stat -e page-faults -a (counting only)", counting, 0),
    ];
    // The workload's own rate drifts by some 5% over a run: each profiler is compared with
    // the runs without one just before and after it.
    let mut baselines = vec![fault_loops(seconds)?];
    let mut rows = Vec::new();
    for (name, command, lead) in profilers {
        let profiler = Profiler::start(name, command)?;
        std::thread::sleep(ATTACH);
        if lead > 0 {
            fault_loops(lead)?;
        }
        let before = profiler.snapshot()?;
        let throughput = fault_loops(seconds)?;
        let cost = profiler.snapshot()?.overhead_since(&before, seconds as f64);
        profiler.stop_for_output()?;
        baselines.push(fault_loops(seconds)?);
        let around = (baselines[baselines.len() - 2] + baselines[baselines.len() - 1]) / 2.0;
        println!("  {name}: done");
        rows.push((name, throughput, around, cost));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let (low, high) = baselines.iter().fold((f64::MAX, 0.0f64), |(l, h), &b| (l.min(b), h.max(b)));
    println!();
    println!("Command: cargo xtask bench faults --seconds {seconds}");
    println!("| profiler | pages touched/s | vs no profiler before and after | profiler cost (% of a core: CPU + BPF) |");
    println!("|---|---|---|---|");
    println!("| no profiler ({} runs) | {low:.0}-{high:.0} | - | - |", baselines.len());
    for (name, throughput, around, cost) in rows {
        println!("| {name} | {throughput:.0} | {:.3} | {:.2}% |", throughput / around, cost * 100.0);
    }
    Ok(())
}
