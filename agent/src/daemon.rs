//! `ember-agent run`: the continuous profiler. Every interval it drains the kernel's buffers
//! and hands the interval to the pipeline; on SIGINT/SIGTERM the partial interval is flushed.
use std::{path::PathBuf, sync::Arc};

use agent_common::{block_state, counter, kind};
use anyhow::{Context as _, Result};
use clap::Args;
use ember_proto::{
    ember::AgentIdentity,
    security::{self, ClientSecurity, ServerSecurity},
};
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
    otlp::Otlp,
    pods::{self, Pods},
    metrics,
    pprof::COUNTER_NAMES,
    push::{self, Shipper},
    relabel::Relabeler,
    status::{self, Health},
    targets::Targets,
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
    /// Bearer token file: sent with pushes; with --serve, required of pullers.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// TLS CA (PEM). Push: the CA that signed the collector's certificate (for an https://
    /// --push). Serve: collectors must present a certificate it signed (mutual TLS).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// This agent's certificate (PEM): its client identity for mutual TLS when pushing, its
    /// server identity when serving ...
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// ... and its private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Push: the name to expect in the collector's certificate [default: the URL's host].
    #[arg(long)]
    tls_domain: Option<String>,
    /// Push plaintext (http://) to a collector on another host, or serve plaintext on a
    /// non-loopback address (both are refused without it).
    #[arg(long)]
    plaintext: bool,
    /// Also export profiles over OTLP (gRPC) to this OpenTelemetry profiles receiver (e.g.
    /// http://127.0.0.1:4317), from its own spool.
    #[arg(long)]
    otlp: Option<String>,
    /// A header on every OTLP export, name=value (repeat for several), e.g. a tenant id.
    #[arg(long)]
    otlp_header: Vec<String>,
    /// Serve /healthz, /readyz and /metrics (Prometheus) over HTTP on this address (e.g.
    /// 0.0.0.0:7073).
    #[arg(long)]
    http: Option<std::net::SocketAddr>,
    /// Pull mode: serve profiles to collectors on this gRPC address (e.g. 0.0.0.0:7072).
    #[arg(long)]
    serve: Option<std::net::SocketAddr>,
    /// Pull mode: how many of the newest profiles to keep for collectors [default: 360].
    #[arg(long)]
    keep: Option<usize>,
    /// Pod name, namespace, container name and pod labels from Kubernetes: auto (in-cluster
    /// when running in a pod), off, in-cluster, or an API server URL that needs no credentials
    /// (e.g. http://127.0.0.1:8001 from kubectl proxy) [default: auto].
    #[arg(long)]
    kubernetes: Option<String>,
    /// This node's name: the `node` label, and whose pods to watch [default: $NODE_NAME].
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
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

/// TLS files and token from flags, else from the config file.
struct Security {
    token: Option<String>,
    ca: Option<PathBuf>,
    identity: Option<(PathBuf, PathBuf)>,
    domain: Option<String>,
    plaintext: bool,
}

impl Security {
    fn new(args: &RunArgs, file: &FileConfig) -> Result<Security> {
        let token_file = args.token_file.clone().or(file.token_file.clone());
        let cert = args.tls_cert.clone().or(file.tls_cert.clone());
        let key = args.tls_key.clone().or(file.tls_key.clone());
        anyhow::ensure!(cert.is_some() == key.is_some(), "TLS needs both tls_cert and tls_key");
        Ok(Security {
            token: token_file.map(|path| security::read_token(&path)).transpose()?,
            ca: args.tls_ca.clone().or(file.tls_ca.clone()),
            identity: cert.zip(key),
            domain: args.tls_domain.clone().or(file.tls_domain.clone()),
            plaintext: args.plaintext || file.plaintext.unwrap_or(false),
        })
    }

    fn client(&self) -> ClientSecurity {
        ClientSecurity { ca: self.ca.clone(), identity: self.identity.clone(), domain: self.domain.clone(), plaintext: self.plaintext }
    }

    fn server(&self) -> ServerSecurity {
        let (cert, key) = self.identity.clone().unzip();
        ServerSecurity { cert, key, client_ca: self.ca.clone(), plaintext: self.plaintext }
    }
}

type Task = tokio::task::JoinHandle<Result<()>>;

