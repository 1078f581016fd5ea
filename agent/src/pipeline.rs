//! The pipeline thread: symbolize -> encode -> write, one interval at a time. It owns the
//! (!Send) blazesym symbolizer and its caches, so the tokio side never waits on symbolization.
use std::{
    collections::HashSet,
    sync::mpsc::{self, Sender},
    thread::JoinHandle,
};

use anyhow::{Context as _, Result};

use crate::{
    output::{write_atomic, Outputs},
    pprof::{self, ProfileInfo},
    profiles::ProfileKind,
    resolve::ResolvedInterval,
    symbolize::Symbolizer,
    views,
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
pub type Plan = Vec<(ProfileKind, Outputs)>;

struct Job {
    interval: ResolvedInterval,
    plan: Plan,
    done: Option<mpsc::Sender<Result<Vec<Written>>>>,
}

pub struct Pipeline {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Pipeline {
    pub fn spawn(event: &'static str, frequency: u64) -> Pipeline {
        let (jobs, queue) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("ember-pipeline".into())
            .spawn(move || {
                let mut symbolizer = Symbolizer::new();
                let info = ProfileInfo { event, frequency };
                for job in queue {
                    let result = process(&mut symbolizer, &info, &job.interval, &job.plan);
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
                            // The interval is lost only if it cannot be written at all: say so loudly.
                            Err(e) => tracing::error!("profile of this interval could not be written: {e:#}"),
                        },
                    }
                }
            })
            .expect("spawning the pipeline thread");
        Pipeline { jobs: Some(jobs), thread: Some(thread) }
    }

    /// Queues an interval; the daemon does not wait for it.
    pub fn submit(&self, interval: ResolvedInterval, plan: Plan) {
        let job = Job { interval, plan, done: None };
        self.jobs.as_ref().expect("pipeline open").send(job).expect("pipeline thread alive");
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

fn process(symbolizer: &mut Symbolizer, info: &ProfileInfo, interval: &ResolvedInterval, plan: &Plan) -> Result<Vec<Written>> {
    symbolizer.prepare(interval);
    plan.iter().map(|(kind, outputs)| write_profile(symbolizer, info, interval, *kind, outputs)).collect()
}

fn write_profile(
    symbolizer: &Symbolizer,
    info: &ProfileInfo,
    interval: &ResolvedInterval,
    kind: ProfileKind,
    outputs: &Outputs,
) -> Result<Written> {
    let profile = pprof::build(interval, symbolizer, info, kind);
    let mut written = Written {
        kind,
        events: profile.sample.iter().map(|s| s.value[0] as u64).sum(),
        processes: interval.samples.iter().filter(|s| kind.includes(s.kind)).map(|s| s.tgid).collect::<HashSet<_>>().len(),
        files: Vec::new(),
    };
    if let Some(path) = &outputs.pprof {
        write_atomic(path, &pprof::encode_gzip(&profile))?;
        written.files.push(path.display().to_string());
    }
    if outputs.folded.is_some() || outputs.flamegraph.is_some() {
        let folded = views::folded(&profile, kind.flame_value(), kind.root_labels());
        if let Some(path) = &outputs.folded {
            write_atomic(path, (folded.join("\n") + "\n").as_bytes())?;
            written.files.push(path.display().to_string());
        }
        if let Some(path) = &outputs.flamegraph {
            let title = format!("Ember {} profile", kind.name());
            let (_, unit) = kind.sample_types()[kind.flame_value()];
            write_atomic(path, &views::flamegraph(&folded, &title, unit)?)?;
            written.files.push(path.display().to_string());
        }
    }
    Ok(written)
}
