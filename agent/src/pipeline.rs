//! The pipeline thread: the stages after resolve, symbolize -> encode -> ship, one interval at
//! a time. It owns the (!Send) blazesym symbolizer and its caches, so the tokio side never
//! waits on symbolization. `run` and `record` feed it.
use std::{
    collections::HashSet,
    sync::mpsc::{self, SyncSender, TrySendError},
    thread::JoinHandle,
};

use anyhow::{Context as _, Result};

use crate::{
    encode::{
        pprof::{self, ProfileInfo},
        ProfileKind,
    },
    kernel::Event,
    ops::{memory, metrics},
    resolve::ResolvedInterval,
    ship::{
        files::{write_atomic, FileOutputs},
        Shipping,
    },
    symbolize::{Debuginfod, SymbolSettings, Symbolizer},
};

/// What one written profile holds.
#[derive(Debug, Clone)]
pub struct Written {
    pub kind: ProfileKind,
    /// Sum of the first sample value (samples, switches, packets...).
    pub events: u64,
    pub processes: usize,
    pub files: Vec<String>,
}

/// The profiles to make of an interval, and where each goes.
pub type Plan = Vec<(ProfileKind, FileOutputs)>;

struct Job {
    interval: ResolvedInterval,
    plan: Plan,
    done: Option<mpsc::Sender<Result<Vec<Written>>>>,
}

/// Intervals that may wait for the pipeline thread. When symbolizing falls this far behind
/// (a huge binary, a slow disk), newer intervals are shed, and counted, rather than held in
/// memory without bound.
const QUEUE: usize = 2;

pub struct Pipeline {
    jobs: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Pipeline {
    pub fn spawn(event: Event, shipping: Option<Shipping>, symbols: SymbolSettings, debuginfod: Option<Debuginfod>) -> Pipeline {
        let (jobs, queue) = mpsc::sync_channel::<Job>(QUEUE);
        let thread = std::thread::Builder::new()
            .name("ember-pipeline".into())
            .spawn(move || {
                let mut symbolizer = Symbolizer::new(&symbols, debuginfod);
                let info = ProfileInfo { event };
                for job in queue {
                    let result = process(&mut symbolizer, &info, &job.interval, &job.plan, shipping.as_ref());
                    // Each kind's pipeline has its own symbolizer: all add to the same counters.
                    metrics::add("ember_symbol_cache_hits_total", &[], std::mem::take(&mut symbolizer.hits) as f64);
                    metrics::add("ember_symbol_cache_misses_total", &[], std::mem::take(&mut symbolizer.misses) as f64);
                    // Give back what symbolizing and encoding touched: the agent's RSS would
                    // stay at its busiest interval's otherwise.
                    memory::give_back();
                    match job.done {
                        Some(done) => {
                            let _ = done.send(result);
                        }
                        None => match result {
                            Ok(written) => {
                                for w in written {
                                    tracing::info!(kind = w.kind.name(), events = w.events, files = ?w.files, "profile written");
                                }
                            }
                            // The interval is lost only if it cannot be written at all: say so
                            // loudly, and count it.
                            Err(e) => {
                                tracing::error!("profile of this interval could not be written: {e:#}");
                                metrics::add("ember_lost_total", &[("reason", "interval_failed")], 1.0);
                            }
                        },
                    }
                }
            })
            .expect("spawning the pipeline thread");
        Pipeline { jobs: Some(jobs), thread: Some(thread) }
    }

    /// Queues an interval; the daemon does not wait for it. If the queue is full, the
    /// interval is shed, and counted.
    pub fn submit(&self, interval: ResolvedInterval, plan: Plan) {
        let job = Job { interval, plan, done: None };
        match self.jobs.as_ref().expect("pipeline open").try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(job)) => {
                let events: u64 = job.interval.samples.iter().map(|s| s.value.count).sum();
                metrics::add("ember_lost_total", &[("reason", "pipeline_full")], 1.0);
                tracing::error!(events, "symbolizing is {QUEUE} intervals behind: this interval's profile is dropped");
            }
            Err(TrySendError::Disconnected(_)) => panic!("the pipeline thread died"),
        }
    }

    /// Processes an interval and waits for its files.
    pub fn process(&self, interval: ResolvedInterval, plan: Plan) -> Result<Vec<Written>> {
        let (done, result) = mpsc::channel();
        let job = Job { interval, plan, done: Some(done) };
        self.jobs.as_ref().expect("pipeline open").send(job).expect("pipeline thread alive");
        result.recv().context("pipeline thread died")?
    }

    /// Finishes queued intervals, then stops the thread.
    pub fn finish(mut self) {
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn process(
    symbolizer: &mut Symbolizer,
    info: &ProfileInfo,
    interval: &ResolvedInterval,
    plan: &Plan,
    shipping: Option<&Shipping>,
) -> Result<Vec<Written>> {
    symbolizer.prepare(interval);
    plan.iter().map(|(kind, outputs)| write_profile(symbolizer, info, interval, *kind, outputs, shipping)).collect()
}

fn write_profile(
    symbolizer: &Symbolizer,
    info: &ProfileInfo,
    interval: &ResolvedInterval,
    kind: ProfileKind,
    outputs: &FileOutputs,
    shipping: Option<&Shipping>,
) -> Result<Written> {
    let profile = pprof::build(interval, symbolizer, info, kind);
    let mut written = Written {
        kind,
        events: profile.sample.iter().map(|s| s.value[0] as u64).sum(),
        processes: interval.samples.iter().filter(|s| kind.includes(s.kind)).map(|s| s.tgid).collect::<HashSet<_>>().len(),
        files: Vec::new(),
    };
    let gzip = ember_pprof::encode_gzip(&profile);
    if let Some(shipping) = shipping {
        let spooled = ember_proto::ember::Profile {
            sequence: 0,
            kind: kind.name().to_string(),
            start_unix_nanos: profile.time_nanos,
            end_unix_nanos: profile.time_nanos + profile.duration_nanos,
            labels: shipping.labels.clone(),
            pprof_gzip: gzip.clone(),
        };
        for spool in &shipping.spools {
            let sequence = spool.append(spooled.clone())?;
            written.files.push(format!("spool {} #{sequence}", spool.sink()));
        }
    }
    if let Some(path) = &outputs.pprof {
        write_atomic(path, &gzip)?;
        written.files.push(path.display().to_string());
    }
    if outputs.folded.is_some() || outputs.flamegraph.is_some() {
        let view = ember_pprof::view(kind.name());
        let folded = view.folded(&profile)?;
        if let Some(path) = &outputs.folded {
            write_atomic(path, (folded.join("\n") + "\n").as_bytes())?;
            written.files.push(path.display().to_string());
        }
        if let Some(path) = &outputs.flamegraph {
            let title = format!("Ember {} profile", kind.name());
            write_atomic(path, &ember_pprof::flamegraph(&folded, &title, view.unit(&profile))?)?;
            written.files.push(path.display().to_string());
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shed() -> f64 {
        metrics::value("ember_lost_total", &[("reason", "pipeline_full")])
    }

    #[test]
    fn intervals_beyond_the_queue_are_shed_and_counted() {
        let pipeline = Pipeline::spawn(crate::kernel::Event::CpuClock, None, SymbolSettings::default(), None);
        let before = shed();
        // Far faster than the thread takes them (each also returns memory to the kernel).
        for _ in 0..1000 {
            pipeline.submit(ResolvedInterval::default(), Vec::new());
        }
        let shed = shed() - before;
        pipeline.finish();
        assert!((1.0..=(1000 - QUEUE) as f64).contains(&shed), "{shed} of 1000 intervals shed");
    }
}
