//! `ember-agent run`: the continuous profiler. Every interval it drains the kernel's buffers
//! and hands the interval to the pipeline; on SIGINT/SIGTERM the partial interval is flushed.
use std::{path::PathBuf, sync::Arc};

use agent_common::{block_state, counter, kind};
use anyhow::{Context as _, Result};
use clap::Args;
use ember_proto::ember::AgentIdentity;
use tokio::{
    signal::unix::{signal, SignalKind},
    time::{interval_at, Instant, MissedTickBehavior},
};

use crate::{
    cgroups,
    collect::Collector,
    config::{self, parse_duration, FileConfig},
    output::Outputs,
    pipeline::{Pipeline, Shipping},
    profiles::ProfileKind,
    push::Pusher,
    serve,
    resolve::ResolvedInterval,
    sampler::{Event, NetEvent, OffCpuOptions, SamplerOptions},
    spool::Spool,
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
    /// Push profiles to this collector (e.g. http://127.0.0.1:7070); local files are then
    /// written only if --output-dir is given.
    #[arg(long)]
    push: Option<String>,
    /// Where profiles wait until the collector has them [default: ./ember-spool].
    #[arg(long)]
    spool_dir: Option<PathBuf>,
    /// Spool size limit in MiB; past it the oldest profiles are dropped [default: 256].
    #[arg(long)]
    spool_max_mib: Option<u64>,
    /// This agent's identity at the collector [default: the host name].
    #[arg(long)]
    agent_id: Option<String>,
    /// File holding the bearer token the collector requires.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// TLS: the CA (PEM) that signed the collector's certificate (with an https:// --push).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Mutual TLS: this agent's certificate (PEM) ...
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// ... and its private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// TLS: the name to expect in the collector's certificate [default: the URL's host].
    #[arg(long)]
    tls_domain: Option<String>,
    /// Push plaintext (http://) to a collector that is not on this host.
    #[arg(long)]
    plaintext: bool,
    /// Pull mode: serve profiles to collectors on this gRPC address (e.g. 0.0.0.0:7072).
    #[arg(long)]
    serve: Option<std::net::SocketAddr>,
    /// Pull mode: how many of the newest profiles to keep for collectors [default: 360].
    #[arg(long)]
    keep: Option<usize>,
    #[command(flatten)]
    sampling: SamplingArgs,
}

pub fn sampler_options(args: &SamplingArgs, file: &FileConfig, default_frequency: u64) -> Result<SamplerOptions> {
    let frequency = args.frequency.or(file.frequency).unwrap_or(default_frequency);
    anyhow::ensure!((1..=100_000).contains(&frequency), "frequency {frequency} Hz is out of range (1-100000)");
    let cgroup = args.cgroup.clone().or(file.cgroup.clone());
    let pick = |flag: &Vec<String>, file: &Option<Vec<String>>| {
        if flag.is_empty() { file.clone().unwrap_or_default() } else { flag.clone() }
    };
    let mut events = pick(&args.events, &file.events);
    if events.is_empty() {
        events.push("cpu".into());
    }
    if let Some(unknown) = events.iter().find(|e| !["cpu", "offcpu", "net"].contains(&e.as_str())) {
        anyhow::bail!("unknown event group {unknown:?}: use cpu, offcpu or net");
    }
    let has = |group: &str| events.iter().any(|e| e == group);
    let off_cpu = has("offcpu").then(|| off_cpu_options(args, file)).transpose()?;
    let mut net_names = pick(&args.net_events, &file.net_events);
    if net_names.is_empty() && has("net") {
        net_names = NetEvent::DEFAULT.iter().map(|s| s.to_string()).collect();
    }
    anyhow::ensure!(net_names.is_empty() || has("net"), "network events were chosen but the net group is off: add --events net");
    let mut net = Vec::new();
    for name in &net_names {
        let event = NetEvent::parse(name)?;
        if !net.contains(&event) {
            net.push(event);
        }
    }
    Ok(SamplerOptions {
        cpu: has("cpu"),
        event: args.event.or(file.event).unwrap_or(Event::CpuClock),
        frequency,
        off_cpu,
        net,
        max_keys: args.max_keys.or(file.max_keys).unwrap_or(config::DEFAULT_MAX_KEYS),
        max_stacks: args.max_stacks.or(file.max_stacks).unwrap_or(config::DEFAULT_MAX_STACKS),
        pids: if args.pids.is_empty() { file.pids.clone().unwrap_or_default() } else { args.pids.clone() },
        cgroup_id: cgroup.as_deref().map(cgroups::cgroup_id).transpose()?,
    })
}

