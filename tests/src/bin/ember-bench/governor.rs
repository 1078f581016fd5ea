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
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};
use ember_tests::Decoded;

use super::{empty_dir, release_bin, Profiler};

const WARM_UP: Duration = Duration::from_secs(8);
const BUDGETS: [&str; 2] = ["1%", "2%"];

/// What one run measured: overhead (share of a core) and the workload's turns per second.
struct Row {
    name: String,
    budget: Option<f64>,
    overhead: Option<f64>,
    turns_per_s: f64,
    /// What the agent's profiles of the window say of the budget's pauses.
    pauses: String,
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
    let mut rows = vec![Row { name: "no profiler".into(), budget: None, overhead: None, turns_per_s: baseline, pauses: String::new() }];

    let dir = empty_dir("governor")?;
    // Each run's name, budget, command, and where Ember writes its profiles.
    let mut runs: Vec<(String, Option<f64>, Command, Option<std::path::PathBuf>)> = Vec::new();
    let mut bpftrace = Command::new("bpftrace");
    bpftrace.args(["-e", "profile:hz:999 { @cpu[kstack, ustack] = count(); } tracepoint:sched:sched_switch { @off[kstack, ustack] = count(); }"]);
    bpftrace.stdout(Stdio::null());
    runs.push(("bpftrace profile + sched_switch".into(), None, bpftrace, None));
    for (run, budget) in [None].into_iter().chain(BUDGETS.map(Some)).enumerate() {
        let out = dir.join(format!("run-{run}"));
        let mut ember = Command::new(release_bin("ember-agent"));
        ember.args(["run", "--events", "cpu,offcpu", "-F", "999", "--interval", "1s", "--output-dir"]).arg(&out);
        let name = match budget {
            Some(budget) => {
                ember.args(["--cpu-budget", budget]);
                format!("ember-agent --cpu-budget {budget}")
            }
            None => "ember-agent, no budget".into(),
        };
        let share = budget.map(|b| b.trim_end_matches('%').parse::<f64>().expect("a percent") / 100.0);
        runs.push((name, share, ember, budget.map(|_| out)));
    }
    for (name, budget, command, out) in runs {
        let (turns_per_s, overhead, window) = measure(command, total, seconds, busy_us, false)?;
        println!("  {name}: done");
        let pauses = out.map(|out| pauses_in(&out, window)).unwrap_or_default();
        rows.push(Row { name, budget, overhead, turns_per_s, pauses });
    }
    print_table(&format!("cargo xtask bench governor --seconds {seconds} --busy-us {busy_us}"), rows, baseline);

    println!("\nbench governor, busy host: pingpong pinned to CPU 0 with no work a turn, {CHURN_RATE} processes started a second");
    let (baseline, _) = churning(total, || pingpong(total, 0, true, || Ok(None)))?;
    let mut rows = vec![Row { name: "no profiler".into(), budget: None, overhead: None, turns_per_s: baseline, pauses: String::new() }];
    let budgets = std::iter::once(None).chain(std::iter::repeat(Some("1%")).take(BUSY_HOST_BUDGET_RUNS));
    for (run, budget) in budgets.enumerate() {
        let out = dir.join(format!("busy-{run}"));
        let mut ember = Command::new(release_bin("ember-agent"));
        ember.args(["run", "--events", "cpu,offcpu", "-F", "999", "--interval", "1s", "--output-dir"]).arg(&out);
        ember.args(budget.map(|b| ["--cpu-budget", b]).into_iter().flatten());
        let (turns_per_s, overhead, window) = churning(total, || measure(ember, total, seconds, 0, true))?;
        let name = budget.map_or("ember-agent, no budget".into(), |b| format!("ember-agent --cpu-budget {b}, run {run}"));
        println!("  {name}: done");
        let pauses = if budget.is_some() { pauses_in(&out, window) } else { String::new() };
        rows.push(Row { name, budget: budget.map(|_| 0.01), overhead, turns_per_s, pauses });
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

/// When a measured window began and ended.
type Window = (SystemTime, SystemTime);

/// Starts the profiler, then the workload; returns the workload's turns per second, what
/// the profiler cost over the window after WARM_UP, and the window.
fn measure(command: Command, total: f64, seconds: u64, busy_us: u64, pinned: bool) -> Result<(f64, Option<f64>, Window)> {
    let profiler = Profiler::start("profiler", command)?;
    std::thread::sleep(Duration::from_secs(2)); // attached before the workload starts
    let window = std::cell::Cell::new((SystemTime::now(), SystemTime::now()));
    let (turns_per_s, overhead) = pingpong(total, busy_us, pinned, || {
        std::thread::sleep(WARM_UP);
        let (before, from) = (profiler.snapshot()?, SystemTime::now());
        std::thread::sleep(Duration::from_secs(seconds));
        let after = profiler.snapshot()?;
        window.set((from, SystemTime::now()));
        Ok(Some(after.overhead_since(&before, seconds as f64)))
    })?;
    profiler.stop()?;
    Ok((turns_per_s, overhead, window.get()))
}

/// How many of the intervals within `window` had each source paused, and the dearest
/// interval's cost, from the profiles' comments.
fn pauses_in(dir: &std::path::Path, (from, to): Window) -> String {
    let nanos = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64);
    let wall = Decoded::read_kind(dir, "wall");
    let inside: Vec<&Decoded> = wall.iter().filter(|p| p.profile.time_nanos >= nanos(from) && p.profile.time_nanos + p.profile.duration_nanos <= nanos(to)).collect();
    let paused = |what: &str| inside.iter().filter(|p| p.comment_field("ember.paused").is_some_and(|v| v.split(',').any(|w| w == what))).count();
    let cost = |p: &Decoded, part: &str| p.comment_field(part).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let dearest = inside.iter().map(|p| cost(p, "ember.overhead.agent") + cost(p, "ember.overhead.bpf")).fold(0.0, f64::max);
    format!(
        "off-CPU paused {}/{n}, exec capture {}/{n}; dearest interval {:.2}%",
        paused("off_cpu"), paused("exec_capture"), dearest * 100.0, n = inside.len()
    )
}

fn print_table(command: &str, rows: Vec<Row>, baseline: f64) {
    println!();
    println!("Command: {command}");
    println!("| profiler | overhead (% of a core: CPU + BPF) | vs budget | workload turns/s | vs none | pauses (intervals in the window) |");
    println!("|---|---|---|---|---|---|");
    for row in rows {
        let overhead = row.overhead.map_or("-".into(), |o| format!("{:.2}%", o * 100.0));
        let versus = match (row.overhead, row.budget) {
            (Some(o), Some(b)) => format!("{:.2}x", o / b),
            _ => "-".into(),
        };
        println!("| {} | {overhead} | {versus} | {:.0} | {:.3} | {} |", row.name, row.turns_per_s, row.turns_per_s / baseline, row.pauses);
    }
}