/// Starts the sinks profiles leave the agent by: push to a collector or serve to pullers, and
/// OTLP export. Each has its own spool the pipeline writes to.
fn start_shipping<F>(
    args: &RunArgs,
    file: &FileConfig,
    hostname: &str,
    push: Option<&str>,
    serve: Option<std::net::SocketAddr>,
    otlp: Option<&str>,
    until_stopped: &impl Fn() -> F,
) -> Result<(Option<Shipping>, Vec<Task>)>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if push.is_none() && serve.is_none() && otlp.is_none() {
        return Ok((None, vec![]));
    }
    let spool_dir = args.spool_dir.clone().or(file.spool_dir.clone()).unwrap_or_else(|| PathBuf::from("ember-spool"));
    let max_bytes = args.spool_max_mib.or(file.spool_max_mib).unwrap_or(256) << 20;
    let security = Security::new(args, file)?;
    let agent = AgentIdentity {
        agent_id: args.agent_id.clone().or(file.agent_id.clone()).unwrap_or_else(|| hostname.to_string()),
        hostname: hostname.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
    };
    let (mut spools, mut tasks): (Vec<Arc<Spool>>, Vec<Task>) = (vec![], vec![]);
    if let Some(url) = push {
        let spool = Arc::new(Spool::open(&spool_dir, "collector", max_bytes, usize::MAX)?);
        let collector = push::Collector::new(security.client().endpoint(url, "collector")?, agent, security.token.as_deref())?;
        tasks.push(Shipper::new(collector, spool.clone()).spawn(until_stopped()));
        spools.push(spool);
    } else if let Some(address) = serve {
        let keep = args.keep.or(file.keep).unwrap_or(360);
        let spool = Arc::new(Spool::open(&spool_dir, "pull", max_bytes, keep)?);
        let tls = security.server().grpc(address)?;
        tasks.push(tokio::spawn(serve::serve(address, tls, security.token.clone(), spool.clone(), agent, until_stopped())));
        spools.push(spool);
    }
    if let Some(url) = otlp {
        let spool = Arc::new(Spool::open(&spool_dir.join("otlp"), "otlp", max_bytes, usize::MAX)?);
        let headers = if args.otlp_header.is_empty() { file.otlp_headers.clone().unwrap_or_default() } else { args.otlp_header.clone() };
        let exporter = Otlp::new(security.client().endpoint(url, "OTLP receiver")?, &headers)?;
        tasks.push(Shipper::new(exporter, spool.clone()).spawn(until_stopped()));
        spools.push(spool);
    }
    let mut labels = file.labels.clone().unwrap_or_default();
    labels.entry("host".into()).or_insert_with(|| hostname.to_string());
    if let Some(node) = node_name(args, file) {
        labels.entry("node".into()).or_insert(node);
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    labels.entry("kernel".into()).or_insert_with(|| kernel.trim().to_string());
    Ok((Some(Shipping { spools, labels }), tasks))
}

fn node_name(args: &RunArgs, file: &FileConfig) -> Option<String> {
    args.node_name.clone().or(file.node_name.clone()).filter(|n| !n.is_empty())
}

/// Starts the watch on this node's pods when Kubernetes labels are on. `auto` turns them off
/// with a warning when the in-cluster config is unusable; an explicit setting fails instead.
fn start_pod_watch<F>(args: &RunArgs, file: &FileConfig, hostname: &str, until_stopped: &impl Fn() -> F) -> Result<Option<(Pods, Task)>>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let setting = args.kubernetes.clone().or(file.kubernetes.clone()).unwrap_or_else(|| "auto".into());
    let Some(source) = pods::Source::parse(&setting)? else { return Ok(None) };
    let node = node_name(args, file).unwrap_or_else(|| {
        tracing::warn!("no node name (set NODE_NAME from the downward API, or --node-name): watching the pods of node {hostname:?}");
        hostname.to_string()
    });
    let pods = Pods::default();
    match pods.watch(&source, &node, until_stopped()) {
        Ok(task) => Ok(Some((pods, task))),
        Err(e) if setting == "auto" => {
            tracing::warn!("no Kubernetes pod labels: {e:#}");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Resolves on the first SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Logs every loss of the interval by reason (losses are also in the profile's comments), and
/// counts what the kernel saw and lost in the metrics.
pub fn report_losses(interval: &ResolvedInterval) {
    let lost = |i| interval.counter(i);
    for (index, name) in COUNTER_NAMES {
        let (metric, label) = match index {
            counter::SAMPLES => ("ember_samples_total", None),
            counter::NET_EVENTS | counter::OFF_CPU_BLOCKS | counter::IDLE | counter::FILTERED | counter::OFF_CPU_OUT_OF_RANGE => {
                ("ember_events_total", Some("event"))
            }
            _ => ("ember_lost_total", Some("reason")),
        };
        let labels: Vec<(&str, &str)> = label.map(|l| (l, name)).into_iter().collect();
        metrics::add(metric, &labels, lost(index) as f64);
    }
    metrics::add("ember_lost_total", &[("reason", "relabel_dropped")], interval.relabel_dropped as f64);
    metrics::add("ember_intervals_total", &[], 1.0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    metrics::set("ember_last_interval_timestamp_seconds", &[], now.as_secs_f64());
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
    let otlp = args.otlp.clone().or(file.otlp.clone());
    let dir = if push.is_none() && serve.is_none() && otlp.is_none() { Some(dir.unwrap_or_else(crate::default_output_dir)) } else { dir };
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
    let (shipping, mut shippers) = start_shipping(&args, &file, &hostname, push.as_deref(), serve, otlp.as_deref(), &until_stopped)?;
    let relabel = Relabeler::new(file.relabel.as_deref().unwrap_or_default())?;
    metrics::set("ember_build_info", &[("version", env!("CARGO_PKG_VERSION"))], 1.0);
    let health = Health::new(every);
    if let Some(address) = args.http.or(file.http) {
        // Up before the programs load, so probes see "live, not ready" meanwhile.
        let listener = status::bind(address).await?;
        shippers.push(tokio::spawn(status::serve(listener, health.clone(), until_stopped())));
    }
    let pods = start_pod_watch(&args, &file, &hostname, &until_stopped)?.map(|(pods, task)| {
        shippers.push(task);
        pods
    });
    let mut collector = Collector::start(&options, Targets::new(pods, relabel))?;
    health.set_ready();
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
        health.tick();
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
    let _ = stop_shipping.send(true);
    for shipper in shippers {
        shipper.await.context("shipping task failed")??;
    }
    Ok(())
}
