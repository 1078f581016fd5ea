//! `cargo xtask bench oncpu`: the same busy workload with no profiler, with `perf record`,
//! with bpftrace and with ember-agent, side by side, at each frequency. The workload is the
//! Rust fixture with frame pointers (70/30 split), or with `--no-frame-pointers` the C
//! `phases` fixture built without them, where perf unwinds with DWARF (`--call-graph dwarf`),
//! or with `--deep` that fixture's 100-deep recursion alone, built with frame pointers, so that
//! every profiler walks the whole stack: what a frame costs each.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result};
use ember_tests::{bigdebug, nofp, perf_script, Decoded};

use super::{empty_dir, ns_per_run_at_once, opt, release_bin, Profiler as Running};

/// Before measuring, each profiler attaches (bpftrace compiles its script), sees the workload
/// binaries once (a short priming run), and Ember completes its first 10 s interval, whose
/// symbolization starts with cold caches (the window waits for its first profile: Ember's
/// start-up, mostly the verifier, delays it), and half an interval more, so that a window of
/// N intervals holds exactly N drains, not N or N+1 by chance. The window is the steady state
/// a host running the profiler all the time pays; the warm-up's cost is reported as start-up
/// CPU.
const WARM_UP: Duration = Duration::from_secs(12);
/// How long Ember's first profile may take to appear before the run is abandoned.
const FIRST_PROFILE: Duration = Duration::from_secs(60);
/// Ember's interval (its default).
const INTERVAL: Duration = Duration::from_secs(10);
const PRIMING: Duration = Duration::from_secs(2);
/// Busy workload processes: one per CPU of the 2-core reference machine.
const WORKERS: usize = 2;

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Profiler {
    Perf,
    Bpftrace,
    Ember,
}

/// What every worker runs.
enum Workload {
    /// `fixture split`: hot_a 70%, hot_b 30%, with frame pointers.
    FramePointers,
    /// `phases` built without frame pointers (its path).
    NoFramePointers(PathBuf),
    /// `phases recursion` built with frame pointers (its path): stacks about 105 frames deep.
    Deep(PathBuf),
}

impl Workload {
    fn command(&self, seconds: f64) -> Command {
        let mut command = match self {
            Workload::FramePointers => Command::new(release_bin("fixture")),
            Workload::NoFramePointers(phases) | Workload::Deep(phases) => Command::new(phases),
        };
        let mode = if let Workload::Deep(_) = self { "recursion" } else { "split" };
        command.args([mode, &seconds.to_string()]);
        command
    }

    /// The workers' thread name, to pick their samples out of host-wide profiles.
    fn comm(&self) -> &'static str {
        match self {
            Workload::FramePointers => "fixture",
            Workload::NoFramePointers(_) => "phases",
            Workload::Deep(_) => "phases-fp",
        }
    }

    fn perf_name(&self) -> &'static str {
        match self {
            Workload::FramePointers | Workload::Deep(_) => "perf record -g",
            Workload::NoFramePointers(_) => "perf --call-graph dwarf",
        }
    }

    fn perf_call_graph(&self) -> &'static [&'static str] {
        match self {
            Workload::FramePointers | Workload::Deep(_) => &["-g"],
            Workload::NoFramePointers(_) => &["--call-graph", "dwarf"],
        }
    }

    /// The column judging each profiler's stacks: hot_a's share of hot_a + hot_b (truth
    /// 0.70), the share of stacks that reach `main`, or how deep they are (which needs no
    /// names: bpftrace names user frames only while the process lives).
    fn judged(&self) -> &'static str {
        match self {
            Workload::FramePointers => "hot_a share (truth 0.70)",
            Workload::NoFramePointers(_) => "stacks reaching main",
            Workload::Deep(_) => "frames per stack",
        }
    }

    fn judge(&self, stacks: &[(Vec<String>, u64)]) -> String {
        let count = |keep: &dyn Fn(&[String]) -> bool| stacks.iter().filter(|(f, _)| keep(f)).map(|(_, n)| n).sum::<u64>();
        let all = count(&|_| true);
        if all == 0 {
            return "no workload samples".into();
        }
        match self {
            Workload::FramePointers => {
                let a = count(&|f| f.iter().any(|n| n.contains("hot_a")));
                let b = count(&|f| f.iter().any(|n| n.contains("hot_b")));
                // bpftrace names user frames when it prints, after the workload has exited.
                if a + b == 0 { "frames unnamed".into() } else { format!("{:.3}", a as f64 / (a + b) as f64) }
            }
            Workload::NoFramePointers(_) => format!("{:.3}", count(&|f| f.iter().any(|n| n == "main")) as f64 / all as f64),
            Workload::Deep(_) => opt(mean_frames(stacks), 1),
        }
    }
}

