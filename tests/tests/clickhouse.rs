//! ClickHouse as the collector's store, beyond what every store answers (those tests run over
//! every store in transport.rs and ui.rs, today's ClickHouse engine among them): collectors sharing one ClickHouse store each profile
//! once even when both take it at the same moment; retention drops whole days; selectors that
//! try to reach the SQL are data, never SQL; and ClickHouse going away loses and doubles
//! nothing; a shard's replicas answer for each other. Each test starts its own
//! clickhouse-server on loopback (and ZooKeeper, for replicas).
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::Barrier,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use ember_proto::ember::{collector_client::CollectorClient, AgentIdentity, Profile, PushRequest, PushResponse};
use ember_tests::{
    clickhouse::{ClickHouseServer, ZooKeeper},
    folded_total, http_get, one_sample_pprof_gzip, require_root,
    transport::{free_address, push_agent, spool_is_empty, stop_agent, stored, CollectorProcess, TestStore},
    Decoded, Fixture, TempDir,
};

const FIXTURE: &str = env!("CARGO_BIN_EXE_fixture");

const NS: i64 = 1_000_000_000;

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// A 10 s cpu profile starting at `start` (unix s) whose one sample weighs `value`.
fn profile(sequence: u64, start: i64, value: i64, labels: &[(&str, &str)]) -> Profile {
    Profile {
        sequence,
        kind: "cpu".into(),
        start_unix_nanos: start * NS,
        end_unix_nanos: (start + 10) * NS,
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>(),
        pprof_gzip: one_sample_pprof_gzip(value),
    }
}

fn push(address: SocketAddr, agent: &str, spool_id: u64, profiles: Vec<Profile>) -> PushResponse {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut client = CollectorClient::connect(format!("http://{address}")).await.unwrap();
        let agent = AgentIdentity { agent_id: agent.into(), hostname: agent.into(), spool_id, ..Default::default() };
        client.push(PushRequest { agent: Some(agent), profiles }).await.unwrap().into_inner()
    })
}

fn server(store: &TestStore) -> &ClickHouseServer {
    match store {
        TestStore::ClickHouse { server, .. } => server,
        TestStore::Embedded(_) => unreachable!("a ClickHouse store"),
    }
}

/// The folded total a collector answers for a selection of the last hour.
fn total(http: SocketAddr, query: &str) -> (u16, i64) {
    let (status, body) = http_get(http, &format!("/query?kind=cpu&format=folded&from={}&to={}&{query}", now() - 3600, now() + 1));
    if status != 200 {
        eprintln!("{query}: {status} {}", String::from_utf8_lossy(&body));
    }
    (status, if status == 200 { folded_total(&String::from_utf8_lossy(&body)) } else { 0 })
}

