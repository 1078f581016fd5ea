//! `ember-bench oncpu | offcpu | governor | net | transport | unwind | jit | python | churn | soak | ui | mappings | faults`, run by `cargo xtask bench` after
//! the release build: Ember and its peers on the same workload, in one command, measured the same way from
//! /proc: CPU over a steady-state window, peak RSS, and (with kernel.bpf_stats_enabled) the run
//! time of each profiler's BPF programs and the memory of its maps.
mod alloc;
mod churn;
mod faults;
mod fleet;
mod fleet_query;
mod churn_cost;
mod governor;
mod jit;
mod mappings;
mod net;
mod offcpu;
mod oncpu;
mod pushing;
mod python;
mod soak;
mod synthetic;
mod transport;
mod ui;
mod unwind;

use std::{
    fs,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _, Result};
use ember_tests::{
    cgroup_cpu::CgroupCpu,
    usage::{self, bpf_usage, status_kib, BpfStats, BpfUsage, HostTimes},
};

#[derive(clap::Parser)]
#[command(name = "cargo xtask bench")]
struct BenchArgs {
    /// Which benchmark.
    #[arg(value_parser = ["oncpu", "offcpu", "governor", "net", "transport", "unwind", "jit", "python", "churn", "soak", "ui", "mappings", "faults", "alloc", "fleet"])]
    which: String,
    /// Length of the measured window per run (soak: 600 for the ten minutes its goal is about).
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Sampling frequencies to compare (oncpu, python; Hz).
    #[arg(long, value_delimiter = ',', default_value = "99,999")]
    frequencies: Vec<u64>,
    /// oncpu: run a C workload built without frame pointers (perf then unwinds with DWARF).
    #[arg(long)]
    no_frame_pointers: bool,
    /// oncpu: run only that C workload's 100-deep recursion, built with frame pointers, so that
    /// every profiler walks the whole stack (what a frame costs each). offcpu: ping-pong from
    /// the bottom of that recursion instead of `perf bench sched pipe`.
    #[arg(long)]
    deep: bool,
    /// oncpu: run a C++ binary with about 100 MB of DWARF beside the workers (what naming it
    /// costs the agent).
    #[arg(long)]
    debug_binary: bool,
    /// fleet: which half, ingest (pushes for --seconds) or query (a day of --hosts hosts).
    /// python: cost runs only the BPF cost per sample beside bpftrace's.
    #[arg(long, value_parser = ["ingest", "query", "cost", "all"], default_value = "all")]
    part: String,
    /// fleet: the fleet sizes whose day is queried (multiples of 5).
    #[arg(long, value_delimiter = ',', default_value = "5,100")]
    hosts: Vec<usize>,
    /// governor: microseconds each pingpong thread is busy per turn (fewer: more switches).
    #[arg(long, default_value_t = 20)]
    busy_us: u64,
}

fn main() {
    let args = <BenchArgs as clap::Parser>::parse();
    if let Err(error) = bench(args) {
        eprintln!("bench: {error:#}");
        std::process::exit(1);
    }
}

fn bench(args: BenchArgs) -> Result<()> {
    let _stats = BpfStats::enable()?;
    let host = HostTimes::now();
    let ran = match args.which.as_str() {
        "oncpu" => oncpu::run(args.seconds, &args.frequencies, args.no_frame_pointers, args.deep, args.debug_binary),
        "offcpu" => offcpu::run(args.seconds, args.deep),
        "governor" => governor::run(args.seconds, args.busy_us),
        "net" => net::run(args.seconds),
        "transport" => transport::run(),
        "unwind" => unwind::run(),
        "jit" => jit::run(args.seconds),
        "python" => python::run(args.seconds, &args.frequencies, args.part == "cost"),
        "churn" => churn::run(args.seconds),
        "faults" => faults::run(args.seconds),
        "alloc" => alloc::run(args.seconds),
        "fleet" => {
            if args.part != "query" {
                fleet::run(args.seconds)?;
            }
            if args.part != "ingest" {
                fleet_query::run(&args.hosts)?;
            }
            Ok(())
        }
        "soak" => soak::run(args.seconds),
        "ui" => ui::run(),
        "mappings" => mappings::run(args.seconds),
        other => bail!("unknown benchmark {other}"),
    };
    // On a virtual machine, what the hypervisor took moves every figure: printed with them.
    println!("host: {:.1}% of the CPUs' busy time was stolen by the hypervisor during the bench", HostTimes::now().steal_since(&host) * 100.0);
    ran
}

/// Waits until the embedded store's collector has built its roll-ups: its CPU stays idle for
/// longer than two of the roller's 10 s rounds (it builds a bucket after a round in which the
/// bucket did not change). Returns how long that took and the CPU it spent meanwhile, in s.
pub fn wait_for_rollups(pid: u32, limit: Duration) -> Result<(f64, f64)> {
    let (started, cpu) = (Instant::now(), usage::process_cpu_seconds(pid));
    loop {
        let before = usage::process_cpu_seconds(pid);
        std::thread::sleep(Duration::from_secs(21));
        let after = usage::process_cpu_seconds(pid);
        if after - before < 0.05 {
            return Ok(((started.elapsed().as_secs_f64() - 21.0).max(0.0), after - cpu));
        }
        ensure!(started.elapsed() < limit, "the collector was still building roll-ups after {} s", limit.as_secs());
    }
}