impl Profiler {
    /// Stops `running`, this profiler's process; whether its output was written. Ember must
    /// stop in time (else the bench fails); a peer's output only adds to its row.
    pub(super) fn stop(self, running: Running) -> Result<bool> {
        if self == Profiler::Ember {
            running.stop().map(|()| true)
        } else {
            running.stop_for_output()
        }
    }

    fn name(self, workload: &Workload) -> &'static str {
        match self {
            Profiler::Perf => workload.perf_name(),
            Profiler::Bpftrace => "bpftrace profile",
            Profiler::Ember => "ember-agent",
        }
    }

    /// The command that profiles `scope` at `hz`, writing where `stacks` reads: perf with
    /// `perf_call_graph`, bpftrace counting kernel and user stacks by comm, Ember writing a
    /// profile every `interval`.
    pub(super) fn command(self, hz: u64, scope: Scope, perf_call_graph: &[&str], interval: Duration, dir: &Path) -> Result<Command> {
        let hz = hz.to_string();
        Ok(match self {
            Profiler::Perf => {
                let mut c = Command::new("perf");
                c.args(["record", "-F", &hz]).args(perf_call_graph);
                match scope {
                    Scope::Pid(pid) => c.args(["-p", pid]),
                    Scope::Host | Scope::Comm(_) => c.arg("-a"),
                };
                c.arg("-o").arg(dir.join("perf.data"));
                c
            }
            Profiler::Bpftrace => {
                let filter = match scope {
                    Scope::Host => String::new(),
                    Scope::Comm(comm) => format!("/comm == \"{comm}\"/ "),
                    Scope::Pid(pid) => format!("/pid == {pid}/ "),
                };
                let mut c = Command::new("bpftrace");
                c.args(["-e", &format!("profile:hz:{hz} {filter}{{ @[kstack, ustack, comm] = count(); }}")]);
                c.stdout(fs::File::create(dir.join("bpftrace.out"))?);
                c
            }
            Profiler::Ember => {
                let mut c = Command::new(release_bin("ember-agent"));
                c.args(["run", "-F", &hz, "--interval", &format!("{}s", interval.as_secs())]);
                if let Scope::Pid(pid) = scope {
                    c.args(["--pid", pid]);
                }
                c.arg("--output-dir").arg(dir.join("profiles"));
                c
            }
        })
    }
}

