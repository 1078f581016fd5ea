//! `cargo xtask setup | build | run | test | bench`: everything a newcomer runs.
mod bench;
mod setup;

use std::process::Command;

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
    /// Set up, then build the workspace (release).
    Build,
    /// Set up, build, and run the agent on this host, writing profiles and flame graphs to
    /// ./ember-profiles (arguments after -- go to `ember-agent run`).
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, build, and run all tests (end-to-end tests need root).
    Test {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Benchmarks against peers on this machine; prints a table (see BENCHMARKS.md).
    Bench(bench::BenchArgs),
}

pub fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()));
    command.current_dir(workspace_root());
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

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Task::Setup => setup::setup(),
        Task::Build => setup::setup().and_then(|()| run(cargo().args(["build", "--release", "--workspace"]))),
        Task::Run { args } => run_agent(args),
        Task::Test { args } => test(args),
        Task::Bench(args) => setup::setup().and_then(|()| bench::bench(args)),
    };
    if let Err(error) = result {
        eprintln!("xtask: {error:#}");
        std::process::exit(1);
    }
}

fn run_agent(args: Vec<String>) -> Result<()> {
    setup::setup()?;
    run(cargo().args(["build", "--release", "-p", "ember-agent"]))?;
    let agent = workspace_root().join("target/release/ember-agent");
    let dir = workspace_root().join("ember-profiles");
    println!("Profiling this host; every 10 s a profile lands in {}:", dir.display());
    println!("  cpu-<time>.pb.gz (pprof), cpu-<time>.svg (flame graph), cpu-<time>.folded. Ctrl-C stops.");
    let defaults = ["--output-dir", dir.to_str().context("non-UTF-8 path")?, "--flamegraphs"];
    run(Command::new(agent).arg("run").args(defaults).args(args))
}

fn test(args: Vec<String>) -> Result<()> {
    setup::setup()?;
    // The end-to-end tests run the agent and collector binaries next to them; build them first.
    run(cargo().args(["build", "-p", "ember-agent", "-p", "ember-collector", "-p", "ember-tests"]))?;
    // Default members (the BPF crate is not a host crate). One test at a time: end-to-end
    // tests measure CPU time on a 2-core machine.
    run(cargo().arg("test").args(&args).args(["--", "--test-threads=1"]))
}
