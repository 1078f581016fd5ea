//! `cargo xtask bench alloc`: what the `alloc` group costs. A process mallocs and frees 64
//! bytes as fast as it can (the fixture's `alloc-loop`), alone, under Ember's probes on its
//! allocator, under heaptrack (preloaded), and under bpftrace doing what bcc's `memleak -p`
//! does on each call (size at entry, address and stack at return, delete at free; memleak
//! itself compiles its program against kernel headers at start, which this kernel does not
//! ship). Ember runs again on the same loop with jemalloc and with tcmalloc preloaded, each
//! beside its own run with no profiler. Then Ember tracks 100,000 live sampled allocations: its
//! memory beside them.
use std::{
    io::Write as _,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result};
use ember_tests::Decoded;

use super::{empty_dir, release_bin, Profiler};

/// What Ember (loading its programs, probing) and bpftrace (compiling) take to attach.
const ATTACH: Duration = Duration::from_secs(5);
/// Allocations held for the footprint, and their size: 16 of the sampling mean (2 KiB
/// there), so that each is sampled.
const HELD: &str = "100000";
const HELD_SIZE: &str = "32768";

/// The fixture in `mode`, waiting for its start line, under `wrapper` (a command line that
/// runs it) if any.
fn spawn(mode: &str, seconds: u64, args: &[&str], wrapper: &[&str]) -> Result<Child> {
    let fixture = release_bin("fixture");
    let mut command = match wrapper.split_first() {
        Some((program, wrapper_args)) => {
            let mut command = Command::new(program);
            command.args(wrapper_args).arg(&fixture);
            command
        }
        None => Command::new(&fixture),
    };
    command.args([mode, &seconds.to_string(), "--wait"]).args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
    command.spawn().context("starting the fixture")
}

/// Starts a waiting fixture, waits for it, and returns the last number it printed.
fn finish(mut child: Child) -> Result<u64> {
    child.stdin.take().context("stdin")?.write_all(b"go\n")?;
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().rev().find_map(|l| l.trim().parse().ok()).with_context(|| format!("no count in the fixture's output: {text}"))
}