/// What a profiler profiles: the whole host; the whole host, though only `comm`'s samples are
/// judged (bpftrace keeps only those); one process.
#[derive(Clone, Copy)]
pub(super) enum Scope<'a> {
    Host,
    Comm(&'a str),
    Pid(&'a str),
}

struct Row {
    profiler: &'static str,
    hz: u64,
    bpf_ns_per_sample: Option<f64>,
    cpu_percent: f64,
    startup_cpu_s: f64,
    rss_mib: f64,
    end_rss_mib: f64,
    end_file_rss_mib: f64,
    map_mib: Option<f64>,
    throughput_ratio: f64,
    judged: String,
}

pub fn run(seconds: u64, frequencies: &[u64], no_frame_pointers: bool, deep: bool, debug_binary: bool) -> Result<()> {
    anyhow::ensure!(!(deep && no_frame_pointers), "--deep and --no-frame-pointers are two workloads: pick one");
    let window = Duration::from_secs(seconds);
    if seconds % INTERVAL.as_secs() != 0 {
        println!("note: --seconds {seconds} is not a whole number of Ember's {}s intervals: its steady CPU then depends on how many drains the window catches", INTERVAL.as_secs());
    }
    let built = empty_dir("nofp")?;
    let workload = if deep {
        Workload::Deep(nofp::build_with_frame_pointers(&built))
    } else if no_frame_pointers {
        Workload::NoFramePointers(nofp::build(&built).pie)
    } else {
        Workload::FramePointers
    };
    let beside = debug_binary.then(|| {
        println!("bench oncpu: building the big-debug workload (C++ at -O0 -g)");
        bigdebug::build(&built)
    });
    if let Some(binary) = &beside {
        println!("  {}: {:.0} MB", binary.display(), fs::metadata(binary)?.len() as f64 / 1e6);
    }
    println!("bench oncpu: {WORKERS} busy {} workers, {seconds}s measured per run after a {}s warm-up", workload.comm(), WARM_UP.as_secs());
    let workload = Setup { workload, beside };
    let beside = workload.start_beside(window)?;
    let baseline = run_workload(&workload, window)?;
    drop(beside);
    println!("  no profiler: {baseline:.1} rounds/s");
    let mut rows = Vec::new();
    let mut together = Vec::new();
    for &hz in frequencies {
        for profiler in [Profiler::Perf, Profiler::Bpftrace, Profiler::Ember] {
            let row = measure(profiler, &workload, hz, window, baseline)?;
            println!("  {:<23} {hz:>4} Hz: done", row.profiler);
            rows.push(row);
        }
        together.push((hz, measure_together(&workload, hz, window)?));
        println!("  bpftrace and ember-agent at once {hz:>4} Hz: done");
    }
    let _ = fs::remove_dir_all(&built);
    println!();
    println!(
        "Command: cargo xtask bench oncpu --seconds {seconds} --frequencies {}{}",
        frequencies.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
        [(no_frame_pointers, " --no-frame-pointers"), (deep, " --deep"), (debug_binary, " --debug-binary")]
            .iter()
            .filter_map(|&(on, flag)| on.then_some(flag))
            .collect::<String>()
    );
    println!("| profiler | Hz | BPF ns/sample | steady CPU % of one core | start-up CPU s | peak RSS MiB | RSS at end MiB (files) | BPF map MiB | throughput vs none | {} |", workload.workload.judged());
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.3} | {:.2} | {:.1} | {:.1} ({:.1}) | {} | {:.3} | {} |",
            r.profiler,
            r.hz,
            opt(r.bpf_ns_per_sample, 0),
            r.cpu_percent,
            r.startup_cpu_s,
            r.rss_mib,
            r.end_rss_mib,
            r.end_file_rss_mib,
            opt(r.map_mib, 1),
            r.throughput_ratio,
            r.judged
        );
    }
    println!();
    println!("At once: bpftrace, bpftrace counting by thread name with no stack (`@[comm] = count()`) and ember-agent attached together, BPF ns/sample over one window (the host's speed moves all alike)");
    println!("| Hz | bpftrace profile | bpftrace, no stack | ember-agent | ember-agent / bpftrace | no stack / bpftrace |");
    println!("|---|---|---|---|---|---|");
    for (hz, t) in together {
        println!("| {hz} | {:.0} | {:.0} | {:.0} | {:.2}x | {:.2}x |", t.bpftrace, t.no_stack, t.ember, t.ember / t.bpftrace, t.no_stack / t.bpftrace);
    }
    Ok(())
}

