//! `ember-agent record`: profile for a fixed time, write one profile (and its views).
use std::{io::IsTerminal, path::PathBuf, time::Duration};

use anyhow::Result;
use clap::Args;
use tokio::time::{interval, sleep_until, Instant, MissedTickBehavior};

use crate::{
    collect::Collector,
    config::{self, parse_duration},
    daemon::{report_losses, sampler_options, shutdown_signal},
    output::Outputs,
    pipeline::Pipeline,
    resolve::ResolvedInterval,
    SamplingArgs,
};

#[derive(Args, Debug)]
pub struct RecordArgs {
    /// How long to profile (e.g. 10s, 500ms, 2m).
    #[arg(short, long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// pprof output (gzipped profile.proto).
    #[arg(short, long, default_value = "profile.pb.gz")]
    output: PathBuf,
    /// Also write folded stacks here.
    #[arg(long)]
    folded: Option<PathBuf>,
    /// Also write an SVG flame graph here.
    #[arg(long)]
    flamegraph: Option<PathBuf>,
    #[command(flatten)]
    sampling: SamplingArgs,
}

/// Kernel buffers are drained this often during a recording, so a long recording needs no
/// more map space than a short one.
const DRAIN_EVERY: Duration = Duration::from_secs(1);

pub async fn record(args: RecordArgs) -> Result<()> {
    crate::preflight::check()?;
    let options = sampler_options(&args.sampling, &Default::default(), config::DEFAULT_RECORD_FREQUENCY)?;
    let mut collector = Collector::start(&options)?;
    let pipeline = Pipeline::spawn(options.event.name(), options.frequency);
    tracing::info!(frequency = options.frequency, event = options.event.name(), duration = ?args.duration, "profiling every CPU");
    let started = Instant::now();
    let deadline = started + args.duration;
    let mut drains = interval(DRAIN_EVERY.min(args.duration));
    drains.set_missed_tick_behavior(MissedTickBehavior::Delay);
    drains.tick().await;
    let progress = std::io::stderr().is_terminal();
    let mut recorded = ResolvedInterval::default();
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            result = collector.capture_new_processes() => result?,
            _ = drains.tick() => {
                recorded.merge(collector.drain()?);
                if progress {
                    let samples: u64 = recorded.samples.iter().map(|s| s.count).sum();
                    eprint!("\rrecording: {:.0}s / {:.0}s, {samples} samples ", started.elapsed().as_secs_f64(), args.duration.as_secs_f64());
                }
            }
            _ = sleep_until(deadline) => break,
            _ = &mut shutdown => {
                tracing::info!("interrupted: writing what was recorded so far");
                break;
            }
        }
    }
    recorded.merge(collector.drain()?);
    drop(collector); // detaches the programs
    if progress {
        eprintln!();
    }
    report_losses(&recorded);
    let outputs = Outputs { pprof: Some(args.output), folded: args.folded, flamegraph: args.flamegraph };
    let written = pipeline.process(recorded, outputs)?;
    pipeline.finish();
    eprintln!(
        "recorded {} samples from {} processes in {:.1}s: {}",
        written.samples,
        written.processes,
        started.elapsed().as_secs_f64(),
        written.files.join(", ")
    );
    Ok(())
}
