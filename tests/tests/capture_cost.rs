//! What a started process costs the agent: a process the filters exclude costs no read of
//! /proc, a process that execs a binary the agent has open already is captured from what
//! the kernel told at its exec, with nothing read, even when the binary's last process is
//! long gone, and a forked child that maps nothing new shares its parent's loaded mappings.
//! The exec program points a process of an executable the agent has loaded at that
//! executable's template, without waking the agent.
//! Counted by the agent's metrics. Needs root (the agent loads BPF programs).
use std::{
    os::{fd::AsRawFd, unix::process::CommandExt},
    process::{Child, Command},
    time::Duration,
};

use ember_tests::{compile_c, usage::context_switches, fetch_metrics, metric, metric_value, require_root, transport::free_address, wait_for_metric, Agent, Decoded, Fixture, TempDir, TestCgroups};

const FIXTURE: &str = env!("CARGO_BIN_EXE_fixture");

/// Starts `count` short processes (`/bin/true`) at about 100 a second.
fn churn(count: usize) {
    for _ in 0..count {
        let status = Command::new("/bin/true").status().expect("running /bin/true");
        assert!(status.success());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Captures so far, from exec and from /proc.
fn captures(http: std::net::SocketAddr) -> (f64, f64) {
    let metrics = fetch_metrics(http);
    let from = |source: &str| metric_value(&metrics, &format!("ember_processes_captured_total{{from=\"{source}\"}}")).unwrap_or(0.0);
    (from("exec"), from("proc"))
}

/// Runs /bin/true until the agent has it open: until ten runs in a row are captured from
/// their exec. Before that a run is captured only by reading /proc while it lives (about a
/// millisecond), so on a slow host the first runs may all end before the agent reads them.
fn open_bin_true(http: std::net::SocketAddr) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let before = captures(http).0;
        churn(10);
        std::thread::sleep(Duration::from_millis(100));
        let exec = captures(http).0 - before;
        if exec >= 10.0 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "/bin/true was not open after 30 s of runs: the last 10 captured from their exec: {exec}");
    }
}

/// Around 200 processes: the captures counted before, and after the agent drained once
/// more (it takes the processes the kernel told of without waking it at the latest then),
/// and the agent's context switches while they ran. Then stops the agent.
fn captures_around_churn(agent: Agent, http: std::net::SocketAddr) -> Churned {
    let from_template = || metric_value(&fetch_metrics(http), "ember_exec_templates_used_total").unwrap_or(0.0);
    let (before, templated) = (captures(http), from_template());
    let switched = context_switches(agent.pid());
    churn(200);
    let switches = context_switches(agent.pid()) - switched;
    let drained = metric_value(&fetch_metrics(http), "ember_intervals_total").unwrap_or(0.0);
    wait_for_metric(http, "ember_intervals_total", Duration::from_secs(30), |n| n > drained);
    let (after, from_template) = (captures(http), from_template() - templated);
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(30));
    Churned { before, after, switches, from_template }
}

struct Churned {
    /// Captures (exec, /proc).
    before: (f64, f64),
    after: (f64, f64),
    switches: u64,
    /// Processes the exec program pointed at their executable's template.
    from_template: f64,
}

fn daemon(dir: &TempDir, filter: &[&str], http: std::net::SocketAddr) -> Agent {
    daemon_every(dir, "10s", filter, http)
}

fn daemon_every(dir: &TempDir, interval: &str, filter: &[&str], http: std::net::SocketAddr) -> Agent {
    let out = dir.path("profiles");
    let mut args = vec!["run", "-F", "99", "--interval", interval, "--output-dir", out.to_str().unwrap()];
    let http_arg = http.to_string();
    args.extend(["--http", &http_arg]);
    args.extend(filter);
    let mut agent = Agent::spawn(&args);
    agent.wait_ready();
    agent
}

#[test]
fn processes_the_filters_exclude_cost_no_capture() {
    require_root();
    let dir = TempDir::new("capture-excluded");
    let http = free_address();
    let mut target: Child = Command::new("sleep").arg("30").spawn().expect("starting sleep");
    let pid = target.id().to_string();
    let Churned { before, after, .. } = captures_around_churn(daemon(&dir, &["--pid", &pid], http), http);
    let _ = target.kill();
    let _ = target.wait();
    // The target itself was read at start-up.
    assert!(before.1 >= 1.0, "the target was not captured: {before:?}");
    assert_eq!(after, before, "200 processes outside --pid were captured (exec, proc): {before:?} -> {after:?}");
}

