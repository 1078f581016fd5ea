//! The pipeline thread: symbolize -> encode -> write, one interval at a time. It owns the
//! (!Send) blazesym symbolizer and its caches, so the tokio side never waits on symbolization.
use std::{
    sync::mpsc::{self, Sender},
    thread::JoinHandle,
};

use anyhow::{Context as _, Result};

use crate::{
    output::{write_atomic, Outputs},
    pprof::{self, ProfileInfo},
    resolve::ResolvedInterval,
    symbolize::Symbolizer,
    views,
};

/// What one written profile holds.
#[derive(Debug, Clone, Default)]
pub struct Written {
    pub samples: u64,
    pub processes: usize,
    pub files: Vec<String>,
}

struct Job {
    interval: ResolvedInterval,
    outputs: Outputs,
    done: Option<mpsc::Sender<Result<Written>>>,
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
                    let result = process(&mut symbolizer, &info, &job.interval, &job.outputs);
                    match job.done {
                        Some(done) => {
                            let _ = done.send(result);
                        }
                        None => match result {
                            Ok(written) => tracing::info!(samples = written.samples, files = ?written.files, "profile written"),
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
    pub fn submit(&self, interval: ResolvedInterval, outputs: Outputs) {
        let job = Job { interval, outputs, done: None };
        self.jobs.as_ref().expect("pipeline open").send(job).expect("pipeline thread alive");
    }

    /// Processes an interval and waits for its files.
    pub fn process(&self, interval: ResolvedInterval, outputs: Outputs) -> Result<Written> {
        let (done, result) = mpsc::channel();
        let job = Job { interval, outputs, done: Some(done) };
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

fn process(symbolizer: &mut Symbolizer, info: &ProfileInfo, interval: &ResolvedInterval, outputs: &Outputs) -> Result<Written> {
    symbolizer.prepare(interval);
    let profile = pprof::build(interval, symbolizer, info);
    let mut written = Written {
        samples: profile.sample.iter().map(|s| s.value[0] as u64).sum(),
        processes: interval.samples.iter().map(|s| s.tgid).collect::<std::collections::HashSet<_>>().len(),
        files: Vec::new(),
    };
    if let Some(path) = &outputs.pprof {
        write_atomic(path, &pprof::encode_gzip(&profile))?;
        written.files.push(path.display().to_string());
    }
    if outputs.folded.is_some() || outputs.flamegraph.is_some() {
        let folded = views::folded(&profile, 0);
        if let Some(path) = &outputs.folded {
            write_atomic(path, (folded.join("\n") + "\n").as_bytes())?;
            written.files.push(path.display().to_string());
        }
        if let Some(path) = &outputs.flamegraph {
            let title = format!("Ember on-CPU ({}, {} Hz)", info.event, info.frequency);
            write_atomic(path, &views::flamegraph(&folded, &title, "samples")?)?;
            written.files.push(path.display().to_string());
        }
    }
    Ok(written)
}
