//! `ember-agent record`: profile for a fixed time, write one profile (and its views).
use std::{io::IsTerminal, path::PathBuf, time::Duration};

use anyhow::Result;
use clap::Args;
use tokio::time::{interval, sleep_until, Instant, MissedTickBehavior};

use crate::{
    collect::Collector,
    config::{self, parse_duration},
    daemon::{profile_kinds, report_losses, sampler_options, shutdown_signal},
    output::{self, Outputs},
    pipeline::Pipeline,
    profiles::ProfileKind,
    relabel::Relabeler,
    resolve::ResolvedInterval,
    targets::Targets,
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
    let mut collector = Collector::start(&options, Targets::new(None, Relabeler::default()))?;
    let pipeline = Pipeline::spawn(options.event.name(), options.frequency, None);
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
                    let events: u64 = recorded.samples.iter().map(|s| s.value.count).sum();
                    eprint!("\rrecording: {:.0}s / {:.0}s, {events} events ", started.elapsed().as_secs_f64(), args.duration.as_secs_f64());
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
    let kinds = profile_kinds(&options);
    let several = kinds.len() > 1;
    let path = |path: &Option<PathBuf>, kind: ProfileKind| {
        path.as_ref().map(|p| if several { output::with_kind(p, kind.name()) } else { p.clone() })
    };
    let plan = kinds
        .iter()
        .map(|&kind| {
            let outputs = Outputs {
                pprof: path(&Some(args.output.clone()), kind),
                folded: path(&args.folded, kind),
                flamegraph: path(&args.flamegraph, kind),
            };
            (kind, outputs)
        })
        .collect();
    let written = pipeline.process(recorded, plan)?;
    pipeline.finish();
    for w in written {
        let (unit, _) = w.kind.sample_types()[0];
        eprintln!(
            "{}: {} {unit} from {} processes in {:.1}s: {}",
            w.kind.name(),
            w.events,
            w.processes,
            started.elapsed().as_secs_f64(),
            w.files.join(", ")
        );
    }
    Ok(())
}
