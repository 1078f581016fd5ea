//! `cargo xtask bench jit`: how much of a JIT runtime's time each profiler names and walks
//! completely, side by side on the same process: Node (`--perf-basic-prof`) and CPython 3.12+
//! (`-X perf`) running the JIT fixtures (hot_a and hot_b under dispatch, 70:30), profiled in
//! turn by `perf record -g`, `perf --call-graph dwarf`, bpftrace and ember-agent, each at 99 Hz
//! for the window, attached by pid to the one long-running process.
use std::{
    fs,
    io::Write as _,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result};
use ember_tests::{python_3_12, JIT_FIXTURES};

use super::{empty_dir, 
    oncpu::{stacks, wait_for_profile, Profiler, Scope},
    Profiler as Running,
};

const HZ: u64 = 99;
/// Ember's interval here: its first profile (the warm-up) is left out of the figures.
const INTERVAL: Duration = Duration::from_secs(5);

struct Runtime {
    name: &'static str,
    command: Command,
    /// A frame every complete stack ends in.
    entry: &'static str,
}

fn runtimes() -> Vec<Runtime> {
    let fixtures = Path::new(JIT_FIXTURES);
    let mut node = Command::new("node");
    // --perf-basic-prof also writes a V8 log into the working directory: not wanted.
    node.args(["--perf-basic-prof", "--interpreted-frames-native-stack", "--no-turbo-inlining", "--logfile=/dev/null"]).arg(fixtures.join("split.js"));
    let mut python = Command::new(python_3_12());
    python.args(["-X", "perf"]).arg(fixtures.join("split.py"));
    vec![Runtime { name: "node", command: node, entry: "node::Start" }, Runtime { name: "python", command: python, entry: "<module>" }]
}

pub fn run(seconds: u64) -> Result<()> {
    let window = Duration::from_secs(seconds);
    let profilers: [(&str, Profiler, &[&str]); 4] = [
        ("perf record -g", Profiler::Perf, &["-g"]),
        ("perf --call-graph dwarf", Profiler::Perf, &["--call-graph", "dwarf"]),
        ("bpftrace profile", Profiler::Bpftrace, &[]),
        ("ember-agent", Profiler::Ember, &[]),
    ];
    let mut rows = Vec::new();
    for runtime in runtimes() {
        for (name, profiler, perf_args) in profilers {
            let (named, complete, samples) = measure(&runtime, profiler, perf_args, window)?;
            println!("  {:<7} {name:<24} done", runtime.name);
            rows.push(format!("| {} | {name} | {samples} | {named:.3} | {complete:.3} |", runtime.name));
        }
    }
    println!("\nCommand: cargo xtask bench jit --seconds {seconds}");
    println!("| runtime | profiler | samples of the process | named hot_a or hot_b | complete (hot_*, dispatch and the runtime's entry) |");
    println!("|---|---|---|---|---|");
    rows.iter().for_each(|row| println!("{row}"));
    Ok(())
}

/// Profiles one run of the fixture: (share of its samples in a named hot_a or hot_b, share in
/// one that also shows dispatch and the entry, samples).
fn measure(runtime: &Runtime, profiler: Profiler, perf_args: &[&str], window: Duration) -> Result<(f64, f64, u64)> {
    let dir = empty_dir("jit")?;
    let mut fixture = Fixture::start(runtime, window + INTERVAL * 3)?;
    std::thread::sleep(Duration::from_secs(2)); // the runtime compiles the hot functions
    let pid = fixture.0.id().to_string();
    let comm = fs::read_to_string(format!("/proc/{pid}/comm"))?.trim().to_string();
    let command = profiler.command(HZ, Scope::Pid(&pid), perf_args, INTERVAL, &dir)?;
    let running = Running::start(runtime.name, command)?;
    if profiler == Profiler::Ember {
        wait_for_profile(&dir.join("profiles"))?;
    }
    std::thread::sleep(window);
    // Stopped while the process still runs: bpftrace names frames when it prints.
    running.stop()?;
    fixture.stop();
    let stacks = stacks(profiler, Some(&comm), &dir);
    let _ = fs::remove_dir_all(&dir);
    let count = |keep: &dyn Fn(&[String]) -> bool| stacks.iter().filter(|(f, _)| keep(f)).map(|(_, n)| n).sum::<u64>();
    let hot = |f: &[String]| f.iter().any(|n| n.contains("hot_a") || n.contains("hot_b"));
    let all = count(&|_| true);
    let named = count(&hot);
    let complete = count(&|f| hot(f) && f.iter().any(|n| n.contains("dispatch")) && f.iter().any(|n| n.contains(runtime.entry)));
    let share = |n: u64| n as f64 / all.max(1) as f64;
    Ok((share(named), share(complete), all))
}

/// The runtime running the fixture for `length`, released at once.
struct Fixture(Child);

impl Fixture {
    fn start(runtime: &Runtime, length: Duration) -> Result<Fixture> {
        let mut command = Command::new(runtime.command.get_program());
        command.args(runtime.command.get_args()).args(["split", &length.as_secs().to_string(), "--wait"]);
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::null()).spawn().with_context(|| format!("starting {}", runtime.name))?;
        child.stdin.take().context("stdin")?.write_all(b"go\n")?;
        Ok(Fixture(child))
    }

    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.stop();
    }
}

