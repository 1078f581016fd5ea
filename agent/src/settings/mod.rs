//! Settings: the command line and the configuration file merged (flags win), defaulted and
//! validated in one place, into the typed values each stage receives. Every user error is
//! found here, before anything is loaded; no stage reads a flag or a file key.
mod file;

use std::{collections::HashMap, net::SocketAddr, path::PathBuf, time::Duration};

use agent_common::{block_state, kind};
use anyhow::{bail, ensure, Context as _, Result};
use ember_proto::{
    ember::AgentIdentity,
    security::{self, ClientSecurity, ServerSecurity},
};
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};

pub use file::FileConfig;
use file::OneOrMany;

use crate::{
    cli::{RecordArgs, RunArgs, SamplingArgs, SymbolArgs},
    duration::parse_duration,
    encode::ProfileKind,
    pod_selector::PodSelector,
    kernel::{tracefs::Format, AllocSettings, Event, KernelSettings, NetEvent, OffCpuSettings},
    resolve::{
        cgroup_dir, cgroup_id,
        pods::{PodSettings, Source},
        relabel::Relabeler,
    },
    ship::{files::FileOutputs, Delivery, ShipSettings},
    symbolize::{DebuginfodSettings, SymbolSettings},
};

const DEFAULT_RUN_FREQUENCY: u64 = 19;
const DEFAULT_RECORD_FREQUENCY: u64 = 99;
const DEFAULT_MAX_KEYS: u32 = 10_240;
/// A page-fault sample walks a stack (microseconds); a fault itself costs about a
/// microsecond: one sample in 1,000 faults keeps what sampling adds to a fault-heavy
/// workload under 1%.
const DEFAULT_FAULT_PERIOD: u64 = 1000;
/// tcmalloc's and Go's mean: big allocations are always seen, and a process allocating a
/// GiB a second is sampled 2,000 times a second.
const DEFAULT_ALLOC_SAMPLE: &str = "512KiB";
const DEFAULT_ALLOC_MAX_LIVE: u32 = 65_536;
const DEFAULT_LEAK_AGE: &str = "10m";
const DEFAULT_ALLOC_FOR: &str = "60s";
const DEFAULT_MAX_STACKS: u32 = 8_192;
const DEFAULT_UNWIND_TABLE_MIB: f64 = 16.0;
const DEFAULT_OFFCPU_MAX_THREADS: u32 = 65_536;
const DEFAULT_INTERVAL: &str = "10s";
/// A profile covers at least a second (a drain per few milliseconds would cost more than the
/// profiling) and at most an hour (the maps hold a whole interval).
const INTERVALS: std::ops::RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(3600);
const DEFAULT_OUTPUT_DIR: &str = "ember-profiles";
const DEFAULT_SPOOL_DIR: &str = "ember-spool";
const DEFAULT_SPOOL_MIB: f64 = 256.0;
const DEFAULT_KEEP: usize = 360;
const DEFAULT_DEBUG_DIR: &str = "/usr/lib/debug";
const DEFAULT_DEBUGINFOD_TIMEOUT: &str = "60s";
const DEFAULT_DEBUG_INFO_MIB: f64 = 8.0;

/// `ember-agent run`, resolved.
pub struct RunSettings {
    pub kernel: KernelSettings,
    /// The profiles each interval makes, in a fixed order.
    pub kinds: Vec<ProfileKind>,
    pub interval: Duration,
    /// The CPU budget, a share of one core, if the governor is on.
    pub cpu_budget: Option<f64>,
    /// Local files, if any: the directory, and whether to add folded stacks and SVG.
    pub files: Option<(PathBuf, bool)>,
    pub ship: Option<ShipSettings>,
    /// Status server (health, readiness, metrics).
    pub http: Option<SocketAddr>,
    pub pods: Option<PodSettings>,
    pub relabel: Relabeler,
    pub symbols: SymbolSettings,
}

/// `ember-agent record`, resolved.
pub struct RecordSettings {
    pub kernel: KernelSettings,
    pub kinds: Vec<ProfileKind>,
    pub duration: Duration,
    /// The files to write; with several kinds, each kind's name is added to them.
    pub files: FileOutputs,
    pub symbols: SymbolSettings,
}

