//! The agent's own metrics, in the OpenMetrics text format (prometheus-client encodes it and
//! escapes label values): what it saw, what it lost and why, how full its maps are, how its
//! caches and sinks do. Every stage records into one registry; the status server renders it.
use std::{
    collections::HashMap,
    sync::{LazyLock, Mutex, atomic::AtomicU64},
};

use prometheus_client::{
    encoding::{EncodeMetric, text::encode},
    metrics::{TypedMetric, counter::Counter, family::Family, gauge::Gauge, histogram::Histogram, info::Info},
    registry::{Metric, Registry},
};

/// The content type of `render()`'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(String, String)>;

/// Every metric, with its help text. Names ending in `_total` are counters, `ember_ship_seconds`
/// is a histogram, the rest are gauges.
const HELP: &[(&str, &str)] = &[
    ("ember_samples_total", "On-CPU samples the kernel programs took"),
    ("ember_events_total", "Other events the kernel programs saw (off-CPU blocks, network events, idle and filtered samples, filtered network events)"),
    ("ember_lost_total", "Samples, stacks or profiles lost, by reason"),
    ("ember_intervals_total", "Intervals drained from the kernel"),
    ("ember_last_interval_timestamp_seconds", "Unix time of the last drain"),
    ("ember_cpu_budget_ratio", "The CPU budget (cpu_budget), as a share of one core"),
    ("ember_overhead_ratio", "What profiling cost over the last interval, as a share of one core: the agent's CPU (part=agent), its BPF programs' run time (part=bpf; measured while a CPU budget is set) and the allocator probes' traps, which the probed processes pay (part=probes)"),
    ("ember_host_cpu_steal_ratio", "Of the time the host's CPUs had work over the last interval, the share the hypervisor took (steal); a clock sampler counts it as on-CPU time of the thread that was current"),
    ("ember_over_cpu_budget", "1 while profiling costs more than the CPU budget even at the lowest rates the governor sets"),
    ("ember_paused", "1 while the CPU budget pauses what no rate lowers: what=off_cpu (the off-CPU program, detached), exec_capture (new processes captured at their first sample, not at exec) or alloc_probes (the allocator probes, taken out for good)"),
    ("ember_alloc_live_tracked", "Sampled allocations tracked until freed at the last drain (the alloc group; at most alloc_max_live)"),
    ("ember_alloc_released_at_exit_total", "Sampled allocations still live when their process exited, given back with it (the alloc group)"),
    ("ember_alloc_unprobed_total", "Processes of the alloc group's cgroup whose allocator could not be probed (gone, or none to probe)"),
    ("ember_unseen_total", "What the CPU budget's pauses did not see: what=context_switches (while off-CPU tracking was paused) or processes_started (while exec captures were paused)"),
    ("ember_sampling_frequency_hz", "On-CPU sampling frequency in force (the governor lowers it under a CPU budget)"),
    ("ember_sampling_ratio", "One event in this many is recorded (and counted this many times), by source: off_cpu, net, faults (its page-fault period is this many times the configured one)"),
    ("ember_map_entries", "Entries in a BPF map at the last drain"),
    ("ember_map_capacity", "Capacity of a BPF map"),
    ("ember_map_fill_ratio", "Entries over capacity of a BPF map at the last drain"),
    ("ember_processes_tracked", "Processes whose mappings the agent holds"),
    (
        "ember_user_stacks_total",
        "User stacks walked, by how the walk ended: complete, or why it stopped (no_process: before the process's unwind tables were loaded, by frame pointers)",
    ),
    (
        "ember_code_replaced_total",
        "Times a process mapped something where code of it had been (a library closed, another loaded in its place): its mappings were read again",
    ),
    ("ember_unwind_tables", "Executables whose unwind tables are loaded in the kernel"),
    ("ember_unwind_tables_idle", "Loaded unwind tables no live process maps (kept until their space is needed)"),
    ("ember_unwind_over_budget", "Executables left out of the unwind table budget (walked by frame pointers until room appears)"),
    ("ember_unwind_tables_readmitted_total", "Unwind tables left out of the budget and built again once room appeared (their processes are loaded again)"),
    ("ember_unwind_rows_used", "Unwind table rows loaded in the kernel"),
    ("ember_unwind_mappings_loaded", "Executable mappings loaded for the walker (held for a drain after their last process goes); processes whose mappings are the same share one copy"),
    ("ember_unwind_layouts", "Distinct sets of executable mappings loaded for the walker: processes with the same mappings (forked workers) count once"),
    ("ember_unwind_rows_capacity", "Unwind table rows the kernel can hold (unwind_table_mib)"),
    ("ember_unwind_build_seconds_total", "Time spent building unwind tables"),
    ("ember_unwind_tables_built_total", "Unwind tables built (each executable once while its table stays loaded)"),
    ("ember_unwind_tables_evicted_total", "Idle unwind tables evicted to make room for another"),
    ("ember_unwind_mappings_dropped_total", "Executable mappings beyond what the walker holds per process (walked by frame pointers)"),
    ("ember_processes_captured_total", "Process mappings taken, by where from: exec (what the kernel told at exec, when the executable is already open: nothing read) or proc (/proc/<pid>/maps, at a process's first sample, or at exec for an executable not seen before)"),
    ("ember_exec_templates_used_total", "Processes the kernel pointed at their executable's template at exec (its code's table, slid to where the process's code went): walked with it from their first sample, and taken by the agent without waking it"),
    ("ember_binaries_unopened_total", "Mapped files the agent could not open as the process maps them, by reason: unreachable (deleted, or its path leads out of the process's root) or changed (its path now names another file), which map_files (CAP_SYS_ADMIN) avoids; not_regular, too_large (over 4 GiB), too_slow (no answer to an open, or to a read on FUSE, in 500 ms) or no_worker (every reader held by such a file); their frames keep module+offset"),
    ("ember_untrusted_files_refused_total", "Files a process can shape that were refused, by file (perf_map) and reason: not_regular (a FIFO, socket or device), too_slow (no answer to an open, or to a read on FUSE, in 500 ms: never read again) or no_worker; their frames stay unnamed"),
    ("ember_python_code_unreadable_total", "Python code objects the agent could not read from their process (a bad address, or memory that is not a code object of the version found); their frames are shown as unreadable"),
    ("ember_python_unknown_versions_total", "Files named for a CPython the agent cannot walk (a version it does not know, or a file it could not read as one); their processes show native frames only"),
    ("ember_untrusted_reads_capped_total", "Reads of files a process can shape that hit a cap, by file: perf_map (64 MiB of perf maps an interval; the rest is read at the next), perf_map_line (a line over 4 KiB, skipped), proc (a /proc file over its cap, cut at a line)"),
    ("ember_symbol_cache_hits_total", "Addresses symbolized from the cache"),
    ("ember_symbol_cache_misses_total", "Addresses symbolized by reading debug info"),
    ("ember_symbolizer_panics_total", "Binaries whose symbolization panicked (caught; their frames keep module+offset)"),
    ("ember_frames_awaiting_debuginfo_total", "Addresses named from a stripped binary's own symbols while its debug info was being fetched (named again once it is here)"),
    ("ember_debuginfod_fetches_total", "debuginfod fetches, by result: found, not_found (no server has the build id), failed (timeout, refused, an error status)"),
    ("ember_debuginfod_fetch_seconds_total", "Time spent on debuginfod fetches (on their own thread, never in the drain)"),
    ("ember_debug_info_held_bytes", "Bytes of symbol tables and DWARF held parsed (bounded by debug_info_mib)"),
    ("ember_debug_info_crowded_out_total", "Binaries that fit the debug-info budget alone but not beside those in use: named from their symbol table for 30 intervals, then tried again"),
    ("ember_binaries_over_debug_info_budget", "Binaries whose symbols and DWARF exceed debug_info_mib: named from their symbol table only, without lines or inlined functions"),
    ("ember_jit_functions_dropped_total", "JIT functions in perf maps beyond the 100,000 kept per process (their frames stay unnamed)"),
    ("ember_ship_seconds", "Time spent sending a batch of profiles to a sink, in seconds"),
    ("ember_ship_failures_total", "Failed sends to a sink (retried)"),
    ("ember_ship_failovers_total", "Pushes that failed on one collector and went on to the next"),
    ("ember_spool_profiles", "Profiles waiting in a sink's spool"),
    ("ember_spool_bytes", "Bytes waiting in a sink's spool"),
    ("ember_kubernetes_pods", "Pods of this node the agent knows from the API server"),
    ("ember_kubernetes_watch_errors_total", "Failed Kubernetes pod watch requests (retried with backoff)"),
];

