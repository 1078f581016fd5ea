//! Push delivery never stalls and never drops what it did not deliver: a real agent pushes
//! to a real collector over loopback through every cause of a gap in its sequence numbers
//! (spool overflow, a refused profile, a renamed agent, a wiped spool, a collector killed
//! mid-batch, an agent killed mid-write with a spool file damaged on disk). Afterwards the collector holds exactly the profiles that were not deliberately
//! dropped, each once, and every dropped one is counted. Needs root (the agent loads BPF).
use std::{
    collections::HashMap,
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant},
};

use ember_proto::ember::Profile;
use ember_tests::{
    empty_pprof_gzip, fetch_metrics, metric_value, require_root,
    transport::{self, free_address, spool_is_empty, stop_agent, stored, CollectorProcess, TestStore},
    wait_for_metric, Agent, TempDir,
};
use prost::Message;

/// An agent that profiles only pid 1 (a few samples) and pushes every second.
fn push_agent(collector: SocketAddr, spool: &Path, agent_id: &str, extra: &[&str]) -> Agent {
    transport::push_agent(collector, spool, agent_id, &[&["--pid", "1"], extra].concat())
}

/// Runs a pushing agent for 3 s against a collector that is up; it must leave nothing spooled.
fn deliver_for_a_while(collector: SocketAddr, spool: &Path, agent_id: &str) {
    let agent = push_agent(collector, spool, agent_id, &[]);
    std::thread::sleep(Duration::from_secs(3));
    stop_agent(agent);
    assert!(spool_is_empty(spool), "{agent_id}: profiles left in the spool with the collector up");
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "not within {timeout:?}: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The spool's next sequence number: every profile it ever numbered is below it.
fn next_sequence(spool: &Path) -> u64 {
    std::fs::read_to_string(spool.join("next-sequence")).unwrap().trim().parse().unwrap()
}

/// The sequences the collector holds, in order, with how many agent names they came under.
fn held_sequences(data: &TestStore) -> Vec<u64> {
    let mut sequences: Vec<u64> = stored(data).into_iter().map(|(_, sequence)| sequence).collect();
    sequences.sort();
    sequences
}

/// A metric's value from the agent's /metrics, 0 if it has no such series yet.
fn metric(http: SocketAddr, series: &str) -> f64 {
    metric_value(&fetch_metrics(http), series).unwrap_or(0.0)
}

#[test]
fn spool_overflow_during_an_outage_drops_the_oldest_counts_them_and_delivers_the_rest() {
    require_root();
    let dir = TempDir::new("overflow");
    let (address, data, spool, http) = (free_address(), TestStore::embedded(&dir), dir.path("spool"), free_address());
    // 1 KiB holds a few small profiles: an 8 s outage overflows it.
    let agent = push_agent(address, &spool, "overflow", &["--spool-max-mib", "0.001", "--http", &http.to_string()]);
    std::thread::sleep(Duration::from_secs(8));
    let dropped = metric(http, "ember_lost_total{reason=\"spool_full\",sink=\"collector\"}");
    assert!(dropped >= 1.0, "the outage did not overflow the spool");
    let collector = CollectorProcess::start(address, &data);
    wait_until("the spool empties once the collector is back", Duration::from_secs(20), || spool_is_empty(&spool));
    let dropped = metric(http, "ember_lost_total{reason=\"spool_full\",sink=\"collector\"}") as u64;
    stop_agent(agent);
    collector.stop();
    assert!(spool_is_empty(&spool));
    // Every profile arrived once or was counted dropped (one dropped while it was being sent
    // and then acknowledged arrived: not counted), and the newest arrived.
    let (held, numbered) = (held_sequences(&data), next_sequence(&spool) - 1);
    assert_eq!(held.len() as u64 + dropped, numbered, "held {held:?} and {dropped} dropped of {numbered} numbered");
    assert!(held.windows(2).all(|w| w[0] < w[1]), "a profile held twice: {held:?}");
    assert!(held.len() >= 2 && held.ends_with(&[numbered - 1, numbered]), "the newest not delivered: {held:?} of {numbered}");
}

/// A spool file as the agent writes it: "EMBSPL", the format's version "01", the profile's
/// length and CRC-32 (little-endian), then the profile.
fn spool_file(profile: &Profile) -> Vec<u8> {
    let body = profile.encode_to_vec();
    let header = [&b"EMBSPL01"[..], &(body.len() as u32).to_le_bytes(), &crc32fast::hash(&body).to_le_bytes()].concat();
    [header, body].concat()
}

#[test]
fn a_refused_profile_in_the_middle_of_a_batch_is_dropped_alone_and_counted() {
    require_root();
    let dir = TempDir::new("refused");
    let (address, data, spool, http) = (free_address(), TestStore::embedded(&dir), dir.path("spool"), free_address());
    // Five spooled profiles from an earlier run; the third claims to start tomorrow.
    std::fs::create_dir_all(&spool).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
    for sequence in 1..=5u64 {
        let start = if sequence == 3 { now + 86_400_000_000_000 } else { now - 10_000_000_000 };
        let profile = Profile {
            sequence,
            kind: "cpu".into(),
            start_unix_nanos: start,
            end_unix_nanos: start + 1_000_000_000,
            labels: HashMap::new(),
            pprof_gzip: empty_pprof_gzip(),
        };
        std::fs::write(spool.join(format!("{sequence:020}.profile")), spool_file(&profile)).unwrap();
    }
    std::fs::write(spool.join("next-sequence"), "6").unwrap();
    let collector = CollectorProcess::start(address, &data);
    let agent = push_agent(address, &spool, "refused", &["--http", &http.to_string()]);
    let refused = "ember_lost_total{reason=\"refused\",sink=\"collector\"}";
    wait_for_metric(http, refused, Duration::from_secs(15), |n| n >= 1.0);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(metric(http, refused), 1.0, "only the bad profile is refused");
    stop_agent(agent);
    collector.stop();
    assert!(spool_is_empty(&spool));
    let expected: Vec<u64> = (1..next_sequence(&spool)).filter(|s| *s != 3).collect();
    assert_eq!(held_sequences(&data), expected, "all but the refused one, once each");
}

#[test]
fn an_agent_renamed_on_the_same_spool_delivers_everything_once() {
    require_root();
    let dir = TempDir::new("renamed");
    let (address, data, spool) = (free_address(), TestStore::embedded(&dir), dir.path("spool"));
    let collector = CollectorProcess::start(address, &data);
    // The shipped DaemonSet used to do this at every pod restart: a new name, the node's spool.
    for name in ["pod-a", "pod-b"] {
        deliver_for_a_while(address, &spool, name);
    }
    collector.stop();
    let rows = stored(&data);
    assert!(rows.iter().any(|(agent, _)| agent == "pod-b"), "the renamed agent delivered nothing: {rows:?}");
    let expected: Vec<u64> = (1..next_sequence(&spool)).collect();
    assert_eq!(held_sequences(&data), expected, "every profile once, across the rename");
}

#[test]
fn a_wiped_spool_numbers_anew_and_nothing_passes_for_already_stored() {
    require_root();
    let dir = TempDir::new("wiped");
    let (address, data, spool) = (free_address(), TestStore::embedded(&dir), dir.path("spool"));
    let collector = CollectorProcess::start(address, &data);
    let mut made = 0;
    for _ in 0..2 {
        deliver_for_a_while(address, &spool, "wiped");
        made += next_sequence(&spool) - 1;
        std::fs::remove_dir_all(&spool).unwrap();
    }
    collector.stop();
    // Both runs numbered from 1: the collector must still hold both runs' profiles.
    assert_eq!(stored(&data).len() as u64, made, "the second run's profiles were taken for the first's");
}

#[test]
fn a_collector_killed_mid_batch_loses_nothing_and_stores_nothing_twice() {
    require_root();
    let dir = TempDir::new("killed");
    let (address, data, spool) = (free_address(), TestStore::embedded(&dir), dir.path("spool"));
    let agent = push_agent(address, &spool, "killed", &[]);
    // An outage first, so that the collector receives a backlog in batches; then collectors
    // killed (SIGKILL) at different moments of the agent's sending.
    std::thread::sleep(Duration::from_secs(8));
    for lives in [300, 1000, 2500] {
        let collector = CollectorProcess::start(address, &data);
        std::thread::sleep(Duration::from_millis(lives));
        drop(collector);
    }
    let collector = CollectorProcess::start(address, &data);
    // The agent backs off up to 30 s while the collector is away.
    wait_until("the spool empties", Duration::from_secs(75), || spool_is_empty(&spool));
    stop_agent(agent);
    collector.stop();
    let expected: Vec<u64> = (1..next_sequence(&spool)).collect();
    assert_eq!(held_sequences(&data), expected, "every profile exactly once");
}

/// The spooled profiles' sequence numbers and files, oldest first.
fn spooled(spool: &Path) -> Vec<(u64, std::path::PathBuf)> {
    let mut files: Vec<_> = std::fs::read_dir(spool)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            let sequence = path.extension().filter(|x| *x == "profile").and(path.file_stem())?.to_str()?.parse().ok()?;
            Some((sequence, path))
        })
        .collect();
    files.sort();
    files
}

