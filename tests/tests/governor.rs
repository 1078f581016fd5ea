//! The overhead governor end to end: a switch-heavy workload on the whole host, a tiny CPU
//! budget, the real programs. What profiling costs, measured from /proc (the agent's threads'
//! CPU and its programs' run time), stays within the budget once the governor has settled;
//! the rates came down to get there; and the profiles still add up to the workload's wall
//! and CPU time, within their sampling error. Needs root.
use std::time::{Duration, Instant, SystemTime};

use ember_tests::{
    least_privilege_agent, require_root,
    usage::{bpf_usage, cpu_ns, sampled_range, BpfStats, HostTimes},
    Agent, Decoded, Fixture, FixtureRun, TempDir,
};

const FIXTURE: &str = env!("CARGO_BIN_EXE_fixture");
const BUDGET: f64 = 0.02;
const SECONDS: f64 = 24.0;
/// Two intervals (2 s) of warm-up, then a few for the governor to bring the cost under the
/// budget.
const SETTLE: Duration = Duration::from_secs(10);

/// What the agent has cost so far: its threads' CPU plus its programs' run time, in ns.
fn spent(pid: u32) -> u64 {
    cpu_ns(pid) + bpf_usage(pid).prog_run_ns
}

/// Runs `fixture` under the agent run with `args` (profiles to `out`), and measures what the
/// agent costs (`spent`) from SETTLE after the start to a second before the fixture's end.
/// Returns the agent, still running, what the fixture printed, the cost as a share of one
/// core, and the measured window.
fn run_measured(mut fixture: Fixture, args: &[&str], out: &std::path::Path) -> (Agent, FixtureRun, f64, (SystemTime, SystemTime)) {
    let mut agent = Agent::spawn(&[args, &["--output-dir", out.to_str().unwrap()]].concat());
    agent.wait_ready();
    fixture.start();
    let started = Instant::now();
    std::thread::sleep(SETTLE);
    let (from, spent_from, unix_from) = (Instant::now(), spent(agent.pid()), SystemTime::now());
    std::thread::sleep(Duration::from_secs_f64(SECONDS - 1.0).saturating_sub(started.elapsed()));
    let overhead = (spent(agent.pid()) - spent_from) as f64 / from.elapsed().as_nanos() as f64;
    let window = (unix_from, SystemTime::now());
    (agent, fixture.finish(), overhead, window)
}

/// The variance, in ns², of the on-CPU time of the samples labelled `label` in `profiles`.
/// Samples are Poisson counts, and the rates change between intervals: each interval adds its
/// time squared over its samples.
fn variance(profiles: &[Decoded], label: (&str, &str)) -> f64 {
    let of_interval = |p: &Decoded| {
        let samples = p.samples_labelled(label.0, label.1);
        let (records, ns) = (Decoded::sum(&samples, 0) as f64, Decoded::sum(&samples, 1) as f64);
        if records > 0.0 { ns * ns / records } else { 0.0 }
    };
    profiles.iter().map(of_interval).sum()
}

/// The variance, in ns², of the off-CPU time `off_cpu` holds for the thread labelled `label`,
/// off CPU `off_ns` in all. A block is recorded once in its interval's `ratio` and stands for
/// that many: the variance is the time off CPU times the mean block times the mean ratio
/// (weighted by time). Taken from the truth, not from the blocks recorded: at the highest
/// ratios a thread has a handful, and an interval that recorded none by chance would claim no
/// error at all.
fn off_cpu_variance(off_cpu: &[Decoded], label: (&str, &str), ratio: impl Fn(&Decoded) -> f64, off_ns: f64) -> f64 {
    // The mean block, from those recorded (most of them at the low ratios).
    let (mut blocks, mut blocked_ns, mut weighted, mut time) = (0.0, 0.0, 0.0, 0.0);
    for p in off_cpu {
        let samples = p.samples_labelled(label.0, label.1);
        blocks += Decoded::sum(&samples, 0) as f64 / ratio(p);
        blocked_ns += Decoded::sum(&samples, 1) as f64 / ratio(p);
        (weighted, time) = (weighted + ratio(p) * p.profile.duration_nanos as f64, time + p.profile.duration_nanos as f64);
    }
    if blocks == 0.0 || time == 0.0 {
        return 0.0;
    }
    off_ns * (blocked_ns / blocks) * (weighted / time)
}

