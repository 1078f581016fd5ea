//! The host's counters in /proc/stat, read once per drain: what its CPUs ran and what the
//! hypervisor stole from them (steal), context switches (each runs the off-CPU program) and
//! processes started (each costs a capture). A thread stays current while its virtual CPU is
//! stolen, so a clock sampler (Ember, perf) counts that time as the thread's on-CPU time,
//! which the thread's own CPU time leaves out: each interval says how much was stolen, so
//! that its on-CPU figures can be read for what they are. The governor judges from the
//! switches and processes what a paused source would cost if it came back.
use std::{io::Read as _, time::Instant};

/// /proc/stat is the kernel's, some 100 bytes a CPU plus a line of interrupt counts. A bound
/// all the same.
const MAX_BYTES: u64 = 1 << 20;

/// The host's counters at one reading.
#[derive(Clone, Copy, Debug)]
pub struct HostStat {
    at: Instant,
    totals: HostActivity,
}

/// What the host did between two readings (or over merged intervals).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostActivity {
    /// Clock ticks the CPUs ran (user, nice, system, irq, softirq) and had stolen.
    pub ran: u64,
    pub stolen: u64,
    pub switches: u64,
    pub processes: u64,
    pub seconds: f64,
}

impl HostStat {
    /// The host's counters now; `None` if /proc/stat cannot be read or lacks them.
    pub fn read() -> Option<HostStat> {
        let mut text = String::new();
        std::fs::File::open("/proc/stat").ok()?.take(MAX_BYTES).read_to_string(&mut text).ok()?;
        HostStat::parse(&text, Instant::now())
    }

    fn parse(text: &str, at: Instant) -> Option<HostStat> {
        let counter = |name: &str| text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<u64>().ok());
        let ticks: Vec<u64> = text.lines().find_map(|line| line.strip_prefix("cpu "))?.split_whitespace().map(|t| t.parse().unwrap_or(0)).collect();
        let tick = |i: usize| ticks.get(i).copied().unwrap_or(0);
        let totals = HostActivity {
            ran: tick(0) + tick(1) + tick(2) + tick(5) + tick(6),
            stolen: tick(7),
            switches: counter("ctxt")?,
            processes: counter("processes")?,
            seconds: 0.0,
        };
        Some(HostStat { at, totals })
    }

    /// What happened since `earlier`.
    pub fn since(&self, earlier: &HostStat) -> HostActivity {
        let (now, then) = (self.totals, earlier.totals);
        HostActivity {
            ran: now.ran.saturating_sub(then.ran),
            stolen: now.stolen.saturating_sub(then.stolen),
            switches: now.switches.saturating_sub(then.switches),
            processes: now.processes.saturating_sub(then.processes),
            seconds: self.at.duration_since(earlier.at).as_secs_f64(),
        }
    }
}

impl HostActivity {
    pub fn add(&mut self, other: HostActivity) {
        self.ran += other.ran;
        self.stolen += other.stolen;
        self.switches += other.switches;
        self.processes += other.processes;
        self.seconds += other.seconds;
    }

    /// Of the time the CPUs had work, the share that was stolen.
    pub fn steal_share(&self) -> f64 {
        match self.ran + self.stolen {
            0 => 0.0,
            busy => self.stolen as f64 / busy as f64,
        }
    }

    pub fn switches_per_s(&self) -> f64 {
        self.switches as f64 / self.seconds.max(1e-3)
    }

    pub fn processes_per_s(&self) -> f64 {
        self.processes as f64 / self.seconds.max(1e-3)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn steal_is_a_share_of_the_time_the_cpus_had_work_and_activity_is_per_second() {
        let at = Instant::now();
        // user nice system idle iowait irq softirq steal guest guest_nice
        let earlier = HostStat::parse("cpu  100 0 50 9000 10 5 5 40 0 0\ncpu0 1 2 3\nintr 5 0\nctxt 1000\nbtime 1\nprocesses 40\n", at).unwrap();
        let later = HostStat::parse("cpu  160 0 70 9500 10 5 5 60 0 0\nctxt 3000\nprocesses 50\n", at + Duration::from_secs(2)).unwrap();
        let interval = later.since(&earlier);
        assert_eq!((interval.ran, interval.stolen, interval.switches, interval.processes), (80, 20, 2000, 10));
        assert!((interval.steal_share() - 0.2).abs() < 1e-9);
        assert_eq!((interval.switches_per_s(), interval.processes_per_s()), (1000.0, 5.0));
        let mut merged = interval;
        merged.add(interval);
        assert_eq!((merged.stolen, merged.switches_per_s()), (40, 1000.0));
        assert_eq!(HostActivity::default().steal_share(), 0.0);
    }

    #[test]
    fn a_text_without_every_counter_is_no_reading() {
        let at = Instant::now();
        assert!(HostStat::parse("ctxt 5\nprocesses 1\n", at).is_none(), "no cpu line");
        assert!(HostStat::parse("cpu  1 2 3\nctxt 5\n", at).is_none(), "no processes line");
        let host = HostStat::read().expect("this host's /proc/stat");
        assert!(host.totals.ran > 0 && host.totals.switches > 0 && host.totals.processes > 0, "{host:?}");
    }
}
