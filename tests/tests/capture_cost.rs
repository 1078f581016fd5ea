//! What a started process costs the agent: a process the filters exclude costs no read of
//! /proc, and a process that execs a binary the agent has open already is captured from what
//! the kernel told at its exec, with nothing read. Counted by the agent's
//! `ember_processes_captured_total`. Needs root (the agent loads BPF programs).
use std::{
    process::{Child, Command},
    time::Duration,
};

use ember_tests::{fetch_metrics, metric_value, require_root, transport::free_address, Agent, TempDir};

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
    let out = dir.path("profiles");
    let mut args = vec!["run", "-F", "99", "--interval", "10s", "--output-dir", out.to_str().unwrap()];
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