#[test]
fn a_tiny_cpu_budget_holds_on_a_switch_heavy_host_and_totals_stay_true() {
    require_root();
    // The kernel's accounting of the programs' run time: the test's own measure, apart from
    // the one the programs take for the governor.
    let _stats = BpfStats::enable().expect("enabling kernel.bpf_stats_enabled");
    let dir = TempDir::new("governor");
    let out = dir.path("profiles");
    // 200 us busy per turn: some 9,000 context switches a second. Unchecked, profiling costs
    // about 1.5 times the budget (programs 2.6%, agent 0.2-0.7%); at the lowest rates the
    // programs still cost some 0.45% (they run at every switch, at 450 ns with the kernel's
    // accounting on). With a 1% budget, the governor's room (70% of it) less that floor and
    // the agent's own CPU was often nothing: it sat at the lowest rates, where a few recorded
    // blocks stand for a thread's whole time, and the totals below were chance.
    let fixture = Fixture::spawn_with(std::process::Command::new(FIXTURE), "pingpong", SECONDS, &["200"]);
    let pid = fixture.pid();
    let args = ["run", "--events", "cpu,offcpu", "-F", "999", "--interval", "2s", "--cpu-budget", "2%"];
    let host = HostTimes::now();
    let (agent, run, overhead, _) = run_measured(fixture, &args, &out);
    let steal = HostTimes::now().steal_since(&host);
    std::thread::sleep(Duration::from_millis(1500));
    agent.signal(libc::SIGINT);
    let stderr = agent.wait_success(Duration::from_secs(30));
    let mut wall = Decoded::read_kind(&out, "wall");
    wall.sort_by_key(|p| p.profile.time_nanos);
    // What the agent measured of itself, interval by interval, for the record.
    for p in &wall {
        let field = |key: &str| p.comment_field(key).unwrap_or("-").to_string();
        println!(
            "interval at {:.1}s: agent {} bpf {} frequency {} off-CPU ratio {}",
            (p.profile.time_nanos - wall[0].profile.time_nanos) as f64 / 1e9,
            field("ember.overhead.agent"), field("ember.overhead.bpf"), field("ember.frequency"), field("ember.off_cpu_ratio")
        );
    }
    println!("measured overhead {:.3}% of a core (budget {:.1}%); {:.1}% of the host's busy time stolen", overhead * 100.0, BUDGET * 100.0, steal * 100.0);
    assert!(overhead <= BUDGET, "profiling cost {:.3}% of a core, over the {:.1}% budget:\n{stderr}", overhead * 100.0, BUDGET * 100.0);

    // The workload is dear to profile unchecked: the governor had to lower the rates.
    let ratios: Vec<u32> = wall.iter().filter_map(|p| p.comment_field("ember.off_cpu_ratio")?.parse().ok()).collect();
    assert!(ratios.iter().any(|&r| r > 1), "the off-CPU ratio never came down: {ratios:?}\n{stderr}");
    assert!(wall.iter().all(|p| p.comment_field("ember.cpu_budget") == Some("0.0200")), "profiles do not carry the budget");
    // And the share of the host's busy time the hypervisor stole, interval by interval (all of
    // it, in a last interval of a few ms whose only clock tick was stolen).
    let stolen: Vec<f64> = wall.iter().filter_map(|p| p.comment_field("ember.host.cpu_steal")?.parse().ok()).collect();
    assert!(stolen.len() == wall.len() && stolen.iter().all(|s| (0.0..=1.0).contains(s)), "profiles do not carry the steal share: {stolen:?}");

    // Every sample counts for what it stands for: each thread's on- and off-CPU time adds
    // up to its wall time, and its on-CPU share is what a clock sampler sees of its busy
    // turns, with what the hypervisor stole (see sampled_range). Both are estimates
    // from samples: on a slow host the governor may go down to its lowest rates, where a
    // thread's on-CPU time rests on a few dozen samples. So each bound is the larger of a
    // fixed one and three standard errors of the estimates.
    let cpu = Decoded::read_kind(&out, "cpu");
    let off_cpu = Decoded::read_kind(&out, "offcpu");
    // An off-CPU profile counts a recorded block as its interval's ratio of blocks.
    let ratio = |p: &Decoded| p.comment_field("ember.off_cpu_ratio").and_then(|r| r.parse().ok()).expect("profiles carry the off-CPU ratio");
    assert_eq!(run.lines.len(), 2, "the fixture's threads: {:?}", run.lines);
    for line in &run.lines {
        let (tid, wall_ns, thread_cpu_ns, busy_ns) = (line[0].to_string(), line[1] as f64, line[2] as f64, line[4] as f64);
        let (low_ns, high_ns) = sampled_range(busy_ns, thread_cpu_ns, steal);
        let samples: Vec<_> = wall.iter().flat_map(|p| p.samples_labelled("tid", &tid)).collect();
        let on_cpu: Vec<_> = samples.iter().copied().filter(|s| s.labels.get("state").is_some_and(|v| v == "on-cpu")).collect();
        let (all_ns, on_ns) = (Decoded::sum(&samples, 0) as f64, Decoded::sum(&on_cpu, 0) as f64);
        let (var_on, var_off) = (variance(&cpu, ("tid", &tid)), off_cpu_variance(&off_cpu, ("tid", &tid), ratio, (wall_ns - low_ns).max(0.0)));
        let off_ns = all_ns - on_ns;
        println!(
            "thread {tid}: profiles {:.2} s ({:.2} s ± {:.2} on-CPU, {:.2} s ± {:.2} off), wall {:.2} s, busy {:.2} s, CPU {:.2} s",
            all_ns / 1e9, on_ns / 1e9, var_on.sqrt() / 1e9, off_ns / 1e9, var_off.sqrt() / 1e9, wall_ns / 1e9, busy_ns / 1e9, thread_cpu_ns / 1e9
        );
        let total_bound = (3.0 * (var_on + var_off).sqrt() / wall_ns).max(0.1);
        let error = (all_ns - wall_ns).abs() / wall_ns;
        assert!(error <= total_bound, "thread {tid}: profiles add up to {:.2} s, its wall time is {:.2} s (bound {total_bound:.3})", all_ns / 1e9, wall_ns / 1e9);
        let share = on_ns / all_ns;
        let share_bound = (3.0 * (off_ns * off_ns * var_on + on_ns * on_ns * var_off).sqrt() / (all_ns * all_ns)).max(0.05);
        let (low, high) = (low_ns / wall_ns, high_ns / wall_ns);
        assert!(
            share >= low - share_bound && share <= high + share_bound,
            "thread {tid}: on-CPU share {share:.3} in the profiles, {low:.3}-{high:.3} measured (bound {share_bound:.3})"
        );
    }
    let fixture_ns: i64 = cpu.iter().map(|p| Decoded::sum(&p.samples_of(pid), 1)).sum();
    let bound = (3.0 * variance(&cpu, ("pid", &pid.to_string())).sqrt() / 1e9 / run.cpu_seconds).max(0.1);
    let busy = run.lines.iter().map(|line| line[4] as f64 / 1e9).sum::<f64>();
    let (low, high) = sampled_range(busy, run.cpu_seconds, steal);
    let held = fixture_ns as f64 / 1e9;
    assert!(
        held >= low * (1.0 - bound) && held <= high * (1.0 + bound),
        "on-CPU profiles hold {held:.2} s of the fixture; its threads were busy {busy:.2} s and it used {:.2} s of CPU, {low:.2}-{high:.2} s with steal (bound {bound:.3})",
        run.cpu_seconds
    );
}

