//! `cargo xtask bench net`: a loopback TCP transfer (fixture tcp-send -> tcp-recv) with and
//! without Ember's network profiling (default tracepoints plus transmit attribution).
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::{empty_dir, opt, release_bin, Profiler};

const WARM_UP: Duration = Duration::from_secs(3);
const BYTES: u64 = 4 << 30;

/// Transfers BYTES over loopback; returns MB/s.
fn transfer() -> Result<f64> {
    let address = format!("127.0.0.1:{}", 42000 + std::process::id() % 10000);
    let fixture = release_bin("fixture");
    let receiver = Command::new(&fixture).args(["tcp-recv", "0", &address]).stdout(Stdio::piped()).spawn()?;
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let status = Command::new(&fixture).args(["tcp-send", "0", &address, &BYTES.to_string()]).stdout(Stdio::null()).status()?;
    anyhow::ensure!(status.success(), "tcp-send failed");
    let received = receiver.wait_with_output()?;
    let seconds = started.elapsed().as_secs_f64();
    let got: u64 = String::from_utf8_lossy(&received.stdout).trim().parse().context("receiver output")?;
    anyhow::ensure!(got == BYTES, "received {got} of {BYTES} bytes");
    Ok(BYTES as f64 / seconds / 1e6)
}

pub fn run(_seconds: u64) -> Result<()> {
    println!("bench net: {} GiB over loopback TCP per run", BYTES >> 30);
    let baseline = transfer()?;
    let dir = empty_dir("net")?;
    let mut ember = Command::new(release_bin("ember-agent"));
    ember.args(["run", "--events", "net", "--output-dir"]).arg(&dir);
    let profiler = Profiler::start("ember-agent net", ember)?;
    std::thread::sleep(WARM_UP);
    let before = profiler.snapshot()?;
    let throughput = transfer()?;
    let after = profiler.snapshot()?;
    profiler.stop()?;
    let _ = std::fs::remove_dir_all(&dir);
    println!();
    println!("Command: cargo xtask bench net");
    println!("| profiler | BPF ns/event | events | throughput MB/s | throughput vs none |");
    println!("|---|---|---|---|---|");
    println!("| no profiler | n/a | n/a | {baseline:.0} | 1.000 |");
    println!(
        "| ember-agent net | {} | {} | {throughput:.0} | {:.3} |",
        opt(after.bpf_ns_per_run_since(&before), 0),
        after.bpf_runs_since(&before),
        throughput / baseline
    );
    Ok(())
}
