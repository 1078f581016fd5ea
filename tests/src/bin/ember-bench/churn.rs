//! `cargo xtask bench churn`: how much of short-lived processes' time each profiler names,
//! side by side on the same churn (200 processes a second, each busy for 20 to 200 ms in
//! `churn_work`): `perf record -a -g` then `perf script`, bpftrace's `profile` with `ustack`,
//! and ember-agent, each host-wide at 99 Hz in turn, on a fresh run of the churn. A sample
//! counts as named when every frame of it has a function name, as complete when it reaches
//! `main` (the fixture is built at -O2, without frame pointers). Then what started processes
//! cost each profiler (`churn_cost`).
use std::{fs, path::Path, process::Command, time::Duration};

use anyhow::{ensure, Context as _, Result};
use ember_tests::soak::build_churn;

use super::{empty_dir, 
    oncpu::{stacks, wait_for_profile, Profiler, Scope},
    Profiler as Running,
};

const HZ: u64 = 99;
const PER_SECOND: &str = "200";
const COMM: &str = "churn_child";
/// Ember's interval: its first profile, before the churn starts, is left out.
const INTERVAL: Duration = Duration::from_secs(5);
/// What bpftrace and perf take to attach before the churn starts.
const ATTACH: Duration = Duration::from_secs(2);

pub fn run(seconds: u64) -> Result<()> {
    let dir = empty_dir("churn")?;
    let (churn, child) = build_churn(&dir);
    println!("bench churn: {PER_SECOND} processes/s for {seconds}s, each profiler host-wide at {HZ} Hz in turn");
    let mut rows = Vec::new();
    for (name, profiler) in [("perf record -g", Profiler::Perf), ("bpftrace profile", Profiler::Bpftrace), ("ember-agent", Profiler::Ember)] {
        let out = dir.join(name.replace(' ', "-"));
        fs::create_dir_all(&out)?;
        let (stacks, overhead) = measure(profiler, &churn, &child, &out, seconds)?;
        let count = |keep: &dyn Fn(&[String]) -> bool| stacks.iter().filter(|(f, _)| keep(f)).map(|(_, n)| n).sum::<u64>();
        let all = count(&|_| true);
        let named = count(&|frames| frames.iter().all(|f| is_named(f)));
        let in_work = count(&|frames| frames.iter().any(|f| f.starts_with("churn_work")));
        let complete = count(&|frames| frames.iter().any(|f| f == "main"));
        let share = |n: u64| n as f64 / all.max(1) as f64;
        println!("  {name:<18} done");
        rows.push(format!("| {name} | {all} | {:.3} | {:.3} | {:.3} | {:.2} |", share(named), share(in_work), share(complete), overhead * 100.0));
    }
    let _ = fs::remove_dir_all(&dir);
    println!("\nCommand: cargo xtask bench churn --seconds {seconds}");
    println!("| profiler | samples of {COMM} | named to function level | in churn_work | reaching main | profiler CPU + BPF, % of a core |");
    println!("|---|---|---|---|---|---|");
    rows.iter().for_each(|row| println!("{row}"));
    super::churn_cost::run(seconds)
}

/// Runs the churn under one profiler: the churn's stacks (function names, leaf first) with
/// their counts, and what the profiler cost over the churn (CPU and BPF run time, a share of
/// one core; perf's `perf script` afterwards is not in it).
fn measure(profiler: Profiler, churn: &Path, child: &Path, out: &Path, seconds: u64) -> Result<(Vec<(Vec<String>, u64)>, f64)> {
    let command = profiler.command(HZ, Scope::Comm(COMM), &["-g"], INTERVAL, out)?;
    let running = Running::start("profiler", command)?;
    match profiler {
        Profiler::Ember => wait_for_profile(&out.join("profiles"))?,
        _ => std::thread::sleep(ATTACH),
    }
    let before = running.snapshot()?;
    let started = std::time::Instant::now();
    let status = Command::new(churn).arg(child).args([&seconds.to_string(), PER_SECOND]).status().context("running the churn")?;
    ensure!(status.success(), "the churn failed: {status}");
    let overhead = running.snapshot()?.overhead_since(&before, started.elapsed().as_secs_f64());
    running.stop()?;
    Ok((stacks(profiler, Some(COMM), out), overhead))
}

/// Whether a frame has a function name: not an address (bpftrace's `0x7f…`, Ember's
/// `module+0x…`) nor perf's `[unknown]`.
fn is_named(frame: &str) -> bool {
    !(frame.starts_with("0x") || frame.contains("+0x") || frame.contains("[unknown]"))
}