/// The budget deployed (deploy/agent.toml: 1%), with the unit's privileges (no root, its
/// capabilities) and the kernel's BPF accounting off, as on a host: the programs time
/// themselves, and the governor holds the cost within the budget. A ping-pong at some 2,000
/// switches a second, profiled on- and off-CPU at 999 Hz, costs more than 1% unchecked.
/// Without the kernel's accounting, the programs' cost is what the agent measured of them.
#[test]
fn the_deployed_budget_holds_with_the_units_privileges_and_no_bpf_stats() {
    require_root();
    let _stats = BpfStats::disable().expect("turning kernel.bpf_stats_enabled off");
    let dir = TempDir::new("governor-unit");
    std::fs::set_permissions(&dir.0, std::os::unix::fs::PermissionsExt::from_mode(0o777)).expect("opening the temp dir to the agent's user");
    let out = dir.path("profiles");
    let mut fixture = Fixture::spawn_with(std::process::Command::new(FIXTURE), "pingpong", SECONDS, &["1000"]);
    let mut command = least_privilege_agent();
    command.args(["run", "--events", "cpu,offcpu", "-F", "999", "--interval", "2s", "--cpu-budget", "1%", "--output-dir", out.to_str().unwrap()]);
    let mut agent = Agent::spawn_command(command);
    agent.wait_ready();
    fixture.start();
    let started = Instant::now();
    std::thread::sleep(SETTLE);
    let (from, cpu_from, unix_from) = (Instant::now(), cpu_ns(agent.pid()), std::time::SystemTime::now());
    std::thread::sleep(Duration::from_secs_f64(SECONDS - 1.0).saturating_sub(started.elapsed()));
    let agent_share = (cpu_ns(agent.pid()) - cpu_from) as f64 / from.elapsed().as_nanos() as f64;
    fixture.finish();
    agent.signal(libc::SIGINT);
    let stderr = agent.wait_success(Duration::from_secs(30));
    let since = unix_from.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
    let field = |p: &Decoded, key: &str| p.comment_field(key).and_then(|v| v.parse::<f64>().ok());
    let wall = Decoded::read_kind(&out, "wall");
    let window: Vec<&Decoded> = wall.iter().filter(|p| p.profile.time_nanos >= since && field(p, "ember.overhead.bpf").is_some()).collect();
    assert!(window.len() >= 4, "{} intervals in the window:\n{stderr}", window.len());
    let bpf_share = window.iter().filter_map(|p| field(p, "ember.overhead.bpf")).sum::<f64>() / window.len() as f64;
    let ratios: Vec<f64> = wall.iter().filter_map(|p| field(p, "ember.off_cpu_ratio")).collect();
    let frequencies: Vec<f64> = wall.iter().filter_map(|p| field(p, "ember.frequency")).collect();
    println!("agent {:.3}% + programs {:.3}% of a core (budget 1%); off-CPU ratios {ratios:?}, frequencies {frequencies:?}", agent_share * 100.0, bpf_share * 100.0);
    assert!(bpf_share > 0.0, "the programs measured no run time of their own:\n{stderr}");
    assert!(ratios.iter().any(|&r| r > 1.0) || frequencies.iter().any(|&f| f < 999.0), "the rates never came down: {ratios:?} {frequencies:?}");
    assert!(agent_share + bpf_share <= 0.01, "profiling cost {:.3}% of a core, over the 1% budget:\n{stderr}", (agent_share + bpf_share) * 100.0);
}

