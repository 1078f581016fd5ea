//! `cargo xtask bench governor`: a switch-heavy workload (the fixture's `pingpong`: two
//! threads handing a turn to each other through pipes, `--busy-us` busy per turn: 20 us
//! makes some 80,000 context switches a second here, 100 us some 16,000) profiled on-CPU
//! at 999 Hz and off-CPU, by bpftrace (the same two programs, stacks counted in maps), by
//! Ember without a budget, and by Ember under CPU budgets. Overhead is the profiler's CPU plus
//! its BPF programs' run time, as a share of one core, over the window after a warm-up long
//! enough for the governor to settle. A second table does the same on a busy host: both
//! threads pinned to one CPU with no work a turn, while processes start (`churn_cost`'s mix),
//! where the off-CPU program's runs alone cost more than a 1% budget at any rate, and no
//! budget holds unless it is paused; Ember without a budget, then three runs under 1%.
use std::{
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result};

use super::{empty_dir, release_bin, Profiler};

const WARM_UP: Duration = Duration::from_secs(8);
const BUDGETS: [&str; 2] = ["1%", "2%"];

/// What one run measured: overhead (share of a core) and the workload's turns per second.
struct Row {
    name: String,
    budget: Option<f64>,
    overhead: Option<f64>,
    turns_per_s: f64,
}

/// The busy host of the second table: both pingpong threads pinned to one CPU, no work per
/// turn (some 400,000 switches a second here), while CHURN_RATE processes a second start.
const CHURN_RATE: u64 = 27;
const BUSY_HOST_BUDGET_RUNS: usize = 3;

