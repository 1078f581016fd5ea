//! On-CPU profiling end to end: real BPF programs in the real kernel, real processes with a
//! known call structure, real pprof files. Needs root; fails loudly without it.
use std::{path::Path, process::Command, time::Duration};

use ember_tests::{
    compile_c, folded_total, held, record_fixtures, release, require_root, spin_c, Agent, Decoded, Fixture, FixtureRun, Sample, TempDir,
    TestCgroups,
};

const FIXTURE: &str = env!("CARGO_BIN_EXE_fixture");
const HZ: u64 = 99;

/// Records the fixtures at `hz`, restricted to their pids.
fn record(dir: &TempDir, fixtures: Vec<Fixture>, seconds: f64, hz: u64, extra: &[&str]) -> (Decoded, Vec<FixtureRun>) {
    let pids: Vec<String> = fixtures.iter().map(|f| f.pid().to_string()).collect();
    let hz = hz.to_string();
    let mut args = vec!["-F", &hz];
    for pid in &pids {
        args.extend(["--pid", pid]);
    }
    args.extend(extra);
    let (out, runs) = record_fixtures(dir, fixtures, seconds, &args);
    (Decoded::read(&out), runs)
}

#[test]
fn split_is_faithful_and_stacks_reach_main() {
    require_root();
    // 499 Hz: ~5000 samples, so sampling error (sd ~0.7 points) stays well inside 3 points.
    const SPLIT_HZ: u64 = 499;
    let dir = TempDir::new("split");
    let fixtures = vec![Fixture::spawn(FIXTURE, "split", 5.0), Fixture::spawn(FIXTURE, "split", 5.0)];
    let pids: Vec<u32> = fixtures.iter().map(Fixture::pid).collect();
    let (profile, runs) = record(&dir, fixtures, 5.0, SPLIT_HZ, &[]);

    let samples: Vec<_> = pids.iter().flat_map(|&pid| profile.samples_of(pid)).collect();
    assert_eq!(samples.len(), profile.samples.len(), "the pid filter let other processes in");
    let total = Decoded::total(&samples);
    let in_fn = |name: &str| Decoded::total(&samples.iter().copied().filter(|s| s.has_function(name)).collect::<Vec<_>>());
    let (a, b) = (in_fn("fixture::hot_a"), in_fn("fixture::hot_b"));
    let share_a = a as f64 / (a + b) as f64;
    let (units, a_units) = runs.iter().fold((0, 0), |(u, au), r| (u + r.lines[0][0], au + r.lines[0][1]));
    let truth = a_units as f64 / units as f64;
    assert!((share_a - truth).abs() <= 0.03, "hot_a share {share_a:.3} (a={a}, b={b}), truth {truth:.3}");

    let complete = Decoded::total(&samples.iter().copied().filter(|s| s.has_function("fixture::main")).collect::<Vec<_>>());
    let complete_share = complete as f64 / total as f64;
    assert!(complete_share >= 0.95, "only {complete_share:.3} of samples reach main ({complete}/{total})");

    let cpu_seconds: f64 = runs.iter().map(|r| r.cpu_seconds).sum();
    let expected = cpu_seconds * SPLIT_HZ as f64;
    let error = (total as f64 - expected).abs() / expected;
    assert!(error <= 0.10, "{total} samples, expected {expected:.0} ({cpu_seconds:.2} CPU s x {SPLIT_HZ} Hz)");
}

#[test]
fn syscall_heavy_fixture_shows_kernel_frames_under_user_frames() {
    require_root();
    let dir = TempDir::new("kernel");
    let fixture = Fixture::spawn(FIXTURE, "read-zero", 3.0);
    let pid = fixture.pid();
    let (profile, _) = record(&dir, vec![fixture], 3.0, HZ, &[]);
    let samples = profile.samples_of(pid);
    assert!(Decoded::total(&samples) >= 100, "only {} samples of read-zero", Decoded::total(&samples));
    let kernel_and_user = samples
        .iter()
        .filter(|s| {
            let vfs = s.frames.iter().position(|f| f.function == "vfs_read" && f.mapping == "[kernel.kallsyms]");
            let user = s.frames.iter().position(|f| f.function == "fixture::read_zero");
            // Leaf first: the kernel frame must come before (above) the user frame.
            matches!((vfs, user), (Some(k), Some(u)) if k < u) && s.has_function("fixture::main")
        })
        .count();
    assert!(
        kernel_and_user * 4 >= samples.len(),
        "{kernel_and_user} of {} samples have vfs_read under read_zero under main",
        samples.len()
    );
}

