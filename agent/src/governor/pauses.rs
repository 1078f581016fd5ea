//! When no rate is low enough. Three costs no sampling rate lowers: the off-CPU program runs at
//! every context switch, recording or not, every new process is captured at its exec, and
//! the allocator probes trap at every call of the processes they watch. While either of the
//! first two alone would take the budget, it is paused (off-CPU first: its program is
//! detached; then exec captures: new processes are captured at their first sample, which the
//! on-CPU rate bounds), and it comes back once the host's activity says it fits. What a pause
//! did not see is counted. The allocator probes, once they take the budget, come out for
//! good: their cost is the probed processes' own rate of calls, which the agent cannot
//! foresee.
use super::{Recent, CUT, TARGET};
use crate::kernel::{HostActivity, Paused, Unseen};

/// What the last interval measured, as shares of one core unless said otherwise.
#[derive(Clone, Copy, Debug)]
pub(super) struct Measured {
    pub(super) total: f64,
    pub(super) agent: f64,
    /// What one run of the off-CPU program costs when it records nothing (ns), and its runs
    /// a second: at the lowest rate, its cost is nearly all theirs.
    pub(super) switch_run_ns: f64,
    pub(super) switch_runs_per_s: f64,
    /// What no rate lowers, beside the off-CPU program's runs: the agent's CPU, the other
    /// programs' runs that recorded nothing. During the warm-up, without the agent, whose
    /// first reading of every process says nothing of what follows.
    pub(super) rest: f64,
    /// The allocator probes' traps.
    pub(super) probes: f64,
    pub(super) warm_up: bool,
}

/// The share of the budget below which the off-CPU program's floor is not worth a pause.
const WEIGHTY: f64 = 0.1;

pub(super) struct Pauses {
    pub(super) paused: Paused,
    /// Whether off-CPU tracking runs at all.
    off_cpu: bool,
    /// An off-CPU run's cost (ns) when tracking was paused.
    switch_run_ns: f64,
    /// The agent's CPU per started process (ns) when exec captures were paused: all of it,
    /// so that they come back only with room to spare, and at least twice the last pause's:
    /// a capture that came back and had to be paused again cost more than was thought.
    process_ns: f64,
    /// The last intervals' `rest`.
    rest: Recent,
}

impl Pauses {
    pub(super) fn new(off_cpu: bool) -> Pauses {
        Pauses { paused: Paused::default(), off_cpu, switch_run_ns: 0.0, process_ns: 0.0, rest: Recent::default() }
    }

    /// What the pauses in force did not see of the host's activity.
    pub(super) fn unseen(&self, host: HostActivity) -> Unseen {
        Unseen {
            switches: if self.paused.off_cpu { host.switches } else { 0 },
            processes: if self.paused.exec_capture { host.processes } else { 0 },
        }
    }

    /// What to pause or bring back for the next interval. Pauses off-CPU tracking when it
    /// costs more than its share even at the lowest rate; then exec captures, when what no
    /// rate lowers still takes the budget. Brings one back at a time, when what it cost
    /// before, at the host's current activity, leaves the total under TARGET of the budget,
    /// the level the rates aim at: under it, what paused it (over CUT) cannot hold again.
    /// Not under LOW of the budget: the agent's own cost at a high rate (half the
    /// budget at 999 Hz in 1 s intervals) would keep a source paused that costs next to
    /// nothing back.
    pub(super) fn decide(&mut self, m: &Measured, activity: HostActivity, budget: f64) -> Paused {
        if !m.warm_up {
            self.rest.push(m.rest);
        }
        let rest = if m.warm_up { m.rest } else { self.rest.median() };
        let over = m.total > CUT * budget;
        let mut next = self.paused;
        if m.probes > 0.0 && !self.paused.alloc_probes && over && m.probes + rest > TARGET * budget {
            next.alloc_probes = true;
        }
        if self.off_cpu && !self.paused.off_cpu {
            // Only a floor of some weight: pausing a program that costs next to nothing
            // lowers nothing when the rest is what is over (the agent's CPU after a burst of
            // new stacks, say), and loses the off-CPU view for nothing.
            let floor = m.switch_runs_per_s * m.switch_run_ns / 1e9;
            if over && floor + rest > TARGET * budget && floor > WEIGHTY * budget {
                next.off_cpu = true;
                self.switch_run_ns = m.switch_run_ns;
            }
        }
        // Exec captures, once off-CPU tracking was paused for a whole interval, and on a
        // full history: the first intervals after the warm-up still name what it met.
        let settled = (!self.off_cpu || self.paused.off_cpu) && self.rest.is_full();
        if !self.paused.exec_capture && settled && !m.warm_up && over && rest > TARGET * budget && activity.processes_per_s() >= 1.0 {
            next.exec_capture = true;
            // The recent intervals' cost, which paused them, not only this one's: a pause
            // decided in a cheap interval would otherwise bring them back at once.
            let estimate = m.agent.max(rest) * 1e9 / activity.processes_per_s();
            self.process_ns = estimate.max(2.0 * self.process_ns);
        }
        let fits = |cost_back: f64| m.total + cost_back < TARGET * budget;
        if self.paused.exec_capture && fits(activity.processes_per_s() * self.process_ns / 1e9) {
            next.exec_capture = false;
        } else if self.paused.off_cpu && fits(activity.switches_per_s() * self.switch_run_ns / 1e9) {
            next.off_cpu = false;
        }
        if next != self.paused {
            self.log(next, m, activity, budget);
            self.paused = next;
        }
        next
    }

