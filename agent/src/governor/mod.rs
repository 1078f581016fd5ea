//! The overhead governor: keeps what profiling costs (the agent's CPU plus its BPF programs'
//! run time) within a budget, a share of one core. Once per interval it measures what each
//! source (on-CPU sampling, off-CPU tracking, network events, the faults group) cost in the runs that recorded
//! something, the part its rate scales; the rest (the agent's own CPU, runs that recorded
//! nothing) is fixed as far as rates go. Over budget, it cuts the dearest sources first, down
//! to an equal share of what the fixed part leaves; with room to spare it raises them back.
//! It only changes rates: every sample keeps counting for what it stands for. What no rate
//! lowers, it pauses while it alone would take the budget (`pauses`).
mod pauses;

use std::time::Instant;

use agent_common::{counter, run};
use anyhow::Result;

use crate::{
    kernel::{HostActivity, Overhead, ProgramCost, Sampler, SamplingRates},
    governor::pauses::{Measured, Pauses},
    ops::metrics,
    resolve::ResolvedInterval,
};

/// Rates never fall below 1/MAX_CUT of the configured ones (1 Hz at least).
const MAX_CUT: f64 = 10_000.0;
/// The sources, in `run`'s order: on-CPU, off-CPU, network, faults.
const SOURCES: usize = run::SOURCES as usize;
/// Above CUT of the budget, cut to TARGET of it; raise rates only while the sources take
/// under LOW/TARGET of the room TARGET leaves beside the fixed part (under LOW of the budget
/// when nothing is fixed), by at most RAISE an interval, and never past TARGET. The room, not
/// the budget: the agent's own cost at 999 Hz, about half the budget on a quiet host, would
/// otherwise keep rates cut for good once a busy spell ended. The margin under the budget
/// covers the drift of costs within an interval. After a cut, costs settle above the target (at lower rates a
/// sample finds colder caches): 84-86% of the budget in the governor test, where a cut only
/// above 90% left 10% of drift before the budget.
const CUT: f64 = 0.8;
const TARGET: f64 = 0.7;
const LOW: f64 = 0.5;
const RAISE: f64 = 4.0;
/// The fixed part is judged on the median of the last few intervals: a burst of new
/// processes is no reason to cut rates, which cannot lower it.
const FIXED_HISTORY: usize = 3;
/// Intervals that set no rates: the agent reads every process, then names their binaries.
const WARM_UP: u32 = 2;
/// What a program run costs beyond what its own clock shows (entering and leaving it, the
/// clock reads), when the kernel's accounting is off. Measured on this VM kind at some 270 ns
/// a run (with the accounting on), where a switch-heavy host's runs record nothing in 200:
/// there it is most of the cost. Lower on bare metal, where it only makes the governor careful.
const ASSUMED_MISS_NS: f64 = 250.0;
/// The weight of the past in the measured miss, per interval.
const MISS_MEMORY: f64 = 0.8;

/// What one source's programs measured of themselves over an interval.
#[derive(Clone, Copy, Debug, Default)]
struct SourceRuns {
    recorded_ns: u64,
    recorded: u64,
    skipped_ns: u64,
    skipped: u64,
}

/// The governor of one running agent.
pub struct Governor {
    budget: f64,
    /// The configured rates: the most the governor allows.
    base: SamplingRates,
    /// Whether the on-CPU frequency may change: only clock events' samples carry their time.
    frequency_governed: bool,
    /// Each source's share of its configured rate, in [1/MAX_CUT, 1].
    levels: [f64; SOURCES],
    /// When the last interval was measured, and the agent's CPU time then (ns).
    last: (Instant, u64),
    /// The fixed part of the last intervals.
    fixed: Recent,
    /// The kernel's accounting at the last interval, if it is on.
    kernel: Option<ProgramCost>,
    /// What the kernel accounted beyond the programs' own clock (ns), and over how many
    /// runs, with past intervals fading: the miss per run.
    missed: (f64, f64),
    over_budget: bool,
    pauses: Pauses,
    /// Intervals measured so far: the first WARM_UP pay for reading every process and naming
    /// its binaries once, and set no rates.
    measured: u32,
}

