//! `ember-agent run`: the continuous profiler. Wires the stages together: starts the sinks, the
//! status server and the pod watch, loads the programs, then every interval drains and
//! resolves the kernel's buffers and hands the interval to the pipeline. On SIGINT/SIGTERM the
//! partial interval is flushed and shipped.
use anyhow::{Context as _, Result};
use tokio::time::sleep_until;

use crate::{
    drain_schedule::DrainSchedule,
    governor::{self, Governor},
    kernel::preflight,
    ops::{losses, status},
    pipeline::Pipeline,
    resolve::{pods, Resolver, Targets},
    settings::RunSettings,
    ship::{self, files::FileOutputs},
    symbolize,
    shutdown_signal,
};

pub async fn run(settings: RunSettings) -> Result<()> {
    preflight::check()?;
    if let Some((dir, _)) = &settings.files {
        std::fs::create_dir_all(dir).with_context(|| format!("creating output directory {}", dir.display()))?;
    }
    let (stop_tasks, tasks_stopped) = tokio::sync::watch::channel(false);
    let until_stopped = move || {
        let mut stopped = tasks_stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let (shipping, mut tasks) = match &settings.ship {
        Some(ship) => ship::start(ship, &until_stopped).map(|(shipping, tasks)| (Some(shipping), tasks))?,
        None => (None, vec![]),
    };
    let health = status::Health::new(settings.interval);
    if let Some(address) = settings.http {
        // Up before the programs load, so probes see "live, not ready" meanwhile.
        let listener = status::bind(address).await?;
        tasks.push(tokio::spawn(status::serve(listener, health.clone(), until_stopped())));
    }
    let pods = match &settings.pods {
        Some(pod_settings) => pods::start(pod_settings, until_stopped())?.map(|(pods, task)| {
            tasks.push(task);
            pods
        }),
        None => None,
    };
    let debuginfod = symbolize::start_debuginfod(&settings.symbols);
    let prefetch = debuginfod.clone().map(|d| symbolize::prefetcher(&settings.symbols, d));
    // Loading takes a second or more (tables of every running process): off this thread, so
    // that the status server answers meanwhile, on one that ends when it is done (a
    // blocking-pool thread would idle on for seconds).
    let (kernel, targets) = (settings.kernel.clone(), Targets::new(pods, settings.relabel));
    let (runtime, (loaded, loading)) = (tokio::runtime::Handle::current(), tokio::sync::oneshot::channel());
    std::thread::Builder::new()
        .name("ember-load".into())
        .spawn(move || {
            let _runtime = runtime.enter(); // the ring buffer registers with it
            let _ = loaded.send(Resolver::start(&kernel, targets, prefetch));
        })
        .context("starting the loading thread")?;
    let mut resolver = loading.await.context("loading the programs: the thread died")??;
    let mut governor = settings.cpu_budget.map(|budget| Governor::start(budget, resolver.sampler(), settings.kernel.event.is_clock()));
    governor::publish(resolver.sampler().rates());
    health.set_ready();
    let pipeline = Pipeline::spawn(settings.kernel.event, shipping, settings.symbols.clone(), debuginfod);
    let names: Vec<&str> = settings.kinds.iter().map(|k| k.name()).collect();
    tracing::info!(
        frequency = settings.kernel.frequency, event = settings.kernel.event.name(), interval = ?settings.interval,
        files = ?settings.files.as_ref().map(|(dir, _)| dir), profiles = ?names,
        cpu_budget = ?settings.cpu_budget.map(|b| format!("{}%", b * 100.0)), "profiling every CPU"
    );
    let mut drains = DrainSchedule::new(settings.interval);
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let mut stopping = false;
    while !stopping {
        let due = drains.next(resolver.sampler().ticks());
        tokio::select! {
            result = resolver.capture_new_processes() => { result?; continue; }
            _ = sleep_until(due) => {}
            _ = &mut shutdown => {
                tracing::info!("stopping: flushing the partial interval");
                resolver.stop_programs();
                stopping = true;
            }
        }
        let mut interval = resolver.drain()?;
        drains.drained();
        if let Some(governor) = governor.as_mut() {
            governor.govern(resolver.sampler(), &mut interval)?;
        }
        health.tick();
        losses::report(interval.losses());
        let start = interval.start.unwrap_or_else(std::time::SystemTime::now);
        let outputs = |kind: &str| match &settings.files {
            Some((dir, flamegraphs)) => FileOutputs::in_dir(dir, kind, start, *flamegraphs),
            None => FileOutputs::default(),
        };
        pipeline.submit(interval, settings.kinds.iter().map(|kind| (*kind, outputs(kind.name()))).collect());
    }
    drop(resolver);
    // The last interval reaches the spool before the pusher's final attempt.
    pipeline.finish();
    let _ = stop_tasks.send(true);
    for task in tasks {
        task.await.context("shipping task failed")??;
    }
    Ok(())
}