#[test]
fn an_agent_killed_mid_write_loses_nothing_spooled_and_quarantines_a_damaged_file() {
    require_root();
    let dir = TempDir::new("agent-killed");
    let (address, data, spool, http) = (free_address(), TestStore::embedded(&dir), dir.path("spool"), free_address());
    // No collector: every interval is spooled. The agent is killed (SIGKILL) at different
    // moments of its writing, then a spooled file is damaged on disk (one bit flipped).
    for life in [1500, 2300, 3100] {
        let agent = push_agent(address, &spool, "agent-killed", &[]);
        std::thread::sleep(Duration::from_millis(life));
        drop(agent);
    }
    let before = spooled(&spool);
    assert!(before.len() >= 3, "{} profiles spooled by the killed agents", before.len());
    let (damaged, damaged_path) = before[1].clone();
    let mut bytes = std::fs::read(&damaged_path).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&damaged_path, bytes).unwrap();
    let first_new = next_sequence(&spool);

    let collector = CollectorProcess::start(address, &data);
    let agent = push_agent(address, &spool, "agent-killed", &["--http", &http.to_string()]);
    wait_until("the spool empties", Duration::from_secs(30), || spool_is_empty(&spool));
    let corrupt = metric(http, "ember_lost_total{reason=\"spool_corrupt\",sink=\"collector\"}");
    stop_agent(agent);
    collector.stop();
    assert_eq!(corrupt, 1.0, "the damaged file is counted");
    assert!(spool.join("quarantine").join(damaged_path.file_name().unwrap()).exists(), "the damaged file is kept aside");
    // Every file the killed agents had spooled arrived (but the damaged one), and everything after.
    let mut expected: Vec<u64> = before.iter().map(|(s, _)| *s).filter(|s| *s != damaged).collect();
    expected.extend(first_new..next_sequence(&spool));
    assert_eq!(held_sequences(&data), expected, "every valid profile exactly once");
}
