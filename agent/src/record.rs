//! `ember-agent record`: profile for a fixed time, write one profile per kind (and its views).
//! Wires the same stages as `run`, draining every second into one interval.
use std::{io::IsTerminal, path::PathBuf, time::Duration};

use anyhow::Result;
use tokio::time::{sleep_until, Instant};

use crate::{
    drain_schedule::DrainSchedule,
    encode::ProfileKind,
    kernel::preflight,
    ops::losses,
    pipeline::Pipeline,
    resolve::{relabel::Relabeler, ResolvedInterval, Resolver, Targets},
    settings::RecordSettings,
    ship::files::{self, FileOutputs},
    symbolize,
    shutdown_signal,
};

/// Kernel buffers are drained this often during a recording, so a long recording needs no
/// more map space than a short one.
const DRAIN_EVERY: Duration = Duration::from_secs(1);

pub async fn record(settings: RecordSettings) -> Result<()> {
    preflight::check()?;
    let kernel = &settings.kernel;
    let debuginfod = symbolize::start_debuginfod(&settings.symbols);
    let prefetch = debuginfod.clone().map(|d| symbolize::prefetcher(&settings.symbols, d));
    let mut resolver = Resolver::start(kernel, Targets::new(None, Relabeler::default()), prefetch)?;
    let pipeline = Pipeline::spawn(kernel.event, None, settings.symbols.clone(), debuginfod.clone());
    tracing::info!(frequency = kernel.frequency, event = kernel.event.name(), duration = ?settings.duration, "profiling every CPU");
    let started = Instant::now();
    let deadline = started + settings.duration;
    let mut drains = DrainSchedule::new(DRAIN_EVERY.min(settings.duration));
    let progress = std::io::stderr().is_terminal();
    let mut recorded = ResolvedInterval::default();
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let due = drains.next(resolver.sampler().ticks());
        tokio::select! {
            result = resolver.capture_new_processes() => result?,
            _ = sleep_until(due) => {
                recorded.merge(resolver.drain()?);
                drains.drained();
                if progress {
                    let events: u64 = recorded.samples.iter().map(|s| s.value.count).sum();
                    eprint!("\rrecording: {:.0}s / {:.0}s, {events} events ", started.elapsed().as_secs_f64(), settings.duration.as_secs_f64());
                }
            }
            _ = sleep_until(deadline) => break,
            _ = &mut shutdown => {
                tracing::info!("interrupted: writing what was recorded so far");
                break;
            }
        }
    }
    // Detached first, so that the last drain holds every event the programs counted.
    resolver.stop_programs();
    recorded.merge(resolver.drain()?);
    drop(resolver);
    if progress {
        eprintln!();
    }
    // Debug info still on its way is waited for (each fetch is bounded by its timeout), so that
    // the profile is named with it.
    if let (Some(debuginfod), Some(fetch)) = (&debuginfod, &settings.symbols.debuginfod) {
        let waiting = debuginfod.in_flight();
        if waiting > 0 {
            tracing::info!(fetches = waiting, timeout = ?fetch.timeout, "waiting for debug info from debuginfod before writing");
            debuginfod.wait_for_fetches(fetch.timeout);
        }
    }
    losses::report(recorded.losses());
    let several = settings.kinds.len() > 1;
    let path = |path: &Option<PathBuf>, kind: ProfileKind| {
        path.as_ref().map(|p| if several { files::with_kind(p, kind.name()) } else { p.clone() })
    };
    let plan = settings
        .kinds
        .iter()
        .map(|&kind| {
            let outputs = FileOutputs {
                pprof: path(&settings.files.pprof, kind),
                folded: path(&settings.files.folded, kind),
                flamegraph: path(&settings.files.flamegraph, kind),
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
