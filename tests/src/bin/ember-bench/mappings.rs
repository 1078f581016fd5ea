//! `cargo xtask bench mappings`: what noticing code replaced in place costs. One loop maps and
//! unmaps an anonymous page (the kernel searches for room for each mapping, where Ember's
//! `area_placed` runs), another makes a system call that does nothing. Each runs with no
//! profiler, under bpftrace counting `munmap` system calls (how a profiler notices unmapped
//! code from system call tracepoints: one enabled sends every system call of the host through
//! the traced path), and under Ember profiling on-CPU at 99 Hz.
use std::{
    path::Path,
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, Result};

use super::{empty_dir, opt, release_bin, Profiler};

const WARM_UP: Duration = Duration::from_secs(3);

/// Runs `program` (fixtures/syscalls/loop.c) in `mode` on CPU 0 for about `seconds`: ns per turn.
fn turn_ns(program: &Path, mode: &str, seconds: u64) -> Result<f64> {
    let mut command = Command::new("taskset");
    command.args(["-c", "0"]).arg(program).args([mode, &seconds.to_string()]);
    let out = command.output().with_context(|| format!("running {command:?}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim().parse().ok().filter(|_| out.status.success()).with_context(|| format!("{command:?} printed no figure: {text}"))
}

pub fn run(seconds: u64) -> Result<()> {
    let dir = empty_dir("mappings")?;
    let program = dir.join("loop");
    ember_tests::compile_c(&Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/syscalls/loop.c"), &program, &["-O2"]);
    println!("bench mappings: mmap + munmap, then getppid, ~{seconds}s each per run");
    let baseline = (turn_ns(&program, "mmap", seconds)?, turn_ns(&program, "getppid", seconds)?);
    let mut bpftrace = Command::new("bpftrace");
    bpftrace.args(["-e", "tracepoint:syscalls:sys_exit_munmap { @ = count(); }"]);
    bpftrace.stdout(std::fs::File::create(dir.join("bpftrace.out"))?);
    let mut ember = Command::new(release_bin("ember-agent"));
    ember.args(["run", "--events", "cpu", "-F", "99", "--output-dir"]).arg(dir.join("profiles"));
    let mut rows = vec![("no profiler", None, baseline)];
    for (name, command) in [("bpftrace sys_exit_munmap", bpftrace), ("ember-agent cpu", ember)] {
        let profiler = Profiler::start(name, command)?;
        std::thread::sleep(WARM_UP);
        let before = profiler.snapshot()?;
        let maps = turn_ns(&program, "mmap", seconds)?;
        // Over all its programs: the mmap loop's runs are nearly all of them.
        let ns = profiler.snapshot()?.bpf_ns_per_run_since(&before);
        let calls = turn_ns(&program, "getppid", seconds)?;
        profiler.stop()?;
        rows.push((name, ns, (maps, calls)));
        println!("  {name}: done");
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!();
    println!("Command: cargo xtask bench mappings --seconds {seconds}");
    println!("| profiler | BPF ns per run (mmap loop) | mmap + munmap ns | vs none | getppid ns | vs none |");
    println!("|---|---|---|---|---|---|");
    for (name, ns, (maps, calls)) in rows {
        println!("| {name} | {} | {maps:.0} | {:.2}x | {calls:.0} | {:.2}x |", opt(ns, 0), maps / baseline.0, calls / baseline.1);
    }
    Ok(())
}
