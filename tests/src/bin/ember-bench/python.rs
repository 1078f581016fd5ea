//! `cargo xtask bench python`: what naming Python frames costs, side by side on one workload:
//! Debian's python3 running the split fixture (hot_a and hot_b under dispatch, 70:30), one
//! process per CPU, with no profiler, with py-spy (one per process: it attaches to one) and
//! with ember-agent (host-wide, Python frames walked in the kernel), at each rate. Then the
//! BPF cost per sample of ember-agent and of bpftrace's `profile` with user stacks (which
//! shows only the interpreter's C frames), attached at once; then 50 Python processes at once.
use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _, Result};
use ember_tests::{
    python::{py_spy, py_spy_functions},
    Decoded, JIT_FIXTURES,
};

use super::{empty_dir, ns_per_run_at_once, oncpu::wait_for_profile, opt, release_bin, Profiler as Running, Snapshot};

/// Debian's python3 (`cargo xtask setup` installs it): the interpreter in a stripped non-PIE
/// executable, the shape most hosts run.
const PYTHON: &str = "/usr/bin/python3";
/// Busy Python processes: one per CPU of the 2-core reference machine.
const WORKERS: usize = 2;
/// The processes of the many-processes run.
const MANY: usize = 50;
/// Ember's interval: its first profile marks it ready.
const INTERVAL: Duration = Duration::from_secs(5);
/// What py-spy and bpftrace are given to attach before a window.
const ATTACH: Duration = Duration::from_secs(3);
/// The workers run this much longer than the window, which starts this much after them: the
/// profilers are measured while every worker runs (py-spy exits with its process).
const MARGIN: Duration = Duration::from_millis(500);
/// How long past its length a worker may take to finish before it counts as stopped.
const STOPPED: Duration = Duration::from_secs(20);

/// `cost_only`: only the BPF cost per sample, beside bpftrace's.
pub fn run(seconds: u64, frequencies: &[u64], cost_only: bool) -> Result<()> {
    ensure!(Path::new(PYTHON).is_file(), "no {PYTHON}: run `cargo xtask setup`");
    let window = Duration::from_secs(seconds);
    println!("bench python: {WORKERS} busy {PYTHON} processes (split.py), {seconds}s measured per run");
    let mut rows = Vec::new();
    let mut together = Vec::new();
    for &hz in frequencies {
        if !cost_only {
            // The workload alone before and after the profilers' runs: the host's speed
            // drifts from minute to minute, and their mean is the baseline of this rate's rows.
            let before = measure(Peer::Nothing, 0, window)?.throughput;
            let measured = [Peer::PySpy, Peer::Ember].into_iter().map(|peer| Ok((peer, measure(peer, hz, window)?))).collect::<Result<Vec<_>>>()?;
            let after = measure(Peer::Nothing, 0, window)?.throughput;
            println!("  {hz:>4} Hz: done (no profiler: {before:.0} then {after:.0} work units/s)");
            rows.extend(measured.into_iter().map(|(peer, m)| (hz, peer, m, (before + after) / 2.0)));
        }
        together.push((hz, bpf_at_once(hz, window)?));
        println!("  bpftrace and ember-agent at once {hz:>4} Hz: done");
    }
    let many: Vec<(Peer, Many)> = if cost_only {
        Vec::new()
    } else {
        let many = [Peer::PySpy, Peer::Ember].into_iter().map(|peer| Ok((peer, many(peer, window)?))).collect::<Result<_>>()?;
        println!("  {MANY} processes: done");
        many
    };

    println!();
    println!(
        "Command: cargo xtask bench python --seconds {seconds} --frequencies {}{}",
        frequencies.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
        if cost_only { " --part cost" } else { "" }
    );
    if !cost_only {
        print_rows(&rows);
    }
    println!("At once: bpftrace `profile:hz:N {{ @[kstack, ustack, comm] = count(); }}` and ember-agent, BPF ns/sample over one window");
    println!("| Hz | bpftrace profile | ember-agent | ember-agent / bpftrace |");
    println!("|---|---|---|---|");
    for (hz, (bpftrace, ember)) in together {
        println!("| {hz} | {bpftrace:.0} | {ember:.0} | {:.2}x |", ember / bpftrace);
    }
    if !cost_only {
        println!();
        println!("{MANY} Python processes at once, 99 Hz (py-spy: one process per target, figures summed)");
        println!("| profiler | processes with hot_* named | processes it kept stopped | CPU % of one core | peak RSS MiB | BPF map MiB |");
        println!("|---|---|---|---|---|---|");
        for (peer, m) in many {
            println!("| {} | {} of {MANY} | {} | {:.3} | {:.1} | {} |", peer.name(), m.named, m.stopped, m.total_percent, m.peak_rss_mib, opt(m.map_mib, 1));
        }
    }
    Ok(())
}