fn off_cpu_options(args: &SamplingArgs, file: &FileConfig) -> Result<OffCpuOptions> {
    let duration_ns = |flag: &Option<String>, file: &Option<String>| -> Result<Option<u64>> {
        flag.clone().or(file.clone()).map(|d| parse_duration(&d).map(|d| d.as_nanos() as u64)).transpose()
    };
    let states = if args.offcpu_states.is_empty() { file.offcpu_states.clone().unwrap_or_default() } else { args.offcpu_states.clone() };
    let mut bits = 0;
    for state in &states {
        bits |= match state.as_str() {
            "sleeping" => block_state::SLEEPING,
            "uninterruptible" => block_state::UNINTERRUPTIBLE,
            "preempted" => block_state::PREEMPTED,
            other => anyhow::bail!("unknown off-CPU state {other:?}: use sleeping, uninterruptible or preempted"),
        };
    }
    let ratio = args.offcpu_sample_ratio.or(file.offcpu_sample_ratio).unwrap_or(1);
    anyhow::ensure!(ratio >= 1, "offcpu_sample_ratio must be at least 1");
    Ok(OffCpuOptions {
        states: if bits == 0 { block_state::SLEEPING | block_state::UNINTERRUPTIBLE | block_state::PREEMPTED } else { bits },
        min_block_ns: duration_ns(&args.offcpu_min_block, &file.offcpu_min_block)?.unwrap_or(0),
        max_block_ns: duration_ns(&args.offcpu_max_block, &file.offcpu_max_block)?.unwrap_or(u64::MAX),
        ratio,
    })
}

/// The profiles the chosen events make, in a fixed order.
pub fn profile_kinds(options: &SamplerOptions) -> Vec<ProfileKind> {
    let net_has = |kinds: &[u8]| options.net.iter().any(|e| kinds.contains(&e.kind()));
    ProfileKind::ALL
        .into_iter()
        .filter(|kind| match kind {
            ProfileKind::Cpu => options.cpu,
            ProfileKind::OffCpu => options.off_cpu.is_some(),
            ProfileKind::Wall => options.cpu && options.off_cpu.is_some(),
            ProfileKind::NetTx => net_has(&[kind::NET_DEV_QUEUE, kind::NET_DEV_XMIT]),
            ProfileKind::NetRx => net_has(&[kind::NETIF_RECEIVE_SKB, kind::NAPI_GRO_RECEIVE_ENTRY]),
            ProfileKind::NetRetransmit => net_has(&[kind::TCP_RETRANSMIT_SKB]),
            ProfileKind::NetDrop => net_has(&[kind::KFREE_SKB]),
        })
        .collect()
}