/// The process's libc (bpftrace probes a path), once its loader has mapped it.
fn libc_of(pid: u32) -> Result<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
        if let Some(path) = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("/libc.so")) {
            return Ok(path.to_string());
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "the fixture maps no libc after 5 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Debian's allocators that the bench preloads beside glibc's (`cargo xtask setup` installs
/// them), with their environment: jemalloc's and tcmalloc-minimal's functions open with other
/// instructions, so their probes land elsewhere; the full tcmalloc with its sampler on (at its
/// documented period) is probed on its sampled path only.
const PRELOADED: [(&str, &str); 3] =
    [("libjemalloc.so.2", ""), ("libtcmalloc_minimal.so.4", ""), ("libtcmalloc.so.4", "TCMALLOC_SAMPLE_PARAMETER=524288")];

pub fn run(seconds: u64) -> Result<()> {
    println!("bench alloc: fixture alloc-loop (malloc+free of 64 bytes), {seconds}s per run");
    let dir = empty_dir("alloc")?;
    let pairs_per_second = |pairs: u64| pairs as f64 / seconds as f64;
    let none = pairs_per_second(finish(spawn("alloc-loop", seconds, &[], &[])?)?);
    println!("  no profiler: {:.1} ns a pair", 1e9 / none);

    // (profiler, pairs a second, pairs a second with no profiler on the same allocator,
    // CPU + BPF share of a core, BPF ns a probe run)
    let mut rows: Vec<(String, f64, f64, Option<f64>, Option<f64>)> = Vec::new();
    for name in ["ember-agent --events alloc", "bpftrace, memleak's probes", "heaptrack"] {
        let (rate, cost, bpf_ns) = match name {
            "heaptrack" => {
                let data = dir.join("heaptrack");
                let child = spawn("alloc-loop", seconds, &[], &["heaptrack", "-o", data.to_str().context("UTF-8 path")?])?;
                (pairs_per_second(finish(child)?), None, None)
            }
            _ => {
                let child = spawn("alloc-loop", seconds, &[], &[])?;
                let pid = child.id();
                let command = if name.starts_with("ember") { ember(pid, seconds, &dir) } else { memleak(pid)? };
                let (rate, cost, bpf_ns) = under(name, command, child, seconds)?;
                (rate, Some(cost), bpf_ns)
            }
        };
        println!("  {name}: done");
        rows.push((name.to_string(), rate, none, cost, bpf_ns));
    }
    for (library, environment) in PRELOADED {
        let path = Path::new("/usr/lib").join(format!("{}-linux-gnu", std::env::consts::ARCH)).join(library);
        anyhow::ensure!(path.is_file(), "{} is missing: run `cargo xtask setup`", path.display());
        let preload = format!("LD_PRELOAD={}", path.display());
        let wrapper: Vec<&str> = ["env", preload.as_str(), environment].into_iter().filter(|a| !a.is_empty()).collect();
        let bare = pairs_per_second(finish(spawn("alloc-loop", seconds, &[], &wrapper)?)?);
        let child = spawn("alloc-loop", seconds, &[], &wrapper)?;
        let command = ember(child.id(), seconds, &dir);
        let (rate, cost, bpf_ns) = under("ember-agent", command, child, seconds)?;
        let name = format!("ember-agent --events alloc, {library} preloaded {environment}").trim_end().to_string();
        println!("  {name}: done ({:.1} ns a pair with no profiler)", 1e9 / bare);
        rows.push((name, rate, bare, Some(cost), bpf_ns));
    }
    let held = footprint(&dir)?;
    let _ = std::fs::remove_dir_all(&dir);

    println!();
    println!("Command: cargo xtask bench alloc --seconds {seconds}");
    println!("| profiler | ns per malloc+free, none / profiled | added per pair, ns | vs bpftrace's added | throughput vs none | BPF ns a probe run | profiler CPU + BPF, % of a core |");
    println!("|---|---|---|---|---|---|---|");
    let added = |rate: f64, bare: f64| 1e9 / rate - 1e9 / bare;
    let bpftrace_added = rows.iter().find(|(n, ..)| n.starts_with("bpftrace")).map(|&(_, rate, bare, ..)| added(rate, bare)).context("bpftrace's row")?;
    for (name, rate, bare, cost, bpf_ns) in &rows {
        let cost = cost.map_or("in the process".to_string(), |c| format!("{:.2}", c * 100.0));
        let bpf_ns = bpf_ns.map_or("n/a".to_string(), |ns| format!("{ns:.0}"));
        // bpftrace probes glibc's functions: a ratio only beside them.
        let ratio = if *bare == none { format!("{:.2}x", added(*rate, *bare) / bpftrace_added) } else { "-".to_string() };
        println!("| {name} | {:.1} / {:.1} | {:.1} | {ratio} | {:.4} | {bpf_ns} | {cost} |", 1e9 / bare, 1e9 / rate, added(*rate, *bare), rate / bare);
    }
    println!();
    println!("Ember with {HELD} live sampled allocations of {HELD_SIZE} bytes (--alloc-sample 2KiB --alloc-max-live 131072):");
    println!("| live allocations in the last profile (inuse_objects) | agent peak RSS MiB | agent RSS MiB | BPF map MiB | agent CPU + BPF over the last 10 s, % of a core |");
    println!("|---|---|---|---|---|");
    println!("| {:.0} | {:.1} | {:.1} | {:.1} | {:.2} |", held.0, held.1, held.2, held.3, held.4 * 100.0);
    Ok(())
}

/// Runs the waiting fixture `child` to its end under the profiler `command`: (pairs a second,
/// profiler CPU + BPF share of a core, BPF ns a probe run).
fn under(program: &str, command: Command, child: Child, seconds: u64) -> Result<(f64, f64, Option<f64>)> {
    let profiler = Profiler::start(if program.starts_with("ember") { "ember-agent" } else { "bpftrace" }, command)?;
    std::thread::sleep(ATTACH);
    let before = profiler.snapshot()?;
    let rate = finish(child)? as f64 / seconds as f64;
    let after = profiler.snapshot()?;
    profiler.stop_for_output()?;
    Ok((rate, after.overhead_since(&before, seconds as f64), after.bpf_ns_per_run_since(&before)))
}

/// Ember recording the process's allocations for the run.
fn ember(pid: u32, seconds: u64, dir: &Path) -> Command {
    let mut command = Command::new(release_bin("ember-agent"));
    let duration = format!("{}s", seconds + ATTACH.as_secs() + 5);
    command.args(["record", "--events", "alloc", "--pid", &pid.to_string(), "-d", &duration, "-o"]).arg(dir.join("loop.pb.gz"));
    command
}

/// bpftrace doing memleak's work on each call of the process's malloc and free.
fn memleak(pid: u32) -> Result<Command> {
    let libc = libc_of(pid)?;
    let program = format!(
        "uprobe:{libc}:malloc {{ @size[tid] = arg0; }} \
         uretprobe:{libc}:malloc /@size[tid]/ {{ @live[retval] = @size[tid]; @stacks[ustack] = sum(@size[tid]); delete(@size[tid]); }} \
         uprobe:{libc}:free {{ delete(@live[arg0]); }}"
    );
    let mut command = Command::new("bpftrace");
    command.args(["-p", &pid.to_string(), "-e", &program]).stdout(Stdio::null());
    Ok(command)
}

/// Ember tracking `HELD` live allocations: (inuse_objects in its last profile, peak RSS MiB,
/// RSS MiB, BPF map MiB, CPU + BPF share of a core over 10 s).
fn footprint(dir: &Path) -> Result<(f64, f64, f64, f64, f64)> {
    let out = dir.join("hold");
    let child = spawn("alloc-hold", 60, &[HELD, HELD_SIZE], &[])?;
    let pid = child.id();
    let mut command = Command::new(release_bin("ember-agent"));
    command.args(["run", "--events", "alloc", "--pid", &pid.to_string(), "--alloc-sample", "2KiB", "--alloc-max-live", "131072", "--interval", "2s", "--output-dir"]).arg(&out);
    let profiler = Profiler::start("ember-agent", command)?;
    std::thread::sleep(ATTACH);
    let mut child = child;
    child.stdin.take().context("stdin")?.write_all(b"go\n")?;
    // The blocks are allocated within seconds; then a few drains read the full table.
    std::thread::sleep(Duration::from_secs(10));
    let before = profiler.snapshot()?;
    std::thread::sleep(Duration::from_secs(10));
    let after = profiler.snapshot()?;
    let cost = after.overhead_since(&before, 10.0);
    profiler.stop()?;
    let _ = child.kill();
    let _ = child.wait();
    let profiles = Decoded::read_kind(&out, "heap");
    let last = profiles.iter().max_by_key(|p| p.profile.time_nanos).context("no heap profile was written")?;
    let in_use = last.samples_of(pid).iter().map(|s| s.values[2]).sum::<i64>() as f64;
    Ok((in_use, after.peak_rss_mib, after.rss_mib, after.map_mib().unwrap_or(0.0), cost))
}
