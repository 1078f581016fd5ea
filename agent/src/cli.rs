//! The command line, as typed: clap's view of `ember-agent run` and `record`. Only `main` and
//! `settings` read these types; `settings` turns them into what the stages receive.
use std::{path::PathBuf, time::Duration};

use clap::{builder::PossibleValue, Args, ValueEnum};

use crate::{duration::parse_duration, kernel::Event};

/// `--event cpu-clock`: the kernel stage's event, by the name it prints.
impl ValueEnum for Event {
    fn value_variants<'a>() -> &'a [Event] {
        &Event::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.name()))
    }
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// TOML configuration file (flags override it).
    #[arg(short, long)]
    pub config: Option<PathBuf>,
    /// Length of one profile [default: 10s].
    #[arg(long)]
    pub interval: Option<String>,
    /// Most CPU profiling may cost, as a share of one core ("1%"): the agent's own CPU plus
    /// its BPF programs' run time. Over it, sampling rates come down (the dearest source
    /// first) and go back up when there is room; totals stay unbiased [default: none].
    #[arg(long)]
    pub cpu_budget: Option<String>,
    /// Directory for the profiles [default: ./ember-profiles].
    #[arg(short, long)]
    pub output_dir: Option<PathBuf>,
    /// Also write folded stacks and an SVG flame graph per interval.
    #[arg(long)]
    pub flamegraphs: bool,
    /// Push profiles to this collector (e.g. http://127.0.0.1:7070); local files are then
    /// written only if --output-dir is given. Repeat it (or give a host name with several
    /// addresses) for collectors that share a store: a failed or timed-out push goes on to the
    /// next.
    #[arg(long)]
    pub push: Vec<String>,
    /// Where profiles wait until the collector has them [default: ./ember-spool].
    #[arg(long)]
    pub spool_dir: Option<PathBuf>,
    /// Spool size limit in MiB; past it the oldest profiles are dropped [default: 256].
    #[arg(long)]
    pub spool_max_mib: Option<f64>,
    /// This agent's identity at the collector [default: the node name (--node-name), else the host name].
    #[arg(long)]
    pub agent_id: Option<String>,
    /// Bearer token file: sent with pushes; with --serve, required of pullers.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// TLS CA (PEM). Push: the CA that signed the collector's certificate (for an https://
    /// --push). Serve: collectors must present a certificate it signed (mutual TLS).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// This agent's certificate (PEM): its client identity for mutual TLS when pushing, its
    /// server identity when serving ...
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// ... and its private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Push: the name to expect in the collector's certificate [default: the URL's host].
    #[arg(long)]
    pub tls_domain: Option<String>,
    /// Push plaintext (http://) to a collector on another host, or serve plaintext on a
    /// non-loopback address (both are refused without it).
    #[arg(long)]
    pub plaintext: bool,
    /// Also export profiles over OTLP (gRPC) to this OpenTelemetry profiles receiver (e.g.
    /// http://127.0.0.1:4317), from its own spool.
    #[arg(long)]
    pub otlp: Option<String>,
    /// A header on every OTLP export, name=value (repeat for several), e.g. a tenant id.
    #[arg(long)]
    pub otlp_header: Vec<String>,
    /// Serve /healthz, /readyz and /metrics (Prometheus) over HTTP on this address (e.g.
    /// 0.0.0.0:7073).
    #[arg(long)]
    pub http: Option<std::net::SocketAddr>,
    /// Pull mode: serve profiles to collectors on this gRPC address (e.g. 0.0.0.0:7072).
    #[arg(long)]
    pub serve: Option<std::net::SocketAddr>,
    /// Pull mode: how many of the newest profiles to keep for collectors [default: 360].
    #[arg(long)]
    pub keep: Option<usize>,
    /// Pod name, namespace, container name and pod labels from Kubernetes: auto (in-cluster
    /// when running in a pod), off, in-cluster, or an API server URL that needs no credentials
    /// (e.g. http://127.0.0.1:8001 from kubectl proxy) [default: auto].
    #[arg(long)]
    pub kubernetes: Option<String>,
    /// This node's name: the `node` label, and whose pods to watch [default: $NODE_NAME].
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub symbols: SymbolArgs,
}

#[derive(Args, Debug)]
pub struct RecordArgs {
    /// How long to profile (e.g. 10s, 500ms, 2m).
    #[arg(short, long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// pprof output (gzipped profile.proto).
    #[arg(short, long, default_value = "profile.pb.gz")]
    pub output: PathBuf,
    /// Also write folded stacks here.
    #[arg(long)]
    pub folded: Option<PathBuf>,
    /// Also write an SVG flame graph here.
    #[arg(long)]
    pub flamegraph: Option<PathBuf>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub symbols: SymbolArgs,
}

