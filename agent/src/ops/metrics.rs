//! The agent's own metrics, in Prometheus' text format: what it saw, what it lost and why,
//! how full its maps are, how its caches and sinks do. Every stage records into one registry;
//! the status server renders it.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    sync::{LazyLock, Mutex},
};

/// name -> rendered label set -> value.
static REGISTRY: LazyLock<Mutex<BTreeMap<&'static str, BTreeMap<String, f64>>>> = LazyLock::new(Default::default);

/// Every metric, with its help text. Names ending in `_total` are counters, the rest gauges.
const HELP: &[(&str, &str)] = &[
    ("ember_samples_total", "On-CPU samples the kernel programs took."),
    ("ember_events_total", "Other events the kernel programs saw (off-CPU blocks, network events, idle and filtered samples)."),
    ("ember_lost_total", "Samples, stacks or profiles lost, by reason."),
    ("ember_intervals_total", "Intervals drained from the kernel."),
    ("ember_last_interval_timestamp_seconds", "Unix time of the last drain."),
    ("ember_map_entries", "Entries in a BPF map at the last drain."),
    ("ember_map_capacity", "Capacity of a BPF map."),
    ("ember_map_fill_ratio", "Entries over capacity of a BPF map at the last drain."),
    ("ember_processes_tracked", "Processes whose mappings the agent holds."),
    ("ember_user_stacks_total", "User stacks walked, by how the walk ended: complete, or why it stopped (no_process: before the process's unwind tables were loaded, by frame pointers)."),
    ("ember_unwind_tables", "Executables whose unwind tables are loaded in the kernel."),
    ("ember_unwind_tables_idle", "Loaded unwind tables no live process maps (kept until their space is needed)."),
    ("ember_unwind_over_budget", "Executables left out of the unwind table budget (walked by frame pointers)."),
    ("ember_unwind_rows_used", "Unwind table rows loaded in the kernel."),
    ("ember_unwind_rows_capacity", "Unwind table rows the kernel can hold (unwind_table_mib)."),
    ("ember_unwind_build_seconds_total", "Time spent building unwind tables."),
    ("ember_unwind_tables_built_total", "Unwind tables built (each executable once while its table stays loaded)."),
    ("ember_unwind_tables_evicted_total", "Idle unwind tables evicted to make room for another."),
    ("ember_unwind_mappings_dropped_total", "Executable mappings beyond what the walker holds per process (walked by frame pointers)."),
    ("ember_symbol_cache_hits_total", "Addresses symbolized from the cache."),
    ("ember_symbol_cache_misses_total", "Addresses symbolized by reading debug info."),
    ("ember_symbolizer_panics_total", "Binaries whose symbolization panicked (caught; their frames keep module+offset)."),
    ("ember_ship_seconds_sum", "Time spent sending profiles to a sink."),
    ("ember_ship_seconds_count", "Batches sent to a sink."),
    ("ember_ship_failures_total", "Failed sends to a sink (retried)."),
    ("ember_spool_profiles", "Profiles waiting in a sink's spool."),
    ("ember_spool_bytes", "Bytes waiting in a sink's spool."),
    ("ember_kubernetes_pods", "Pods of this node the agent knows from the API server."),
    ("ember_kubernetes_watch_errors_total", "Failed Kubernetes pod watch requests (retried with backoff)."),
    ("ember_build_info", "The agent's version."),
];

fn key(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))).collect();
    format!("{{{}}}", pairs.join(","))
}

fn update(name: &'static str, labels: &[(&str, &str)], change: impl FnOnce(&mut f64)) {
    debug_assert!(HELP.iter().any(|(n, _)| *n == name), "metric {name} has no help text");
    let mut registry = REGISTRY.lock().expect("metrics lock");
    change(registry.entry(name).or_default().entry(key(labels)).or_insert(0.0));
}

pub fn add(name: &'static str, labels: &[(&str, &str)], value: f64) {
    update(name, labels, |v| *v += value);
}

pub fn set(name: &'static str, labels: &[(&str, &str)], value: f64) {
    update(name, labels, |v| *v = value);
}

/// The registry in Prometheus' text exposition format.
pub fn render() -> String {
    let registry = REGISTRY.lock().expect("metrics lock");
    let mut out = String::new();
    for (name, help) in HELP {
        let Some(series) = registry.get(name) else { continue };
        let kind = if name.ends_with("_total") { "counter" } else { "gauge" };
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in series {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    }
    out
}

/// A series' value now (0 before its first update), for tests.
#[cfg(test)]
pub fn value(name: &'static str, labels: &[(&str, &str)]) -> f64 {
    let registry = REGISTRY.lock().expect("metrics lock");
    registry.get(name).and_then(|series| series.get(&key(labels))).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_gauges_with_escaped_labels() {
        add("ember_lost_total", &[("reason", "map_full")], 2.0);
        add("ember_lost_total", &[("reason", "map_full")], 3.0);
        set("ember_spool_profiles", &[("sink", "a\"b")], 7.0);
        let text = render();
        assert!(text.contains("# TYPE ember_lost_total counter\n"), "{text}");
        assert!(text.contains("ember_lost_total{reason=\"map_full\"} 5\n"), "{text}");
        assert!(text.contains("# TYPE ember_spool_profiles gauge\n"), "{text}");
        assert!(text.contains("ember_spool_profiles{sink=\"a\\\"b\"} 7\n"), "{text}");
    }
}