    fn log(&self, next: Paused, m: &Measured, activity: HostActivity, budget: f64) {
        let percent = |share: f64| format!("{:.2}%", share * 100.0);
        let (cost, budget) = (percent(m.total), percent(budget));
        if next.off_cpu && !self.paused.off_cpu {
            tracing::warn!(
                cost, budget, switches_per_s = activity.switches_per_s().round(), run_ns = m.switch_run_ns.round(),
                "off-CPU tracking paused: its program runs at every context switch and, even at the lowest rate, costs more than the CPU budget leaves it; switches from here on are counted as unseen"
            );
        }
        if next.alloc_probes && !self.paused.alloc_probes {
            tracing::warn!(
                cost, budget, probes = percent(m.probes),
                "allocator probes taken out for the CPU budget: their traps cost the probed processes more than the budget leaves; allocations from here on are not seen"
            );
        }
        if next.exec_capture && !self.paused.exec_capture {
            tracing::warn!(
                cost, budget, processes_per_s = activity.processes_per_s().round(),
                "capture of new processes at exec paused for the CPU budget: they are captured at their first sample, and a short one's first frames may go unnamed"
            );
        }
        if !next.off_cpu && self.paused.off_cpu {
            tracing::info!(cost, budget, switches_per_s = activity.switches_per_s().round(), "off-CPU tracking resumed: the CPU budget has room for it");
        }
        if !next.exec_capture && self.paused.exec_capture {
            tracing::info!(cost, budget, processes_per_s = activity.processes_per_s().round(), "capture of new processes at exec resumed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: f64 = 0.01;

    fn measured(total: f64, switch_runs_per_s: f64, rest: f64) -> Measured {
        Measured { total, agent: rest, switch_run_ns: 300.0, switch_runs_per_s, rest, probes: 0.0, warm_up: false }
    }

    /// A second of the host's activity.
    fn activity(switches: u64, processes: u64) -> HostActivity {
        HostActivity { switches, processes, seconds: 1.0, ..HostActivity::default() }
    }

    fn pauses() -> Pauses {
        Pauses { paused: Paused::default(), off_cpu: true, switch_run_ns: 0.0, process_ns: 0.0, rest: Recent::default() }
    }

    #[test]
    fn off_cpu_pauses_when_its_floor_takes_the_budget_and_comes_back_when_switches_calm_down() {
        let mut p = pauses();
        // 100,000 switches a second at 300 ns: 3% at any rate.
        let paused = p.decide(&measured(0.035, 100_000.0, 0.002), activity(100_000, 0), BUDGET);
        assert_eq!(paused, Paused { off_cpu: true, ..Paused::default() });
        // Still busy: 0.2% without it, but it would cost 3% back.
        assert!(p.decide(&measured(0.002, 0.0, 0.002), activity(100_000, 0), BUDGET).off_cpu);
        // 1,000 switches a second: 0.03% back, room for it.
        assert!(!p.decide(&measured(0.002, 0.0, 0.002), activity(1_000, 0), BUDGET).off_cpu);
    }

    #[test]
    fn off_cpu_comes_back_beside_an_agent_that_takes_half_the_budget() {
        let mut p = pauses();
        p.paused = Paused { off_cpu: true, ..Paused::default() };
        p.switch_run_ns = 1_400.0;
        // The quiet host after the workload: 140 switches a second cost 0.02% back, beside the
        // agent's 0.55% at 999 Hz.
        assert!(!p.decide(&measured(0.0055, 0.0, 0.0055), activity(140, 0), BUDGET).off_cpu);
        // 2,000 switches a second would cost 0.28% back: past the target, still paused.
        p.paused.off_cpu = true;
        assert!(p.decide(&measured(0.0055, 0.0, 0.0055), activity(2_000, 0), BUDGET).off_cpu);
    }

    #[test]
    fn a_floor_of_no_weight_is_not_paused_when_the_rest_is_over() {
        let mut p = pauses();
        // The agent at 1.3% after a burst of new stacks; 134 switches a second cost 0.004%.
        let burst = measured(0.014, 134.0, 0.013);
        for _ in 0..3 {
            assert!(!p.decide(&burst, activity(134, 0), BUDGET).off_cpu);
        }
    }

    #[test]
    fn a_floor_that_fits_is_left_to_the_rates() {
        let mut p = pauses();
        // Over the budget at full rate, but 1,000 switches a second cost 0.03% at any rate.
        assert_eq!(p.decide(&measured(0.05, 1_000.0, 0.001), activity(1_000, 0), BUDGET), Paused::default());
    }

    #[test]
    fn exec_captures_pause_only_after_off_cpu_and_with_processes_starting() {
        let mut p = pauses();
        // The agent alone takes 2% under churn: off-CPU goes first.
        let churn = measured(0.025, 50_000.0, 0.02);
        assert_eq!(p.decide(&churn, activity(50_000, 100), BUDGET), Paused { off_cpu: true, ..Paused::default() });
        assert_eq!(p.decide(&measured(0.02, 0.0, 0.02), activity(50_000, 100), BUDGET).exec_capture, false, "two intervals measured");
        assert_eq!(p.decide(&measured(0.02, 0.0, 0.02), activity(50_000, 100), BUDGET), Paused { off_cpu: true, exec_capture: true, ..Paused::default() });
        // No processes start: the cost is not theirs, and pausing their capture would not help.
        let mut q = pauses();
        q.off_cpu = false;
        assert_eq!(q.decide(&measured(0.02, 0.0, 0.02), activity(0, 0), BUDGET), Paused::default());
    }

    #[test]
    fn paused_sources_come_back_one_at_a_time_exec_captures_first() {
        let mut p = pauses();
        p.paused = Paused { off_cpu: true, exec_capture: true, ..Paused::default() };
        (p.switch_run_ns, p.process_ns) = (300.0, 100_000.0);
        // Quiet: both would fit, exec captures come back first, then off-CPU.
        let quiet = measured(0.001, 0.0, 0.001);
        assert_eq!(p.decide(&quiet, activity(100, 1), BUDGET), Paused { off_cpu: true, ..Paused::default() });
        assert_eq!(p.decide(&quiet, activity(100, 1), BUDGET), Paused::default());
    }

    #[test]
    fn exec_captures_that_had_to_be_paused_again_need_twice_the_room_to_come_back() {
        let mut p = pauses();
        p.off_cpu = false;
        // 27 processes a second: three intervals at 10%, and the pause decided in a cheaper
        // one (2%) still counts what the recent ones cost: 0.1 / 27 s a process.
        let busy = measured(0.1, 0.0, 0.1);
        p.decide(&busy, activity(0, 27), BUDGET);
        p.decide(&busy, activity(0, 27), BUDGET);
        assert!(p.decide(&measured(0.02, 0.0, 0.02), activity(0, 27), BUDGET).exec_capture);
        assert!((p.process_ns - 0.1 * 1e9 / 27.0).abs() < 1.0, "{}", p.process_ns);
        // Back when few processes start, paused again when they cost as much: twice the bar.
        assert!(!p.decide(&measured(0.002, 0.0, 0.002), activity(0, 0), BUDGET).exec_capture);
        for _ in 0..3 {
            p.decide(&busy, activity(0, 27), BUDGET);
        }
        assert!(p.paused.exec_capture);
        assert!((p.process_ns - 2.0 * 0.1 * 1e9 / 27.0).abs() < 1.0, "{}", p.process_ns);
    }

    #[test]
    fn a_burst_in_one_interval_does_not_pause_exec_captures() {
        let mut p = pauses();
        p.off_cpu = false;
        let calm = measured(0.002, 0.0, 0.002);
        p.decide(&calm, activity(0, 5), BUDGET);
        p.decide(&calm, activity(0, 5), BUDGET);
        // One interval at 2%: the median of the last three is still calm.
        assert_eq!(p.decide(&measured(0.02, 0.0, 0.02), activity(0, 100), BUDGET), Paused::default());
    }

    #[test]
    fn allocator_probes_come_out_for_good_when_their_traps_take_the_budget() {
        let mut p = pauses();
        p.off_cpu = false;
        // 0.5% of traps beside 0.2% of the rest fits under 1%: they stay.
        let fits = Measured { probes: 0.005, ..measured(0.007, 0.0, 0.002) };
        assert_eq!(p.decide(&fits, activity(0, 0), BUDGET), Paused::default());
        // 3% of traps: out, and they stay out when the cost falls with them.
        let dear = Measured { probes: 0.03, ..measured(0.032, 0.0, 0.002) };
        assert!(p.decide(&dear, activity(0, 0), BUDGET).alloc_probes);
        assert!(p.decide(&measured(0.002, 0.0, 0.002), activity(0, 0), BUDGET).alloc_probes);
    }
}
