//! `cargo xtask bench governor`: a switch-heavy workload (the fixture's `pingpong`: two
//! threads handing a turn to each other through pipes, `--busy-us` busy per turn: 20 us
//! makes some 80,000 context switches a second here, 100 us some 16,000) profiled on-CPU
//! at 999 Hz and off-CPU, by bpftrace (the same two programs, stacks counted in maps), by
//! Ember without a budget, and by Ember under CPU budgets. Overhead is the profiler's CPU plus
//! its BPF programs' run time, as a share of one core, over the window after a warm-up long
//! enough for the governor to settle.
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

/// Runs the workload for `seconds`, calling `during` once it runs; returns turns per second
/// (both threads together).
fn pingpong(seconds: f64, busy_us: u64, during: impl FnOnce() -> Result<Option<f64>>) -> Result<(f64, Option<f64>)> {
    let child = Command::new(release_bin("fixture"))
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
    let (baseline, _) = pingpong(total, busy_us, || Ok(None))?;
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
        let profiler = Profiler::start("profiler", command)?;
        std::thread::sleep(Duration::from_secs(2)); // attached before the workload starts
        let (turns_per_s, overhead) = pingpong(total, busy_us, || {
            std::thread::sleep(WARM_UP);
            let before = profiler.snapshot()?;
            std::thread::sleep(Duration::from_secs(seconds));
            let after = profiler.snapshot()?;
            Ok(Some(after.overhead_since(&before, seconds as f64)))
        })?;
        profiler.stop()?;
        println!("  {name}: done");
        rows.push(Row { name, budget, overhead, turns_per_s });
    }
    let _ = std::fs::remove_dir_all(&dir);

    println!();
    println!("Command: cargo xtask bench governor --seconds {seconds} --busy-us {busy_us}");
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
    Ok(())
}
