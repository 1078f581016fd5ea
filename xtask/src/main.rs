//! `cargo xtask setup | build | run | test | bench | fuzz`: everything a newcomer runs.
//!
//! xtask itself depends on nothing that `setup` installs, so it builds on a fresh machine in
//! seconds; everything else is one shared release build (`build`).
mod fuzz;
mod setup;

use std::{os::unix::process::CommandExt, process::Command};

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what is missing (rust-src, bpf-linker 0.10.4, apt packages, tracefs). Idempotent.
    Setup,
    /// Set up, then build the agent, the collector and the tools (release).
    Build,
    /// Set up, build, and run a collector (embedded store in ./ember-data) and an agent
    /// profiling this host and pushing to it (arguments after -- go to `ember-agent run`).
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, build, and run all tests (end-to-end tests need root).
    Test {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Benchmarks against peers on this machine; prints a table (see BENCHMARKS.md). Arguments
    /// go to `ember-bench` (`cargo xtask bench -- --help`).
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, and run every fuzz target (or those named) for a number of inputs each
    /// (coverage-guided, libFuzzer). `cargo xtask test` runs a short version.
    Fuzz {
        /// Inputs per target.
        #[arg(long, default_value_t = 1_000_000)]
        runs: u64,
        /// Only these targets (the file names in fuzz/fuzz_targets).
        targets: Vec<String>,
    },
}

/// Inputs per fuzz target in `cargo xtask test`.
const TEST_FUZZ_RUNS: u64 = 10_000;

/// A cargo command in the workspace, with the environment of a plain `cargo` in a shell.
pub fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()));
    command.current_dir(workspace_root());
    // `cargo run` gave xtask its own package's variables (CARGO_PKG_NAME=xtask, ...). Build
    // scripts such as ring's rerun when these change, so passing them on would rebuild half
    // the dependencies between `cargo xtask test` and a plain `cargo build --release`.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let package_variable = key.starts_with("CARGO_PKG_")
            || ["CARGO_MANIFEST_DIR", "CARGO_MANIFEST_PATH", "CARGO_MANIFEST_LINKS", "CARGO_CRATE_NAME", "CARGO_BIN_NAME", "CARGO_PRIMARY_PACKAGE"]
                .contains(&key.as_ref());
        if package_variable {
            command.env_remove(key.as_ref());
        }
    }
    command
}

pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

pub fn run(command: &mut Command) -> Result<()> {
    let status = command.status().with_context(|| format!("starting {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(())
}

/// A progress line, so that a newcomer always sees which step is running.
pub fn step(message: &str) {
    println!("xtask: {message}");
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Task::Setup => setup::setup(),
        Task::Build => setup::setup().and_then(|()| build()),
        Task::Run { args } => run_agent(args),
        Task::Test { args } => test(args),
        Task::Bench { args } => bench(args),
        Task::Fuzz { runs, targets } => setup::setup().and_then(|()| fuzz::fuzz(runs, &targets)),
    };
    if let Err(error) = result {
        eprintln!("xtask: {error:#}");
        std::process::exit(1);
    }
}

/// The main job on the embedded default: a collector with its embedded store, and an agent
/// profiling this host and pushing to it (also keeping local files).
fn run_agent(args: Vec<String>) -> Result<()> {
    setup::setup()?;
    build()?;
    let (root, release) = (workspace_root(), release_dir());
    let path = |name: &str| root.join(name).to_str().map(str::to_string).context("non-UTF-8 path");
    // The collector gets its own process group: Ctrl-C reaches the agent, which flushes its
    // last interval and pushes it, and only then is the collector stopped.
    let mut collector = Command::new(release.join("ember-collector"))
        .args(["serve", "--listen", "127.0.0.1:7070", "--http", "127.0.0.1:7071", "--data-dir", &path("ember-data")?])
        .process_group(0)
        .spawn()
        .context("starting ember-collector")?;
    unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    println!("Profiling this host. Every 10 s the profiles are pushed to the collector (./ember-data) and");
    println!("written to ./ember-profiles (pprof, folded, SVG). The live flame graph, in a browser:");
    println!("  http://127.0.0.1:7071/   (the first profiles arrive within 10 s)");
    println!("or as a file: curl 'http://127.0.0.1:7071/query?kind=cpu&format=svg' > cpu.svg");
    println!("Ctrl-C stops both.");
    let agent = Command::new(release.join("ember-agent"))
        .args(["run", "--push", "http://127.0.0.1:7070", "--spool-dir", &path("ember-spool")?])
        .args(["--output-dir", &path("ember-profiles")?, "--flamegraphs"])
        .args(args)
        .status();
    unsafe { libc::kill(collector.id() as i32, libc::SIGINT) };
    collector.wait()?;
    let status = agent.context("starting ember-agent")?;
    if !status.success() {
        bail!("ember-agent failed ({status})");
    }
    Ok(())
}

/// The one build that `run`, `test` and `bench` share: every host binary, in release, for the
/// workspace's default members (agent-ebpf is built for BPF inside the agent's build). The
/// same profile and the same package selection resolve the same features, so whichever command
/// comes first builds for the others, and `cargo test --release` reuses it all.
fn build() -> Result<()> {
    step("building Ember in release (about 6 minutes on 2 cores the first time, seconds after)");
    run(cargo().args(["build", "--release"]))
}

fn release_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace_root().join("target"), Into::into).join("release")
}

fn test(args: Vec<String>) -> Result<()> {
    setup::setup()?;
    // The end-to-end tests run the agent and collector binaries of their own build.
    build()?;
    step("running the tests (release; end-to-end tests load BPF programs, one test at a time)");
    // One test at a time: end-to-end tests measure CPU time on a 2-core machine.
    run(cargo().args(["test", "--release"]).args(&args).args(["--", "--test-threads=1"]))?;
    if args.is_empty() {
        step(&format!("fuzzing every input surface, {TEST_FUZZ_RUNS} inputs each (`cargo xtask fuzz` runs more)"));
        fuzz::fuzz(TEST_FUZZ_RUNS, &[])?;
    }
    Ok(())
}

fn bench(args: Vec<String>) -> Result<()> {
    setup::setup()?;
    build()?;
    step("benchmarking");
    run(Command::new(release_dir().join("ember-bench")).current_dir(workspace_root()).args(args))
}