/// BPF ns/sample of bpftrace's program, of bpftrace counting by thread name alone (no stack:
/// the floor under what any program that takes a stack costs) and of Ember's, attached at
/// once and measured over one window.
fn measure_together(setup: &Setup, hz: u64, window: Duration) -> Result<Together> {
    let workload = &setup.workload;
    let dir = empty_dir("together")?;
    let beside = setup.start_beside(window)?;
    let start = |profiler: Profiler| -> Result<Running> {
        Running::start(profiler.name(workload), profiler.command(hz, Scope::Host, workload.perf_call_graph(), INTERVAL, &dir)?)
    };
    let mut no_stack = Command::new("bpftrace");
    no_stack.args(["-e", &format!("profile:hz:{hz} {{ @[comm] = count(); }}")]).stdout(Stdio::null());
    let (bpftrace, no_stack, ember) = (start(Profiler::Bpftrace)?, Running::start("bpftrace, no stack", no_stack)?, start(Profiler::Ember)?);
    warm_up(setup, &dir, true)?;
    let ns = ns_per_run_at_once(&[&bpftrace, &no_stack, &ember], || run_workload(setup, window))?;
    // bpftrace's output is not used here, and printing it means naming every stack it
    // counted, ember-agent's among them: more than two minutes. So it is killed (on drop).
    drop((bpftrace, no_stack));
    ember.stop()?;
    drop(beside);
    let _ = fs::remove_dir_all(&dir);
    Ok(Together { bpftrace: ns[0], no_stack: ns[1], ember: ns[2] })
}

/// BPF ns/sample of the programs `measure_together` attaches.
struct Together {
    bpftrace: f64,
    no_stack: f64,
    ember: f64,
}

/// The workers' workload, and a binary that runs beside them (not counted in throughput).
struct Setup {
    workload: Workload,
    beside: Option<PathBuf>,
}

/// The binary beside the workers, running until dropped.
struct Beside(Option<Child>);

impl Setup {
    /// Starts the binary beside the workers for the whole of a measurement, warm-up included:
    /// the steady figures are those of a host that runs it, not of one that starts it.
    fn start_beside(&self, window: Duration) -> Result<Beside> {
        let seconds = (window + WARM_UP + FIRST_PROFILE).as_secs_f64().to_string();
        let child = self.beside.as_ref().map(|binary| Command::new(binary).arg(&seconds).stdout(Stdio::null()).spawn()).transpose()?;
        Ok(Beside(child))
    }
}

impl Drop for Beside {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs the workload on every worker; returns completed rounds per second.
fn run_workload(setup: &Setup, window: Duration) -> Result<f64> {
    let workers: Vec<Child> = (0..WORKERS)
        .map(|_| setup.workload.command(window.as_secs_f64()).stdout(Stdio::piped()).spawn())
        .collect::<Result<_, _>>()
        .context("starting the workload")?;
    let mut rounds = 0u64;
    for worker in workers {
        let out = worker.wait_with_output()?;
        // The first number is the work done.
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        rounds += text.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()).context("fixture output")?;
    }
    Ok(rounds as f64 / window.as_secs_f64())
}

fn measure(profiler: Profiler, setup: &Setup, hz: u64, window: Duration, baseline: f64) -> Result<Row> {
    let workload = &setup.workload;
    let dir = empty_dir("profiler")?;
    let command = profiler.command(hz, Scope::Host, workload.perf_call_graph(), INTERVAL, &dir)?;
    let beside = setup.start_beside(window)?;
    let profiler_process = Running::start(profiler.name(workload), command)?;
    warm_up(setup, &dir, profiler == Profiler::Ember)?;
    let before = profiler_process.snapshot()?;
    let started = std::time::Instant::now();
    let throughput = run_workload(setup, window)?;
    let elapsed = started.elapsed().as_secs_f64();
    let after = profiler_process.snapshot()?;
    let printed = profiler.stop(profiler_process)?;
    drop(beside);
    let row = Row {
        profiler: profiler.name(workload),
        hz,
        bpf_ns_per_sample: after.bpf_ns_per_run_since(&before),
        cpu_percent: after.cpu_percent_since(&before, elapsed),
        startup_cpu_s: before.cpu_ns as f64 / 1e9,
        rss_mib: after.peak_rss_mib,
        end_rss_mib: after.rss_mib,
        end_file_rss_mib: after.file_rss_mib,
        map_mib: after.map_mib(),
        throughput_ratio: throughput / baseline,
        judged: if printed { workload.judge(&stacks(profiler, Some(workload.comm()), &dir)) } else { "not printed".into() },
    };
    let _ = fs::remove_dir_all(&dir);
    Ok(row)
}