impl RunSettings {
    pub fn resolve(args: &RunArgs) -> Result<RunSettings> {
        let file = match &args.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        let interval = parse_duration(args.interval.as_deref().or(file.interval.as_deref()).unwrap_or(DEFAULT_INTERVAL))?;
        ensure!(INTERVALS.contains(&interval), "interval {interval:?} is out of range: use 1s to 1h");
        let mut kernel = kernel_settings(&args.sampling, &file, DEFAULT_RUN_FREQUENCY)?;
        let cpu_budget = args.cpu_budget.as_deref().or(file.cpu_budget.as_deref()).map(parse_cpu_budget).transpose()?.flatten();
        kernel.measure_run_time = cpu_budget.is_some();
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
        let ship = ship_settings(args, &file, &hostname)?;
        // Agents that ship profiles keep local files only when asked to.
        let dir = args.output_dir.clone().or(file.output_dir.clone());
        let dir = if ship.is_none() { Some(dir.unwrap_or_else(|| PathBuf::from(DEFAULT_OUTPUT_DIR))) } else { dir };
        let flamegraphs = args.flamegraphs || file.flamegraphs.unwrap_or(false);
        let pods = pod_settings(args, &file, &hostname)?;
        ensure!(
            pods.is_some() || kernel.alloc.as_ref().is_none_or(|alloc| alloc.pods.is_none()),
            "--alloc-pods needs this node's pods: set `kubernetes` (in-cluster, or an API server URL) in the config"
        );
        Ok(RunSettings {
            kinds: profile_kinds(&kernel),
            kernel,
            interval,
            cpu_budget,
            files: dir.map(|dir| (dir, flamegraphs)),
            ship,
            http: args.http.or(file.http),
            pods,
            relabel: Relabeler::new(file.relabel.as_deref().unwrap_or_default())?,
            symbols: symbol_settings(&args.symbols, &file)?,
        })
    }
}

impl RecordSettings {
    pub fn resolve(args: &RecordArgs) -> Result<RecordSettings> {
        let mut kernel = kernel_settings(&args.sampling, &FileConfig::default(), DEFAULT_RECORD_FREQUENCY)?;
        // A recording's probes stay in for its duration, unless told otherwise.
        if let Some(alloc) = kernel.alloc.as_mut() {
            alloc.probe_for = args.sampling.alloc_for.as_deref().map(parse_duration).transpose()?;
            ensure!(alloc.pods.is_none(), "--alloc-pods needs this node's pods, which only `run` watches (with `kubernetes` in its config)");
        }
        let files = FileOutputs { pprof: Some(args.output.clone()), folded: args.folded.clone(), flamegraph: args.flamegraph.clone() };
        let symbols = symbol_settings(&args.symbols, &FileConfig::default())?;
        Ok(RecordSettings { kinds: profile_kinds(&kernel), kernel, duration: args.duration, files, symbols })
    }
}

fn symbol_settings(args: &SymbolArgs, file: &FileConfig) -> Result<SymbolSettings> {
    let mut debug_dirs = if args.debug_dirs.is_empty() { file.debug_dirs.clone().unwrap_or_default() } else { args.debug_dirs.clone() };
    if debug_dirs.is_empty() {
        debug_dirs.push(PathBuf::from(DEFAULT_DEBUG_DIR));
    }
    let urls: Vec<String> = match &args.debuginfod_urls {
        Some(urls) => urls.split_whitespace().map(str::to_string).collect(),
        None => file.debuginfod_urls.clone().unwrap_or_default(),
    };
    for url in &urls {
        ensure!(url.starts_with("http://") || url.starts_with("https://"), "debuginfod URL {url:?} is not http:// or https://");
        url.parse::<hyper::Uri>().with_context(|| format!("debuginfod URL {url:?} is not a URL"))?;
    }
    let timeout = args.debuginfod_timeout.as_deref().or(file.debuginfod_timeout.as_deref()).unwrap_or(DEFAULT_DEBUGINFOD_TIMEOUT);
    let timeout = parse_duration(timeout).context("debuginfod_timeout")?;
    let cache = args.debuginfod_cache.clone().or(file.debuginfod_cache.clone()).unwrap_or_else(default_debuginfod_cache);
    let debuginfod = (!urls.is_empty()).then_some(DebuginfodSettings { urls, cache, timeout });
    let budget = args.debug_info_mib.or(file.debug_info_mib).unwrap_or(DEFAULT_DEBUG_INFO_MIB);
    ensure!(budget > 0.0 && budget <= 65536.0, "debug_info_mib {budget} is out of range (above 0, at most 65536)");
    Ok(SymbolSettings { debug_dirs, debuginfod, debug_info_budget: (budget * (1 << 20) as f64) as u64 })
}

