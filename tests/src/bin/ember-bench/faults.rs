//! `cargo xtask bench faults`: what the `faults` group costs a fault-heavy workload (the
//! fixture's `fault-loop`: map 64 MiB, touch every page, unmap, again; both CPUs, one
//! process each) and its profiler, side by side: Ember's `--events faults` at its default
//! period (one fault in 1,000), `perf record -e page-faults -c 1000 -g -a`, and bpftrace
//! counting user stacks every 1,000 faults. Throughput is pages touched a second; cost is
//! the profiler's CPU plus its BPF run time, as a share of one core, over the workload.
use std::{
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result};

use super::{empty_dir, release_bin, Profiler};

/// What perf and bpftrace take to attach, and Ember to read the host's processes.
const ATTACH: Duration = Duration::from_secs(3);

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
    println!("bench faults: fixture fault-loop on every CPU, {seconds}s per run");
    let baseline = fault_loops(seconds)?;
    let dir = empty_dir("faults")?;
    let mut ember = Command::new(release_bin("ember-agent"));
    ember.args(["run", "--events", "faults", "--output-dir"]).arg(&dir);
    let mut perf = Command::new("perf");
    perf.args(["record", "-e", "page-faults", "-c", "1000", "-g", "-a", "-o"]).arg(dir.join("perf.data")).stdout(Stdio::null());
    let mut bpftrace = Command::new("bpftrace");
    bpftrace.args(["-e", "software:page-faults:1000 { @[ustack, comm] = count(); }"]).stdout(Stdio::null());
    let mut rows = Vec::new();
    for (name, command) in [("ember-agent --events faults", ember), ("perf record -e page-faults -c 1000 -g -a", perf), ("bpftrace software:page-faults:1000", bpftrace)] {
        let profiler = Profiler::start(name, command)?;
        std::thread::sleep(ATTACH);
        let before = profiler.snapshot()?;
        let throughput = fault_loops(seconds)?;
        let cost = profiler.snapshot()?.overhead_since(&before, seconds as f64);
        profiler.stop_for_output()?;
        println!("  {name}: done");
        rows.push((name, throughput, cost));
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!();
    println!("Command: cargo xtask bench faults --seconds {seconds}");
    println!("| profiler | pages touched/s | vs none | profiler cost (% of a core: CPU + BPF) |");
    println!("|---|---|---|---|");
    println!("| no profiler | {baseline:.0} | 1.000 | - |");
    for (name, throughput, cost) in rows {
        println!("| {name} | {throughput:.0} | {:.3} | {:.2}% |", throughput / baseline, cost * 100.0);
    }
    Ok(())
}
