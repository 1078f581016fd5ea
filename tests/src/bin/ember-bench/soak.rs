//! `cargo xtask bench soak --seconds 600`: the agent's footprint over a long run at 999 Hz
//! with process churn (200 processes a second, each busy for 20 to 200 ms) beside two busy
//! workers: RSS, open files, mappings, BPF map memory, threads and CPU, every 30 s after a
//! minute's warm-up. The goal is flat: no growth after the warm-up.
use std::{
    fs,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use ember_tests::soak::{self, Footprint, Growth};

use crate::{empty_dir, release_bin, Profiler};

/// At least a minute, then until the agent's counts have not risen for 30 s (`soak::settle`).
const WARM_UP: Duration = Duration::from_secs(60);
const MAX_WARM_UP: Duration = Duration::from_secs(180);
const EVERY: Duration = Duration::from_secs(30);
const INTERVAL: &str = "10s";

pub fn run(seconds: u64) -> Result<()> {
    let window = Duration::from_secs(seconds);
    let dir = empty_dir("soak")?;
    let (churn, child) = soak::build_churn(&dir);
    println!("bench soak: ember-agent at 999 Hz, {seconds}s measured after a warm-up of at least {}s (until its counts settle), churn of 200 processes/s and 2 busy workers", WARM_UP.as_secs());
    let mut command = Command::new(release_bin("ember-agent"));
    command.args(["run", "-F", "999", "--interval", INTERVAL, "--output-dir"]).arg(dir.join("profiles"));
    let agent = Profiler::start("ember-agent", command)?;
    let total = (MAX_WARM_UP + window + EVERY).as_secs().to_string();
    let mut load: Vec<Child> = vec![Command::new(&churn).arg(&child).args([&total, "200"]).stdout(Stdio::null()).spawn().context("starting the churn")?];
    for _ in 0..2 {
        load.push(Command::new(release_bin("fixture")).args(["split", &total]).stdout(Stdio::null()).spawn()?);
    }
    let warm_up = soak::settle(agent.pid(), WARM_UP, Duration::from_secs(30), MAX_WARM_UP).context("ember-agent exited in its warm-up")?;
    println!("warm-up: {}s", warm_up.as_secs());
    let (started, cpu_from) = (Instant::now(), agent.snapshot()?.cpu_ns);
    let mut samples = Vec::new();
    loop {
        samples.push(Footprint::of(agent.pid(), started.elapsed()).context("ember-agent exited during the soak")?);
        if started.elapsed() >= window {
            break;
        }
        std::thread::sleep(EVERY);
    }
    let (end, measured) = (agent.snapshot()?, started.elapsed());
    agent.stop()?;
    for mut process in load {
        let _ = process.kill();
        let _ = process.wait();
    }
    let _ = fs::remove_dir_all(&dir);

    let growth = Growth::of(&samples);
    println!();
    println!("Command: cargo xtask bench soak --seconds {seconds}");
    print!("{}", soak::table(&samples));
    let cpu = (end.cpu_ns - cpu_from) as f64 / measured.as_nanos() as f64 * 100.0;
    println!("CPU over the window: {cpu:.2}% of one core; peak RSS over the whole run, start-up included: {:.1} MiB", end.peak_rss_mib);
    println!("first third -> last third: {growth:?}");
    match growth.problems() {
        problems if problems.is_empty() => println!("flat: nothing grew beyond noise after the warm-up"),
        problems => println!("GREW: {}", problems.join("; ")),
    }
    Ok(())
}