impl Governor {
    /// `budget`: a share of one core (0.01 is 1%). The programs must time themselves
    /// (`KernelSettings::measure_run_time`).
    pub fn start(budget: f64, sampler: &Sampler, frequency_governed: bool) -> Governor {
        metrics::set("ember_cpu_budget_ratio", &[], budget);
        Governor {
            budget,
            base: sampler.rates(),
            frequency_governed,
            levels: [1.0; SOURCES],
            last: (Instant::now(), process_cpu_ns()),
            fixed: Recent::default(),
            kernel: sampler.program_cost(),
            missed: (0.0, 0.0),
            over_budget: false,
            pauses: Pauses::new(sampler.tracks_off_cpu()),
            measured: 0,
        }
    }

    /// Measures the interval just drained, notes its cost in it, and sets the next
    /// interval's rates.
    pub fn govern(&mut self, sampler: &mut Sampler, interval: &mut ResolvedInterval) -> Result<()> {
        let slot = |source: u32, slot: u32| interval.counter(counter::RUN_NS + run::SLOTS * source + slot);
        let runs = [run::ON_CPU, run::OFF_CPU, run::NET, run::FAULTS].map(|source| SourceRuns {
            recorded_ns: slot(source, run::RECORDED_NS),
            recorded: slot(source, run::RECORDED_RUNS),
            skipped_ns: slot(source, run::SKIPPED_NS),
            skipped: slot(source, run::SKIPPED_RUNS),
        });
        // Each allocation call traps twice (entry and return), each free once; some hits
        // also step an instruction.
        let traps = 2 * interval.counter(counter::ALLOC_CALLS) + interval.counter(counter::FREE_CALLS) + interval.counter(counter::SAMPLED_PATH_HITS);
        let steps = interval.counter(counter::PROBE_STEPS);
        let probes_ns = sampler.alloc_trap_costs().map_or(0.0, |c| c.trap_ns * traps as f64 + c.step_ns * steps as f64);
        let (overhead, rates) = self.observe(runs, sampler.program_cost(), probes_ns, interval.host);
        interval.overhead = Some(overhead);
        if self.pauses.paused.alloc_probes && sampler.probes_allocators() {
            sampler.unprobe_allocators()?;
        }
        if let Some(rates) = rates {
            tracing::info!(
                cost = format!("{:.2}%", overhead.total() * 100.0), frequency = rates.frequency,
                off_cpu_ratio = rates.off_cpu_ratio, net_ratio = rates.net_ratio, fault_ratio = rates.fault_ratio,
                "sampling rates changed for the CPU budget"
            );
            sampler.set_rates(rates)?;
            publish(rates);
        }
        Ok(())
    }