/// Seconds a send to a sink takes: 1 ms to 16 s.
fn ship_seconds() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(0.001, 4.0, 8))
}

type F64Counter = Counter<f64, AtomicU64>;
type F64Gauge = Gauge<f64, AtomicU64>;

/// One metric: a single series, or a family of labelled ones (a family always prints braces,
/// so a metric used without labels is a single series).
enum Series<M> {
    One(M),
    Labelled(Family<Labels, M, fn() -> M>),
}

impl<M: Metric + TypedMetric + EncodeMetric + Clone> Series<M> {
    fn register(registry: &mut Registry, name: &str, help: &str, labelled: bool, make: fn() -> M) -> Self {
        if labelled {
            let family = Family::new_with_constructor(make);
            registry.register(name, help, family.clone());
            Series::Labelled(family)
        } else {
            let metric = make();
            registry.register(name, help, metric.clone());
            Series::One(metric)
        }
    }

    fn with<R>(&self, labels: &[(&str, &str)], use_it: impl FnOnce(&M) -> R) -> R {
        match self {
            Series::One(metric) => {
                debug_assert!(labels.is_empty(), "a metric first used without labels got {labels:?}");
                use_it(metric)
            }
            Series::Labelled(family) => {
                let labels: Labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
                use_it(&family.get_or_create(&labels))
            }
        }
    }
}