/// At the lowest rate (1 Hz) the sampler's clock ticks once a second on every CPU. The
/// governor sets that rate during a drain, so the ticks fall at a fixed point of each
/// interval: drains there would find every tick while the agent itself runs, and sample it
/// (or nothing: the kernel skips the sampling program while a map update is under way)
/// instead of the workload. With every CPU busy with the workload, nearly every tick must
/// find it.
#[test]
fn at_the_lowest_rate_ticks_do_not_fall_in_step_with_the_drains() {
    require_root();
    let dir = TempDir::new("governor-ticks");
    let out = dir.path("profiles");
    let cpus = std::thread::available_parallelism().unwrap().get();
    let mut fixtures: Vec<Fixture> = (0..cpus).map(|_| Fixture::spawn(FIXTURE, "split", 20.0)).collect();
    // A budget the agent's own CPU exceeds: the governor goes to the lowest rates at once.
    let args = ["run", "--events", "cpu", "-F", "999", "--interval", "1s", "--cpu-budget", "0.05%"];
    let mut agent = Agent::spawn(&[&args[..], &["--output-dir", out.to_str().unwrap()]].concat());
    agent.wait_ready();
    fixtures.iter_mut().for_each(Fixture::start);
    let pids: Vec<String> = fixtures.iter().map(|f| f.pid().to_string()).collect();
    for fixture in fixtures {
        fixture.finish();
    }
    agent.signal(libc::SIGINT);
    agent.wait_success(Duration::from_secs(30));
    let mut cpu = Decoded::read_kind(&out, "cpu");
    cpu.sort_by_key(|p| p.profile.time_nanos);
    // Whole intervals at 1 Hz, after the one the rate changed in.
    let at_floor: Vec<&Decoded> = cpu.iter().filter(|p| p.comment_field("ember.frequency") == Some("1")).skip(1).collect();
    let (samples, seconds): (i64, f64) = at_floor[..at_floor.len().saturating_sub(1)]
        .iter()
        .map(|p| (pids.iter().map(|pid| Decoded::total(&p.samples_labelled("pid", pid))).sum::<i64>(), p.profile.duration_nanos as f64 / 1e9))
        .fold((0, 0.0), |(n, s), (dn, ds)| (n + dn, s + ds));
    let ticks = seconds * cpus as f64;
    println!("{} intervals at 1 Hz: {samples} samples of the workload in {ticks:.1} CPU-seconds", at_floor.len());
    assert!(seconds >= 10.0, "only {seconds:.1} s at 1 Hz: the governor did not go to the lowest rate");
    assert!(samples as f64 >= 0.9 * ticks, "{samples} samples of the workload in {ticks:.1} CPU-seconds of 1 Hz ticks");
}