    /// Measures the interval that just ended from what the programs measured of themselves
    /// and, if it is on, the kernel's accounting so far, given what the host did. Returns the
    /// interval's overhead and the rates for the next interval, if they change.
    fn observe(&mut self, runs: [SourceRuns; SOURCES], kernel: Option<ProgramCost>, probes_ns: f64, host: HostActivity) -> (Overhead, Option<SamplingRates>) {
        let now = (Instant::now(), process_cpu_ns());
        let wall = now.0.duration_since(self.last.0).as_nanos().max(1) as f64;
        let (miss_ns, other_ns) = self.miss(&runs, kernel);
        let costs = runs.map(|r| (r.recorded_ns as f64 + r.recorded as f64 * miss_ns) / wall);
        let agent = now.1.saturating_sub(self.last.1) as f64 / wall;
        let unrecorded = runs.map(|r| (r.skipped_ns as f64 + r.skipped as f64 * miss_ns) / wall);
        let skipped = unrecorded.iter().sum::<f64>() + other_ns / wall;
        let unseen = self.pauses.unseen(host);
        let probes = probes_ns / wall;
        let overhead = Overhead { budget: self.budget, agent, bpf: costs.iter().sum::<f64>() + skipped, probes, unseen };
        self.last = now;
        metrics::set("ember_overhead_ratio", &[("part", "agent")], overhead.agent);
        metrics::set("ember_overhead_ratio", &[("part", "bpf")], overhead.bpf);
        metrics::set("ember_overhead_ratio", &[("part", "probes")], overhead.probes);
        metrics::add("ember_unseen_total", &[("what", "context_switches")], unseen.switches as f64);
        metrics::add("ember_unseen_total", &[("what", "processes_started")], unseen.processes as f64);

        self.measured += 1;
        let before = self.rates();
        let off_cpu = runs[run::OFF_CPU as usize];
        let warm_up = self.measured <= WARM_UP;
        let measured = Measured {
            total: overhead.total(),
            agent,
            switch_run_ns: if off_cpu.skipped > 0 { off_cpu.skipped_ns as f64 / off_cpu.skipped as f64 } else { 0.0 } + miss_ns,
            switch_runs_per_s: (off_cpu.skipped + off_cpu.recorded) as f64 * 1e9 / wall,
            rest: skipped - unrecorded[run::OFF_CPU as usize] + if warm_up { 0.0 } else { agent },
            probes,
            warm_up,
        };
        let paused = self.pauses.decide(&measured, host, self.budget);
        if paused.off_cpu {
            // It comes back at the lowest rate, and rises as there is room.
            self.levels[run::OFF_CPU as usize] = 1.0 / MAX_CUT;
        }
        for (what, on) in [("off_cpu", paused.off_cpu), ("exec_capture", paused.exec_capture), ("alloc_probes", paused.alloc_probes)] {
            metrics::set("ember_paused", &[("what", what)], f64::from(u8::from(on)));
        }
        if warm_up {
            let after = self.rates();
            return (overhead, (after != before).then_some(after));
        }
        self.fixed.push(agent + skipped);
        let steady_fixed = self.fixed.median();
        let mut levels = next_levels(self.levels, costs, steady_fixed, overhead.total(), self.budget, self.frequency_governed);
        if paused.off_cpu {
            levels[run::OFF_CPU as usize] = self.levels[run::OFF_CPU as usize];
        }
        self.levels = levels;
        let after = self.rates();
        let at_floor = self.levels.iter().zip(costs).all(|(level, cost)| cost == 0.0 || *level <= 1.0 / MAX_CUT);
        let over = overhead.total() > self.budget && (at_floor || steady_fixed >= self.budget);
        if over != self.over_budget {
            self.over_budget = over;
            if over {
                let percent = |share: f64| format!("{:.2}%", share * 100.0);
                tracing::warn!(
                    cost = percent(overhead.total()), budget = percent(self.budget), agent = percent(agent),
                    programs_recording_nothing = percent(skipped), paused = %paused.names(),
                    "profiling costs more than the CPU budget even at the lowest rates"
                );
            }
        }
        metrics::set("ember_over_cpu_budget", &[], f64::from(u8::from(over)));
        (overhead, (after != before).then_some(after))
    }