#[test]
fn pprof_round_trip_and_views_agree() {
    require_root();
    let dir = TempDir::new("roundtrip");
    let fixture = Fixture::spawn(FIXTURE, "split", 2.0);
    let (folded, svg) = (dir.path("p.folded"), dir.path("p.svg"));
    let extra = ["--folded", folded.to_str().unwrap(), "--flamegraph", svg.to_str().unwrap()];
    let (profile, _) = record(&dir, vec![fixture], 2.0, HZ, &extra);

    // Decoding already checked every location, function, mapping and string reference.
    let p = &profile.profile;
    let types: Vec<(&str, &str)> = p.sample_type.iter().map(|t| (profile.string(t.r#type), profile.string(t.unit))).collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    assert_eq!(p.period, 1_000_000_000 / HZ as i64);
    assert!(p.time_nanos > 0 && p.duration_nanos >= 2_000_000_000, "time range {} + {}", p.time_nanos, p.duration_nanos);
    for sample in &profile.samples {
        assert_eq!(sample.values[1], sample.values[0] * p.period);
        for label in ["pid", "tid", "comm", "cgroup"] {
            assert!(sample.labels.contains_key(label), "sample without label {label}");
        }
    }
    let total: i64 = profile.samples.iter().map(|s| s.values[0]).sum();
    assert_eq!(total as u64, profile.counter("samples") - profile.counter("map_full"));
    let fixture_mapping = p.mapping.iter().find(|m| profile.string(m.filename).ends_with("/fixture")).expect("fixture mapping");
    assert_eq!(profile.string(fixture_mapping.build_id).len(), 40, "fixture mapping carries its build id");

    let folded = std::fs::read_to_string(&folded).unwrap();
    assert_eq!(folded_total(&folded), total);
    assert!(folded.contains("fixture::main;fixture::hot_a;fixture::burn"));
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("<svg") && svg.contains("fixture::hot_a"));
}

#[test]
fn full_counts_map_drops_are_counted_exactly() {
    require_root();
    let dir = TempDir::new("drops");
    let fixture = Fixture::spawn(FIXTURE, "split", 3.0);
    let pid = fixture.pid();
    let (profile, runs) = record(&dir, vec![fixture], 3.0, HZ, &["--max-keys", "1"]);
    let kept = Decoded::total(&profile.samples_of(pid)) as u64;
    let (seen, dropped) = (profile.counter("samples"), profile.counter("map_full"));
    assert!(dropped > 0, "a one-key map must overflow on a workload with several stacks");
    assert!(kept > 0, "nothing kept in the one-key map ({dropped} of {seen} dropped)");
    assert_eq!(kept + dropped, seen, "kept {kept} + dropped {dropped} must equal samples seen {seen}");
    let expected = runs[0].cpu_seconds * HZ as f64;
    assert!((seen as f64 - expected).abs() / expected <= 0.10, "{seen} samples seen, expected {expected:.0}");
}

#[test]
fn daemon_flushes_on_sigterm_and_symbolizes_exited_processes() {
    require_root();
    let dir = TempDir::new("daemon");
    let out = dir.path("profiles");
    let mut agent = Agent::spawn(&["run", "-F", "99", "--interval", "60s", "--output-dir", out.to_str().unwrap()]);
    agent.wait_ready();
    let mut fixture = Fixture::spawn(FIXTURE, "split", 1.0);
    let pid = fixture.pid();
    fixture.start();
    fixture.finish(); // exited long before the 60 s drain
    std::thread::sleep(Duration::from_millis(500));
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(30));

    let files: Vec<_> = std::fs::read_dir(&out).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(files.len(), 1, "one flushed profile expected: {files:?}");
    let profile = Decoded::read(&files[0]);
    let samples = profile.samples_of(pid);
    assert!(Decoded::total(&samples) >= 50, "fixture samples missing after SIGTERM flush");
    for sample in &samples {
        let unresolved: Vec<_> =
            sample.frames.iter().filter(|f| f.mapping.ends_with("/fixture") && f.function.contains("+0x")).collect();
        assert!(unresolved.is_empty(), "unsymbolized frames of an exited process: {unresolved:?}");
    }
    assert!(samples.iter().any(|s| s.has_function("fixture::hot_a") && s.has_function("fixture::main")));
}

#[test]
fn cgroup_filter_keeps_only_that_cgroup() {
    require_root();
    let root = ember_tests::cgroup2_root();
    let name = format!("ember-test-{}", std::process::id());
    let cgroup = root.join(&name);
    std::fs::create_dir(&cgroup).expect("creating a test cgroup");
    let inside = Fixture::spawn(FIXTURE, "split", 2.0);
    let outside = Fixture::spawn(FIXTURE, "split", 2.0);
    let (inside_pid, outside_pid) = (inside.pid(), outside.pid());
    std::fs::write(cgroup.join("cgroup.procs"), inside_pid.to_string()).expect("moving the fixture into the cgroup");
    let dir = TempDir::new("cgroup");
    let out = dir.path("p.pb.gz");
    let mut agent = Agent::spawn(&["record", "-d", "4s", "-F", "99", "--cgroup", &name, "-o", out.to_str().unwrap()]);
    agent.wait_ready();
    let mut fixtures = vec![inside, outside];
    fixtures.iter_mut().for_each(Fixture::start);
    let runs: Vec<_> = fixtures.into_iter().map(Fixture::finish).collect();
    agent.wait_success(Duration::from_secs(30));
    std::fs::remove_dir(&cgroup).expect("removing the test cgroup");

    let profile = Decoded::read(&out);
    // Against its CPU time, not a fixed count: on a loaded machine it gets less CPU.
    let expected = runs[0].cpu_seconds * 99.0;
    let inside = Decoded::total(&profile.samples_of(inside_pid)) as f64;
    assert!(inside >= 0.9 * expected && expected > 20.0, "{inside} samples from the process in the cgroup, expected {expected:.0}");
    assert!(profile.samples_of(outside_pid).is_empty(), "a process outside the cgroup was sampled");
    let expected = format!("/{name}");
    assert!(profile.samples.iter().all(|s| s.labels.get("cgroup") == Some(&expected)), "samples outside {expected}");
    // With a cgroup, a process already running is loaded at its first sample, whose stack
    // (and any taken before the load is done) is walked by frame pointers only: each such
    // walk is marked at its root, and counted.
    let marker = "[walked by frame pointers: tables not loaded yet]";
    let marked: Vec<_> = profile.samples.iter().filter(|s| s.frames.last().is_some_and(|f| f.function == marker)).collect();
    let marked = Decoded::total(&marked);
    let counted = profile.counter("unwind_no_process");
    println!("{marked} of {inside} samples walked by frame pointers only, {counted} such walks counted");
    assert!(marked > 0 && marked as u64 == counted, "{marked} samples marked as walked by frame pointers only, {counted} such walks counted");
}

#[test]
fn missing_privilege_is_a_one_line_error() {
    // Runs the agent as nobody with no capabilities.
    let output = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"])
        .arg(ember_tests::agent_bin())
        .args(["record", "-d", "1s", "-o", "/tmp/ember-never-written.pb.gz"])
        .output()
        .expect("running setpriv (util-linux)");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("missing privilege CAP_BPF and CAP_PERFMON"), "{stderr}");
}