/// Processes of a binary the agent has open are captured from what the kernel told at
/// their exec, with nothing read; the exec program points them at the binary's template,
/// and the agent is not woken for each (it is for those sampled, which read their libraries).
#[test]
fn processes_that_exec_a_binary_already_open_are_captured_without_reading_proc_or_waking_the_agent() {
    require_root();
    let dir = TempDir::new("capture-exec");
    let http = free_address();
    let agent = daemon(&dir, &[], http);
    open_bin_true(http);
    let Churned { before, after, switches, from_template } = captures_around_churn(agent, http);
    let (exec, proc) = (after.0 - before.0, after.1 - before.1);
    println!("200 runs of /bin/true: {exec} captured from their exec, {proc} from /proc; {from_template} walked from the template; the agent switched {switches} times");
    // /bin/true is open: most runs are captured from their exec. Those sampled (99 Hz, a
    // millisecond each) and other processes of the host are read from /proc.
    assert!(exec >= 190.0, "{exec} of 200 execs of a known binary captured from the exec ({proc} from /proc)");
    assert!(proc < exec / 4.0, "{proc} captures read /proc beside {exec} from exec");
    assert!(from_template >= 190.0, "{from_template} of 200 processes of a known binary pointed at its template");
    // Woken for each, it switched more than 200 times.
    assert!(switches < 60, "the agent switched {switches} times while 200 processes of a known binary started");
}

/// A binary that only short processes run (a cron job, a health check) stays open after its
/// last process is gone and forgotten: the next run is captured from its exec again, with
/// nothing read, and its tables and facts are not built again. The agent profiles only a
/// cgroup of the test's, where the runs start: the host's own new processes are read from
/// /proc at their first sample, and would count.
#[test]
fn a_binary_run_again_after_its_processes_are_forgotten_is_captured_from_the_exec() {
    require_root();
    let dir = TempDir::new("capture-idle");
    let http = free_address();
    // A static program that sleeps 0.2 s: no other process of the host runs it, each run
    // lasts long enough to be read from /proc if it must be, and no library of its own is
    // mapped (a dynamic one's first sample in ld.so or libc reads its libraries, by design).
    let binary = dir.path("nap");
    compile_c(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/capture/nap.c"), &binary, &["-O2", "-static"]);
    let mut cgroups = TestCgroups::new();
    cgroups.create("runs");
    let cgroup = cgroups.dir("runs");
    let agent = daemon_every(&dir, "1s", &["--cgroup", cgroup.to_str().unwrap()], http);
    let procs = std::fs::OpenOptions::new().write(true).open(cgroup.join("cgroup.procs")).expect("opening the cgroup's cgroup.procs");
    let run = || run_in(&procs, &mut Command::new(&binary));
    run();
    // The binary was not open: this first run is read from /proc, and on a busy host that may
    // be counted only after the run ended. It must be counted before the runs below are.
    wait_for_metric(http, "ember_processes_captured_total{from=\"proc\"}", Duration::from_secs(20), |n| n >= 1.0);
    let before = captures(http);
    for _ in 0..3 {
        // The process exited: marked at one drain, forgotten at the next.
        std::thread::sleep(Duration::from_millis(2500));
        run();
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = captures(http);
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(30));
    let (exec, proc) = (after.0 - before.0, after.1 - before.1);
    println!("3 runs, each after the last one was forgotten: {exec} captured from their exec, {proc} from /proc");
    assert!(exec >= 3.0 && proc == 0.0, "runs of a binary whose processes were forgotten: {exec} captured from the exec, {proc} from /proc");
}

/// A process sampled while it execs has the new program's memory and the old one's registers
/// (the kernel tears the old memory down after putting the new one in place, and starts the
/// program last). Neither is walked then, nor announced: the exec's own announcement captures
/// the new program from what the kernel tells, with nothing read. Each child of a parent
/// with 2 GiB resident spends milliseconds so, sampled there at 99 Hz in most runs.
#[test]
fn processes_sampled_while_they_exec_are_captured_from_the_exec() {
    require_root();
    let dir = TempDir::new("capture-mid-exec");
    let http = free_address();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/capture");
    let (parent, nap) = (dir.path("forks_execs"), dir.path("nap"));
    compile_c(&fixtures.join("forks_execs.c"), &parent, &["-O2", "-static"]);
    compile_c(&fixtures.join("nap.c"), &nap, &["-O2", "-static"]);
    let mut cgroups = TestCgroups::new();
    cgroups.create("execs");
    let cgroup = cgroups.dir("execs");
    let agent = daemon_every(&dir, "1s", &["--cgroup", cgroup.to_str().unwrap()], http);
    let procs = std::fs::OpenOptions::new().write(true).open(cgroup.join("cgroup.procs")).expect("opening the cgroup's cgroup.procs");
    const RUNS: f64 = 20.0;
    run_in(&procs, Command::new(&parent).arg("2048").arg(RUNS.to_string()).arg(&nap));
    std::thread::sleep(Duration::from_millis(500));
    let (exec, proc) = captures(http);
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(30));
    println!("a 2 GiB parent and {RUNS} children that exec: {exec} captured from their exec, {proc} from /proc");
    // Read from /proc: the parent (static: at its exec only) and the first child, whose
    // program was not open yet. A child sampled before its exec began is a process of its
    // own, read if the read is quick enough: allowed twice.
    assert_eq!(exec, RUNS - 1.0, "children captured from their exec: all but the first");
    assert!(proc <= 4.0, "{proc} processes read from /proc: children sampled mid-exec were read as half-built");
}

