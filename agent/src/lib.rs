//! ember-agent: an eBPF continuous profiler. `run` profiles the host continuously and writes
//! one profile per interval; `record` profiles once and writes one profile; `unwind-table`
//! prints the unwind table of a binary.
//!
//! The modules follow the data flow (see design.md): `kernel` -> `unwind` -> `resolve` ->
//! `symbolize` -> `encode` -> `ship`, with `ops` (metrics, status, losses) and `maps_line`
//! (/proc/<pid>/maps) beside them. `cli`
//! and `settings` turn the command line and the config file into what the stages receive;
//! `run`, `record`, `unwind_table` and `pipeline` wire the stages together, `governor`
//! keeps `run`'s cost within its CPU budget, and `drain_schedule` times the drains between
//! the on-CPU sampler's ticks. Imports only point down that list.
mod cli;
mod drain_schedule;
mod duration;
mod encode;
mod governor;
mod kernel;
mod maps_line;
mod ops;
mod pipeline;
mod pod_selector;
mod record;
mod resolve;
mod run;
mod settings;
mod ship;
mod symbolize;
mod unwind;
mod unwind_table;

#[cfg(fuzzing)]
pub mod fuzz;

use std::{io::IsTerminal as _, process::ExitCode};

use clap::{Parser, Subcommand};
use tokio::signal::unix::{signal, SignalKind};

use crate::settings::{RecordSettings, RunSettings};

#[derive(Parser)]
#[command(name = "ember-agent", version, about = "Ember: low-overhead eBPF continuous profiler")]
struct Cli {
    /// Log format.
    #[arg(long, global = true, default_value = "human", value_parser = ["human", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Profile the host continuously, writing one profile per interval.
    Run(cli::RunArgs),
    /// Profile once for a fixed time and write one profile.
    Record(cli::RecordArgs),
    /// Print the unwind table Ember builds for a binary (to walk stacks without frame pointers).
    UnwindTable(cli::UnwindTableArgs),
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a terminal: the journal and log files get plain `key=value`.
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal());
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// The command line: parses it, runs the command, and prints a failure as one line.
pub fn main() -> ExitCode {
    bound_the_heap();
    let cli = Cli::parse();
    init_logging(&cli.log_format);
    // One thread: the kernel's announcements wake the thread that reads them, and nothing
    // hands the wake-up on. Long work that must not hold the status server or the shippers
    // up meanwhile goes to a thread of its own (loading the programs, the pipeline).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("starting the tokio runtime");
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(RunSettings::resolve(&args)?).await,
            Command::Record(args) => record::record(RecordSettings::resolve(&args)?).await,
            Command::UnwindTable(args) => unwind_table::print(&args),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line: what happened and, where we know it, what to do.
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// glibc's defaults suit throughput, not a daemon with a memory ceiling: every thread that
/// allocates gets an arena of its own, each keeping its busiest moment's pages; and once a large
/// buffer is freed, the mmap threshold rises to its size, so that later large buffers come from
/// the arenas and stay there. One arena and a fixed 128 KiB threshold instead: a large transient
/// (an unwind table being built, a debug section inflated) goes back to the kernel when freed.
/// Called before any thread starts.
fn bound_the_heap() {
    // SAFETY: mallopt only sets allocator parameters; no allocation is in flight.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 10);
    }
}

/// Resolves on the first SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
