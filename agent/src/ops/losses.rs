//! Losses: every interval's counters, from the kernel's per-CPU counters and the resolve
//! stage, logged by reason and added to the metrics. The commands call it once per drain; the
//! same counters also go into each profile's comments (`encode::pprof`).
use agent_common::counter;

use super::metrics;

/// One interval's losses: the kernel's counters and what the resolve stage lost.
pub struct Losses<'a> {
    pub counters: &'a [u64; counter::COUNT as usize],
    /// Events of targets that relabel rules dropped.
    pub relabel_dropped: u64,
    /// Processes that exited before their mappings could be read.
    pub processes_unread: u64,
}

/// Logs every loss of the interval by reason (losses are also in the profile's comments), and
/// counts what the kernel saw and lost in the metrics.
pub fn report(losses: Losses) {
    let Losses { counters, relabel_dropped, processes_unread } = losses;
    let lost = |i: u32| counters[i as usize];
    for (index, name) in counter::NAMES {
        let (metric, label) = match index {
            counter::SAMPLES => ("ember_samples_total", None),
            counter::NET_EVENTS
            | counter::OFF_CPU_BLOCKS
            | counter::IDLE
            | counter::FILTERED
            | counter::NET_FILTERED
            | counter::OFF_CPU_OUT_OF_RANGE
            | counter::OFF_CPU_WAKES_UNSEEN
            | counter::FAULT_SAMPLES
            | counter::ALLOC_CALLS
            | counter::FREE_CALLS
            | counter::PROBE_STEPS
            | counter::SAMPLED_PATH_HITS
            | counter::ALLOC_SAMPLES => ("ember_events_total", Some("event")),
            counter::ALLOC_UNTRACKED => ("ember_lost_total", Some("reason")),
            counter::RUN_NS.. => continue, // a cost, not an event: the governor reports it
            counter::CODE_REPLACED => ("ember_code_replaced_total", None),
            counter::UNWIND_NO_PROCESS.. => ("ember_user_stacks_total", Some("walk")),
            _ => ("ember_lost_total", Some("reason")),
        };
        let labels: Vec<(&str, &str)> = label.map(|l| (l, name)).into_iter().collect();
        metrics::add(metric, &labels, lost(index) as f64);
    }
    metrics::add("ember_lost_total", &[("reason", "relabel_dropped")], relabel_dropped as f64);
    metrics::add("ember_lost_total", &[("reason", "process_exited_unread")], processes_unread as f64);
    if processes_unread > 0 {
        tracing::warn!(processes = processes_unread, "processes exited before their mappings could be read: their frames stay unnamed");
    }
    metrics::add("ember_intervals_total", &[], 1.0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    metrics::set("ember_last_interval_timestamp_seconds", &[], now.as_secs_f64());
    if lost(counter::MAP_FULL) > 0 {
        tracing::warn!(lost = lost(counter::MAP_FULL), "samples lost: counts map full (raise max_keys)");
    }
    if lost(counter::ALLOC_UNTRACKED) > 0 {
        tracing::warn!(
            lost = lost(counter::ALLOC_UNTRACKED),
            "sampled allocations not tracked until freed: the live table is full (raise alloc_max_live); they count as allocated, not in use"
        );
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