/// Each profiler's row at each rate, against py-spy's at that rate and the workload's
/// throughput alone (`baseline`).
fn print_rows(rows: &[(u64, Peer, Measured, f64)]) {
    println!("| profiler | Hz | CPU % of one core | BPF % | total % | total vs py-spy | peak RSS MiB | throughput vs none | hot_a share (truth 0.70) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (hz, peer, m, baseline) in rows {
        let spy = rows.iter().find(|(h, p, _, _)| h == hz && *p == Peer::PySpy).map(|(_, _, m, _)| m.total_percent());
        println!(
            "| {} | {hz} | {:.3} | {:.3} | {:.3} | {:.2}x | {:.1} | {:.3} | {} |",
            peer.name(),
            m.cpu_percent,
            m.bpf_percent,
            m.total_percent(),
            m.total_percent() / spy.unwrap_or(f64::NAN),
            m.peak_rss_mib,
            m.throughput / baseline,
            opt(m.share, 3)
        );
    }
    println!();
}

#[derive(Clone, Copy, PartialEq)]
enum Peer {
    Nothing,
    PySpy,
    Ember,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Nothing => "none",
            Peer::PySpy => "py-spy",
            Peer::Ember => "ember-agent",
        }
    }

    /// Starts profiling `pids` (py-spy: one process each; Ember: the host) at `hz`, writing
    /// into `dir`, and waits until it is attached.
    fn start(self, hz: u64, pids: &[u32], dir: &Path) -> Result<Vec<Running>> {
        let hz = hz.to_string();
        let running = match self {
            Peer::Nothing => Vec::new(),
            Peer::PySpy => {
                let py_spy = py_spy();
                let spies = pids.iter().map(|pid| {
                    let mut c = Command::new(&py_spy);
                    c.args(["record", "--format", "raw", "-r", &hz, "--pid", &pid.to_string(), "-o"]).arg(dir.join(format!("py-spy-{pid}.txt")));
                    c.stdout(Stdio::null());
                    Running::start("py-spy", c)
                });
                let spies = spies.collect::<Result<Vec<_>>>()?;
                std::thread::sleep(ATTACH);
                spies
            }
            Peer::Ember => {
                let mut c = Command::new(release_bin("ember-agent"));
                c.args(["run", "-F", &hz, "--interval", &format!("{}s", INTERVAL.as_secs())]).arg("--output-dir").arg(dir.join("profiles"));
                let agent = Running::start("ember-agent", c)?;
                wait_for_profile(&dir.join("profiles"))?;
                vec![agent]
            }
        };
        Ok(running)
    }

    /// Samples in hot_a and hot_b of `pids`, from what the profiler wrote into `dir`.
    fn hot_counts(self, pids: &[u32], dir: &Path) -> Vec<(u32, u64, u64)> {
        match self {
            Peer::Nothing => Vec::new(),
            Peer::PySpy => pids
                .iter()
                .map(|&pid| {
                    let functions = py_spy_functions(&fs::read_to_string(dir.join(format!("py-spy-{pid}.txt"))).unwrap_or_default());
                    let count = |name: &str| functions.get(name).copied().unwrap_or(0) as u64;
                    (pid, count("hot_a"), count("hot_b"))
                })
                .collect(),
            Peer::Ember => {
                let files: Vec<PathBuf> = fs::read_dir(dir.join("profiles")).into_iter().flatten().flatten().map(|e| e.path()).collect();
                let profiles: Vec<Decoded> = files.iter().map(|path| Decoded::read(path)).collect();
                pids.iter()
                    .map(|&pid| {
                        let count = |name: &str| -> u64 {
                            let python = |s: &&ember_tests::Sample| s.frames.iter().any(|f| f.mapping == "[python]" && f.function == name);
                            profiles.iter().map(|p| p.samples_of(pid).into_iter().filter(python).map(|s| s.values[0] as u64).sum::<u64>()).sum()
                        };
                        (pid, count("hot_a"), count("hot_b"))
                    })
                    .collect()
            }
        }
    }
}

