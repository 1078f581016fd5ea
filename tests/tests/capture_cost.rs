//! What a started process costs the agent: a process the filters exclude costs no read of
//! /proc, and a process that execs a binary the agent has open already is captured from what
//! the kernel told at its exec, with nothing read, even when the binary's last process is
//! long gone. Counted by the agent's
//! `ember_processes_captured_total`. Needs root (the agent loads BPF programs).
use std::{
    os::{fd::AsRawFd, unix::process::CommandExt},
    process::{Child, Command},
    time::Duration,
};

use ember_tests::{fetch_metrics, metric_value, require_root, transport::free_address, Agent, TempDir, TestCgroups};

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

/// The captures counted before and after 200 processes, then stops the agent.
fn captures_around_churn(agent: Agent, http: std::net::SocketAddr) -> ((f64, f64), (f64, f64)) {
    let before = captures(http);
    churn(200);
    std::thread::sleep(Duration::from_millis(500));
    let after = captures(http);
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(30));
    (before, after)
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
    let (before, after) = captures_around_churn(daemon(&dir, &["--pid", &pid], http), http);
    let _ = target.kill();
    let _ = target.wait();
    // The target itself was read at start-up.
    assert!(before.1 >= 1.0, "the target was not captured: {before:?}");
    assert_eq!(after, before, "200 processes outside --pid were captured (exec, proc): {before:?} -> {after:?}");
}

#[test]
fn processes_that_exec_a_binary_already_open_are_captured_without_reading_proc() {
    require_root();
    let dir = TempDir::new("capture-exec");
    let http = free_address();
    let (before, after) = captures_around_churn(daemon(&dir, &[], http), http);
    let (exec, proc) = (after.0 - before.0, after.1 - before.1);
    println!("200 runs of /bin/true: {exec} captured from their exec, {proc} from /proc");
    // /bin/true is open from its first run on (or from a process of the host that runs it):
    // most runs are captured from their exec. Those sampled (99 Hz, a millisecond each) and
    // other processes of the host are read from /proc.
    assert!(exec >= 180.0, "{exec} of 200 execs of a known binary captured from the exec ({proc} from /proc)");
    assert!(proc < exec / 4.0, "{proc} captures read /proc beside {exec} from exec");
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
    // A copy of sleep: no other process of the host runs it. Each run lasts long enough to
    // be read from /proc if it must be.
    let binary = dir.path("own-sleep");
    std::fs::copy("/bin/sleep", &binary).expect("copying /bin/sleep");
    let mut cgroups = TestCgroups::new();
    cgroups.create("runs");
    let cgroup = cgroups.dir("runs");
    let agent = daemon_every(&dir, "1s", &["--cgroup", cgroup.to_str().unwrap()], http);
    let procs = std::fs::OpenOptions::new().write(true).open(cgroup.join("cgroup.procs")).expect("opening the cgroup's cgroup.procs");
    let run = || {
        let mut command = Command::new(&binary);
        command.arg("0.2");
        let fd = procs.as_raw_fd();
        // SAFETY: between fork and exec only write(2) runs: "0" moves the writing process,
        // so each run execs inside the cgroup.
        unsafe {
            command.pre_exec(move || match libc::write(fd, b"0".as_ptr().cast(), 1) {
                1 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            })
        };
        assert!(command.status().expect("running the copy in the cgroup").success());
    };
    run();
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
    assert!(exec >= 3.0 && proc < 3.0, "runs of a binary whose processes were forgotten: {exec} captured from the exec, {proc} from /proc");
}