/// TLS for pushing to an https:// collector; plaintext only to this host or when asked for.
fn client_tls(args: &RunArgs, url: &str) -> Result<Option<tonic::transport::ClientTlsConfig>> {
    let read = |path: &PathBuf| std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    if url.starts_with("https://") {
        let ca = args.tls_ca.as_ref().context("pushing over https:// needs --tls-ca (the CA that signed the collector)")?;
        let mut tls = tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(read(ca)?));
        if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
            tls = tls.identity(tonic::transport::Identity::from_pem(read(cert)?, read(key)?));
        }
        if let Some(domain) = &args.tls_domain {
            tls = tls.domain_name(domain.clone());
        }
        return Ok(Some(tls));
    }
    let host = url.trim_start_matches("http://").split([':', '/']).next().unwrap_or_default();
    let local = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    anyhow::ensure!(
        local || args.plaintext,
        "refusing to push plaintext to {url}: use https:// with --tls-ca, or --plaintext to accept it"
    );
    Ok(None)
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
    if lost(counter::OFF_CPU_TABLE_FULL) > 0 {
        tracing::warn!(lost = lost(counter::OFF_CPU_TABLE_FULL), "off-CPU blocks not tracked: blocked-thread table full");
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
    let push = args.push.clone().or(file.push.clone());
    let serve = args.serve.or(file.serve);
    anyhow::ensure!(
        push.is_none() || serve.is_none(),
        "choose push (--push) or pull (--serve), not both: a pusher deletes what pullers still need"
    );
    // Agents that ship profiles keep local files only when asked to.
    let dir = args.output_dir.clone().or(file.output_dir.clone());
    let dir = if push.is_none() && serve.is_none() { Some(dir.unwrap_or_else(crate::default_output_dir)) } else { dir };
    let flamegraphs = args.flamegraphs || file.flamegraphs.unwrap_or(false);
    let options = sampler_options(&args.sampling, &file, config::DEFAULT_DAEMON_FREQUENCY)?;
    crate::preflight::check()?;
    if let Some(dir) = &dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating output directory {}", dir.display()))?;
    }
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
    let (stop_shipping, shipping_stopped) = tokio::sync::watch::channel(false);
    let until_stopped = move || {
        let mut stopped = shipping_stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let mut shipping = None;
    let mut shipper = None;
    if push.is_some() || serve.is_some() {
        let spool_dir = args.spool_dir.clone().or(file.spool_dir.clone()).unwrap_or_else(|| PathBuf::from("ember-spool"));
        let max_mib = args.spool_max_mib.or(file.spool_max_mib).unwrap_or(256);
        let keep = if serve.is_some() { args.keep.or(file.keep).unwrap_or(360) } else { usize::MAX };
        let spool = Arc::new(Spool::open(&spool_dir, max_mib << 20, keep)?);
        let agent = AgentIdentity {
            agent_id: args.agent_id.clone().or(file.agent_id.clone()).unwrap_or_else(|| hostname.clone()),
            hostname: hostname.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        };
        let mut labels = file.labels.clone().unwrap_or_default();
        labels.entry("host".into()).or_insert_with(|| hostname.clone());
        shipper = Some(match (&push, serve) {
            (Some(url), _) => {
                let token = match args.token_file.clone().or(file.token_file.clone()) {
                    Some(path) => {
                        let token = std::fs::read_to_string(&path).with_context(|| format!("reading token file {}", path.display()))?;
                        Some(token.trim().to_string())
                    }
                    None => None,
                };
                let pusher = Pusher::new(url, spool.clone(), agent, token.as_deref(), client_tls(&args, url)?)?;
                tokio::spawn(async move {
                    pusher.run(until_stopped()).await;
                    Ok(())
                })
            }
            (None, Some(address)) => tokio::spawn(serve::serve(address, spool.clone(), agent, until_stopped())),
            (None, None) => unreachable!("checked above"),
        });
        shipping = Some(Shipping { spool, labels });
    }

    let mut collector = Collector::start(&options)?;
    let pipeline = Pipeline::spawn(options.event.name(), options.frequency, shipping);
    let kinds = profile_kinds(&options);
    let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    tracing::info!(
        frequency = options.frequency, event = options.event.name(), interval = ?every, dir = ?dir, push = ?push, serve = ?serve,
        profiles = ?names, "profiling every CPU"
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
        let start = interval.start.unwrap_or_else(std::time::SystemTime::now);
        let outputs = |kind: &ProfileKind| match &dir {
            Some(dir) => Outputs::in_dir(dir, kind.name(), start, flamegraphs),
            None => Outputs::default(),
        };
        pipeline.submit(interval, kinds.iter().map(|kind| (*kind, outputs(kind))).collect());
    }
    drop(collector);
    // The last interval reaches the spool before the pusher's final attempt.
    pipeline.finish();
    if let Some(shipper) = shipper {
        let _ = stop_shipping.send(true);
        shipper.await.context("shipping task failed")??;
    }
    Ok(())
}