/// Runs `command` to success in the cgroup whose `cgroup.procs` is open as `procs`.
fn run_in(procs: &std::fs::File, command: &mut Command) {
    let status = in_cgroup(procs, command).status().expect("running a program in the test's cgroup");
    assert!(status.success(), "{command:?} in the test's cgroup: {status}");
}

/// Has `command` start in the cgroup whose `cgroup.procs` is open as `procs`: it moves itself
/// there before its exec.
fn in_cgroup<'a>(procs: &std::fs::File, command: &'a mut Command) -> &'a mut Command {
    let fd = procs.as_raw_fd();
    // SAFETY: between fork and exec only write(2) runs: "0" moves the writing process.
    unsafe {
        command.pre_exec(move || match libc::write(fd, b"0".as_ptr().cast(), 1) {
            1 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        })
    }
}

/// Children forked without an exec map what their parent maps: each is captured (its maps
/// read) and walked, but shares the parent's loaded mappings. No table is built for it, no
/// mapping written, and the distinct layouts stay one, at every drain while they run.
#[test]
fn forked_children_that_map_nothing_new_share_their_parents_mappings() {
    require_root();
    let dir = TempDir::new("capture-forks");
    let http = free_address();
    let mut cgroups = TestCgroups::new();
    cgroups.create("forks");
    let agent = daemon_every(&dir, "1s", &["--cgroup", cgroups.dir("forks").to_str().unwrap()], http);
    let mut fixture = Fixture::spawn(FIXTURE, "forks", 30.0);
    cgroups.enter("forks", fixture.pid());
    fixture.start();
    // The parent alone, loaded: what the children must not add to.
    wait_for_metric(http, "ember_unwind_layouts", Duration::from_secs(20), |n| n >= 1.0);
    let gauges = || {
        let text = fetch_metrics(http);
        let at = |series: &str| metric(&text, series);
        (at("ember_unwind_layouts"), at("ember_unwind_mappings_loaded"), at("ember_unwind_tables_built_total"), at("ember_processes_captured_total{from=\"proc\"}"))
    };
    let parent = gauges();
    assert_eq!(parent.0, 1.0, "the parent alone loaded {} layouts", parent.0);
    unsafe { libc::kill(fixture.pid() as i32, libc::SIGUSR1) };
    // Ten children of 200 ms one after the other, and two drains after the last (an exited
    // process's mappings are held until the drain that forgets it).
    let mut most = parent;
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(100));
        let now = gauges();
        most = (most.0.max(now.0), most.1.max(now.1), most.2.max(now.2), now.3);
    }
    let run = fixture.finish();
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(30));
    let children: Vec<String> = run.lines.iter().map(|l| l[0].to_string()).collect();
    println!("parent (layouts, mappings, tables built, captured from /proc) {parent:?}; most while {} children ran {most:?}", children.len());
    assert_eq!(children.len(), 10, "the fixture forked {} children", children.len());
    assert!(most.3 >= parent.3 + 8.0, "{} of 10 children captured from /proc", most.3 - parent.3);
    assert_eq!((most.0, most.1, most.2), (parent.0, parent.1, parent.2), "children that map nothing new added layouts, mappings or tables");
    // Walked all the same: their samples in hot_a reach main, but for a first sample or two
    // of each, taken before it was loaded (walked by frame pointers, which stop in libc).
    let samples: Vec<_> = Decoded::read_kind(&dir.path("profiles"), "cpu").into_iter().flat_map(|p| p.samples).collect();
    let of_children: Vec<_> = samples.iter().filter(|s| s.labels.get("pid").is_some_and(|p| children.contains(p)) && s.has_function("fixture::hot_a")).collect();
    let whole = Decoded::total(&of_children.iter().copied().filter(|s| s.has_function("fixture::main") && s.has_function("_start")).collect::<Vec<_>>());
    let all = Decoded::total(&of_children);
    println!("children's samples in hot_a: {all}, {whole} of them whole");
    assert!(all >= 100 && whole >= all - 20, "{whole} of the children's {all} samples in hot_a reach _start");
}