    /// What a run costs beyond what the programs' own clock shows (ns), and what the programs
    /// that do not time themselves cost over the interval (ns). From the kernel's accounting
    /// when it is on, over the last few intervals (MISS_MEMORY): the programs' counters and
    /// the kernel's cover slightly different windows. The first interval's counters reach
    /// back to when the programs were attached, before the governor's first reading.
    fn miss(&mut self, runs: &[SourceRuns; SOURCES], kernel: Option<ProgramCost>) -> (f64, f64) {
        let (Some(now), Some(last)) = (kernel, self.kernel) else { return (ASSUMED_MISS_NS, 0.0) };
        self.kernel = Some(now);
        let own_ns: u64 = runs.iter().map(|r| r.recorded_ns + r.skipped_ns).sum();
        if self.measured > 0 {
            let missed = now.timed_ns.saturating_sub(last.timed_ns) as f64 - own_ns as f64;
            let runs = now.timed_runs.saturating_sub(last.timed_runs) as f64;
            self.missed = (self.missed.0 * MISS_MEMORY + missed, self.missed.1 * MISS_MEMORY + runs);
        }
        let miss = if self.missed.1 > 0.0 { (self.missed.0 / self.missed.1).max(0.0) } else { ASSUMED_MISS_NS };
        (miss, now.other_ns.saturating_sub(last.other_ns) as f64)
    }

    /// The rates the levels stand for.
    pub fn rates(&self) -> SamplingRates {
        let ratio = |base: u32, level: f64| ((f64::from(base.max(1)) / level).ceil() as u32).max(1);
        SamplingRates {
            frequency: if self.frequency_governed {
                ((self.base.frequency as f64 * self.levels[0]).round() as u64).max(1)
            } else {
                self.base.frequency
            },
            off_cpu_ratio: ratio(self.base.off_cpu_ratio, self.levels[1]),
            net_ratio: ratio(self.base.net_ratio, self.levels[2]),
            fault_ratio: ratio(self.base.fault_ratio, self.levels[3]),
            paused: self.pauses.paused,
        }
    }
}

/// The last FIXED_HISTORY values of a measure, judged by their median: one interval's may be
/// a burst.
#[derive(Default)]
struct Recent(Vec<f64>);

impl Recent {
    fn push(&mut self, value: f64) {
        if self.0.len() == FIXED_HISTORY {
            self.0.remove(0);
        }
        self.0.push(value);
    }

    fn is_full(&self) -> bool {
        self.0.len() == FIXED_HISTORY
    }

    fn median(&self) -> f64 {
        let mut sorted = self.0.clone();
        sorted.sort_by(f64::total_cmp);
        sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
    }
}

/// The rates in force, as metrics.
pub fn publish(rates: SamplingRates) {
    metrics::set("ember_sampling_frequency_hz", &[], rates.frequency as f64);
    metrics::set("ember_sampling_ratio", &[("source", "off_cpu")], f64::from(rates.off_cpu_ratio));
    metrics::set("ember_sampling_ratio", &[("source", "net")], f64::from(rates.net_ratio));
    metrics::set("ember_sampling_ratio", &[("source", "faults")], f64::from(rates.fault_ratio));
}

/// The levels for the next interval. Each source's cost is taken as proportional to its
/// level, so its cost at full rate is `cost / level`. The room TARGET of the budget leaves
/// beside `fixed` is shared by water filling: sources whose full cost fits an equal share
/// keep it, the dearer ones are capped at an equal share of the rest. Above CUT of the
/// budget (`total`), the levels go to that share at once; well within the room, they rise
/// towards it by at most RAISE a time (a cost measured at a low rate is a rough guide); in
/// between they stay.
fn next_levels(levels: [f64; SOURCES], costs: [f64; SOURCES], fixed: f64, total: f64, budget: f64, frequency_governed: bool) -> [f64; SOURCES] {
    let governed = |i: usize| (i != 0 || frequency_governed) && costs[i] > 0.0;
    let full = std::array::from_fn::<f64, SOURCES, _>(|i| costs[i] / levels[i]);
    let mut room = (TARGET * budget - fixed - (0..SOURCES).filter(|&i| !governed(i)).map(|i| costs[i]).sum::<f64>()).max(0.0);
    let mut dear: Vec<usize> = (0..SOURCES).filter(|&i| governed(i)).collect();
    dear.sort_by(|&a, &b| full[a].total_cmp(&full[b]));
    while let Some(&cheapest) = dear.first() {
        if full[cheapest] * dear.len() as f64 > room {
            break;
        }
        room -= full[cheapest];
        dear.remove(0);
    }
    let cap = room / dear.len().max(1) as f64;
    let rising = total - fixed < LOW / TARGET * (TARGET * budget - fixed);
    let mut next = levels;
    // A cut source that recorded nothing costs nothing: it goes back up when there is room.
    for i in (0..SOURCES).filter(|&i| (i != 0 || frequency_governed) && costs[i] == 0.0 && rising) {
        next[i] = (levels[i] * RAISE).min(1.0);
    }
    for i in (0..SOURCES).filter(|&i| governed(i)) {
        let share = if dear.contains(&i) { (cap / full[i]).clamp(1.0 / MAX_CUT, 1.0) } else { 1.0 };
        if total > CUT * budget {
            next[i] = share.min(levels[i]);
        } else if rising {
            next[i] = share.min(levels[i] * RAISE).max(levels[i]);
        }
    }
    next
}

