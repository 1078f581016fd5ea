//! The second table of `cargo xtask bench churn`: what started processes cost each profiler,
//! host-wide, at 0, 10, 50 and 200 processes a second, at 19 Hz (the daemon's default) and
//! 99 Hz. The processes are a mix of `sh -c true`, `/bin/true`, `python3 -c pass` (Debian's
//! interpreter, not a version manager's shim, which starts a dozen processes of its own) and a Rust
//! binary (`ember-agent --version`), started evenly. Each profiler runs alone: perf record -a
//! -g, bpftrace's `profile` counting kernel and user stacks by comm, and ember-agent as the
//! daemon runs (10 s intervals), once per frequency. After its start (Ember's first profile
//! written), the mix runs at 10 a second for one interval, and Ember writes that interval's
//! profile, before the windows: a binary first seen, read and named costs once per host, not
//! per process. Then one window per rate. Cost is the profiler's CPU plus its BPF run time
//! over a window; the cost per started process is the cost at 200 a second less the cost at
//! none, per process the host started (from /proc/stat, the mix's and any other).
use std::{
    fs,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use ember_tests::usage::context_switches;

use super::{
    empty_dir,
    oncpu::{wait_for_profile, wait_for_profiles, Profiler, Scope},
    release_bin, Profiler as Running,
};

const RATES: [u64; 4] = [0, 10, 50, 200];
const FREQUENCIES: [u64; 2] = [19, 99];
/// The daemon's interval.
const INTERVAL: Duration = Duration::from_secs(10);
/// What bpftrace and perf take to attach.
const ATTACH: Duration = Duration::from_secs(2);

pub fn run(seconds: u64) -> Result<()> {
    let dir = empty_dir("churn-cost")?;
    println!("\nbench churn, cost: {RATES:?} processes/s for {seconds}s each, each profiler host-wide alone");
    let mut rows = Vec::new();
    for hz in FREQUENCIES {
        for (name, profiler) in [("perf record -a -g", Profiler::Perf), ("bpftrace profile", Profiler::Bpftrace), ("ember-agent", Profiler::Ember)] {
            let out = dir.join(format!("{}-{hz}", name.replace(' ', "-")));
            fs::create_dir_all(&out)?;
            let costs = measure(profiler, hz, seconds, &out)?;
            let _ = fs::remove_dir_all(&out);
            println!("  {name:<18} {hz} Hz done");
            rows.push((name, hz, costs));
        }
    }
    let _ = fs::remove_dir_all(&dir);
    println!("\nCommand: cargo xtask bench churn --seconds {seconds}");
    println!("| profiler | Hz | CPU + BPF, % of a core, at 0 / 10 / 50 / 200 processes/s | per started process at 200/s, ms | context switches/s at 0 / 200 | processes/s started (host-wide) |");
    println!("|---|---|---|---|---|---|");
    for (name, hz, costs) in rows {
        let percents: Vec<String> = costs.iter().map(|c| format!("{:.3}", c.share * 100.0)).collect();
        let (idle, busiest) = (&costs[0], &costs[RATES.len() - 1]);
        let per_process_ms = (busiest.share - idle.share) * 1e3 / busiest.host_rate.max(1.0);
        let rates: Vec<String> = costs.iter().map(|c| format!("{:.0} ({:.0})", c.rate, c.host_rate)).collect();
        println!("| {name} | {hz} | {} | {per_process_ms:.3} | {:.0} / {:.0} | {} |", percents.join(" / "), idle.switches, busiest.switches, rates.join(" / "));
    }
    Ok(())
}

struct Cost {
    /// CPU plus BPF run time, a share of one core.
    share: f64,
    /// The profiler's context switches per second.
    switches: f64,
    /// The mix's processes started per second, as the host managed.
    rate: f64,
    /// Processes the host started per second, the mix's and any other.
    host_rate: f64,
}

/// Processes the host has started since boot (/proc/stat).
fn host_processes() -> Result<u64> {
    let stat = fs::read_to_string("/proc/stat")?;
    stat.lines().find_map(|line| line.strip_prefix("processes ")?.trim().parse().ok()).context("/proc/stat has no processes line")
}

/// One profiler at `hz`: the warm-up, then a window of `seconds` at each of RATES.
fn measure(profiler: Profiler, hz: u64, seconds: u64, out: &std::path::Path) -> Result<Vec<Cost>> {
    let command = profiler.command(hz, Scope::Host, &["-g"], INTERVAL, out)?;
    let running = Running::start("profiler", command)?;
    let profiles = out.join("profiles");
    match profiler {
        Profiler::Ember => wait_for_profile(&profiles)?,
        _ => std::thread::sleep(ATTACH),
    }
    churn(WARM_UP_RATE, INTERVAL)?;
    match profiler {
        // The interval that saw the warm-up is drained and named.
        Profiler::Ember => wait_for_profiles(&profiles, fs::read_dir(&profiles)?.count() + 1)?,
        _ => std::thread::sleep(ATTACH),
    }
    let mut costs = Vec::new();
    for rate in RATES {
        let (before, switched, forked) = (running.snapshot()?, context_switches(running.pid()), host_processes()?);
        let started = Instant::now();
        let count = churn(rate, Duration::from_secs(seconds))?;
        let elapsed = started.elapsed().as_secs_f64();
        let share = running.snapshot()?.overhead_since(&before, elapsed);
        let switches = context_switches(running.pid()).saturating_sub(switched) as f64 / elapsed;
        let host_rate = host_processes()?.saturating_sub(forked) as f64 / elapsed;
        costs.push(Cost { share, switches, rate: count as f64 / elapsed, host_rate });
    }
    // Only the cost counts here: a peer that takes long to write its output is not waited on.
    running.stop_for_output()?;
    Ok(costs)
}

const MIX_LEN: u64 = 4;
/// Processes a second while each profiler warms up.
const WARM_UP_RATE: u64 = 10;

/// Starts `rate` processes a second for `length`, cycling through the mix; waits for the
/// last to exit. Returns how many it started.
pub(super) fn churn(rate: u64, length: Duration) -> Result<u64> {
    let start = Instant::now();
    if rate == 0 {
        std::thread::sleep(length);
        return Ok(0);
    }
    let agent = release_bin("ember-agent");
    let mix: [(&std::ffi::OsStr, &[&str]); MIX_LEN as usize] =
        [("sh".as_ref(), &["-c", "true"]), ("/bin/true".as_ref(), &[]), ("/usr/bin/python3".as_ref(), &["-c", "pass"]), (agent.as_os_str(), &["--version"])];
    let mut running: Vec<Child> = Vec::new();
    let mut started = 0u64;
    while start.elapsed() < length {
        let (program, args) = mix[(started % mix.len() as u64) as usize];
        let child = Command::new(program).args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn();
        running.push(child.with_context(|| format!("starting {program:?}"))?);
        started += 1;
        running.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
        let next = start + Duration::from_secs_f64(started as f64 / rate as f64);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    for mut child in running {
        child.wait()?;
    }
    Ok(started)
}
