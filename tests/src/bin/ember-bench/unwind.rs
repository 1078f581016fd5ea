//! `cargo xtask bench unwind`: what unwinding without frame pointers costs besides the walk
//! itself (`bench oncpu --no-frame-pointers` measures that): each table's kernel memory and
//! build time for libc, the agent and a binary of 50 MB or more; the agent's memory with 200
//! more processes running; and the share of complete stacks in the first interval after
//! start, with 50 busy processes already running.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use ember_tests::{fetch_metrics, metric_value, nofp, transport::free_address, Decoded};

use super::{empty_dir, opt, release_bin, Profiler};

pub fn run() -> Result<()> {
    println!("Command: cargo xtask bench unwind\n");
    tables()?;
    many_processes()?;
    cold_start()
}

/// The largest shared library of 50 MB or more under the rustup toolchains (librustc_driver).
fn big_binary() -> Option<PathBuf> {
    let home = std::env::var_os("RUSTUP_HOME").map(PathBuf::from).or_else(|| Some(PathBuf::from(std::env::var_os("HOME")?).join(".rustup")))?;
    let libs = fs::read_dir(home.join("toolchains")).ok()?.flatten().flat_map(|t| fs::read_dir(t.path().join("lib")).into_iter().flatten().flatten());
    libs.map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "so"))
        .filter_map(|p| Some((fs::metadata(&p).ok()?.len(), p)))
        .filter(|(size, _)| *size >= 50 << 20)
        .max()
        .map(|(_, p)| p)
}

fn tables() -> Result<()> {
    let mut files = vec![PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"), release_bin("ember-agent")];
    files.extend(big_binary());
    let out = Command::new(release_bin("ember-agent")).arg("unwind-table").args(&files).output().context("running unwind-table")?;
    if !out.status.success() {
        bail!("unwind-table failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    println!("| binary | file MB | CFI rows | kernel rows | kernel KiB (rows + page index) | build ms |");
    println!("|---|---|---|---|---|---|");
    for (file, line) in files.iter().zip(String::from_utf8_lossy(&out.stdout).lines()) {
        // "<path>: <n> rows from <src> in <ms> ms (...); in the kernel: <k> rows, <p> pages, <kib> KiB"
        let number = |after: &str| line.split(after).nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or("?").to_string();
        let size = fs::metadata(file).map(|m| m.len() as f64 / 1e6).unwrap_or(0.0);
        let name = file.file_name().unwrap_or_default().to_string_lossy();
        let kernel_rows = line.split("in the kernel: ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or("?");
        println!("| {name} | {size:.1} | {} | {kernel_rows} | {} | {} |", number(": "), number("pages, "), number(" in "));
    }
    println!();
    Ok(())
}

/// `count` sleeping processes of a few different binaries. None starts a child of its own
/// (`sh -c "sleep 600"` did): a child would outlive the kill at the end, holding the
/// bench's stderr open for ten minutes.
fn start_idle(count: usize) -> Result<Processes> {
    let commands: [&[&str]; 4] = [&["sleep", "600"], &["tail", "-f", "/dev/null"], &["sh", "-c", "read line"], &["perl", "-e", "sleep 600"]];
    let children = (0..count)
        .map(|i| {
            let argv = commands[i % commands.len()];
            // The shell waits on a pipe that nothing writes to.
            Command::new(argv[0]).args(&argv[1..]).stdin(Stdio::piped()).stdout(Stdio::null()).spawn()
        })
        .collect::<Result<_, _>>()
        .context("starting idle processes")?;
    Ok(Processes(children))
}

/// The agent at 99 Hz with 200 more processes than the host runs: all are loaded at start.
fn many_processes() -> Result<()> {
    let _idle = start_idle(200)?;
    std::thread::sleep(Duration::from_secs(1));
    let processes = fs::read_dir("/proc")?.flatten().filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok()).count();
    let (dir, http) = (empty_dir("many")?, free_address());
    let mut command = Command::new(release_bin("ember-agent"));
    command.args(["run", "-F", "99", "--interval", "10s", "--http", &http.to_string(), "--output-dir"]).arg(dir.join("profiles"));
    let started = Instant::now();
    let agent = Profiler::start("ember-agent", command)?;
    std::thread::sleep(Duration::from_secs(25));
    let metrics = fetch_metrics(http);
    let snapshot = agent.snapshot()?;
    agent.stop()?;
    let _ = fs::remove_dir_all(&dir);
    let metric = |name: &str| opt(metric_value(&metrics, name), 0);
    println!("| processes on the host | tables loaded | rows used | agent peak RSS MiB | RSS after {}s MiB | BPF map MiB |", started.elapsed().as_secs());
    println!("|---|---|---|---|---|---|");
    println!(
        "| {processes} | {} | {} | {:.1} | {:.1} | {} |\n",
        metric("ember_unwind_tables"),
        metric("ember_unwind_rows_used"),
        snapshot.peak_rss_mib,
        snapshot.rss_mib,
        opt(snapshot.map_mib(), 1)
    );
    Ok(())
}

/// 50 busy processes without frame pointers run before the agent starts: the share of their
/// samples whose stacks reach `main`, in the first interval and the second.
fn cold_start() -> Result<()> {
    let dir = empty_dir("cold")?;
    let built = nofp::build(&dir);
    // Niced: 50 busy processes on 2 CPUs would otherwise leave the agent (and any profiler)
    // a 1/26 share of a CPU to start with.
    let workers: Vec<Child> = (0..50)
        .map(|_| Command::new("nice").args(["-n", "19"]).arg(&built.pie).args(["phases", "120"]).stdout(Stdio::null()).spawn())
        .collect::<Result<_, _>>()?;
    let workers = Processes(workers);
    std::thread::sleep(Duration::from_secs(2));
    let profiles = dir.join("profiles");
    let mut command = Command::new(release_bin("ember-agent"));
    command.args(["run", "-F", "99", "--interval", "5s", "--output-dir"]).arg(&profiles);
    let agent = Profiler::start("ember-agent", command)?;
    let deadline = Instant::now() + Duration::from_secs(90);
    let cpu_profiles = || -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = fs::read_dir(&profiles).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| is_cpu_profile(p)).collect();
        files.sort();
        files
    };
    while cpu_profiles().len() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    agent.stop()?;
    drop(workers);
    let files = cpu_profiles();
    println!("| interval after start | phases samples | share reaching main |");
    println!("|---|---|---|");
    for (i, file) in files.iter().take(2).enumerate() {
        let profile = Decoded::read(file);
        let samples: Vec<_> = profile.samples.iter().filter(|s| s.labels.get("comm").is_some_and(|c| c == "phases")).collect();
        let total: i64 = samples.iter().map(|s| s.values[0]).sum();
        let complete: i64 = samples.iter().filter(|s| s.frames.iter().any(|f| f.function == "main")).map(|s| s.values[0]).sum();
        println!("| {} | {total} | {:.4} |", i + 1, complete as f64 / total.max(1) as f64);
    }
    let _ = fs::remove_dir_all(&dir);
    Ok(())
}

fn is_cpu_profile(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("cpu-") && n.to_string_lossy().ends_with(".pb.gz"))
}

/// Processes the benchmark started, killed on drop.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
