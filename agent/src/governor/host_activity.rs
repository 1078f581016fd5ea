//! How busy the host is, from the kernel's counters in /proc/stat: context switches (each
//! runs the off-CPU program) and processes started (each costs a capture). The governor
//! judges from them what a paused source would cost if it came back, and counts what a
//! pause did not see.
use std::{io::Read as _, time::Instant};

/// /proc/stat is the kernel's: some 100 bytes a CPU. A bound all the same.
const MAX_BYTES: u64 = 1 << 20;

/// The host's counters at one reading.
#[derive(Clone, Copy, Debug)]
pub(super) struct HostCounters {
    at: Instant,
    switches: u64,
    processes: u64,
}

/// The host's activity between two readings.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Activity {
    pub(super) switches: u64,
    pub(super) processes: u64,
    pub(super) switches_per_s: f64,
    pub(super) processes_per_s: f64,
}

impl HostCounters {
    /// Reads /proc/stat; `None` if it cannot be read or lacks the counters.
    pub(super) fn read() -> Option<HostCounters> {
        let mut text = String::new();
        std::fs::File::open("/proc/stat").ok()?.take(MAX_BYTES).read_to_string(&mut text).ok()?;
        parse(&text, Instant::now())
    }

    /// What happened since `earlier`.
    pub(super) fn since(&self, earlier: &HostCounters) -> Activity {
        let seconds = self.at.duration_since(earlier.at).as_secs_f64().max(1e-3);
        let (switches, processes) = (self.switches.saturating_sub(earlier.switches), self.processes.saturating_sub(earlier.processes));
        Activity { switches, processes, switches_per_s: switches as f64 / seconds, processes_per_s: processes as f64 / seconds }
    }
}

/// The `ctxt` and `processes` lines of /proc/stat's text.
fn parse(text: &str, at: Instant) -> Option<HostCounters> {
    let counter = |name: &str| text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<u64>().ok());
    Some(HostCounters { at, switches: counter("ctxt")?, processes: counter("processes")? })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn counters_come_from_their_lines_and_activity_is_per_second() {
        let at = Instant::now();
        let text = "cpu  1 2 3\ncpu0 1 2 3\nintr 5 0\nctxt 1000\nbtime 1\nprocesses 40\nprocs_running 1\n";
        let earlier = parse(text, at).expect("parsing /proc/stat");
        let later = parse("ctxt 3000\nprocesses 50\n", at + Duration::from_secs(2)).unwrap();
        let activity = later.since(&earlier);
        assert_eq!((activity.switches, activity.processes), (2000, 10));
        assert_eq!((activity.switches_per_s, activity.processes_per_s), (1000.0, 5.0));
        assert!(parse("ctxt 5\n", at).is_none(), "a text without the processes line");
        assert!(HostCounters::read().is_some(), "this host's /proc/stat");
    }
}