enum Kind {
    Counter(Series<F64Counter>),
    Gauge(Series<F64Gauge>),
    Histogram(Series<Histogram>),
}

struct Metrics {
    registry: Registry,
    by_name: HashMap<&'static str, Kind>,
}

static METRICS: LazyLock<Mutex<Metrics>> = LazyLock::new(|| {
    let mut registry = Registry::default();
    registry.register("ember_build", "The agent's version", Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]));
    Mutex::new(Metrics { registry, by_name: HashMap::new() })
});

/// Runs `update` on the metric `name`, registered at its first use (with labels or without).
fn with_metric<R>(name: &'static str, labelled: bool, update: impl FnOnce(&Kind) -> R) -> R {
    let mut metrics = METRICS.lock().expect("metrics lock");
    let Metrics { registry, by_name } = &mut *metrics;
    let kind = by_name.entry(name).or_insert_with(|| {
        let help = HELP.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("metric {name} is not in HELP")).1;
        if let Some(stem) = name.strip_suffix("_total") {
            // The encoder adds the `_total` suffix to counters itself.
            Kind::Counter(Series::register(registry, stem, help, labelled, F64Counter::default))
        } else if name == "ember_ship_seconds" {
            Kind::Histogram(Series::register(registry, name, help, labelled, ship_seconds))
        } else {
            Kind::Gauge(Series::register(registry, name, help, labelled, F64Gauge::default))
        }
    });
    update(kind)
}

/// Adds to a counter (or a gauge).
pub fn add(name: &'static str, labels: &[(&str, &str)], value: f64) {
    with_metric(name, !labels.is_empty(), |kind| match kind {
        Kind::Counter(series) => _ = series.with(labels, |c| c.inc_by(value)),
        Kind::Gauge(series) => _ = series.with(labels, |g| g.inc_by(value)),
        Kind::Histogram(_) => panic!("{name} is a histogram: observe() it"),
    })
}