/// A switch rate at which the off-CPU program's runs alone, recording nothing, cost more than
/// the budget: both ping-pong threads pinned to one CPU, some 400,000 switches a second here
/// (some 20% of a core in the programs unchecked). No rate is low enough: the governor pauses
/// off-CPU tracking, says so in the profiles, counts the switches it did not see, keeps the
/// cost within the budget, and brings tracking back once the workload ends.
#[test]
fn off_cpu_tracking_pauses_when_switches_alone_take_the_budget_and_comes_back() {
    require_root();
    let _stats = BpfStats::enable().expect("enabling kernel.bpf_stats_enabled");
    let dir = TempDir::new("governor-pause");
    let out = dir.path("profiles");
    let mut pinned = std::process::Command::new("taskset");
    pinned.args(["-c", "0", FIXTURE]);
    let fixture = Fixture::spawn_with(pinned, "pingpong", SECONDS, &["0"]);
    let args = ["run", "--events", "cpu,offcpu", "-F", "999", "--interval", "1s", "--cpu-budget", "1%"];
    let (agent, _, overhead, (unix_from, unix_to)) = run_measured(fixture, &args, &out);
    let paused = |p: &Decoded| p.comment_field("ember.paused").is_some_and(|v| v.split(',').any(|what| what == "off_cpu"));
    let blocks = |p: &Decoded| p.comment_field("ember.counter.off_cpu_blocks").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let wall = || {
        let mut wall = Decoded::read_kind(&out, "wall");
        wall.sort_by_key(|p| p.profile.time_nanos);
        wall
    };
    // The workload is gone: the quiet host is measured, tracking attached again, and its
    // sampling ratio raised back from the paused one (a few intervals), until it records
    // blocks again. At most 20 s.
    let back = Instant::now() + Duration::from_secs(20);
    while Instant::now() < back {
        std::thread::sleep(Duration::from_secs(1));
        let wall = wall();
        if wall.iter().rposition(paused).is_some_and(|last| wall.len() - last > 2 && wall[last + 1..].iter().any(|p| blocks(p) > 0)) {
            break;
        }
    }
    agent.signal(libc::SIGINT);
    let stderr = agent.wait_success(Duration::from_secs(30));
    let nanos = |t: SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
    let wall = wall();
    let unseen = |p: &Decoded| p.comment_field("ember.unseen.context_switches").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    for p in &wall {
        println!(
            "interval at {:.1}s: agent {} bpf {} paused {:?} unseen switches {}",
            (p.profile.time_nanos - wall[0].profile.time_nanos) as f64 / 1e9,
            p.comment_field("ember.overhead.agent").unwrap_or("-"), p.comment_field("ember.overhead.bpf").unwrap_or("-"),
            p.comment_field("ember.paused").unwrap_or("-"), unseen(p)
        );
    }
    println!("measured overhead {:.3}% of a core (budget 1%)", overhead * 100.0);
    let window: Vec<&Decoded> = wall.iter().filter(|p| p.profile.time_nanos >= nanos(unix_from) && p.profile.time_nanos + p.profile.duration_nanos <= nanos(unix_to)).collect();
    assert!(window.len() >= 8, "{} intervals in the window:\n{stderr}", window.len());
    assert!(window.iter().all(|p| paused(p)), "off-CPU tracking was not paused throughout the window:\n{stderr}");
    // Each interval counts the host's switches it did not see: the workload's alone are
    // hundreds of thousands a second.
    assert!(window.iter().all(|p| unseen(p) > 10_000), "paused intervals counted no unseen switches");
    assert!(stderr.contains("off-CPU tracking paused"), "no warning said so:\n{stderr}");
    assert!(overhead <= 0.01, "profiling cost {:.3}% of a core, over the 1% budget:\n{stderr}", overhead * 100.0);
    // Tracking came back on the quiet host, and recorded blocks again.
    let last = wall.iter().rposition(paused).expect("no interval was paused");
    let after = &wall[last + 1..];
    assert!(stderr.contains("off-CPU tracking resumed") && after.len() >= 2, "off-CPU tracking did not come back ({} intervals after the last paused one):\n{stderr}", after.len());
    assert!(after.iter().all(|p| unseen(p) == 0), "intervals after the pause counted unseen switches");
    assert!(after.iter().any(|p| blocks(p) > 0), "no off-CPU block was recorded within 20 s once tracking came back:\n{stderr}");
}