/// Where stripped binaries' debug info is found, for `run` and `record`.
#[derive(Args, Debug, Clone, Default)]
pub struct SymbolArgs {
    /// Directory of separate debug files, searched by build id (.build-id/ab/cdef….debug) and
    /// for debug links; repeat for several [default: /usr/lib/debug].
    #[arg(long = "debug-dir")]
    pub debug_dirs: Vec<PathBuf>,
    /// debuginfod servers to fetch missing debug info from, space-separated [default:
    /// $DEBUGINFOD_URLS].
    #[arg(long, env = "DEBUGINFOD_URLS")]
    pub debuginfod_urls: Option<String>,
    /// Where fetched debug info is kept [default: $CACHE_DIRECTORY/debuginfod, else
    /// ~/.cache/ember/debuginfod].
    #[arg(long)]
    pub debuginfod_cache: Option<PathBuf>,
    /// Give up on a debuginfod fetch after this long (frames keep the binary's own names)
    /// [default: 60s].
    #[arg(long)]
    pub debuginfod_timeout: Option<String>,
    /// Symbol tables and DWARF held parsed at once, in MiB of their sections [default: 8]. A
    /// binary with more is named from its symbol table only, without lines or inlined
    /// functions, and counted.
    #[arg(long)]
    pub debug_info_mib: Option<f64>,
}

/// Sampling options shared by `run` and `record`.
#[derive(Args, Debug, Clone, Default)]
pub struct SamplingArgs {
    /// Event groups to record: cpu (on-CPU sampling), offcpu (blocked time, by where threads
    /// blocked; with cpu also a wall-clock profile), net (network tracepoints), faults (page
    /// faults: where memory is first touched), alloc (the allocator calls of the --pid
    /// processes, or of those in the --cgroup or the --alloc-pods pods, those that join later
    /// too: what they allocate and hold) [default: cpu].
    #[arg(long, value_delimiter = ',', value_parser = ["cpu", "offcpu", "net", "faults", "alloc"])]
    pub events: Vec<String>,
    /// Faults: record one page fault in N on each CPU (each sample stands for N)
    /// [default: 1000].
    #[arg(long)]
    pub fault_period: Option<u64>,
    /// Alloc: sample one allocation per this many bytes allocated, on average (e.g. 512KiB,
    /// 1MiB) [default: 512KiB].
    #[arg(long)]
    pub alloc_sample: Option<String>,
    /// Alloc: sampled allocations tracked until freed; beyond, they are counted as untracked
    /// [default: 65536].
    #[arg(long)]
    pub alloc_max_live: Option<u32>,
    /// Alloc: sampled allocations still live after this long are labelled leak=suspected
    /// [default: 10m].
    #[arg(long)]
    pub leak_age: Option<String>,
    /// Alloc: take the probes out after this long (every allocator call traps while they
    /// are in) [default: 60s; record: its duration].
    #[arg(long)]
    pub alloc_for: Option<String>,
    /// Alloc, in `run` with Kubernetes metadata: probe the processes of this node's pods whose
    /// labels this selector selects (app=checkout,tier!=batch), and of pods that match later.
    #[arg(long)]
    pub alloc_pods: Option<String>,
    /// Network tracepoints for the net group [default: net:net_dev_queue,
    /// net:netif_receive_skb, tcp:tcp_retransmit_skb, skb:kfree_skb].
    #[arg(long, value_delimiter = ',')]
    pub net_events: Vec<String>,
    /// Off-CPU: ignore blocks shorter than this (e.g. 100us, 1ms) [default: 0].
    #[arg(long)]
    pub offcpu_min_block: Option<String>,
    /// Off-CPU: ignore blocks longer than this [default: none].
    #[arg(long)]
    pub offcpu_max_block: Option<String>,
    /// Off-CPU: task states to include [default: sleeping,uninterruptible,preempted].
    #[arg(long, value_delimiter = ',', value_parser = ["sleeping", "uninterruptible", "preempted"])]
    pub offcpu_states: Vec<String>,
    /// Off-CPU: record one block in N (each counted N times) to bound cost [default: 1].
    #[arg(long)]
    pub offcpu_sample_ratio: Option<u32>,
    /// Off-CPU: live threads whose blocks can be measured (a thread holds its slot from its
    /// first block until it exits); blocks of threads beyond are counted as lost
    /// (off_cpu_table_full) [default: 65536].
    #[arg(long)]
    pub offcpu_max_threads: Option<u32>,
    /// Samples per second per CPU [run: 19, record: 99].
    #[arg(short = 'F', long)]
    pub frequency: Option<u64>,
    /// Perf event that triggers sampling [default: cpu-clock].
    #[arg(long, value_enum)]
    pub event: Option<Event>,
    /// Only profile this process (repeat for several).
    #[arg(short, long = "pid")]
    pub pids: Vec<u32>,
    /// Only profile this cgroup (path, absolute or relative to the cgroup2 mount).
    #[arg(long)]
    pub cgroup: Option<String>,
    /// Distinct (thread, stack) keys kept per interval; samples beyond are counted as lost.
    #[arg(long)]
    pub max_keys: Option<u32>,
    /// Distinct stacks kept per interval.
    #[arg(long)]
    pub max_stacks: Option<u32>,
    /// Kernel memory for unwind tables, all executables together [default: 16]. Executables
    /// beyond it are walked by frame pointers, and counted.
    #[arg(long)]
    pub unwind_table_mib: Option<f64>,
}

#[derive(Args, Debug)]
pub struct UnwindTableArgs {
    /// ELF files (executables or shared libraries).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Print every row (address, then the rule), not only the summary.
    #[arg(long)]
    pub rows: bool,
}