/// An empty directory of this bench run, named `name`: for its builds and profiles.
pub fn empty_dir(name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("ember-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A binary of the same build as this one (`cargo xtask bench` builds them all in release).
pub fn release_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("ember-bench's own path");
    exe.parent().expect("target/release").join(name)
}

pub fn opt(value: Option<f64>, digits: usize) -> String {
    value.map_or("n/a".to_string(), |v| format!("{v:.digits$}"))
}

/// A profiler process under measurement, in a cgroup of its own that counts its CPU time.
pub struct Profiler {
    name: &'static str,
    child: Child,
    cpu: CgroupCpu,
}

/// What a profiler process has used so far.
pub struct Snapshot {
    /// CPU time of all its threads, ended ones included, and of its children.
    pub cpu_ns: u64,
    pub peak_rss_mib: f64,
    /// RSS now, and how much of it is mapped files (binaries, debug info being read).
    pub rss_mib: f64,
    pub file_rss_mib: f64,
    bpf: BpfUsage,
}

impl Profiler {
    pub fn start(name: &'static str, mut command: Command) -> Result<Profiler> {
        let cpu = CgroupCpu::new(name)?;
        cpu.enter_on_exec(&mut command);
        let child = command.stderr(Stdio::null()).spawn().with_context(|| format!("starting {name}"))?;
        Ok(Profiler { name, child, cpu })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn snapshot(&self) -> Result<Snapshot> {
        let pid = self.child.id();
        let status = fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("{} exited before it was measured", self.name))?;
        let mib = |field: &str| status_kib(&status, field) as f64 / 1024.0;
        Ok(Snapshot {
            cpu_ns: self.cpu.cpu_ns()?,
            peak_rss_mib: mib("VmHWM:"),
            rss_mib: mib("VmRSS:"),
            file_rss_mib: mib("RssFile:"),
            bpf: bpf_usage(pid),
        })
    }

    /// SIGINT (every profiler here stops and writes its output on it), bounded wait.
    pub fn stop(mut self) -> Result<()> {
        if !self.interrupt()? {
            bail!("{} did not stop within {STOP_WAIT:?} of SIGINT", self.name);
        }
        Ok(())
    }

    /// `stop`, for a peer whose output only adds to its row: bpftrace names every stack it
    /// counted as it exits, which once took more than two minutes. One that does not exit in
    /// time is killed and told; false then, and its output is to be left out.
    pub fn stop_for_output(mut self) -> Result<bool> {
        let stopped = self.interrupt()?;
        if !stopped {
            println!("  note: {} did not exit within {STOP_WAIT:?} of SIGINT: its output is left out", self.name);
        }
        Ok(stopped)
    }

    /// SIGINT, then up to `STOP_WAIT` for the process to exit; false if it did not (it is
    /// killed then).
    fn interrupt(&mut self) -> Result<bool> {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + STOP_WAIT;
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(true)
    }
}

/// How long a profiler may take to exit after SIGINT.
const STOP_WAIT: Duration = Duration::from_secs(120);

/// A profiler left running by a measurement that failed before stopping it must not outlive
/// the bench (nor keep its programs attached).
impl Drop for Profiler {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// BPF ns per run of each profiler's programs over one `run` with all of them attached. Run
/// one after the other, each figure moves with the host's speed in its own minutes (on this
/// VM, by a third between runs a few minutes apart); at once, the host moves them alike.
pub fn ns_per_run_at_once<T>(profilers: &[&Profiler], run: impl FnOnce() -> Result<T>) -> Result<Vec<f64>> {
    let before = profilers.iter().map(|p| p.snapshot()).collect::<Result<Vec<_>>>()?;
    run()?;
    profilers
        .iter()
        .zip(&before)
        .map(|(p, before)| p.snapshot()?.bpf_ns_per_run_since(before).with_context(|| format!("{}: no BPF runs in the window", p.name)))
        .collect()
}

impl Snapshot {
    /// Average run time of the process's BPF programs between two snapshots.
    pub fn bpf_ns_per_run_since(&self, before: &Snapshot) -> Option<f64> {
        let runs = self.bpf.prog_runs.saturating_sub(before.bpf.prog_runs);
        (runs > 0).then(|| (self.bpf.prog_run_ns - before.bpf.prog_run_ns) as f64 / runs as f64)
    }

    pub fn bpf_runs_since(&self, before: &Snapshot) -> u64 {
        self.bpf.prog_runs.saturating_sub(before.bpf.prog_runs)
    }

    /// CPU plus BPF run time between two snapshots, as a share of one core.
    pub fn overhead_since(&self, before: &Snapshot, seconds: f64) -> f64 {
        let ns = (self.cpu_ns - before.cpu_ns) + self.bpf.prog_run_ns.saturating_sub(before.bpf.prog_run_ns);
        ns as f64 / 1e9 / seconds
    }

    pub fn cpu_percent_since(&self, before: &Snapshot, seconds: f64) -> f64 {
        (self.cpu_ns - before.cpu_ns) as f64 / 1e9 / seconds * 100.0
    }

    pub fn map_mib(&self) -> Option<f64> {
        (self.bpf.map_bytes > 0).then(|| self.bpf.map_bytes as f64 / (1 << 20) as f64)
    }
}