/// "1%", "0.5%" or "none": a share of one core, from 0.01% to 400%.
fn parse_cpu_budget(text: &str) -> Result<Option<f64>> {
    if text == "none" {
        return Ok(None);
    }
    let percent: f64 = text
        .strip_suffix('%')
        .and_then(|n| n.trim().parse().ok())
        .with_context(|| format!("invalid cpu_budget {text:?}: expected a share of one core such as \"1%\", or \"none\""))?;
    ensure!((0.01..=400.0).contains(&percent), "cpu_budget {text:?} is out of range: use 0.01% to 400% of one core");
    Ok(Some(percent / 100.0))
}

/// systemd's cache directory (CacheDirectory=), else the user's.
fn default_debuginfod_cache() -> PathBuf {
    let base = std::env::var_os("CACHE_DIRECTORY")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("ember")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/ember")))
        .unwrap_or_else(|| PathBuf::from("/var/cache/ember"));
    base.join("debuginfod")
}

/// A list from the flag if given, else from the file.
fn list(flag: &[String], file: &Option<Vec<String>>) -> Vec<String> {
    if flag.is_empty() { file.clone().unwrap_or_default() } else { flag.to_vec() }
}

fn kernel_settings(args: &SamplingArgs, file: &FileConfig, default_frequency: u64) -> Result<KernelSettings> {
    let frequency = args.frequency.or(file.frequency).unwrap_or(default_frequency);
    ensure!((1..=100_000).contains(&frequency), "frequency {frequency} Hz is out of range (1-100000)");
    let cgroup = args.cgroup.clone().or(file.cgroup.clone());
    let mut events = list(&args.events, &file.events);
    if events.is_empty() {
        events.push("cpu".into());
    }
    if let Some(unknown) = events.iter().find(|e| !["cpu", "offcpu", "net", "faults", "alloc"].contains(&e.as_str())) {
        bail!("unknown event group {unknown:?}: use cpu, offcpu, net, faults or alloc");
    }
    let has = |group: &str| events.iter().any(|e| e == group);
    let fault_period = args.fault_period.or(file.fault_period).unwrap_or(DEFAULT_FAULT_PERIOD);
    ensure!(fault_period >= 1, "fault_period must be at least 1");
    let off_cpu = has("offcpu").then(|| off_cpu_settings(args, file)).transpose()?;
    let mut net_names = list(&args.net_events, &file.net_events);
    if net_names.is_empty() && has("net") {
        net_names = NetEvent::DEFAULT.iter().map(|s| s.to_string()).collect();
    }
    ensure!(net_names.is_empty() || has("net"), "network events were chosen but the net group is off: add --events net");
    let mut net = Vec::new();
    for name in &net_names {
        let event = net_event(name)?;
        if !net.contains(&event) {
            net.push(event);
        }
    }
    let pids = if args.pids.is_empty() { file.pids.clone().unwrap_or_default() } else { args.pids.clone() };
    let alloc = has("alloc").then(|| alloc_settings(args, file, &pids, cgroup.as_deref())).transpose()?;
    Ok(KernelSettings {
        cpu: has("cpu"),
        event: args.event.or(file.event).unwrap_or(Event::CpuClock),
        frequency,
        off_cpu,
        net,
        fault_period: has("faults").then_some(fault_period),
        alloc,
        max_keys: args.max_keys.or(file.max_keys).unwrap_or(DEFAULT_MAX_KEYS),
        max_stacks: args.max_stacks.or(file.max_stacks).unwrap_or(DEFAULT_MAX_STACKS),
        unwind_rows: unwind_rows(args.unwind_table_mib.or(file.unwind_table_mib).unwrap_or(DEFAULT_UNWIND_TABLE_MIB))?,
        pids,
        cgroup_id: cgroup.as_deref().map(cgroup_id).transpose()?,
        measure_run_time: false,
    })
}