/// Sets a gauge.
pub fn set(name: &'static str, labels: &[(&str, &str)], value: f64) {
    with_metric(name, !labels.is_empty(), |kind| match kind {
        Kind::Gauge(series) => _ = series.with(labels, |g| g.set(value)),
        _ => panic!("{name} is not a gauge"),
    })
}

/// Records one observation in a histogram.
pub fn observe(name: &'static str, labels: &[(&str, &str)], value: f64) {
    with_metric(name, !labels.is_empty(), |kind| match kind {
        Kind::Histogram(series) => series.with(labels, |h| h.observe(value)),
        _ => panic!("{name} is not a histogram"),
    })
}

/// The registry in the OpenMetrics text format.
pub fn render() -> String {
    let mut out = String::new();
    encode(&mut out, &METRICS.lock().expect("metrics lock").registry).expect("writing to a String cannot fail");
    out
}

/// A counter's or gauge's value now, for tests.
#[cfg(test)]
pub fn value(name: &'static str, labels: &[(&str, &str)]) -> f64 {
    with_metric(name, !labels.is_empty(), |kind| match kind {
        Kind::Counter(series) => series.with(labels, |c| c.get()),
        Kind::Gauge(series) => series.with(labels, |g| g.get()),
        Kind::Histogram(_) => panic!("{name} is a histogram"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A metric missing from HELP would panic the thread that first uses it: every name the
    /// agent's source passes to `add`, `set` or `observe` must be there.
    #[test]
    fn every_metric_the_agent_updates_has_help() {
        fn sources(dir: &std::path::Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    sources(&path, out);
                } else if path.extension().is_some_and(|x| x == "rs") {
                    out.push(std::fs::read_to_string(&path).unwrap());
                }
            }
        }
        let mut texts = Vec::new();
        sources(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut texts);
        let call = regex::Regex::new(r#"metrics::(?:add|set|observe)\(\s*"([a-z_]+)""#).unwrap();
        let used: Vec<String> = texts.iter().flat_map(|t| call.captures_iter(t).map(|c| c[1].to_string()).collect::<Vec<_>>()).collect();
        assert!(used.len() > 30, "only {} metric updates found: is the pattern stale?", used.len());
        let missing: Vec<&String> = used.iter().filter(|name| !HELP.iter().any(|(n, _)| n == name)).collect();
        assert!(missing.is_empty(), "metrics without HELP: {missing:?}");
    }

    #[test]
    fn renders_counters_gauges_and_histograms_with_escaped_labels() {
        add("ember_lost_total", &[("reason", "map_full")], 2.0);
        add("ember_lost_total", &[("reason", "map_full")], 3.0);
        set("ember_spool_profiles", &[("sink", "a\"b\nc\\d")], 7.0);
        observe("ember_ship_seconds", &[("sink", "s")], 0.002);
        let text = render();
        assert!(text.contains("# TYPE ember_lost counter\n"), "{text}");
        assert!(text.contains("ember_lost_total{reason=\"map_full\"} 5.0\n"), "{text}");
        assert!(text.contains("# TYPE ember_spool_profiles gauge\n"), "{text}");
        // A quote, a newline and a backslash in a label value stay on one line, escaped.
        assert!(text.contains("ember_spool_profiles{sink=\"a\\\"b\\nc\\\\d\"} 7.0\n"), "{text}");
        assert!(text.contains("ember_ship_seconds_bucket{le=\"0.001\",sink=\"s\"} 0\n"), "{text}");
        assert!(text.contains("ember_ship_seconds_bucket{le=\"0.004\",sink=\"s\"} 1\n"), "{text}");
        assert!(text.contains("ember_ship_seconds_bucket{le=\"+Inf\",sink=\"s\"} 1\n"), "{text}");
        assert!(text.contains("ember_build_info{version=\""), "{text}");
        add("ember_intervals_total", &[], 1.0);
        assert!(render().contains("\nember_intervals_total 1.0\n"), "a metric without labels has no braces");
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(value("ember_lost_total", &[("reason", "map_full")]), 5.0);
    }
}
