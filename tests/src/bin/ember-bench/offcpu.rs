//! `cargo xtask bench offcpu`: `perf bench sched pipe` (two tasks ping-ponging through a pipe
//! on one CPU: every operation is two context switches) with no profiler, with a bpftrace sched_switch
//! program that records both stacks, and with Ember's off-CPU profiling. With `--deep`, the
//! ping-pong is `phases pipe` built with frame pointers: every switch has a 100-deep user
//! stack, which bpftrace's frame-pointer walk follows as far as Ember's table walk.
//! Then both profilers attached at once, in both orders, over one ping-pong each: the host's
//! speed, which moves from minute to minute on a VM, then moves both figures alike.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, Result};
use ember_tests::nofp;

use super::{
    empty_dir, ns_per_run_at_once,
    oncpu::{mean_frames, stacks, Profiler as Stacks},
    opt, release_bin, Profiler,
};

const WARM_UP: Duration = Duration::from_secs(3);

/// What ping-pongs through the pipes.
enum PingPong {
    /// `perf bench sched pipe`.
    Perf,
    /// `phases pipe` (its path).
    Deep(PathBuf),
}

/// Runs the ping-pong pinned to CPU 0 for about `seconds`; returns microseconds per
/// operation. Pinned, every operation is two context switches on one CPU; unpinned, the
/// figure measures cross-CPU wake-up latency of the VM instead.
fn pipe_latency(ping_pong: &PingPong, seconds: u64) -> Result<f64> {
    let mut command = Command::new("taskset");
    command.args(["-c", "0"]);
    match ping_pong {
        // About 2 us per op unprofiled on the reference machine: size the loop count to the window.
        PingPong::Perf => command.args(["perf", "bench", "sched", "pipe", "-l", &(seconds * 400_000).to_string()]),
        PingPong::Deep(phases) => command.arg(phases).args(["pipe", &seconds.to_string()]),
    };
    let out = command.output().with_context(|| format!("running {command:?}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let latency = match ping_pong {
        PingPong::Perf => text.lines().find(|l| l.contains("usecs/op")).and_then(|l| l.split_whitespace().next()?.parse().ok()),
        // It prints its turns.
        PingPong::Deep(_) => text.trim().parse::<f64>().ok().filter(|&turns| turns > 0.0).map(|turns| seconds as f64 * 1e6 / turns),
    };
    latency.with_context(|| format!("no operation count in the output of {command:?}: {text}"))
}

pub fn run(seconds: u64, deep: bool) -> Result<()> {
    let built = empty_dir("offcpu-build")?;
    let ping_pong = if deep {
        PingPong::Deep(nofp::build_with_frame_pointers(&built))
    } else {
        PingPong::Perf
    };
    let workload = if deep { "phases pipe (frame pointers, 100-deep stacks)" } else { "perf bench sched pipe" };
    println!("bench offcpu: {workload}, ~{seconds}s per run");
    let baseline = pipe_latency(&ping_pong, seconds)?;
    let dir = empty_dir("offcpu")?;
    let mut rows = vec![("no profiler", None, baseline, None)];
    for (name, kind, command) in [(BPFTRACE, Stacks::Bpftrace, bpftrace(&dir)?), (EMBER, Stacks::Ember, ember(&dir))] {
        let profiler = Profiler::start(name, command)?;
        std::thread::sleep(WARM_UP);
        let before = profiler.snapshot()?;
        let latency = pipe_latency(&ping_pong, seconds)?;
        let after = profiler.snapshot()?;
        let printed = kind.stop(profiler)?;
        // Kernel and user frames per recorded switch, over every task's (the ping-pong's are
        // nearly all of them): whether the stacks are equally deep. Ember's include its
        // block-state frame; its first profile, the warm-up's, is left out.
        let frames = if printed { mean_frames(&stacks(kind, None, &dir)) } else { None };
        rows.push((name, after.bpf_ns_per_run_since(&before), latency, frames));
        println!("  {name}: done");
    }
    let mut together = Vec::new();
    for ember_first in [false, true] {
        together.push((ember_first, measure_together(&ping_pong, seconds, ember_first)?));
        println!("  at once, {} attached first: done", if ember_first { EMBER } else { BPFTRACE });
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&built);
    println!();
    println!("Command: cargo xtask bench offcpu --seconds {seconds}{}", if deep { " --deep" } else { "" });
    println!("| profiler | sched_switch program ns/run | pipe usecs/op | latency vs none | frames per switch |");
    println!("|---|---|---|---|---|");
    for (name, ns, latency, frames) in rows {
        println!("| {name} | {} | {latency:.2} | {:.2}x | {} |", opt(ns, 0), latency / baseline, opt(frames, 1));
    }
    println!();
    println!("At once: both attached, ns per run of each one's sched_switch program over one ping-pong. The program attached second runs second, on lines the first made warm");
    println!("| attached first | bpftrace ns/run | ember-agent ns/run | ember-agent / bpftrace |");
    println!("|---|---|---|---|");
    let mut product = 1.0;
    for &(ember_first, (bpftrace, ember)) in &together {
        product *= ember / bpftrace;
        println!("| {} | {bpftrace:.0} | {ember:.0} | {:.2}x |", if ember_first { EMBER } else { BPFTRACE }, ember / bpftrace);
    }
    println!("| both orders (geometric mean) | | | {:.2}x |", product.sqrt());
    Ok(())
}

const BPFTRACE: &str = "bpftrace sched_switch";
const EMBER: &str = "ember-agent offcpu";

fn bpftrace(dir: &Path) -> Result<Command> {
    let mut bpftrace = Command::new("bpftrace");
    bpftrace.args(["-e", "tracepoint:sched:sched_switch { @[kstack, ustack] = count(); }"]);
    bpftrace.stdout(std::fs::File::create(dir.join("bpftrace.out"))?);
    Ok(bpftrace)
}

fn ember(dir: &Path) -> Command {
    let mut ember = Command::new(release_bin("ember-agent"));
    ember.args(["run", "--events", "offcpu", "--output-dir"]).arg(dir.join("profiles"));
    ember
}

/// BPF ns per run of bpftrace's program and of Ember's, attached at once (in the order
/// given, each warmed up before the next starts) and measured over one ping-pong.
fn measure_together(ping_pong: &PingPong, seconds: u64, ember_first: bool) -> Result<(f64, f64)> {
    let dir = empty_dir("offcpu-together")?;
    let start = |ember_now: bool| -> Result<Profiler> {
        let profiler = if ember_now { Profiler::start(EMBER, ember(&dir))? } else { Profiler::start(BPFTRACE, bpftrace(&dir)?)? };
        std::thread::sleep(WARM_UP);
        Ok(profiler)
    };
    let first = start(ember_first)?;
    let second = start(!ember_first)?;
    let (bpftrace, ember) = if ember_first { (second, first) } else { (first, second) };
    let ns = ns_per_run_at_once(&[&bpftrace, &ember], || pipe_latency(ping_pong, seconds))?;
    // bpftrace's output is not used here, and printing it (naming every stack) takes long:
    // it is killed (on drop).
    drop(bpftrace);
    ember.stop()?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok((ns[0], ns[1]))
}
