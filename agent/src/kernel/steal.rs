//! What the hypervisor took from the host's CPUs (steal), from the first line of /proc/stat.
//! A thread stays current while its virtual CPU is stolen, so a clock sampler (Ember, perf)
//! counts that time as the thread's on-CPU time, which the thread's own CPU time leaves out.
//! Each interval says how much was stolen, so that its on-CPU figures can be read for what
//! they are.
use std::io::Read as _;

/// Clock ticks the host's CPUs ran (user, nice, system, irq, softirq) and had stolen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostCpu {
    pub ran: u64,
    pub stolen: u64,
}

impl HostCpu {
    /// The host's totals so far; zero if /proc/stat cannot be read.
    pub fn now() -> HostCpu {
        // The first line (all CPUs) is all that is needed; the file can be long.
        let mut head = [0u8; 512];
        let read = std::fs::File::open("/proc/stat").and_then(|mut f| f.read(&mut head)).unwrap_or(0);
        HostCpu::parse(&String::from_utf8_lossy(&head[..read]))
    }

    fn parse(stat: &str) -> HostCpu {
        let line = stat.lines().next().filter(|l| l.starts_with("cpu ")).unwrap_or("");
        let ticks: Vec<u64> = line.split_whitespace().skip(1).map(|t| t.parse().unwrap_or(0)).collect();
        let tick = |i: usize| ticks.get(i).copied().unwrap_or(0);
        HostCpu { ran: tick(0) + tick(1) + tick(2) + tick(5) + tick(6), stolen: tick(7) }
    }

    /// What was added since `earlier`.
    pub fn since(self, earlier: HostCpu) -> HostCpu {
        HostCpu { ran: self.ran.saturating_sub(earlier.ran), stolen: self.stolen.saturating_sub(earlier.stolen) }
    }

    pub fn add(&mut self, other: HostCpu) {
        (self.ran, self.stolen) = (self.ran + other.ran, self.stolen + other.stolen);
    }

    /// Of the time the CPUs had work, the share that was stolen.
    pub fn steal_share(&self) -> f64 {
        match self.ran + self.stolen {
            0 => 0.0,
            busy => self.stolen as f64 / busy as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_is_a_share_of_the_time_the_cpus_had_work() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let earlier = HostCpu::parse("cpu  100 0 50 9000 10 5 5 40 0 0\ncpu0 1 2 3\n");
        let later = HostCpu::parse("cpu  160 0 70 9500 10 5 5 60 0 0\n");
        let interval = later.since(earlier);
        assert_eq!(interval, HostCpu { ran: 80, stolen: 20 });
        assert!((interval.steal_share() - 0.2).abs() < 1e-9);
        assert_eq!(HostCpu::parse("intr 1 2\n"), HostCpu::default());
        assert_eq!(HostCpu::now().since(HostCpu::now()).steal_share(), 0.0);
    }
}
