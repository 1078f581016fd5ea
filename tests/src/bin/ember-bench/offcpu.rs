//! `cargo xtask bench offcpu`: `perf bench sched pipe` (two tasks ping-ponging through a pipe
//! on one CPU: every operation is two context switches) with no profiler, with a bpftrace sched_switch
//! program that records both stacks, and with Ember's off-CPU profiling.
use std::{process::Command, time::Duration};

use anyhow::{Context as _, Result};

use super::{opt, release_bin, Profiler};

const WARM_UP: Duration = Duration::from_secs(3);

/// Runs `perf bench sched pipe` pinned to CPU 0 for about `seconds`; returns microseconds per
/// operation. Pinned, every operation is two context switches on one CPU; unpinned, the
/// figure measures cross-CPU wake-up latency of the VM instead.
fn pipe_latency(seconds: u64) -> Result<f64> {
    // About 2 us per op unprofiled on the reference machine: size the loop count to the window.
    let loops = (seconds * 400_000).to_string();
    let out = Command::new("taskset")
        .args(["-c", "0", "perf", "bench", "sched", "pipe", "-l", &loops])
        .output()
        .context("running perf bench")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.contains("usecs/op"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no usecs/op in perf bench output: {text}"))
}

pub fn run(seconds: u64) -> Result<()> {
    println!("bench offcpu: perf bench sched pipe, ~{seconds}s per run");
    let baseline = pipe_latency(seconds)?;
    let mut bpftrace = Command::new("bpftrace");
    bpftrace.args(["-e", "tracepoint:sched:sched_switch { @[kstack, ustack] = count(); }"]).stdout(std::process::Stdio::null());
    let mut ember = Command::new(release_bin("ember-agent"));
    let dir = std::env::temp_dir().join(format!("ember-bench-offcpu-{}", std::process::id()));
    ember.args(["run", "--events", "offcpu", "--output-dir"]).arg(&dir);
    let mut rows = vec![("no profiler", None, baseline)];
    for (name, command) in [("bpftrace sched_switch", bpftrace), ("ember-agent offcpu", ember)] {
        let profiler = Profiler::start(name, command)?;
        std::thread::sleep(WARM_UP);
        let before = profiler.snapshot()?;
        let latency = pipe_latency(seconds)?;
        let after = profiler.snapshot()?;
        profiler.stop()?;
        rows.push((name, after.bpf_ns_per_run_since(&before), latency));
        println!("  {name}: done");
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!();
    println!("Command: cargo xtask bench offcpu --seconds {seconds}");
    println!("| profiler | sched_switch program ns/run | pipe usecs/op | latency vs none |");
    println!("|---|---|---|---|");
    for (name, ns, latency) in rows {
        println!("| {name} | {} | {latency:.2} | {:.2}x |", opt(ns, 0), latency / baseline);
    }
    Ok(())
}