/// Debian's python3 embeds its interpreter. Once the agent has loaded a process of it from
/// its exec, the exec program points each new one at that template, interpreter included,
/// and the agent writes nothing for it: its Python frames are walked from the template's
/// interpreter, slid to where the process's code went, from its first sample.
#[test]
fn a_python_started_from_its_executables_template_is_walked_from_it() {
    require_root();
    let python = "/usr/bin/python3.11";
    assert!(std::path::Path::new(python).exists(), "no Debian python3.11: run `cargo xtask setup`");
    let dir = TempDir::new("capture-python-template");
    let http = free_address();
    let mut cgroups = TestCgroups::new();
    cgroups.create("runs");
    let cgroup = cgroups.dir("runs");
    let out = dir.path("profiles");
    let (out_arg, http_arg) = (out.to_str().unwrap().to_string(), http.to_string());
    let mut agent = Agent::spawn(&["run", "-F", "999", "--interval", "1s", "--output-dir", &out_arg, "--http", &http_arg, "--cgroup", cgroup.to_str().unwrap()]);
    agent.wait_ready();
    let procs = std::fs::OpenOptions::new().write(true).open(cgroup.join("cgroup.procs")).expect("opening the cgroup's cgroup.procs");
    let templates = || metric_value(&fetch_metrics(http), "ember_exec_templates_used_total").unwrap_or(0.0);
    // The first run is read from /proc; the second, its executable open by then, is loaded
    // from its exec and made the template, which lives while it runs.
    run_in(&procs, Command::new(python).args(["-c", "pass"]));
    wait_for_metric(http, "ember_processes_captured_total{from=\"proc\"}", Duration::from_secs(20), |n| n >= 1.0);
    let mut waiting = Command::new(python);
    waiting.args(["-c", "import sys; sys.stdin.read()"]).stdin(std::process::Stdio::piped());
    let mut waiting = in_cgroup(&procs, &mut waiting).spawn().expect("starting a waiting python3.11");
    wait_for_metric(http, "ember_processes_captured_total{from=\"exec\"}", Duration::from_secs(20), |n| n >= 1.0);
    let before = templates();
    let spin = "import os, time\ndef spin(until):\n    while time.time() < until:\n        pass\nprint(os.getpid(), flush=True)\nspin(time.time() + 1.5)";
    let output = in_cgroup(&procs, Command::new(python).args(["-c", spin])).output().expect("running python3.11 in the test's cgroup");
    drop(waiting.stdin.take());
    let _ = waiting.wait();
    let pid = String::from_utf8_lossy(&output.stdout).trim().to_string();
    assert!(output.status.success() && !pid.is_empty(), "the spinning python3.11: {output:?}");
    let drained = metric(&fetch_metrics(http), "ember_intervals_total");
    wait_for_metric(http, "ember_intervals_total", Duration::from_secs(30), |n| n > drained + 1.0);
    let used = templates() - before;
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(30));
    let profiles = Decoded::read_kind(&out, "cpu");
    let samples: Vec<&ember_tests::Sample> = profiles.iter().flat_map(|p| &p.samples).filter(|s| s.labels.get("pid") == Some(&pid)).collect();
    let total = Decoded::total(&samples);
    let in_spin = Decoded::total(&samples.iter().copied().filter(|s| s.frames.iter().any(|f| f.function == "spin" && f.mapping == "[python]")).collect::<Vec<_>>());
    println!("python3.11 started from its template ({used} processes pointed at it): {in_spin} of {total} samples in its Python function spin");
    assert_eq!(used, 1.0, "processes pointed at python3.11's template");
    // 1.5 s at 999 Hz; its start-up, before spin runs, takes some 15 ms.
    assert!(total > 1000 && in_spin as f64 >= 0.95 * total as f64, "{in_spin} of {total} samples of python3.11 walked from its template in spin");
}