/// CPU time of every thread of the agent, in ns.
fn process_cpu_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: f64 = 0.01;

    /// `next_levels` with the total the costs and the fixed part add up to.
    fn next(levels: [f64; SOURCES], costs: [f64; SOURCES], fixed: f64, frequency_governed: bool) -> [f64; SOURCES] {
        next_levels(levels, costs, fixed, fixed + costs.iter().sum::<f64>(), BUDGET, frequency_governed)
    }

    fn governor(kernel: Option<ProgramCost>) -> Governor {
        Governor {
            budget: BUDGET,
            base: SamplingRates { frequency: 999, off_cpu_ratio: 1, net_ratio: 1, ..SamplingRates::default() },
            frequency_governed: true,
            levels: [1.0; SOURCES],
            last: (Instant::now(), 0),
            fixed: Recent::default(),
            kernel,
            missed: (0.0, 0.0),
            over_budget: false,
            pauses: Pauses::new(true),
            measured: 0,
        }
    }

    #[test]
    fn the_miss_per_run_is_what_the_kernel_accounts_beyond_the_programs_clock() {
        let cost = |timed_ns, timed_runs, other_ns| Some(ProgramCost { timed_ns, timed_runs, other_ns });
        let mut runs = [SourceRuns::default(); SOURCES];
        runs[0] = SourceRuns { recorded_ns: 1_000, recorded: 10, skipped_ns: 9_000, skipped: 90 };
        let mut g = governor(cost(0, 0, 0));
        // The first interval's counters reach back before the governor's first reading.
        assert_eq!(g.miss(&runs, cost(5_000, 100, 7)), (ASSUMED_MISS_NS, 7.0));
        g.measured = 1;
        // 30 us accounted over 100 runs the programs timed at 10 us: 200 ns a run.
        assert_eq!(g.miss(&runs, cost(35_000, 200, 7)), (200.0, 0.0));
        // It fades: the next interval's 400 ns a run weighs more than the last one's.
        let (miss, _) = g.miss(&runs, cost(85_000, 300, 7));
        assert!(miss > 300.0 && miss < 400.0, "{miss}");
        // Without the kernel's accounting, a run is taken to miss ASSUMED_MISS_NS.
        assert_eq!(governor(None).miss(&runs, None), (ASSUMED_MISS_NS, 0.0));
    }

    #[test]
    fn over_budget_the_dearest_source_is_cut_first_and_the_cheap_one_kept() {
        // On-CPU costs 0.3%, off-CPU 4%: of the 0.7% target, on-CPU keeps its 0.3%, off-CPU
        // gets the remaining 0.4%, a tenth of its cost.
        let levels = next([1.0; SOURCES], [0.003, 0.04, 0.0, 0.0], 0.0, true);
        assert_eq!(levels[0], 1.0);
        assert!((levels[1] - 0.1).abs() < 1e-9, "{levels:?}");
        assert_eq!(levels[2], 1.0);
    }

    #[test]
    fn a_costly_faults_group_is_cut_to_its_share_and_records_one_event_in_its_ratio() {
        // Page faults cost 7%, on-CPU 0.1%: the faults group gets the 0.6% left, 1/11.7 of its rate.
        let levels = next([1.0; SOURCES], [0.001, 0.0, 0.0, 0.07], 0.0, true);
        assert_eq!(levels[..3], [1.0; 3]);
        assert!((levels[3] - 0.006 / 0.07).abs() < 1e-9, "{levels:?}");
        let mut g = governor(None);
        g.levels = levels;
        assert_eq!(g.rates().fault_ratio, 12, "one event in 11.7, rounded up");
    }

    #[test]
    fn sources_dearer_than_an_equal_share_share_the_room_equally() {
        // Full costs 2% and 4% (at level 0.5); room 0.7% - 0.1% fixed - 0.1% net: 0.25% each.
        let levels = next([1.0, 0.5, 1.0, 1.0], [0.02, 0.02, 0.001, 0.0], 0.001, true);
        assert!((levels[0] - 0.125).abs() < 1e-9 && (levels[1] - 0.0625).abs() < 1e-9, "{levels:?}");
        assert_eq!(levels[2], 1.0);
    }

    #[test]
    fn a_fixed_frequency_is_never_cut_and_the_others_make_room_for_it() {
        let levels = next([1.0; SOURCES], [0.006, 0.01, 0.0, 0.0], 0.0, false);
        assert_eq!(levels[0], 1.0);
        assert!((levels[1] - 0.1).abs() < 1e-9, "{levels:?}");
    }

    #[test]
    fn with_no_room_beside_the_fixed_part_every_source_goes_to_the_floor() {
        assert_eq!(next([1.0; SOURCES], [0.5, 0.5, 0.5, 0.5], 0.02, true), [1.0 / MAX_CUT; SOURCES]);
    }

    #[test]
    fn well_under_budget_levels_rise_by_at_most_raise_and_never_past_the_target() {
        // On-CPU at 1% of its rate costs 0.01%: its full cost, 1%, does not fit the 0.7%
        // target; it rises by RAISE. At 40% (full cost 1%) it rises to 70%, not beyond.
        let levels = next([0.01, 0.1, 1.0, 1.0], [0.0001, 0.0, 0.0, 0.0], 0.001, true);
        assert!((levels[0] - 0.01 * RAISE).abs() < 1e-9, "{levels:?}");
        assert_eq!(levels[1], 0.1 * RAISE, "a source that recorded nothing rises too");
        let levels = next([0.4, 1.0, 1.0, 1.0], [0.004, 0.0, 0.0, 0.0], 0.0, true);
        assert!((levels[0] - 0.7).abs() < 1e-9, "{levels:?}");
    }

    #[test]
    fn beside_an_agent_that_takes_half_the_budget_cut_rates_rise_again() {
        // A quiet host after a busy spell: the agent alone takes 0.55% (999 Hz in 1 s
        // intervals), the sources at the floor 0.01%. The total is over half the budget, yet
        // the sources use a tenth of the 0.15% the target leaves them.
        let floor = 1.0 / MAX_CUT;
        let levels = next([floor; SOURCES], [0.0001, 0.0, 0.0, 0.0], 0.0055, true);
        assert!(levels.iter().all(|&l| (l - floor * RAISE).abs() < 1e-12), "{levels:?}");
        // Once they use most of that room, they stay.
        let levels = [0.5, 0.25, 1.0, 1.0];
        assert_eq!(next(levels, [0.0008, 0.0004, 0.0, 0.0], 0.0055, true), levels);
    }

    #[test]
    fn between_low_and_cut_nothing_changes() {
        let levels = [0.5, 0.25, 1.0, 1.0];
        assert_eq!(next(levels, [0.003, 0.003, 0.0, 0.0], 0.001, true), levels);
    }
}