/// One profiler's run beside the workers.
struct Measured {
    throughput: f64,
    cpu_percent: f64,
    bpf_percent: f64,
    peak_rss_mib: f64,
    share: Option<f64>,
}

impl Measured {
    fn total_percent(&self) -> f64 {
        self.cpu_percent + self.bpf_percent
    }
}

/// Runs the workers for the window under `peer` at `hz`.
fn measure(peer: Peer, hz: u64, window: Duration) -> Result<Measured> {
    let dir = empty_dir("python")?;
    let workers = Workers::spawn(WORKERS, window + MARGIN * 2)?;
    let pids = workers.pids();
    let profilers = peer.start(hz, &pids, &dir)?;
    let (throughput, used, stopped) = workers.run_measured(&profilers, window)?;
    ensure!(stopped == 0, "{}: {stopped} of its {WORKERS} processes did not finish", peer.name());
    stop(peer, profilers)?;
    let counts = peer.hot_counts(&pids, &dir);
    let (a, b) = counts.iter().fold((0, 0), |(a, b), &(_, x, y)| (a + x, b + y));
    let _ = fs::remove_dir_all(&dir);
    let share = (a + b > 0).then(|| a as f64 / (a + b) as f64);
    Ok(Measured { throughput, cpu_percent: used.cpu_percent, bpf_percent: used.bpf_percent, peak_rss_mib: used.peak_rss_mib, share })
}

/// BPF ns per sample of bpftrace's `profile` with stacks and of Ember's programs, attached
/// at once (the host's speed moves both alike) while the workers run.
fn bpf_at_once(hz: u64, window: Duration) -> Result<(f64, f64)> {
    let dir = empty_dir("python-at-once")?;
    let workers = Workers::spawn(WORKERS, window + MARGIN * 2)?;
    let mut bpftrace = Command::new("bpftrace");
    bpftrace.args(["-e", &format!("profile:hz:{hz} {{ @[kstack, ustack, comm] = count(); }}")]).stdout(Stdio::null());
    let bpftrace = Running::start("bpftrace", bpftrace)?;
    let mut ember = Peer::Ember.start(hz, &[], &dir)?;
    let ns = ns_per_run_at_once(&[&bpftrace, &ember[0]], || workers.run())?;
    // bpftrace would name every stack it counted before exiting: not needed here.
    drop(bpftrace);
    ember.remove(0).stop()?;
    let _ = fs::remove_dir_all(&dir);
    Ok((ns[0], ns[1]))
}

/// The many-processes run.
struct Many {
    named: usize,
    /// Processes the profiler kept from finishing (killed).
    stopped: usize,
    total_percent: f64,
    peak_rss_mib: f64,
    map_mib: Option<f64>,
}

/// `MANY` busy Python processes under `peer` at 99 Hz.
fn many(peer: Peer, window: Duration) -> Result<Many> {
    let dir = empty_dir("python-many")?;
    let workers = Workers::spawn(MANY, window + MARGIN * 2)?;
    let pids = workers.pids();
    let profilers = peer.start(99, &pids, &dir)?;
    let (_, used, stopped) = workers.run_measured(&profilers, window)?;
    stop(peer, profilers)?;
    let named = peer.hot_counts(&pids, &dir).iter().filter(|&&(_, a, b)| a > 0 && b > 0).count();
    let _ = fs::remove_dir_all(&dir);
    Ok(Many { named, stopped, total_percent: used.cpu_percent + used.bpf_percent, peak_rss_mib: used.peak_rss_mib, map_mib: used.map_mib })
}

