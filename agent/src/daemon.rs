//! `ember-agent run`: the continuous profiler. Every interval it drains the kernel's buffers
//! and hands the interval to the pipeline; on SIGINT/SIGTERM the partial interval is flushed.
use std::path::PathBuf;

use agent_common::counter;
use anyhow::{Context as _, Result};
use clap::Args;
use tokio::{
    signal::unix::{signal, SignalKind},
    time::{interval_at, Instant, MissedTickBehavior},
};

use crate::{
    cgroups,
    collect::Collector,
    config::{self, parse_duration, FileConfig},
    output::Outputs,
    pipeline::Pipeline,
    resolve::ResolvedInterval,
    sampler::{Event, SamplerOptions},
    SamplingArgs,
};

#[derive(Args, Debug)]
pub struct RunArgs {
    /// TOML configuration file (flags override it).
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// Length of one profile [default: 10s].
    #[arg(long)]
    interval: Option<String>,
    /// Directory for the profiles [default: ./ember-profiles].
    #[arg(short, long)]
    output_dir: Option<PathBuf>,
    /// Also write folded stacks and an SVG flame graph per interval.
    #[arg(long)]
    flamegraphs: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
}

pub fn sampler_options(args: &SamplingArgs, file: &FileConfig, default_frequency: u64) -> Result<SamplerOptions> {
    let frequency = args.frequency.or(file.frequency).unwrap_or(default_frequency);
    anyhow::ensure!((1..=100_000).contains(&frequency), "frequency {frequency} Hz is out of range (1-100000)");
    let cgroup = args.cgroup.clone().or(file.cgroup.clone());
    Ok(SamplerOptions {
        event: args.event.or(file.event).unwrap_or(Event::CpuClock),
        frequency,
        max_keys: args.max_keys.or(file.max_keys).unwrap_or(config::DEFAULT_MAX_KEYS),
        max_stacks: args.max_stacks.or(file.max_stacks).unwrap_or(config::DEFAULT_MAX_STACKS),
        pids: if args.pids.is_empty() { file.pids.clone().unwrap_or_default() } else { args.pids.clone() },
        cgroup_id: cgroup.as_deref().map(cgroups::cgroup_id).transpose()?,
    })
}

/// Resolves on the first SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Logs every loss of the interval by reason; losses are also in the profile's comments.
pub fn report_losses(interval: &ResolvedInterval) {
    let lost = |i| interval.counter(i);
    if lost(counter::MAP_FULL) > 0 {
        tracing::warn!(lost = lost(counter::MAP_FULL), "samples lost: counts map full (raise max_keys)");
    }
    let collisions = lost(counter::USER_STACK_COLLISION) + lost(counter::KERNEL_STACK_COLLISION);
    if collisions > 0 {
        tracing::warn!(collisions, "stacks lost to stack map hash collisions (raise max_stacks); their samples are kept");
    }
    let errors = lost(counter::USER_STACK_ERROR) + lost(counter::KERNEL_STACK_ERROR);
    if errors > 0 {
        tracing::warn!(errors, "stacks that could not be captured; their samples are kept");
    }
    if lost(counter::PROCESS_EVENT_LOST) > 0 {
        tracing::warn!(lost = lost(counter::PROCESS_EVENT_LOST), "new-process notifications delayed: ring buffer full");
    }
}

pub async fn run(args: RunArgs) -> Result<()> {
    let file = match &args.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let every = parse_duration(args.interval.as_deref().or(file.interval.as_deref()).unwrap_or("10s"))?;
    let dir = args.output_dir.clone().or(file.output_dir.clone()).unwrap_or_else(crate::default_output_dir);
    let flamegraphs = args.flamegraphs || file.flamegraphs.unwrap_or(false);
    let options = sampler_options(&args.sampling, &file, config::DEFAULT_DAEMON_FREQUENCY)?;
    crate::preflight::check()?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating output directory {}", dir.display()))?;

    let mut collector = Collector::start(&options)?;
    let pipeline = Pipeline::spawn(options.event.name(), options.frequency);
    tracing::info!(
        frequency = options.frequency, event = options.event.name(), interval = ?every, dir = %dir.display(),
        "profiling every CPU"
    );
    let mut ticks = interval_at(Instant::now() + every, every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let mut stopping = false;
    while !stopping {
        tokio::select! {
            result = collector.capture_new_processes() => { result?; continue; }
            _ = ticks.tick() => {}
            _ = &mut shutdown => {
                tracing::info!("stopping: flushing the partial interval");
                stopping = true;
            }
        }
        let interval = collector.drain()?;
        report_losses(&interval);
        let outputs = Outputs::in_dir(&dir, interval.start.unwrap_or_else(std::time::SystemTime::now), flamegraphs);
        pipeline.submit(interval, outputs);
    }
    drop(collector);
    pipeline.finish();
    Ok(())
}
