//! ember-agent: an eBPF continuous profiler. `run` profiles the host continuously and writes
//! one profile per interval; `record` profiles once and writes one profile.
mod btf;
mod cgroups;
mod collect;
mod config;
mod daemon;
mod otlp;
mod metrics;
mod output;
mod pods;
mod pipeline;
mod pprof;
mod preflight;
mod procs;
mod push;
mod profiles;
mod record;
mod relabel;
mod resolve;
mod sampler;
mod serve;
mod spool;
mod status;
mod symbolize;
mod targets;
mod tracefs;

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Parser, Subcommand};

use crate::sampler::Event;

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
    Run(daemon::RunArgs),
    /// Profile once for a fixed time and write one profile.
    Record(record::RecordArgs),
}

/// Sampling options shared by `run` and `record`.
#[derive(Args, Debug, Clone, Default)]
pub struct SamplingArgs {
    /// Event groups to record: cpu (on-CPU sampling), offcpu (blocked time, by where threads
    /// blocked; with cpu also a wall-clock profile), net (network tracepoints) [default: cpu].
    #[arg(long, value_delimiter = ',', value_parser = ["cpu", "offcpu", "net"])]
    events: Vec<String>,
    /// Network tracepoints for the net group [default: net:net_dev_queue,
    /// net:netif_receive_skb, tcp:tcp_retransmit_skb, skb:kfree_skb].
    #[arg(long, value_delimiter = ',')]
    net_events: Vec<String>,
    /// Off-CPU: ignore blocks shorter than this (e.g. 100us, 1ms) [default: 0].
    #[arg(long)]
    offcpu_min_block: Option<String>,
    /// Off-CPU: ignore blocks longer than this [default: none].
    #[arg(long)]
    offcpu_max_block: Option<String>,
    /// Off-CPU: task states to include [default: sleeping,uninterruptible,preempted].
    #[arg(long, value_delimiter = ',', value_parser = ["sleeping", "uninterruptible", "preempted"])]
    offcpu_states: Vec<String>,
    /// Off-CPU: record one block in N (each counted N times) to bound cost [default: 1].
    #[arg(long)]
    offcpu_sample_ratio: Option<u32>,
    /// Samples per second per CPU [run: 19, record: 99].
    #[arg(short = 'F', long)]
    frequency: Option<u64>,
    /// Perf event that triggers sampling [default: cpu-clock].
    #[arg(long, value_enum)]
    event: Option<Event>,
    /// Only profile this process (repeat for several).
    #[arg(short, long = "pid")]
    pids: Vec<u32>,
    /// Only profile this cgroup (path, absolute or relative to the cgroup2 mount).
    #[arg(long)]
    cgroup: Option<String>,
    /// Distinct (thread, stack) keys kept per interval; samples beyond are counted as lost.
    #[arg(long)]
    max_keys: Option<u32>,
    /// Distinct stacks kept per interval.
    #[arg(long)]
    max_stacks: Option<u32>,
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("starting the tokio runtime");
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => daemon::run(args).await,
            Command::Record(args) => record::record(args).await,
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

/// Default output directory of the daemon when neither config nor flags name one.
pub fn default_output_dir() -> PathBuf {
    PathBuf::from("ember-profiles")
}