/// The faults group under the budget: a process that faults in fresh memory all the time
/// (some 500,000 faults a second here) costs a quarter of a core sampled at every fault. The
/// governor lengthens the period until the cost is within the budget, and the profiles still
/// add up to the pages the process touched: each sample carries its own period.
#[test]
fn a_fault_heavy_process_is_sampled_within_the_budget_and_its_faults_add_up() {
    require_root();
    let _stats = BpfStats::enable().expect("enabling kernel.bpf_stats_enabled");
    let dir = TempDir::new("governor-faults");
    let out = dir.path("profiles");
    let fixture = Fixture::spawn_with(std::process::Command::new(FIXTURE), "fault-loop", SECONDS, &[]);
    let pid = fixture.pid();
    let args = ["run", "--events", "faults", "--fault-period", "1", "--interval", "2s", "--cpu-budget", "1%"];
    let (agent, run, overhead, _) = run_measured(fixture, &args, &out);
    std::thread::sleep(Duration::from_millis(1500));
    agent.signal(libc::SIGINT);
    let stderr = agent.wait_success(Duration::from_secs(30));
    let mut faults = Decoded::read_kind(&out, "faults");
    faults.sort_by_key(|p| p.profile.time_nanos);
    let ratio = |p: &Decoded| p.comment_field("ember.fault_ratio").and_then(|r| r.parse::<u64>().ok()).expect("profiles carry the fault ratio");
    for p in &faults {
        let samples = p.samples_of(pid);
        println!(
            "interval at {:.1}s: agent {} bpf {} fault ratio {}: {} faults, {:.0} MiB",
            (p.profile.time_nanos - faults[0].profile.time_nanos) as f64 / 1e9,
            p.comment_field("ember.overhead.agent").unwrap_or("-"), p.comment_field("ember.overhead.bpf").unwrap_or("-"),
            ratio(p), Decoded::sum(&samples, 0), Decoded::sum(&samples, 1) as f64 / 1048576.0
        );
    }
    println!("measured overhead {:.3}% of a core (budget 1%)", overhead * 100.0);
    assert!(faults.iter().any(|p| ratio(p) > 10), "the fault sampling was never narrowed: {:?}\n{stderr}", faults.iter().map(ratio).collect::<Vec<_>>());
    assert!(overhead <= 0.01, "profiling cost {:.3}% of a core, over the 1% budget:\n{stderr}", overhead * 100.0);

    // Faults are sampled every period on each CPU: an interval's count is off by under a
    // period a CPU, and a change of period loses under one too. So the bound is a few
    // longest periods, and 2% at least.
    let touched = (run.lines[0][0] * 4096) as f64;
    let bytes: i64 = faults.iter().map(|p| Decoded::sum(&p.samples_of(pid), 1)).sum();
    let longest = faults.iter().map(ratio).max().unwrap_or(1) as f64 * 4096.0;
    let bound = (0.02 * touched).max(faults.len() as f64 * 2.0 * longest);
    println!("faults hold {:.0} MiB; the fixture touched {:.0} MiB (bound {:.0} MiB)", bytes as f64 / 1048576.0, touched / 1048576.0, bound / 1048576.0);
    assert!((bytes as f64 - touched).abs() <= bound, "the fixture's faults add up to {:.0} MiB; it touched {:.0} MiB", bytes as f64 / 1048576.0, touched / 1048576.0);
}