/// Stops what profiled the workers: Ember on SIGINT; py-spy exits with its process, writing
/// its output.
fn stop(peer: Peer, profilers: Vec<Running>) -> Result<()> {
    for profiler in profilers {
        if peer == Peer::Ember {
            profiler.stop()?;
        } else {
            profiler.stop_for_output()?;
        }
    }
    Ok(())
}

/// What a set of profiler processes used over a window, summed.
struct Used {
    cpu_percent: f64,
    bpf_percent: f64,
    peak_rss_mib: f64,
    map_mib: Option<f64>,
}

/// Python processes running the split fixture, waiting for their start.
struct Workers {
    children: Vec<Child>,
    seconds: f64,
}

impl Workers {
    fn spawn(count: usize, length: Duration) -> Result<Workers> {
        let seconds = length.as_secs_f64();
        let script = Path::new(JIT_FIXTURES).join("split.py");
        let children = (0..count)
            .map(|_| {
                let mut c = Command::new(PYTHON);
                c.arg(&script).args(["split", &seconds.to_string(), "--wait"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()
            })
            .collect::<Result<Vec<_>, _>>()
            .context("starting python3")?;
        Ok(Workers { children, seconds })
    }

    fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// Starts every worker and waits for them: work units per second, all together.
    fn run(mut self) -> Result<f64> {
        self.release()?;
        let (throughput, stopped) = self.finish(&[])?;
        ensure!(stopped == 0, "{stopped} workers did not finish");
        Ok(throughput)
    }

    /// Starts every worker, measures `profilers` over `window` while all of them run, and
    /// waits for them: work units per second, what the profilers used, and how many workers
    /// a profiler kept from finishing.
    fn run_measured(mut self, profilers: &[Running], window: Duration) -> Result<(f64, Used, usize)> {
        self.release()?;
        std::thread::sleep(MARGIN);
        let snapshots = || profilers.iter().map(Running::snapshot).collect::<Result<Vec<Snapshot>>>();
        let (before, started) = (snapshots()?, Instant::now());
        std::thread::sleep(window);
        let (after, elapsed) = (snapshots()?, started.elapsed().as_secs_f64());
        let mut used = Used { cpu_percent: 0.0, bpf_percent: 0.0, peak_rss_mib: 0.0, map_mib: None };
        for (before, after) in before.iter().zip(&after) {
            let cpu = after.cpu_percent_since(before, elapsed);
            used.cpu_percent += cpu;
            used.bpf_percent += after.overhead_since(before, elapsed) * 100.0 - cpu;
            used.peak_rss_mib += after.peak_rss_mib;
            used.map_mib = after.map_mib().map(|m| m + used.map_mib.unwrap_or(0.0)).or(used.map_mib);
        }
        let (throughput, stopped) = self.finish(profilers)?;
        Ok((throughput, used, stopped))
    }

    fn release(&mut self) -> Result<()> {
        for child in &mut self.children {
            child.stdin.take().context("a worker's stdin")?.write_all(b"go\n")?;
        }
        Ok(())
    }

    /// Waits for every worker (each given until `STOPPED` past its length): work units per
    /// second of those that finished, and how many a profiler kept from finishing. py-spy
    /// stops its process for each sample, and one that hangs keeps it stopped where not even
    /// SIGKILL ends it: `profilers` are then killed first, then the stopped workers.
    fn finish(mut self, profilers: &[Running]) -> Result<(f64, usize)> {
        let deadline = Instant::now() + Duration::from_secs_f64(self.seconds) + STOPPED;
        let (mut units, mut stopped) = (0u64, 0);
        for mut child in std::mem::take(&mut self.children) {
            while child.try_wait()?.is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if child.try_wait()?.is_none() {
                for profiler in profilers {
                    // SAFETY: kill(2) on a child of this process that has not been waited for.
                    unsafe { libc::kill(profiler.pid() as i32, libc::SIGKILL) };
                }
                let _ = child.kill();
                let _ = child.wait();
                stopped += 1;
                continue;
            }
            let out = child.wait_with_output()?;
            ensure!(out.status.success(), "a Python worker failed");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            units += text.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()).context("a worker's output")?;
        }
        Ok((units as f64 / self.seconds, stopped))
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