fn alloc_settings(args: &SamplingArgs, file: &FileConfig, pids: &[u32], cgroup: Option<&str>) -> Result<AllocSettings> {
    let pods = args.alloc_pods.clone().or(file.alloc_pods.clone()).map(|text| PodSelector::parse(&text)).transpose().context("alloc_pods")?;
    // Every call of a probed allocator traps (microseconds): never on every process of a host.
    let ways = usize::from(!pids.is_empty() || cgroup.is_some()) + usize::from(pods.is_some());
    ensure!(
        ways > 0,
        "the alloc group probes the allocators of chosen processes only: give them with --pid, their cgroup with --cgroup, or their pods with --alloc-pods"
    );
    ensure!(ways == 1, "choose the alloc group's processes one way: --pid or --cgroup, or --alloc-pods");
    let text = |flag: &Option<String>, file: &Option<String>, default: &str| flag.clone().or(file.clone()).unwrap_or_else(|| default.to_string());
    let mean_bytes = parse_bytes(&text(&args.alloc_sample, &file.alloc_sample, DEFAULT_ALLOC_SAMPLE)).context("alloc_sample")?;
    ensure!((1..=1 << 40).contains(&mean_bytes), "alloc_sample must be between 1 byte and 1TiB");
    let max_live = args.alloc_max_live.or(file.alloc_max_live).unwrap_or(DEFAULT_ALLOC_MAX_LIVE);
    ensure!((1..=1 << 24).contains(&max_live), "alloc_max_live must be between 1 and 16777216");
    Ok(AllocSettings {
        mean_bytes,
        max_live,
        leak_age: parse_duration(&text(&args.leak_age, &file.leak_age, DEFAULT_LEAK_AGE)).context("leak_age")?,
        probe_for: Some(parse_duration(&text(&args.alloc_for, &file.alloc_for, DEFAULT_ALLOC_FOR)).context("alloc_for")?),
        cgroup: cgroup.filter(|_| pids.is_empty()).map(cgroup_dir).transpose()?,
        pods,
    })
}

/// "512KiB", "1MiB", "64k", "4096" (bytes): binary units, as allocators count.
fn parse_bytes(text: &str) -> Result<u64> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number.parse().with_context(|| format!("invalid size {text:?}: expected e.g. 512KiB or 1MiB"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        other => bail!("invalid size {text:?}: unknown unit {other:?} (use B, KiB, MiB or GiB)"),
    };
    value.checked_mul(scale).with_context(|| format!("size {text:?} is too large"))
}

/// Rows of 8 bytes that fit in the unwind table budget.
fn unwind_rows(mib: f64) -> Result<u32> {
    ensure!((0.001..=4096.0).contains(&mib), "unwind_table_mib must be between 0.001 and 4096, not {mib}");
    Ok((mib * 1024.0 * 1024.0 / size_of::<agent_common::UnwindRow>() as f64) as u32)
}

/// "category:name". Tracepoints this kernel lacks, or that Ember does not record, are
/// one-line errors listing the alternatives.
fn net_event(text: &str) -> Result<NetEvent> {
    let Some((category, name)) = text.split_once(':') else {
        bail!("network event {text:?} must be category:name, e.g. net:net_dev_queue");
    };
    if let Some(event) = NetEvent::find(category, name) {
        return Ok(event);
    }
    // Unknown to this kernel: the tracefs error lists what exists here.
    Format::read(category, name)?;
    bail!("tracepoint {text} is not one Ember records; it records {}", NetEvent::supported().join(", "))
}

fn off_cpu_settings(args: &SamplingArgs, file: &FileConfig) -> Result<OffCpuSettings> {
    let duration_ns = |flag: &Option<String>, file: &Option<String>| -> Result<Option<u64>> {
        flag.clone().or(file.clone()).map(|d| parse_duration(&d).map(|d| d.as_nanos() as u64)).transpose()
    };
    let mut bits = 0;
    for state in &list(&args.offcpu_states, &file.offcpu_states) {
        bits |= match state.as_str() {
            "sleeping" => block_state::SLEEPING,
            "uninterruptible" => block_state::UNINTERRUPTIBLE,
            "preempted" => block_state::PREEMPTED,
            other => bail!("unknown off-CPU state {other:?}: use sleeping, uninterruptible or preempted"),
        };
    }
    let ratio = args.offcpu_sample_ratio.or(file.offcpu_sample_ratio).unwrap_or(1);
    ensure!(ratio >= 1, "offcpu_sample_ratio must be at least 1");
    Ok(OffCpuSettings {
        states: if bits == 0 { block_state::SLEEPING | block_state::UNINTERRUPTIBLE | block_state::PREEMPTED } else { bits },
        min_block_ns: duration_ns(&args.offcpu_min_block, &file.offcpu_min_block)?.unwrap_or(0),
        max_block_ns: duration_ns(&args.offcpu_max_block, &file.offcpu_max_block)?.unwrap_or(u64::MAX),
        ratio,
        max_threads: args.offcpu_max_threads.or(file.offcpu_max_threads).unwrap_or(DEFAULT_OFFCPU_MAX_THREADS),
    })
}