/// The warm-up before a window (see `WARM_UP`), with Ember's first profile if it runs.
fn warm_up(setup: &Setup, dir: &Path, ember: bool) -> Result<()> {
    let started = std::time::Instant::now();
    run_workload(setup, PRIMING)?;
    std::thread::sleep(WARM_UP.saturating_sub(started.elapsed()));
    if ember {
        wait_for_profile(&dir.join("profiles"))?;
        std::thread::sleep(INTERVAL / 2);
    }
    Ok(())
}

/// Frames per stack, weighted by the stacks' counts; None without stacks.
pub(super) fn mean_frames(stacks: &[(Vec<String>, u64)]) -> Option<f64> {
    let count: u64 = stacks.iter().map(|(_, n)| n).sum();
    let frames: u64 = stacks.iter().map(|(f, n)| f.len() as u64 * n).sum();
    (count > 0).then(|| frames as f64 / count as f64)
}

/// Waits until Ember has written a profile to `dir`.
pub(super) fn wait_for_profile(dir: &Path) -> Result<()> {
    wait_for_profiles(dir, 1)
}

/// Waits (at most FIRST_PROFILE) until ember-agent has written `count` files in `dir`.
pub(super) fn wait_for_profiles(dir: &Path, count: usize) -> Result<()> {
    let started = std::time::Instant::now();
    while fs::read_dir(dir).map_or(0, |entries| entries.count()) < count {
        anyhow::ensure!(started.elapsed() < FIRST_PROFILE, "ember-agent wrote {count} profiles not within {FIRST_PROFILE:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The stacks of `comm` (all stacks if None), as function names leaf first, with their counts,
/// from each profiler's own output.
pub(super) fn stacks(profiler: Profiler, comm: Option<&str>, dir: &Path) -> Vec<(Vec<String>, u64)> {
    let mut stacks = Vec::new();
    // "main+0x12" and "main+18" are main.
    let bare = |frame: &str| frame.split('+').next().unwrap_or(frame).to_string();
    match profiler {
        Profiler::Ember => {
            // The first profile holds the warm-up (priming run, cold start): the others, the window.
            let mut files: Vec<PathBuf> = fs::read_dir(dir.join("profiles")).into_iter().flatten().flatten().map(|e| e.path()).collect();
            files.sort();
            for path in files.iter().skip(1) {
                let profile = Decoded::read(path);
                for sample in profile.samples.iter().filter(|s| comm.is_none_or(|comm| s.labels.get("comm").is_some_and(|c| c == comm))) {
                    stacks.push((sample.frames.iter().map(|f| f.function.clone()).collect(), sample.values[0] as u64));
                }
            }
        }
        Profiler::Perf => {
            // No samples where perf script fails: the judged column says so.
            let samples = perf_script(&dir.join("perf.data"), "comm").unwrap_or_default();
            stacks.extend(samples.into_iter().filter(|(header, _)| comm.is_none_or(|comm| header == comm)).map(|(_, frames)| (frames, 1)));
        }
        Profiler::Bpftrace => {
            let text = fs::read_to_string(dir.join("bpftrace.out")).unwrap_or_default();
            for block in text.split("@[").skip(1) {
                let Some((key, n)) = block.rsplit_once("]: ") else { continue };
                if comm.is_none_or(|comm| key.trim_end().ends_with(comm)) {
                    let frames = key.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with(',')).map(bare).collect();
                    stacks.push((frames, n.trim().parse().unwrap_or(0)));
                }
            }
        }
    }
    stacks
}