#[test]
fn bad_config_is_a_one_line_error() {
    let dir = TempDir::new("config");
    let config = dir.path("agent.toml");
    std::fs::write(&config, "frequency = 99\nintervall = \"5s\"\n").unwrap();
    let output = Command::new(ember_tests::agent_bin()).args(["run", "--config", config.to_str().unwrap()]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("line 2") && stderr.contains("intervall"), "{stderr}");
}

#[test]
fn durations_out_of_range_are_one_line_errors_not_panics() {
    let dir = TempDir::new("durations");
    let config = dir.path("agent.toml");
    for (interval, expected) in [("0.0000000001s", "between 1us and 365 days"), ("99999999999999999999h", "between 1us and 365 days"), ("10ms", "use 1s to 1h")] {
        std::fs::write(&config, format!("interval = \"{interval}\"\n")).unwrap();
        let output = Command::new(ember_tests::agent_bin()).args(["run", "--config", config.to_str().unwrap()]).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "interval {interval}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(expected), "interval {interval}: {stderr}");
    }
    let output = Command::new(ember_tests::agent_bin()).args(["record", "-d", "0.0000000001s"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "clap refuses the flag: {stderr}");
    assert!(stderr.contains("between 1us and 365 days"), "{stderr}");
}

/// Has perl fork a child, without exec, as pid `pid` (the kernel hands out the pid after
/// ns_last_pid); the child is busy for 2 s. Returns whether the child got that pid.
fn fork_perl_child_as(pid: u32) -> bool {
    use std::io::{BufRead as _, Write as _};
    let script = "$| = 1; <STDIN>; my $child = fork(); if ($child == 0) { my $t = time; while (time - $t < 2) {} exit 0 } print \"$child\\n\"; waitpid($child, 0);";
    let mut perl = Command::new("perl")
        .args(["-e", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("starting perl");
    std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).expect("setting ns_last_pid (needs root)");
    perl.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut line = String::new();
    std::io::BufReader::new(perl.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(perl.wait().unwrap().success());
    line.trim() == pid.to_string()
}

/// Runs the agent with `args` while the `held` workload runs, from its release to its end.
fn record_while(workload: &mut std::process::Child, args: &[&str]) {
    let mut agent = Agent::spawn(args);
    agent.wait_ready();
    release(workload);
    assert!(workload.wait().unwrap().success());
    agent.wait_success(Duration::from_secs(30));
}

#[test]
fn a_reused_pid_is_announced_afresh_and_named_with_its_own_mappings() {
    require_root();
    let dir = TempDir::new("reused-pid");
    let out = dir.path("profiles");
    // A long interval: the first process is still in the agent's table when the second one,
    // with the same pid, runs and exits, all before the drain. The second is a fork without
    // exec (a pre-forked worker), so no exec event announces it either. The first frees a
    // large heap in its exit path, where it is still sampled after its exit event (which once
    // made it known to the programs again, so that the second was never announced).
    let mut agent = Agent::spawn(&["run", "-F", "99", "--interval", "60s", "--output-dir", out.to_str().unwrap()]);
    agent.wait_ready();
    let reused = (0..5)
        .find_map(|_| {
            let mut first = Fixture::spawn_with(Command::new(FIXTURE), "exit-large", 1.0, &["1024"]);
            let pid = first.pid();
            first.start();
            first.finish();
            fork_perl_child_as(pid).then_some(pid)
        })
        .expect("another process kept taking the pid");
    std::thread::sleep(Duration::from_millis(500));
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(30));
    let profiles = Decoded::read_kind(&out, "cpu");
    let of_comm = |comm: &str| -> Vec<&Sample> {
        profiles.iter().flat_map(|p| p.samples_of(reused)).filter(|s| s.labels.get("comm").map(String::as_str) == Some(comm)).collect()
    };
    let perl = of_comm("perl");
    assert!(Decoded::total(&perl) > 50, "perl's samples under pid {reused} are missing");
    let named = perl.iter().filter(|s| s.frames.iter().any(|f| f.function.starts_with("Perl_"))).count();
    assert!(named * 2 >= perl.len(), "{named} of {} perl samples named from perl's own binary: the dead fixture's mappings were used", perl.len());
    // And the first process's samples, drained after perl took its pid, from the fixture's.
    let first = of_comm("fixture");
    assert!(Decoded::total(&first) > 50, "the first process's samples under pid {reused} are missing");
    let named = first.iter().filter(|s| s.frames.iter().any(|f| f.mapping.ends_with("/fixture"))).count();
    let leaves: Vec<String> = first.iter().take(5).filter_map(|s| Some(format!("{} ({})", s.frames.first()?.function, s.frames.first()?.mapping))).collect();
    assert!(named * 2 >= first.len(), "{named} of {} samples of the first process under pid {reused} named from its own binary: perl's mappings were used; leaves {leaves:?}", first.len());
}

/// One pid runs a program that then execs another, within one interval: both built without
/// PIE, so that their code lies at the same addresses. The samples taken before the exec are
/// named from the first program, whose mappings were read before it exec'd, and the samples
/// after it from the second.
#[test]
fn samples_taken_before_an_exec_are_named_from_the_program_that_ran_then() {
    require_root();
    let dir = TempDir::new("exec-lives");
    let (first, second) = (dir.path("exec_after"), dir.path("after_exec"));
    compile_c(&Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lifecycle/exec_after.c"), &first, &["-O2", "-no-pie"]);
    std::fs::write(dir.path("after_exec.c"), spin_c("after_exec", "")).unwrap();
    compile_c(&dir.path("after_exec.c"), &second, &["-O2", "-no-pie"]);
    let mut workload = held(&first, &["1.5", second.to_str().unwrap(), "1.5"]);
    let out = dir.path("exec.pb.gz");
    let pid = workload.id().to_string();
    record_while(&mut workload, &["record", "-d", "5s", "-F", "499", "--pid", &pid, "-o", out.to_str().unwrap()]);

    let profile = Decoded::read(&out);
    for (comm, own, other) in [("exec_after", "before_exec", "after_exec"), ("after_exec", "after_exec", "before_exec")] {
        let samples = profile.samples_labelled("comm", comm);
        let with = |function: &str| Decoded::total(&samples.iter().copied().filter(|s| s.has_function(function)).collect::<Vec<_>>());
        let (total, named, wrong) = (Decoded::total(&samples), with(own), with(other));
        let leaves: std::collections::BTreeSet<&str> = samples.iter().filter_map(|s| Some(s.frames.first()?.function.as_str())).collect();
        // 1.5 s at 499 Hz. A sample taken in the exec itself may have neither function.
        assert!(total > 400, "{total} samples of {comm}");
        assert!(named as f64 >= 0.95 * total as f64 && wrong * 100 <= total, "{comm}: {named} of {total} samples in {own}, {wrong} in {other}; leaves {leaves:?}");
    }
}

/// Process churn as on a busy host: 200 processes a second, each busy for 20 to 200 ms, most
/// gone before the interval is drained. Their samples are named to function level.
#[test]
fn short_lived_processes_are_named() {
    require_root();
    let dir = TempDir::new("churn");
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/churn");
    let (churn, child) = (dir.path("churn"), dir.path("churn_child"));
    compile_c(&sources.join("churn.c"), &churn, &["-O2"]);
    compile_c(&sources.join("churn_child.c"), &child, &["-O2"]);
    // The churn starts in a cgroup of its own (its processes inherit it) once the agent runs.
    let mut cgroups = TestCgroups::new();
    let cgroup = cgroups.create("churn");
    let mut launcher = held(&churn, &[child.to_str().unwrap(), "4", "200"]);
    cgroups.enter("churn", launcher.id());
    let out = dir.path("churn.pb.gz");
    record_while(&mut launcher, &["record", "-d", "6s", "-F", "99", "--cgroup", &cgroup, "-o", out.to_str().unwrap()]);

    let profile = Decoded::read(&out);
    let samples = profile.samples_labelled("comm", "churn_child");
    let (named, unnamed): (Vec<_>, Vec<_>) = samples.iter().copied().partition(|s| s.frames.iter().all(|f| !f.function.contains("+0x")));
    let unnamed: Vec<Vec<&str>> = unnamed.iter().take(5).map(|s| s.frames.iter().map(|f| f.function.as_str()).collect()).collect();
    let (named, total) = (Decoded::total(&named), Decoded::total(&samples));
    let in_work = Decoded::total(&samples.iter().copied().filter(|s| s.has_function("churn_work")).collect::<Vec<_>>());
    let complete = Decoded::total(&samples.iter().copied().filter(|s| s.has_function("churn_work") && s.has_function("main")).collect::<Vec<_>>());
    println!("churn: {named} of {total} samples named to function level, {in_work} in churn_work, {complete} of them reaching main; unnamed: {unnamed:?}");
    // The goal is 95%; measured 96.0-98.5% here. What stays unnamed is taken at exec (the old
    // image's stack) or at exit (libc mapped after the capture at exec, gone by the drain).
    // The margin keeps a loaded machine from failing the build while catching a regression.
    assert!(total > 200 && named as f64 >= 0.93 * total as f64, "{named} of {total} samples of short-lived processes named; unnamed: {unnamed:?}");
    assert!(in_work as f64 >= 0.8 * total as f64, "{in_work} of {total} samples in churn_work");
    // Walks by frame pointers before the tables are loaded meet words of data where a frame
    // pointer is not one (the loader's code keeps none): the walk stops there, and shows no
    // address beyond user space.
    let beyond_user_space = |f: &str| f.strip_prefix("[unmapped]+0x").and_then(|a| u64::from_str_radix(a, 16).ok()).is_some_and(|a| a >= 1 << 47);
    let shown: Vec<&str> = samples.iter().flat_map(|s| &s.frames).map(|f| f.function.as_str()).filter(|f| beyond_user_space(f)).collect();
    assert!(shown.is_empty(), "frames beyond user space: {shown:?}");
    // Two dozen processes share two CPUs: each is sampled once or twice in its life. Once
    // the agent has loaded churn_child for one of them, the exec program points each next one
    // at that template, so even its first sample has churn_child's table, and its stack (built
    // without frame pointers) reaches main: 99.9-100% here; 76-84% when the agent loaded each
    // on hearing of its exec, 41-42% when each was first announced by its first sample.
    assert!(complete as f64 >= 0.95 * in_work as f64, "{complete} of {in_work} samples in churn_work reach main");
}