/// The profiles the chosen events make, in a fixed order.
fn profile_kinds(kernel: &KernelSettings) -> Vec<ProfileKind> {
    ProfileKind::ALL
        .into_iter()
        .filter(|profile| match profile {
            ProfileKind::Cpu => kernel.cpu,
            ProfileKind::OffCpu => kernel.off_cpu.is_some(),
            ProfileKind::Wall => kernel.cpu && kernel.off_cpu.is_some(),
            ProfileKind::NetTx => kernel.records_net(&[kind::NET_DEV_QUEUE, kind::NET_DEV_XMIT]),
            ProfileKind::NetRx => kernel.records_net(&[kind::NETIF_RECEIVE_SKB, kind::NAPI_GRO_RECEIVE_ENTRY]),
            ProfileKind::NetRetransmit => kernel.records_net(&[kind::TCP_RETRANSMIT_SKB]),
            ProfileKind::NetDrop => kernel.records_net(&[kind::KFREE_SKB]),
            ProfileKind::Faults | ProfileKind::MemoryRequests => kernel.fault_period.is_some(),
            ProfileKind::Heap => kernel.alloc.is_some(),
        })
        .collect()
}

/// Where profiles leave the agent, if anywhere: push to a collector or serve to pullers, and
/// OTLP export, with the spool, identity, TLS and token they share.
fn ship_settings(args: &RunArgs, file: &FileConfig, hostname: &str) -> Result<Option<ShipSettings>> {
    let push = match &args.push {
        given if !given.is_empty() => given.clone(),
        _ => file.push.clone().map(OneOrMany::into_vec).unwrap_or_default(),
    };
    let serve = args.serve.or(file.serve);
    let otlp = args.otlp.clone().or(file.otlp.clone());
    ensure!(
        push.is_empty() || serve.is_none(),
        "choose push (--push) or pull (--serve), not both: a pusher deletes what pullers still need"
    );
    if push.is_empty() && serve.is_none() && otlp.is_none() {
        return Ok(None);
    }
    let token = args.token_file.clone().or(file.token_file.clone()).map(|path| security::read_token(&path)).transpose()?;
    let cert = args.tls_cert.clone().or(file.tls_cert.clone());
    let key = args.tls_key.clone().or(file.tls_key.clone());
    ensure!(cert.is_some() == key.is_some(), "TLS needs both tls_cert and tls_key");
    let ca = args.tls_ca.clone().or(file.tls_ca.clone());
    let plaintext = args.plaintext || file.plaintext.unwrap_or(false);
    let client = ClientSecurity {
        ca: ca.clone(),
        identity: cert.clone().zip(key.clone()),
        domain: args.tls_domain.clone().or(file.tls_domain.clone()),
        plaintext,
    };
    let server = ServerSecurity { cert, key, client_ca: ca, plaintext };
    let delivery = match (push.is_empty(), serve) {
        (false, _) => Some(Delivery::Push(collectors(&push, &client)?)),
        (true, Some(address)) => Some(Delivery::Serve { address, tls: server.grpc(address)?, keep: args.keep.or(file.keep).unwrap_or(DEFAULT_KEEP) }),
        (true, None) => None,
    };
    let otlp = match otlp {
        Some(url) => Some((client.endpoint(&url, "OTLP receiver")?, otlp_headers(&list(&args.otlp_header, &file.otlp_headers))?)),
        None => None,
    };
    // In Kubernetes the host name is the pod's, new at every restart, while the spool stays on
    // the node: the node names the agent and the host.
    let node = node_name(args, file);
    let host = node.clone().unwrap_or_else(|| hostname.to_string());
    let mut labels: HashMap<String, String> = file.labels.clone().unwrap_or_default();
    labels.entry("host".into()).or_insert_with(|| host.clone());
    if let Some(node) = node {
        labels.entry("node".into()).or_insert(node);
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    labels.entry("kernel".into()).or_insert_with(|| kernel.trim().to_string());
    Ok(Some(ShipSettings {
        delivery,
        otlp,
        spool_dir: args.spool_dir.clone().or(file.spool_dir.clone()).unwrap_or_else(|| PathBuf::from(DEFAULT_SPOOL_DIR)),
        spool_max_bytes: spool_max_bytes(args.spool_max_mib.or(file.spool_max_mib).unwrap_or(DEFAULT_SPOOL_MIB))?,
        agent: AgentIdentity {
            agent_id: args.agent_id.clone().or(file.agent_id.clone()).unwrap_or_else(|| host.clone()),
            hostname: host,
            version: env!("CARGO_PKG_VERSION").to_string(),
            // Each spool adds its own id when it ships.
            spool_id: 0,
        },
        token,
        labels,
    }))
}

/// The collectors to push to, in order: each URL, and each address of a host name that
/// resolves to several (TLS still checks the certificate against the name).
fn collectors(urls: &[String], security: &ClientSecurity) -> Result<Vec<(String, tonic::transport::Endpoint)>> {
    let mut out = Vec::new();
    for url in urls {
        let addresses = addresses_of(url);
        if addresses.len() < 2 {
            out.push((url.clone(), security.endpoint(url, "collector")?));
            continue;
        }
        let host = security::url_host(url);
        let named = ClientSecurity { domain: security.domain.clone().or_else(|| Some(host.to_string())), ..security.clone() };
        for ip in addresses {
            let one = url.replacen(host, &if ip.is_ipv6() { format!("[{ip}]") } else { ip.to_string() }, 1);
            out.push((format!("{one} ({host})"), named.endpoint(&one, "collector")?));
        }
    }
    Ok(out)
}

/// The addresses a URL's host name resolves to (none for an address or a name that does not
/// resolve now: the connection resolves it then).
fn addresses_of(url: &str) -> Vec<std::net::IpAddr> {
    use std::net::ToSocketAddrs as _;
    let host = security::url_host(url);
    let port = url.rsplit_once(':').and_then(|(_, p)| p.trim_end_matches('/').parse::<u16>().ok()).unwrap_or(7070);
    if host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[') {
        return Vec::new();
    }
    let mut found: Vec<std::net::IpAddr> = (host, port).to_socket_addrs().map(|a| a.map(|a| a.ip()).collect()).unwrap_or_default();
    found.sort();
    found.dedup();
    found
}

/// A spool size in MiB (fractions allowed), as bytes.
fn spool_max_bytes(mib: f64) -> Result<u64> {
    ensure!(mib.is_finite() && mib > 0.0 && mib <= 1024.0 * 1024.0, "spool_max_mib {mib} is out of range: use more than 0 and at most 1048576");
    Ok((mib * (1 << 20) as f64) as u64)
}

/// "name=value" pairs, as gRPC metadata.
fn otlp_headers(headers: &[String]) -> Result<MetadataMap> {
    let mut map = MetadataMap::new();
    for header in headers {
        let (name, value) = header.split_once('=').with_context(|| format!("OTLP header {header:?} is not name=value"))?;
        let name = MetadataKey::from_bytes(name.trim().to_ascii_lowercase().as_bytes())
            .with_context(|| format!("OTLP header name {name:?} is not a valid header name"))?;
        let value = MetadataValue::try_from(value.trim()).with_context(|| format!("OTLP header {name:?} has an invalid value"))?;
        map.insert(name, value);
    }
    Ok(map)
}

fn node_name(args: &RunArgs, file: &FileConfig) -> Option<String> {
    args.node_name.clone().or(file.node_name.clone()).filter(|n| !n.is_empty())
}

/// `auto` (in-cluster when running in a pod, else none), `off`, `in-cluster`, or a URL.
fn pod_source(text: &str) -> Result<Option<Source>> {
    Ok(match text {
        "off" => None,
        "auto" => std::env::var_os("KUBERNETES_SERVICE_HOST").map(|_| Source::InCluster),
        "in-cluster" => Some(Source::InCluster),
        url if url.starts_with("http://") || url.starts_with("https://") => Some(Source::Url(url.to_string())),
        other => bail!("kubernetes = {other:?}: use auto, off, in-cluster or an http(s):// API server URL"),
    })
}

/// Kubernetes pod labels, if on. `auto` turns them off when not in a pod.
fn pod_settings(args: &RunArgs, file: &FileConfig, hostname: &str) -> Result<Option<PodSettings>> {
    let setting = args.kubernetes.clone().or(file.kubernetes.clone()).unwrap_or_else(|| "auto".into());
    let Some(source) = pod_source(&setting)? else { return Ok(None) };
    let node = node_name(args, file).unwrap_or_else(|| {
        tracing::warn!("no node name (set NODE_NAME from the downward API, or --node-name): watching the pods of node {hostname:?}");
        hostname.to_string()
    });
    Ok(Some(PodSettings { source, node, required: setting != "auto" }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse() {
        assert_eq!(pod_source("off").unwrap(), None);
        assert_eq!(pod_source("in-cluster").unwrap(), Some(Source::InCluster));
        assert_eq!(pod_source("http://127.0.0.1:8001").unwrap(), Some(Source::Url("http://127.0.0.1:8001".into())));
        assert!(pod_source("kube.local").unwrap_err().to_string().contains("use auto, off"));
    }

    #[test]
    fn cpu_budgets_are_shares_of_one_core_with_one_line_errors() {
        assert_eq!(parse_cpu_budget("1%").unwrap(), Some(0.01));
        assert_eq!(parse_cpu_budget("0.5 %").unwrap(), Some(0.005));
        assert_eq!(parse_cpu_budget("none").unwrap(), None);
        for bad in ["1", "0%", "500%", "one%"] {
            let error = parse_cpu_budget(bad).unwrap_err().to_string();
            assert!(error.contains("cpu_budget") && !error.contains('\n'), "{bad}: {error}");
        }
    }

    #[test]
    fn the_alloc_group_needs_chosen_processes_and_takes_its_defaults() {
        let mut args = SamplingArgs { events: vec!["alloc".into()], ..SamplingArgs::default() };
        let error = kernel_settings(&args, &FileConfig::default(), 19).err().expect("alloc without --pid").to_string();
        assert!(error.contains("--pid") && error.contains("--cgroup") && !error.contains('\n'), "{error}");
        args.pids = vec![1];
        let alloc = kernel_settings(&args, &FileConfig::default(), 19).unwrap().alloc.expect("the alloc group");
        assert_eq!((alloc.mean_bytes, alloc.max_live), (512 << 10, 65_536));
        assert_eq!((alloc.leak_age, alloc.probe_for), (Duration::from_secs(600), Some(Duration::from_secs(60))));
        args.alloc_sample = Some("0".into());
        assert!(kernel_settings(&args, &FileConfig::default(), 19).is_err(), "a zero mean");
    }

    #[test]
    fn the_alloc_group_takes_a_pod_selector_alone() {
        let mut args = SamplingArgs { events: vec!["alloc".into()], alloc_pods: Some("app=checkout".into()), ..SamplingArgs::default() };
        let alloc = kernel_settings(&args, &FileConfig::default(), 19).unwrap().alloc.expect("the alloc group");
        assert_eq!(alloc.pods.map(|s| s.to_string()).as_deref(), Some("app=checkout"));
        args.pids = vec![1];
        let error = kernel_settings(&args, &FileConfig::default(), 19).err().expect("a pid and a selector").to_string();
        assert!(error.contains("one way"), "{error}");
        args.pids.clear();
        args.alloc_pods = Some("app in (a)".into());
        let error = format!("{:#}", kernel_settings(&args, &FileConfig::default(), 19).err().expect("a set-based selector"));
        assert!(error.contains("alloc_pods") && error.contains("not key=value") && !error.contains('\n'), "{error}");
    }

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse_bytes("512KiB").unwrap(), 512 << 10);
        assert_eq!(parse_bytes("1 MiB").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("64k").unwrap(), 64 << 10);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        for bad in ["", "1.5MiB", "12 parsecs", "99999999999999999999GiB"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
