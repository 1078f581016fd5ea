//! Losses the agent used to log only, or not at all, are counted: in the profile's counters
//! and in /metrics. Needs root (the agent loads BPF programs).
use std::{net::SocketAddr, process::Command, time::Duration};

use ember_tests::{fetch_metrics, metric_value, require_root, transport::free_address, Agent, Decoded, TempDir};

/// A daemon writing profiles to `out` and serving /metrics on `http`, ready.
fn daemon(hz: &str, interval: &str, out: &std::path::Path, http: SocketAddr) -> Agent {
    let mut agent = Agent::spawn(&["run", "-F", hz, "--interval", interval, "--output-dir", out.to_str().unwrap(), "--http", &http.to_string()]);
    agent.wait_ready();
    agent
}

#[test]
fn processes_that_exit_before_their_mappings_are_read_are_counted() {
    require_root();
    let dir = TempDir::new("unread");
    let (out, http) = (dir.path("profiles"), free_address());
    let agent = daemon("999", "2s", &out, http);
    // The agent is stopped while short processes run and exit: the kernel samples them and
    // announces them, but nobody reads their mappings before they are gone.
    agent.signal(libc::SIGSTOP);
    for _ in 0..5 {
        let status = Command::new("sh").args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"]).status().unwrap();
        assert!(status.success());
    }
    agent.signal(libc::SIGCONT);
    std::thread::sleep(Duration::from_secs(3));
    let counted = metric_value(&fetch_metrics(http), "ember_lost_total{reason=\"process_exited_unread\"}");
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(30));
    assert!(counted.is_some_and(|n| n >= 5.0), "5 processes exited unread, /metrics says {counted:?}");
    let in_profiles: u64 = Decoded::read_kind(&out, "cpu").iter().map(|p| p.counter("process_exited_unread")).sum();
    assert!(in_profiles >= 5, "the profiles count {in_profiles} processes exited unread");
}

#[test]
fn an_interval_that_cannot_be_written_is_counted() {
    require_root();
    let dir = TempDir::new("unwritable");
    let (out, http) = (dir.path("profiles"), free_address());
    let agent = daemon("99", "1s", &out, http);
    std::thread::sleep(Duration::from_millis(1500));
    // The output directory disappears: the next intervals cannot be written.
    std::fs::remove_dir_all(&out).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let failed = metric_value(&fetch_metrics(http), "ember_lost_total{reason=\"interval_failed\"}");
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(30));
    assert!(failed.is_some_and(|n| n >= 1.0), "/metrics says {failed:?} failed intervals");
}