/// Waits until a collector reads all `profiles` cpu profiles of [from, to) (unix s) from
/// roll-ups (its roller builds them every 10 s, once due). Fewer may be read meanwhile (a
/// replica that has not copied them all yet), never more.
fn wait_for_roll_ups(http: SocketAddr, (from, to): (i64, i64), profiles: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = http_get(http, &format!("/api/tree?kind=cpu&from={from}&to={to}"));
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let tree: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(tree["profiles"].as_u64().is_some_and(|read| read <= profiles), "{tree}");
        if tree["profiles"] == profiles && tree["rolled_up"] == profiles {
            return;
        }
        assert!(Instant::now() < deadline, "not all rolled up after 60 s: {tree}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn two_collectors_taking_the_same_profiles_at_once_store_them_once() {
    let dir = TempDir::new("ch-twice");
    let store = TestStore::clickhouse(&dir);
    let (grpc, http) = ([free_address(), free_address()], [free_address(), free_address()]);
    let _collectors = [0, 1].map(|i| CollectorProcess::start_with_http(grpc[i], http[i], &store, &[]));
    // Ten rounds of five profiles of one spool, each pushed to both collectors at the same
    // moment: an agent that timed out on one and resent to the other.
    let start = now() - 1200;
    for round in 0..10u64 {
        let batch: Vec<Profile> = (1..=5).map(|i| round * 5 + i).map(|n| profile(n, start + n as i64 * 10, n as i64, &[])).collect();
        let barrier = Barrier::new(2);
        let answers: Vec<PushResponse> = std::thread::scope(|scope| {
            let (barrier, batch) = (&barrier, &batch);
            let pushes: Vec<_> = grpc
                .iter()
                .map(|&address| {
                    scope.spawn(move || {
                        barrier.wait();
                        push(address, "twice", 7, batch.clone())
                    })
                })
                .collect();
            pushes.into_iter().map(|p| p.join().unwrap()).collect()
        });
        for answer in answers {
            assert!(answer.refused.is_empty() && answer.held.len() == 5, "{answer:?}");
        }
    }
    let copies: u64 = server(&store).query("SELECT count() FROM ember_test.profiles").trim().parse().unwrap();
    eprintln!("{copies} copies of 50 profiles stored by the race");
    // And a second copy of every profile with every value doubled, as a collector that lost a
    // race would have written under a later attempt: reads must keep one copy, never sum them.
    let columns = "day, start_ns, end_ns, kind, origin, sequence, attempt + 1, agent, host, label_keys, label_values";
    server(&store).query(&format!(
        "INSERT INTO ember_test.samples SELECT {columns}, sample_keys, sample_values, sample_num_keys, sample_nums, stack, arrayMap(x -> x * 2, values) FROM ember_test.samples"
    ));
    server(&store).query(&format!(
        "INSERT INTO ember_test.profiles SELECT {columns}, sample_types, sample_units, period_type, period_unit, period, totals, samples FROM ember_test.profiles"
    ));
    let expected: i64 = (1..=50).sum();
    for http in http {
        assert_eq!(total(http, ""), (200, expected), "each profile once, whichever collector answers");
        let (status, body) = http_get(http, &format!("/api/series?kind=cpu&from={}&to={}", now() - 3600, now() + 1));
        let series: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!((status, series["profiles"].as_u64()), (200, Some(50)), "{series}");
        let values: i64 = series["lines"][0]["values"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).sum();
        assert_eq!(values, expected);
    }
    let rows = stored(&store);
    assert_eq!(rows, (1..=50).map(|n| ("twice".to_string(), n)).collect::<Vec<_>>());
    // Both collectors roll up the buckets (all due: they ended 11 minutes ago and more), each
    // from one copy of each profile; where both built a bucket, reads take one build.
    for http in http {
        wait_for_roll_ups(http, (now() - 3600, now() + 1), 50);
        assert_eq!(total(http, ""), (200, expected), "from the roll-ups, each profile once");
    }
}

/// A collector stores a push that goes on from its own last one without asking ClickHouse what
/// is stored: an agent back on it after another collector stored its next push unacknowledged
/// sends that push again, and it is stored twice. Reads keep one copy.
#[test]
fn a_push_stored_by_two_collectors_one_of_which_went_on_from_its_own_last_counts_once() {
    let dir = TempDir::new("ch-continuing");
    let store = TestStore::clickhouse(&dir);
    let (grpc, http) = ([free_address(), free_address()], [free_address(), free_address()]);
    let _collectors = [0, 1].map(|i| CollectorProcess::start_with_http(grpc[i], http[i], &store, &[]));
    let start = now() - 1200;
    let batch = |numbers: std::ops::RangeInclusive<u64>| numbers.map(|n| profile(n, start + n as i64 * 10, n as i64, &[])).collect::<Vec<_>>();
    assert_eq!(push(grpc[0], "back", 3, batch(1..=5)).stored_through, 5);
    assert_eq!(push(grpc[1], "back", 3, batch(6..=10)).stored_through, 10, "the second collector asks ClickHouse");
    let again = push(grpc[0], "back", 3, batch(6..=10));
    assert_eq!((again.held.len(), again.refused.len()), (5, 0), "{again:?}");
    let copies: u64 = server(&store).query("SELECT count() FROM ember_test.profiles WHERE sequence > 5").trim().parse().unwrap();
    assert_eq!(copies, 10, "the first collector went on from its own last push without asking");
    let expected: i64 = (1..=10).sum();
    for http in http {
        assert_eq!(total(http, ""), (200, expected), "each profile once, whichever collector answers");
    }
    assert_eq!(stored(&store), (1..=10).map(|n| ("back".to_string(), n)).collect::<Vec<_>>());
    // Out of line with its last push (a retry of it), the collector asks again.
    let retry = push(grpc[0], "back", 3, batch(6..=10));
    assert_eq!((retry.duplicates, retry.stored_through), (5, 10), "{retry:?}");
}

/// Four hundred agents' first pushes at once, each asking ClickHouse what is stored: all held.
/// ClickHouse closes the connections past those its handler threads and its queue of 64 take
/// (32 threads here; a busy server starts its threads too slowly for such a burst), so each
/// collector bounds its own.
#[test]
fn four_hundred_agents_pushing_at_once_are_all_stored() {
    let dir = TempDir::new("ch-thousand");
    let server = ClickHouseServer::start_configured(&dir.path("clickhouse"), "<max_connections>32</max_connections>");
    let store = TestStore::ClickHouse { server, database: "ember_test".into(), cluster: None, replicated: false };
    let (grpc, http) = (free_address(), free_address());
    let _collector = CollectorProcess::start_with_http(grpc, http, &store, &[]);
    const AGENTS: u64 = 400;
    let start = now() - 1200;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let answers: Vec<PushResponse> = runtime.block_on(async {
        let mut connections = Vec::new();
        for _ in 0..8 {
            connections.push(CollectorClient::connect(format!("http://{grpc}")).await.unwrap());
        }
        let pushes: Vec<_> = (1..=AGENTS)
            .map(|n| {
                let mut client = connections[n as usize % connections.len()].clone();
                let agent = AgentIdentity { agent_id: format!("agent-{n}"), hostname: format!("host-{n}"), spool_id: n, ..Default::default() };
                tokio::spawn(async move { client.push(PushRequest { agent: Some(agent), profiles: vec![profile(1, start, 1, &[])] }).await })
            })
            .collect();
        let mut answers = Vec::new();
        for push in pushes {
            answers.push(push.await.unwrap().expect("a push refused").into_inner());
        }
        answers
    });
    assert!(answers.iter().all(|a| a.stored_through == 1 && a.refused.is_empty()), "{:?}", answers.iter().find(|a| a.stored_through != 1));
    assert_eq!(total(http, ""), (200, AGENTS as i64));
}

#[test]
fn retention_drops_whole_days_and_a_late_retry_is_not_stored_again() {
    let dir = TempDir::new("ch-retention");
    let store = TestStore::clickhouse(&dir);
    let (grpc, http) = (free_address(), free_address());
    let collector = CollectorProcess::start_with_http(grpc, http, &store, &[]);
    let three_days_ago = now() - 3 * 86_400;
    let old: Vec<Profile> = (1..=3).map(|n| profile(n, three_days_ago + n as i64 * 10, 1, &[])).collect();
    let recent: Vec<Profile> = (4..=5).map(|n| profile(n, now() - 100 + n as i64, 1, &[])).collect();
    assert_eq!(push(grpc, "kept", 9, [old.clone(), recent].concat()).stored_through, 5);
    collector.stop();
    assert_eq!(stored(&store).len(), 5);
    // Retention runs when a collector starts, then every minute.
    let _collector = CollectorProcess::start_with_http(grpc, http, &store, &["--retention-hours", "24"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while stored(&store).len() != 2 {
        assert!(Instant::now() < deadline, "the old day is still stored: {:?}", stored(&store));
        std::thread::sleep(Duration::from_millis(200));
    }
    let partitions = server(&store).query("SELECT count() FROM system.parts WHERE database = 'ember_test' AND table != 'watermarks' AND active AND toUInt16(max_date) < toUInt16(today()) - 1");
    assert_eq!(partitions.trim(), "0", "parts of dropped days remain");
    let retry = push(grpc, "kept", 9, vec![old[0].clone()]);
    assert_eq!((retry.stored_through, retry.duplicates), (5, 1));
    assert_eq!(stored(&store), [("kept".to_string(), 4), ("kept".to_string(), 5)]);
}

#[test]
fn selectors_and_parameters_that_try_to_reach_the_sql_are_only_data() {
    let dir = TempDir::new("ch-hostile");
    let store = TestStore::clickhouse(&dir);
    let (grpc, http) = (free_address(), free_address());
    let _collector = CollectorProcess::start_with_http(grpc, http, &store, &[]);
    let start = now() - 60;
    push(grpc, "quoted", 1, vec![profile(1, start, 7, &[("team", "o'brien\\")])]);
    push(grpc, "plain", 2, vec![profile(1, start, 11, &[("team", "x")])]);
    let encode = |text: &str| text.bytes().map(|b| format!("%{b:02X}")).collect::<String>();
    assert_eq!(total(http, ""), (200, 18));
    // A value with a quote and a backslash is a value like any other.
    assert_eq!(total(http, &format!("selector={}", encode("team=o'brien\\"))), (200, 7));
    for hostile in ["team=x' OR '1'='1", "team=x\\' OR 1=1 --", "x') OR 1=1 --=1", "team=x'; DROP TABLE ember_test.samples; --", "host=plain' AND sleep(3) = 0 --"] {
        assert_eq!(total(http, &format!("selector={}", encode(hostile))).0, 404, "{hostile}");
    }
    for kind in ["cpu' OR '1'='1", "cpu') --", "cpu\\"] {
        let (status, _) = http_get(http, &format!("/query?kind={}&format=folded", encode(kind)));
        assert_eq!(status, 404, "{kind}");
        let (status, body) = http_get(http, &format!("/api/labels?kind={}", encode(kind)));
        assert_eq!((status, String::from_utf8_lossy(&body).as_ref()), (200, r#"{"labels":{},"truncated":[]}"#), "{kind}");
    }
    // Two profiles that start in the same second, one per group: two profiles, two lines.
    let (status, body) = http_get(http, "/api/series?kind=cpu&group_by=team");
    let series: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((status, series["profiles"].as_u64(), series["lines"].as_array().map(Vec::len)), (200, Some(2), Some(2)), "{series}");
    let (status, body) = http_get(http, &format!("/api/series?kind=cpu&group_by={}", encode("team') --")));
    assert!(status == 200 && String::from_utf8_lossy(&body).contains("[none]"), "{status} {}", String::from_utf8_lossy(&body));
    // Too many terms: refused in one line.
    let many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
    let (status, body) = http_get(http, &format!("/query?kind=cpu&format=folded&selector={}", encode(&many.join(","))));
    let text = String::from_utf8_lossy(&body);
    assert!((400..500).contains(&status) && text.contains("at most 32 terms") && text.trim_end().lines().count() == 1, "{status} {text}");
    // As many terms as may be: answered (the statement is far longer than the 16 KiB request
    // line ClickHouse's HTTP server takes).
    let labels: Vec<(String, String)> = (0..32).map(|i| (format!("k{i}"), "v".to_string())).collect();
    let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    push(grpc, "labelled", 3, vec![profile(1, start, 5, &labels)]);
    assert_eq!(total(http, &format!("selector={}", encode(&many[..32].join(",")))), (200, 5));
    // Everything is still there.
    assert_eq!(total(http, ""), (200, 23));
    assert_eq!(stored(&store).len(), 3);
}

#[test]
fn clickhouse_away_for_20_s_loses_and_doubles_nothing_and_readyz_says_why() {
    require_root();
    let dir = TempDir::new("ch-outage");
    let mut store = TestStore::clickhouse(&dir);
    let (grpc, http, spool) = (free_address(), free_address(), dir.path("spool"));
    let collector = CollectorProcess::start_with_http(grpc, http, &store, &[]);
    let agent = push_agent(grpc, &spool, "outage-agent", &["--pid", "1"]);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(http_get(http, "/readyz"), (200, b"ready\n".to_vec()));
    let TestStore::ClickHouse { server, .. } = &mut store else { unreachable!() };
    server.kill();
    let away = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let (status, body) = http_get(http, "/readyz");
    let text = String::from_utf8_lossy(&body);
    assert!(status == 503 && text.starts_with("not ready: ClickHouse is not answering") && text.trim_end().lines().count() == 1, "{status} {text}");
    assert_eq!(http_get(http, "/healthz").0, 200, "the collector itself is alive");
    std::thread::sleep(Duration::from_secs(20).saturating_sub(away.elapsed()));
    assert!(!spool_is_empty(&spool), "nothing was spooled while ClickHouse was away");
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !spool_is_empty(&spool) {
        assert!(Instant::now() < deadline, "the spool was not delivered within 60 s of ClickHouse's return");
        std::thread::sleep(Duration::from_millis(250));
    }
    stop_agent(agent);
    collector.stop();
    let made: u64 = std::fs::read_to_string(spool.join("next-sequence")).unwrap().trim().parse::<u64>().unwrap() - 1;
    // Profiling went on all along: 3 s before, 20 s away, and the restart.
    assert!(made >= 20, "only {made} profiles in some 24 s at 1 s intervals");
    assert_eq!(stored(&store), (1..=made).map(|n| ("outage-agent".to_string(), n)).collect::<Vec<_>>(), "every profile once");
}

#[test]
fn an_agent_fails_over_when_its_collector_dies_mid_push_and_each_profile_is_stored_once() {
    require_root();
    let dir = TempDir::new("ch-failover");
    let store = TestStore::clickhouse(&dir);
    let (first_address, second_address, spool) = (free_address(), free_address(), dir.path("spool"));
    let first = CollectorProcess::start(first_address, &store);
    let _second = CollectorProcess::start(second_address, &store);
    let second_url = format!("http://{second_address}");
    let agent = push_agent(first_address, &spool, "failover-agent", &["--pid", "1", "--push", &second_url]);
    std::thread::sleep(Duration::from_secs(3));
    // Frozen, the first collector holds the next push unanswered; killed, it never answers.
    unsafe { libc::kill(first.pid() as i32, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_millis(2500));
    unsafe { libc::kill(first.pid() as i32, libc::SIGKILL) };
    // The kill closes the connection of the push it held: the agent moves on at once, and
    // the second collector stores what the spool holds within a few pushes.
    let killed = Instant::now();
    while !spool_is_empty(&spool) && killed.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(250));
    }
    println!("spool delivered {:.1} s after the kill", killed.elapsed().as_secs_f64());
    assert!(spool_is_empty(&spool), "the second collector did not take the spool within 30 s:\n{}", agent.stderr());
    std::thread::sleep(Duration::from_secs(4).saturating_sub(killed.elapsed()));
    let log = agent.stderr();
    stop_agent(agent);
    assert!(log.contains(&format!("failed, trying {second_url}")), "no failover in the agent's log:\n{log}");
    let made: u64 = std::fs::read_to_string(spool.join("next-sequence")).unwrap().trim().parse::<u64>().unwrap() - 1;
    assert!(made >= 8, "only {made} profiles in ~10 s at 1 s intervals");
    assert_eq!(stored(&store), (1..=made).map(|n| ("failover-agent".to_string(), n)).collect::<Vec<_>>(), "every profile once");
}

#[test]
fn two_shards_behind_two_collectors_answer_what_three_agents_recorded() {
    require_root();
    let dir = TempDir::new("ch-cluster");
    let stores: Vec<TestStore> = ClickHouseServer::cluster(&dir.0, "fleet", 2)
        .into_iter()
        .map(|server| TestStore::ClickHouse { server, database: "ember_test".into(), cluster: Some("fleet".into()), replicated: false })
        .collect();
    let (grpc, http) = ([free_address(), free_address()], [free_address(), free_address()]);
    let _collectors: Vec<CollectorProcess> = (0..2).map(|i| CollectorProcess::start_with_http(grpc[i], http[i], &stores[i], &[])).collect();
    let mut fixture = Fixture::spawn(FIXTURE, "split", 3.0);
    let (fixture_pid, pid) = (fixture.pid(), fixture.pid().to_string());
    // The first pushes to one collector, the second to the other, the third to either.
    let second = format!("http://{}", grpc[1]);
    let agents: Vec<_> = (0..3)
        .map(|i| {
            let (spool, local) = (dir.path(&format!("spool-{i}")), dir.path(&format!("local-{i}")));
            let mut extra = vec!["--pid".to_string(), pid.clone(), "--output-dir".to_string(), local.display().to_string()];
            if i == 2 {
                extra.extend(["--push".to_string(), second.clone()]);
            }
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            (push_agent(grpc[usize::from(i == 1)], &spool, &format!("agent-{i}"), &extra), spool, local)
        })
        .collect();
    fixture.start();
    fixture.finish();
    let mut recorded = Vec::new();
    for (agent, spool, local) in agents {
        stop_agent(agent);
        assert!(spool_is_empty(&spool), "{} kept profiles", spool.display());
        let total: i64 = Decoded::read_kind(&local, "cpu").iter().map(|p| Decoded::total(&p.samples_of(fixture_pid))).sum();
        assert!(total > 50, "an agent recorded only {total} samples of the fixture");
        recorded.push(total);
    }
    let merged = |http: SocketAddr, selector: &str| -> i64 {
        let (status, body) = http_get(http, &format!("/query?kind=cpu&format=pprof&from={}&to={}&selector={selector}", now() - 600, now() + 1));
        assert_eq!(status, 200, "{selector}: {}", String::from_utf8_lossy(&body));
        Decoded::total(&Decoded::from_gzip(&body).samples_of(fixture_pid))
    };
    for http in http {
        for (i, total) in recorded.iter().enumerate() {
            assert_eq!(merged(http, &format!("agent=agent-{i}")), *total, "agent-{i}, asked of {http}");
        }
        assert_eq!(merged(http, ""), recorded.iter().sum::<i64>(), "all agents, asked of {http}");
    }
    // Both shards hold part of it.
    let local = |store: &TestStore, table: &str| -> u64 { server(store).query(&format!("SELECT count() FROM ember_test.{table}_local")).trim().parse().unwrap() };
    assert!(stores.iter().all(|s| local(s, "stacks") > 0), "a shard holds no stacks");
    assert_eq!(stores.iter().map(|s| local(s, "profiles")).sum::<u64>() as usize, stored(&stores[0]).len());
    // Roll-ups over the cluster, beside the agents' profiles of other sample types.
    earlier_profiles_are_rolled_up_and_read_through_each(grpc[0], &http);
}

/// A spool's profiles of ten minutes that ended 20 minutes ago, pushed to `collector`: each
/// of the collectors at `http` answers for them from the roll-ups.
fn earlier_profiles_are_rolled_up_and_read_through_each(collector: SocketAddr, http: &[SocketAddr]) {
    let start = (now() - 1800) / 600 * 600;
    let answer = push(collector, "earlier", 9, (1..=12).map(|n| profile(n, start + n as i64 * 10, n as i64, &[])).collect());
    assert!(answer.refused.is_empty(), "{answer:?}");
    for &http in http {
        wait_for_roll_ups(http, (start, start + 600), 12);
        assert_eq!(total(http, "selector=agent=earlier"), (200, (1..=12).sum()), "asked of {http}");
    }
}

#[test]
fn two_replicas_of_a_shard_answer_everything_while_one_is_away_and_it_catches_up_on_return() {
    require_root();
    let dir = TempDir::new("ch-replicas");
    let zookeeper = ZooKeeper::start(&dir.path("zookeeper"));
    let mut stores: Vec<TestStore> = ClickHouseServer::replicas(&dir.0, "fleet", 2, &zookeeper)
        .into_iter()
        .map(|server| TestStore::ClickHouse { server, database: "ember_test".into(), cluster: Some("fleet".into()), replicated: true })
        .collect();
    let (grpc, http) = ([free_address(), free_address()], [free_address(), free_address()]);
    let _collectors: Vec<CollectorProcess> = (0..2).map(|i| CollectorProcess::start_with_http(grpc[i], http[i], &stores[i], &[])).collect();
    let count = |store: &TestStore, table: &str| -> u64 { server(store).query(&format!("SELECT count() FROM ember_test.{table}_local")).trim().parse().unwrap() };
    // Replicas copy in the background, each table on its own.
    let within_60_s = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(Instant::now() < deadline, "not within 60 s: {what}");
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    let recent = now() - 300;
    let profiles = |numbers: std::ops::RangeInclusive<u64>| numbers.map(|n| profile(n, recent + n as i64, n as i64, &[])).collect::<Vec<_>>();
    // Ten stored through the first replica: the second copies them.
    assert!(push(grpc[0], "replicated", 1, profiles(1..=10)).refused.is_empty());
    within_60_s("the second replica holds the first ten", &|| count(&stores[1], "profiles") == 10 && count(&stores[1], "samples") == 10);
    // The first replica lost: its collector says so, the other stores ten more through the
    // second replica and answers for all twenty, and a retry of the first ten is known.
    let TestStore::ClickHouse { server: first, .. } = &mut stores[0] else { unreachable!() };
    first.kill();
    let (status, body) = http_get(http[0], "/readyz");
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert!(push(grpc[1], "replicated", 1, profiles(11..=20)).refused.is_empty());
    assert!(push(grpc[1], "replicated", 1, profiles(1..=10)).refused.is_empty());
    assert_eq!(total(http[1], "selector=agent=replicated"), (200, (1..=20).sum()));
    assert_eq!(count(&stores[1], "profiles"), 20, "a retry was stored again");
    // Back, the first replica fetches what it missed, and either collector answers for all.
    let TestStore::ClickHouse { server: first, .. } = &mut stores[0] else { unreachable!() };
    first.restart();
    for http in http {
        within_60_s(&format!("{http} answers for all twenty"), &|| total(http, "selector=agent=replicated") == (200, (1..=20).sum()));
    }
    within_60_s("the first replica fetches what it missed", &|| count(&stores[0], "profiles") == 20 && count(&stores[0], "samples") == 20);
    assert_eq!(stored(&stores[0]), (1..=20).map(|n| ("replicated".to_string(), n)).collect::<Vec<_>>(), "every profile once");
    // Roll-ups on replicas, held by both.
    earlier_profiles_are_rolled_up_and_read_through_each(grpc[1], &http);
    assert!(count(&stores[0], "rollups") > 0, "no roll-ups on the first replica");
    within_60_s("both replicas hold the roll-ups", &|| count(&stores[0], "rollups") == count(&stores[1], "rollups"));
}
