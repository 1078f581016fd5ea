//! The agent's footprint stays flat at 999 Hz with process churn: the short version of
//! `cargo xtask bench soak` (ten minutes there, a minute here, judged the same way).
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use ember_tests::{
    require_root,
    soak::{self, Footprint, Growth},
    Agent, Decoded, TempDir,
};

const INTERVAL: Duration = Duration::from_secs(5);
/// Long enough for every binary of the churn and the host to have been seen and named once:
/// at least the first, then until the agent's counts have not risen for the second, at most
/// the third.
const WARM_UP: (Duration, Duration, Duration) = (Duration::from_secs(20), Duration::from_secs(10), Duration::from_secs(60));
const MEASURED: Duration = Duration::from_secs(60);
const EVERY: Duration = Duration::from_secs(2);

#[test]
fn footprint_stays_flat_at_999_hz_with_process_churn() {
    require_root();
    let dir = TempDir::new("soak");
    let (churn, child) = soak::build_churn(&dir.0);
    let profiles = dir.path("profiles");
    let mut agent = Agent::spawn(&["run", "-F", "999", "--interval", "5s", "--output-dir", profiles.to_str().unwrap()]);
    agent.wait_ready();
    let seconds = (WARM_UP.2 + MEASURED + INTERVAL).as_secs().to_string();
    let mut launcher = Command::new(&churn).args([child.to_str().unwrap(), &seconds, "200"]).stdout(Stdio::null()).spawn().expect("starting the churn");
    let warm_up = soak::settle(agent.pid(), WARM_UP.0, WARM_UP.1, WARM_UP.2).unwrap_or_else(|| panic!("ember-agent exited in its warm-up:\n{}", agent.stderr()));
    println!("warm-up: {warm_up:?}");

    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < MEASURED {
        let footprint = Footprint::of(agent.pid(), started.elapsed());
        samples.push(footprint.unwrap_or_else(|| panic!("ember-agent exited during the soak:\n{}", agent.stderr())));
        std::thread::sleep(EVERY);
    }
    println!("{}", soak::table(&samples));
    let growth = Growth::of(&samples);
    println!("{growth:?}");
    assert!(growth.problems().is_empty(), "the agent's footprint grew under churn: {}", growth.problems().join("; "));

    let _ = launcher.kill(); // it churns for the longest warm-up
    let _ = launcher.wait();
    agent.signal(libc::SIGINT);
    let stderr = agent.wait_success(Duration::from_secs(30));
    assert!(!stderr.contains("profile is dropped"), "an interval was dropped:\n{stderr}");
    // It kept up: a profile for every interval of the run.
    let written = std::fs::read_dir(&profiles).unwrap().count() as u64;
    let expected = (warm_up + MEASURED).as_secs() / INTERVAL.as_secs();
    assert!(written >= expected, "{written} profiles written in {expected} intervals");
    // And it profiled the churn all along: a flat footprint of an agent that sampled nothing
    // would prove nothing.
    let churn: i64 = Decoded::read_kind(&profiles, "cpu").iter().map(|p| Decoded::total(&p.samples_labelled("comm", "churn_child"))).sum();
    assert!(churn >= 20_000, "only {churn} samples of the churn's processes");
}