/// Runs the workload for `seconds` (pinned to CPU 0 if `pinned`), calling `during` once it
/// runs; returns turns per second (both threads together).
fn pingpong(seconds: f64, busy_us: u64, pinned: bool, during: impl FnOnce() -> Result<Option<f64>>) -> Result<(f64, Option<f64>)> {
    let mut command = if pinned { Command::new("taskset") } else { Command::new(release_bin("fixture")) };
    if pinned {
        command.args(["-c", "0"]).arg(release_bin("fixture"));
    }
    let child = command
        .args(["pingpong", &seconds.to_string(), &busy_us.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the fixture")?;
    let measured = during();
    let out = child.wait_with_output().context("waiting for the fixture")?;
    let text = String::from_utf8_lossy(&out.stdout);
    // Each thread prints "<tid> <wall ns> <cpu ns> <turns>".
    let turns: u64 = text.lines().filter_map(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok()).sum();
    anyhow::ensure!(turns > 0, "the fixture printed no turns: {text}");
    Ok((turns as f64 / seconds, measured?))
}

pub fn run(seconds: u64, busy_us: u64) -> Result<()> {
    let total = (WARM_UP.as_secs() + seconds + 1) as f64;
    println!(
        "bench governor: fixture pingpong ({busy_us} us a turn), on-CPU 999 Hz + off-CPU, {}s warm-up + {seconds}s window per run",
        WARM_UP.as_secs()
    );
    let (baseline, _) = pingpong(total, busy_us, false, || Ok(None))?;
    let mut rows = vec![Row { name: "no profiler".into(), budget: None, overhead: None, turns_per_s: baseline }];

    let dir = empty_dir("governor")?;
    let mut runs: Vec<(String, Option<f64>, Command)> = Vec::new();
    let mut bpftrace = Command::new("bpftrace");
    bpftrace.args(["-e", "profile:hz:999 { @cpu[kstack, ustack] = count(); } tracepoint:sched:sched_switch { @off[kstack, ustack] = count(); }"]);
    bpftrace.stdout(Stdio::null());
    runs.push(("bpftrace profile + sched_switch".into(), None, bpftrace));
    for budget in [None].into_iter().chain(BUDGETS.map(Some)) {
        let mut ember = Command::new(release_bin("ember-agent"));
        ember.args(["run", "--events", "cpu,offcpu", "-F", "999", "--interval", "1s", "--output-dir"]).arg(&dir);
        let name = match budget {
            Some(budget) => {
                ember.args(["--cpu-budget", budget]);
                format!("ember-agent --cpu-budget {budget}")
            }
            None => "ember-agent, no budget".into(),
        };
        let share = budget.map(|b| b.trim_end_matches('%').parse::<f64>().expect("a percent") / 100.0);
        runs.push((name, share, ember));
    }
    for (name, budget, command) in runs {
        let (turns_per_s, overhead) = measure(command, total, seconds, busy_us, false)?;
        println!("  {name}: done");
        rows.push(Row { name, budget, overhead, turns_per_s });
    }
    print_table(&format!("cargo xtask bench governor --seconds {seconds} --busy-us {busy_us}"), rows, baseline);

    println!("\nbench governor, busy host: pingpong pinned to CPU 0 with no work a turn, {CHURN_RATE} processes started a second");
    let (baseline, _) = churning(total, || pingpong(total, 0, true, || Ok(None)))?;
    let mut rows = vec![Row { name: "no profiler".into(), budget: None, overhead: None, turns_per_s: baseline }];
    let budgets = std::iter::once(None).chain(std::iter::repeat(Some("1%")).take(BUSY_HOST_BUDGET_RUNS));
    for (run, budget) in budgets.enumerate() {
        let mut ember = Command::new(release_bin("ember-agent"));
        ember.args(["run", "--events", "cpu,offcpu", "-F", "999", "--interval", "1s", "--output-dir"]).arg(&dir);
        ember.args(budget.map(|b| ["--cpu-budget", b]).into_iter().flatten());
        let (turns_per_s, overhead) = churning(total, || measure(ember, total, seconds, 0, true))?;
        let name = budget.map_or("ember-agent, no budget".into(), |b| format!("ember-agent --cpu-budget {b}, run {run}"));
        println!("  {name}: done");
        rows.push(Row { name, budget: budget.map(|_| 0.01), overhead, turns_per_s });
    }
    let _ = std::fs::remove_dir_all(&dir);
    print_table(&format!("cargo xtask bench governor --seconds {seconds} --busy-us {busy_us} (busy host)"), rows, baseline);
    Ok(())
}

/// Runs `during` while CHURN_RATE processes a second start, for `seconds`.
fn churning<T>(seconds: f64, during: impl FnOnce() -> Result<T>) -> Result<T> {
    let churn = std::thread::spawn(move || super::churn_cost::churn(CHURN_RATE, Duration::from_secs_f64(seconds)));
    let measured = during();
    churn.join().expect("the churn thread panicked")?;
    measured
}

/// Starts the profiler, then the workload; returns the workload's turns per second and what
/// the profiler cost over the window after WARM_UP.
fn measure(command: Command, total: f64, seconds: u64, busy_us: u64, pinned: bool) -> Result<(f64, Option<f64>)> {
    let profiler = Profiler::start("profiler", command)?;
    std::thread::sleep(Duration::from_secs(2)); // attached before the workload starts
    let measured = pingpong(total, busy_us, pinned, || {
        std::thread::sleep(WARM_UP);
        let before = profiler.snapshot()?;
        std::thread::sleep(Duration::from_secs(seconds));
        let after = profiler.snapshot()?;
        Ok(Some(after.overhead_since(&before, seconds as f64)))
    })?;
    profiler.stop()?;
    Ok(measured)
}

fn print_table(command: &str, rows: Vec<Row>, baseline: f64) {
    println!();
    println!("Command: {command}");
    println!("| profiler | overhead (% of a core: CPU + BPF) | vs budget | workload turns/s | vs none |");
    println!("|---|---|---|---|---|");
    for row in rows {
        let overhead = row.overhead.map_or("-".into(), |o| format!("{:.2}%", o * 100.0));
        let versus = match (row.overhead, row.budget) {
            (Some(o), Some(b)) => format!("{:.2}x", o / b),
            _ => "-".into(),
        };
        println!("| {} | {overhead} | {versus} | {:.0} | {:.3} |", row.name, row.turns_per_s, row.turns_per_s / baseline);
    }
}
