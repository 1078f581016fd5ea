//! Transport end to end on loopback: agents push to a real collector over gRPC; the collector
//! stores, de-duplicates and merges. Needs root (the agent loads BPF programs).
use std::{process::Command, time::Duration};

use ember_tests::{
    http_get, http_get_with, require_root,
    over_every_store,
    transport::{collector_bin, free_address, health_and_services, push_agent, spool_is_empty, stop_agent as stop, stored, CollectorProcess, TestStore},
    Agent, Decoded, Fixture, TempDir,
};

over_every_store!(
    pushed_profiles_are_stored_and_query_returns_the_fixtures_totals,
    bad_pushes_are_refused_without_crashing_or_losing_what_is_stored,
    queries_are_bounded_and_overflowing_merges_are_errors,
    heap_in_use_is_each_agents_average_and_growth_shows_between_two_times,
    the_collector_rolls_up_what_it_stored_and_answers_as_from_the_profiles,
);

const FIXTURE: &str = env!("CARGO_BIN_EXE_fixture");

fn pushed_profiles_are_stored_and_query_returns_the_fixtures_totals(store: fn(&TempDir) -> TestStore) {
    require_root();
    let dir = TempDir::new("push");
    let (address, data, spool, local) = (free_address(), store(&dir), dir.path("spool"), dir.path("local"));
    let http = free_address();
    let collector = CollectorProcess::start_with_http(address, http, &data, &[]);
    let mut fixture = Fixture::spawn(FIXTURE, "split", 2.0);
    let pid = fixture.pid().to_string();
    let agent = push_agent(address, &spool, "test-agent", &["--pid", &pid, "--output-dir", local.to_str().unwrap()]);
    fixture.start();
    fixture.finish();
    stop(agent);
    assert!(spool_is_empty(&spool), "profiles left in the spool with the collector up");
    // The running collector answers queries over HTTP.
    assert_eq!(http_get(http, "/healthz"), (200, b"ok\n".to_vec()));
    let (status, folded) = http_get(http, "/query?kind=cpu&selector=agent=test-agent&format=folded");
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&folded).contains("fixture::main;fixture::hot_a"));
    let (status, svg) = http_get(http, "/query?kind=cpu&format=svg");
    assert!(status == 200 && String::from_utf8_lossy(&svg).contains("<svg"));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let (status, diff) = http_get(http, &format!("/diff?kind=cpu&base_from={}&base_to={}&from={}&to={}", now - 3600, now + 1, now - 3600, now + 1));
    assert!(status == 200 && String::from_utf8_lossy(&diff).contains("<svg"), "diff: {status}");
    let (status, _) = http_get(http, "/query?kind=offcpu");
    assert_eq!(status, 404, "no off-CPU profiles were pushed");
    collector.stop();

    let out = dir.path("merged.pb.gz");
    let query = Command::new(collector_bin())
        .arg("query")
        .args(data.args())
        .args(["--kind", "cpu", "--selector", "agent=test-agent"])
        .args(["--format", "pprof", "-o", out.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(query.success());
    let merged = Decoded::read(&out);
    // The agent also wrote every profile locally: the collector's merge must hold the same.
    let local_total: i64 = Decoded::read_kind(&local, "cpu").iter().map(|p| Decoded::total(&p.samples_of(fixture_pid(&pid)))).sum();
    let merged_total = Decoded::total(&merged.samples_of(fixture_pid(&pid)));
    assert!(merged_total > 100, "the fixture's samples are missing from the query");
    assert_eq!(merged_total, local_total);
    assert!(merged.samples_of(fixture_pid(&pid)).iter().any(|s| s.has_function("fixture::hot_a")));
}

fn fixture_pid(pid: &str) -> u32 {
    pid.parse().unwrap()
}

/// The collector's outage, not its store's: over ClickHouse, `clickhouse.rs` stops ClickHouse.
#[test]
fn collector_outage_and_agent_restart_lose_nothing_and_store_each_profile_once() {
    require_root();
    let dir = TempDir::new("outage");
    let (address, data, spool) = (free_address(), TestStore::embedded(&dir), dir.path("spool"));
    let collector = CollectorProcess::start(address, &data);
    let agent = push_agent(address, &spool, "test-agent", &["--pid", "1"]);
    std::thread::sleep(Duration::from_secs(3));
    collector.stop();
    // 30 s without a collector: the agent keeps profiling into its spool.
    std::thread::sleep(Duration::from_secs(30));
    assert!(!spool_is_empty(&spool), "nothing was spooled during the outage");
    // The agent stops while the collector is still down: its spool must survive the restart.
    stop(agent);
    let collector = CollectorProcess::start(address, &data);
    let agent = push_agent(address, &spool, "test-agent", &["--pid", "1"]);
    std::thread::sleep(Duration::from_secs(3));
    stop(agent);
    collector.stop();

    assert!(spool_is_empty(&spool), "spooled profiles were not delivered");
    let next: u64 = std::fs::read_to_string(spool.join("next-sequence")).unwrap().trim().parse().unwrap();
    let rows = stored(&data);
    let expected: Vec<(String, u64)> = (1..next).map(|s| ("test-agent".to_string(), s)).collect();
    assert!(expected.len() > 30, "only {} profiles made in ~36 s at 1 s intervals", expected.len());
    assert_eq!(rows, expected, "every profile exactly once, none missing");
}

fn bad_pushes_are_refused_without_crashing_or_losing_what_is_stored(store: fn(&TempDir) -> TestStore) {
    use std::collections::HashMap;

    use ember_proto::ember::{collector_client::CollectorClient, AgentIdentity, Profile, PushRequest};
    use tonic::Code;

    let dir = TempDir::new("bad-push");
    let (address, data) = (free_address(), store(&dir));
    let collector = CollectorProcess::start(address, &data);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
    let valid_pprof = ember_tests::empty_pprof_gzip();
    let profile = |sequence: u64| Profile {
        sequence,
        kind: "cpu".into(),
        start_unix_nanos: now - 10_000_000_000,
        end_unix_nanos: now,
        labels: HashMap::new(),
        pprof_gzip: valid_pprof.clone(),
    };
    let push = |profile: Profile| {
        runtime.block_on(async {
            let mut client = CollectorClient::connect(format!("http://{address}")).await.unwrap();
            let agent = AgentIdentity { agent_id: "bad-test".into(), hostname: "h".into(), version: "0".into(), ..Default::default() };
            client.push(PushRequest { agent: Some(agent), profiles: vec![profile] }).await
        })
    };

    let first = push(profile(1)).expect("a valid push is stored").into_inner();
    assert_eq!((first.stored_through, first.duplicates), (1, 0));

    // Bad content is refused profile by profile, with the reason, and never stored; a message
    // too large to read is refused whole by the transport.
    let refused = |p: Profile, codes: &[Code], what: &str| match push(p) {
        Ok(response) => {
            let response = response.into_inner();
            assert!(codes.contains(&Code::InvalidArgument), "{what}: accepted as content: {response:?}");
            assert!(response.held.is_empty() && response.refused.len() == 1 && response.refused[0].sequence == 2, "{what}: {response:?}");
            assert!(!response.refused[0].reason.is_empty(), "{what}: no reason given");
        }
        Err(status) => assert!(codes.contains(&status.code()) && status.code() != Code::InvalidArgument, "{what}: {status:?}"),
    };
    refused(Profile { pprof_gzip: b"not a profile".to_vec(), ..profile(2) }, &[Code::InvalidArgument], "malformed pprof");
    refused(Profile { kind: "gpu".into(), ..profile(2) }, &[Code::InvalidArgument], "unknown kind");
    let tomorrow = now + 86_400_000_000_000;
    refused(Profile { start_unix_nanos: tomorrow, end_unix_nanos: tomorrow + 1, ..profile(2) }, &[Code::InvalidArgument], "clock skew");
    refused(Profile { end_unix_nanos: now - 20_000_000_000, ..profile(2) }, &[Code::InvalidArgument], "end before start");
    refused(Profile { pprof_gzip: vec![7; 5 << 20], ..profile(2) }, &[Code::ResourceExhausted, Code::OutOfRange], "oversized message");
    // 100 MiB of zeros gzip to 100 KiB: the collector must not inflate it.
    let bomb = ember_tests::gzip(&vec![0u8; 100 << 20]);
    refused(Profile { pprof_gzip: bomb, ..profile(2) }, &[Code::InvalidArgument], "decompression bomb");
    refused(Profile { pprof_gzip: ember_tests::one_sample_pprof_gzip(-1), ..profile(2) }, &[Code::InvalidArgument], "negative value");
    let labels: HashMap<String, String> = (0..1_000_000).map(|i| (format!("k{i}"), "v".into())).collect();
    refused(Profile { labels, ..profile(2) }, &[Code::ResourceExhausted, Code::OutOfRange, Code::InvalidArgument], "a million labels");

    // A retry of what is stored is acknowledged and dropped.
    let retry = push(profile(1)).expect("a retry is not an error").into_inner();
    assert_eq!((retry.stored_through, retry.duplicates), (1, 1));
    collector.stop();
    assert_eq!(stored(&data), [("bad-test".to_string(), 1)]);
}

#[test]
fn a_collector_with_a_token_refuses_pushes_and_queries_without_it() {
    require_root();
    use ember_proto::ember::{collector_client::CollectorClient, AgentIdentity, PushRequest};

    let dir = TempDir::new("token");
    let (address, http, data, spool) = (free_address(), free_address(), TestStore::embedded(&dir), dir.path("spool"));
    let (token_file, wrong_file) = (dir.path("token"), dir.path("wrong"));
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    std::fs::write(&wrong_file, "not-the-token\n").unwrap();
    let collector = CollectorProcess::start_with_http(address, http, &data, &["--token-file", token_file.to_str().unwrap()]);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let push = |authorization: Option<&str>| {
        runtime.block_on(async {
            let mut client = CollectorClient::connect(format!("http://{address}")).await.unwrap();
            let agent = AgentIdentity { agent_id: "token-test".into(), ..Default::default() };
            let mut request = tonic::Request::new(PushRequest { agent: Some(agent), profiles: vec![] });
            if let Some(value) = authorization {
                request.metadata_mut().insert("authorization", value.parse().unwrap());
            }
            client.push(request).await.map(|_| ()).map_err(|status| status.code())
        })
    };
    assert_eq!(push(None), Err(tonic::Code::Unauthenticated));
    assert_eq!(push(Some("Bearer not-the-token")), Err(tonic::Code::Unauthenticated));
    assert_eq!(push(Some("Bearer s3cret-token")), Ok(()));

    assert_eq!(http_get(http, "/healthz").0, 200, "probes need no token");
    assert_eq!(http_get(http, "/query?kind=cpu").0, 401);
    assert_eq!(http_get_with(http, "/query?kind=cpu", "Authorization: Bearer not-the-token\r\n").0, 401);
    // With the token: nothing stored yet, so "not found" rather than "unauthorized".
    assert_eq!(http_get_with(http, "/query?kind=cpu", "Authorization: Bearer s3cret-token\r\n").0, 404);

    // An agent with the wrong token keeps its profiles; with the right one they arrive.
    let agent = push_agent(address, &spool, "test-agent", &["--pid", "1", "--token-file", wrong_file.to_str().unwrap()]);
    std::thread::sleep(Duration::from_secs(3));
    stop(agent);
    assert!(!spool_is_empty(&spool), "refused profiles must stay spooled");
    let agent = push_agent(address, &spool, "test-agent", &["--pid", "1", "--token-file", token_file.to_str().unwrap()]);
    std::thread::sleep(Duration::from_secs(2));
    stop(agent);
    assert!(spool_is_empty(&spool));
    collector.stop();
    let rows = stored(&data);
    assert!(rows.len() >= 4 && rows.iter().all(|(agent, _)| agent == "test-agent"), "{rows:?}");
}

#[test]
fn a_collector_pulls_from_an_agent_and_resumes_without_gaps_after_a_restart() {
    require_root();
    let dir = TempDir::new("pull");
    let (agent_address, data, spool) = (free_address(), TestStore::embedded(&dir), dir.path("spool"));
    let serve = agent_address.to_string();
    let args = ["run", "-F", "99", "--interval", "1s", "--serve", &serve, "--agent-id", "pulled-agent", "--pid", "1"];
    let mut agent = Agent::spawn(&[&args[..], &["--spool-dir", spool.to_str().unwrap()]].concat());
    agent.wait_ready();
    let pull = format!("http://{agent_address}");
    let collector = CollectorProcess::start_with_http(free_address(), free_address(), &data, &["--pull", &pull]);
    std::thread::sleep(Duration::from_secs(4));
    collector.stop();
    // The agent keeps profiling while no collector pulls; the restarted one resumes.
    std::thread::sleep(Duration::from_secs(4));
    let collector = CollectorProcess::start_with_http(free_address(), free_address(), &data, &["--pull", &pull]);
    std::thread::sleep(Duration::from_secs(4));
    collector.stop();
    stop(agent);

    let rows = stored(&data);
    let made: u64 = std::fs::read_to_string(spool.join("next-sequence")).unwrap().trim().parse::<u64>().unwrap() - 1;
    let last = rows.last().map_or(0, |(_, s)| *s);
    let expected: Vec<(String, u64)> = (1..=last).map(|s| ("pulled-agent".to_string(), s)).collect();
    assert_eq!(rows, expected, "pulled profiles must be 1..=N, each once");
    // Everything made while a collector was connected or away, but the final flush after it
    // stopped pulling.
    assert!(last + 2 >= made && last >= 8, "pulled {last} of {made} profiles");
}

#[test]
fn collector_and_pulled_agent_answer_grpc_health_checks_and_reflection() {
    require_root();
    let dir = TempDir::new("health");
    let (address, agent_address) = (free_address(), free_address());
    let collector = CollectorProcess::start(address, &TestStore::embedded(&dir));
    let serve = agent_address.to_string();
    let spool = dir.path("spool");
    let mut agent = Agent::spawn(&["run", "--interval", "1s", "--serve", &serve, "--pid", "1", "--spool-dir", spool.to_str().unwrap()]);
    agent.wait_ready();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for (address, service) in [(address, "ember.v1.Collector"), (agent_address, "ember.v1.Agent")] {
        let (status, services) = runtime.block_on(async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap().connect().await.unwrap();
            health_and_services(channel, service).await
        });
        assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32, "{service}");
        assert!(services.contains(&service.to_string()), "{services:?}");
        assert!(services.contains(&"grpc.health.v1.Health".to_string()), "{services:?}");
    }
    stop(agent);
    collector.stop();
}

/// Queries are bounded (default and maximum range, concurrency, time) and values that would
/// overflow a merge give a one-line error, not a wrong answer or a crash.
fn queries_are_bounded_and_overflowing_merges_are_errors(store: fn(&TempDir) -> TestStore) {
    use ember_proto::ember::{collector_client::CollectorClient, AgentIdentity, Profile, PushRequest};

    let dir = TempDir::new("query-limits");
    let (address, http, data) = (free_address(), free_address(), store(&dir));
    // No roll-ups (they come a day after a bucket ends): the queries below must read every
    // profile, to be slow enough to overlap and to time out.
    let limits = ["--query-max-range-hours", "2", "--query-concurrency", "1", "--rollup-delay-seconds", "86400"];
    let collector = CollectorProcess::start_with_http(address, http, &data, &limits);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    const NS: i64 = 1_000_000_000;
    let push = |kind: &str, profiles: Vec<(i64, i64)>, first: u64| {
        let profiles = profiles
            .into_iter()
            .enumerate()
            .map(|(i, (start, value))| Profile {
                sequence: first + i as u64,
                kind: kind.into(),
                start_unix_nanos: start * NS,
                end_unix_nanos: start * NS + NS,
                labels: Default::default(),
                pprof_gzip: ember_tests::one_sample_pprof_gzip(value),
            })
            .collect();
        runtime.block_on(async {
            let mut client = CollectorClient::connect(format!("http://{address}")).await.unwrap();
            let agent = AgentIdentity { agent_id: format!("limits-{kind}"), spool_id: first, ..Default::default() };
            let response = client.push(PushRequest { agent: Some(agent), profiles }).await.unwrap().into_inner();
            assert!(response.refused.is_empty(), "{response:?}");
        })
    };
    let total = |body: &[u8]| -> i64 { String::from_utf8_lossy(body).lines().filter_map(|l| l.rsplit_once(' ')?.1.parse::<i64>().ok()).sum() };
    let one_line = |body: &[u8]| String::from_utf8_lossy(body).trim_end().lines().count() == 1;

    // A profile of the last minute and one of 90 minutes ago: a query without a range covers
    // the last hour only.
    push("cpu", vec![(now - 60, 5), (now - 5400, 7)], 1);
    let (status, body) = http_get(http, "/query?kind=cpu&format=folded");
    assert_eq!((status, total(&body)), (200, 5), "{}", String::from_utf8_lossy(&body));
    let (status, body) = http_get(http, &format!("/query?kind=cpu&format=folded&from={}&to={}", now - 7000, now + 1));
    assert_eq!((status, total(&body)), (200, 12));
    // Longer than the maximum: refused, one line.
    let (status, body) = http_get(http, &format!("/query?kind=cpu&format=folded&from=0&to={now}"));
    assert!(status == 400 && one_line(&body) && String::from_utf8_lossy(&body).contains("longer than"), "{status} {}", String::from_utf8_lossy(&body));

    // Two valid profiles whose values sum past i64: the merge says so.
    push("offcpu", vec![(now - 30, i64::MAX - 1), (now - 20, i64::MAX - 1)], 10);
    let (status, body) = http_get(http, "/query?kind=offcpu&format=folded");
    assert!(status == 422 && one_line(&body) && String::from_utf8_lossy(&body).contains("overflow"), "{status} {}", String::from_utf8_lossy(&body));

    // Tens of thousands of profiles: while one query merges them, queries beside it are
    // turned away.
    let many: Vec<(i64, i64)> = (0..30_000).map(|i| (now - 3000 + i % 2000, 1)).collect();
    for (n, chunk) in many.chunks(500).enumerate() {
        push("wall", chunk.to_vec(), 100 + n as u64 * 1000);
    }
    let answers: Vec<(u16, Vec<u8>)> = std::thread::scope(|scope| {
        let queries: Vec<_> = (0..4).map(|_| scope.spawn(|| http_get(http, "/query?kind=wall&format=folded"))).collect();
        queries.into_iter().map(|q| q.join().unwrap()).collect()
    });
    let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    assert!(statuses.contains(&200) && statuses.contains(&503), "{statuses:?}");
    let (ok, busy) = (&answers.iter().find(|(s, _)| *s == 200).unwrap().1, &answers.iter().find(|(s, _)| *s == 503).unwrap().1);
    assert_eq!(total(ok), 30_000);
    assert!(one_line(busy), "{}", String::from_utf8_lossy(busy));
    collector.stop();
    // The same store with a 1 ms time limit: the query stops, with a one-line error.
    let collector = CollectorProcess::start_with_http(address, http, &data, &["--query-timeout-ms", "1", "--rollup-delay-seconds", "86400"]);
    let (status, body) = http_get(http, "/query?kind=wall&format=folded");
    assert!(status == 504 && one_line(&body), "{status} {}", String::from_utf8_lossy(&body));
    assert_eq!(http_get(http, "/healthz").0, 200);
    collector.stop();
}

/// Heap profiles tell what was in use when each was taken: over a range, an agent's in-use is
/// the average of its profiles and the agents' averages add up, where allocations add up over
/// time; growth shows between two ranges. Agent a leaks 100 bytes every 10 s, b holds 1000.
fn heap_in_use_is_each_agents_average_and_growth_shows_between_two_times(store: fn(&TempDir) -> TestStore) {
    use ember_proto::ember::{collector_client::CollectorClient, AgentIdentity, Profile, PushRequest};

    let dir = TempDir::new("heap-in-use");
    let (address, http, data) = (free_address(), free_address(), store(&dir));
    // Minutes are rolled up as soon as they end: the answers hold from the profiles and from
    // their roll-ups alike.
    let collector = CollectorProcess::start_with_http(address, http, &data, &["--rollup-delay-seconds", "0"]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    const NS: i64 = 1_000_000_000;
    // Each profile: (start, bytes allocated in its 10 s, bytes in use at its end).
    let push = |agent: &str, spool_id: u64, profiles: &[(i64, i64, i64)]| {
        let profiles = profiles
            .iter()
            .enumerate()
            .map(|(i, &(start, allocated, in_use))| Profile {
                sequence: i as u64 + 1,
                kind: "heap".into(),
                start_unix_nanos: start * NS,
                end_unix_nanos: (start + 10) * NS,
                labels: Default::default(),
                pprof_gzip: heap_pprof_gzip(allocated, in_use),
            })
            .collect();
        runtime.block_on(async {
            let mut client = CollectorClient::connect(format!("http://{address}")).await.unwrap();
            let agent = AgentIdentity { agent_id: agent.into(), spool_id, ..Default::default() };
            let response = client.push(PushRequest { agent: Some(agent), profiles }).await.unwrap().into_inner();
            assert!(response.refused.is_empty(), "{response:?}");
        })
    };
    push("heap-a", 1, &[(now - 300, 10, 100), (now - 290, 10, 200), (now - 280, 10, 300)]);
    push("heap-b", 2, &[(now - 290, 5, 1000)]);
    // The folded view of a heap weighs by bytes in use.
    let in_use = |from: i64, to: i64| -> i64 {
        let (status, body) = http_get(http, &format!("/query?kind=heap&format=folded&from={from}&to={to}"));
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        String::from_utf8_lossy(&body).lines().filter_map(|l| l.rsplit_once(' ')?.1.parse::<i64>().ok()).sum()
    };
    assert_eq!(in_use(now - 400, now), 200 + 1000, "a's average and b's, not the sum of the four profiles");
    // The series over one step: in use (value 3) as above, allocated (value 1) summed.
    let series = |value: usize| -> String {
        let (status, body) = http_get(http, &format!("/api/series?kind=heap&from={}&to={now}&step=400&value={value}", now - 400));
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        String::from_utf8_lossy(&body).into_owned()
    };
    assert!(series(3).contains(r#""values":[1200]"#), "{}", series(3));
    assert!(series(1).contains(r#""values":[35]"#), "{}", series(1));
    // Growth: the first profile of a against its third.
    let (before, after) = (in_use(now - 305, now - 295), in_use(now - 285, now - 275));
    assert_eq!((before, after), (100, 300));
    let (status, diff) = http_get(http, &format!("/diff?kind=heap&base_from={}&base_to={}&from={}&to={}", now - 305, now - 295, now - 285, now - 275));
    assert!(status == 200 && String::from_utf8_lossy(&diff).contains("leak"), "diff: {status}");
    // Once every minute is rolled up, the average per agent is the same.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = http_get(http, &format!("/api/tree?kind=heap&from={}&to={now}", now - 400));
        let tree: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!((status, tree["profiles"].as_u64()), (200, Some(4)), "{tree}");
        if tree["rolled_up"] == 4 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not all rolled up after 60 s: {tree}");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(in_use(now - 400, now), 200 + 1000, "through roll-ups");
    collector.stop();
}

/// A heap pprof (alloc_objects, alloc_space, inuse_objects, inuse_space) of one stack,
/// main;leak, with `allocated` bytes allocated and `in_use` bytes in use.
fn heap_pprof_gzip(allocated: i64, in_use: i64) -> Vec<u8> {
    use ember_proto::pprof::{Function, Line, Location, Profile, Sample, ValueType};
    use prost::Message as _;
    let strings = ["", "alloc_objects", "count", "alloc_space", "bytes", "inuse_objects", "inuse_space", "main", "leak"].map(String::from).to_vec();
    let frame = |id: u64| (Function { id, name: id as i64 + 6, ..Default::default() }, Location { id, line: vec![Line { function_id: id, ..Default::default() }], ..Default::default() });
    let (functions, locations) = (1..=2).map(frame).unzip();
    let profile = Profile {
        string_table: strings,
        sample_type: [(1, 2), (3, 4), (5, 2), (6, 4)].map(|(r#type, unit)| ValueType { r#type, unit }).to_vec(),
        sample: vec![Sample { location_id: vec![2, 1], value: vec![1, allocated, 1, in_use], label: vec![] }],
        function: functions,
        location: locations,
        ..Default::default()
    };
    ember_tests::gzip(&profile.encode_to_vec())
}

/// A pprof of two stacks, main;work_a (`a` samples, labelled pod=`pod`) and main;work_b (2).
fn two_stack_pprof_gzip(a: i64, pod: &str) -> Vec<u8> {
    use ember_proto::pprof::{Function, Label, Line, Location, Profile, Sample, ValueType};
    use prost::Message as _;
    let strings = ["", "samples", "count", "main", "work_a", "work_b", "pod", pod].map(String::from).to_vec();
    let frame = |id: u64| (Function { id, name: id as i64 + 2, ..Default::default() }, Location { id, line: vec![Line { function_id: id, ..Default::default() }], ..Default::default() });
    let (functions, locations) = (1..=3).map(frame).unzip();
    let pod = Label { key: 6, str: 7, ..Default::default() };
    let profile = Profile {
        string_table: strings,
        sample_type: vec![ValueType { r#type: 1, unit: 2 }],
        sample: vec![
            Sample { location_id: vec![2, 1], value: vec![a], label: vec![pod] },
            Sample { location_id: vec![3, 1], value: vec![2], label: vec![] },
        ],
        function: functions,
        location: locations,
        ..Default::default()
    };
    ember_tests::gzip(&profile.encode_to_vec())
}

fn the_collector_rolls_up_what_it_stored_and_answers_as_from_the_profiles(store: fn(&TempDir) -> TestStore) {
    use ember_proto::ember::{collector_client::CollectorClient, AgentIdentity, Profile, PushRequest};

    let dir = TempDir::new("rollups");
    let (address, http, data) = (free_address(), free_address(), store(&dir));
    let collector = CollectorProcess::start_with_http(address, http, &data, &[]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    const NS: i64 = 1_000_000_000;
    // 20 minutes of 10 s profiles from two agents, two hours ago, from a ten-minute boundary:
    // every bucket is due at once.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let start = (now - 7200) / 600 * 600;
    let push = |agent: usize, numbers: std::ops::Range<i64>| {
        let profiles = numbers
            .map(|i| Profile {
                sequence: i as u64 + 1,
                kind: "cpu".into(),
                start_unix_nanos: (start + 10 * i) * NS,
                end_unix_nanos: (start + 10 * i + 10) * NS,
                labels: Default::default(),
                pprof_gzip: two_stack_pprof_gzip(1 + i % 3, &format!("pod-{}", i % 2)),
            })
            .collect();
        runtime.block_on(async {
            let mut client = CollectorClient::connect(format!("http://{address}")).await.unwrap();
            let agent = AgentIdentity { agent_id: format!("agent-{agent}"), hostname: format!("host-{agent}"), ..Default::default() };
            let response = client.push(PushRequest { agent: Some(agent), profiles }).await.unwrap().into_inner();
            assert!(response.refused.is_empty(), "{response:?}");
        })
    };
    // What each query must answer: a, summed per selection, and work_b's 2 per profile.
    let expected = |numbers: std::ops::Range<i64>, pod: Option<i64>| -> i64 {
        numbers.map(|i| if pod.is_none_or(|p| p == i % 2) { 1 + i % 3 } else { 0 } + if pod.is_none() { 2 } else { 0 }).sum()
    };
    push(0, 0..120);
    push(1, 0..120);
    let range = format!("from={start}&to={}", start + 1200);
    let tree = |extra: &str| -> serde_json::Value {
        let (status, body) = http_get(http, &format!("/api/tree?kind=cpu&{range}&max_nodes=10{extra}"));
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).unwrap()
    };
    let totals = |selector: &str| -> i64 {
        let (status, body) = http_get(http, &format!("/query?kind=cpu&format=folded&{range}&selector={selector}"));
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        ember_tests::folded_total(&String::from_utf8_lossy(&body))
    };
    // The roller (every 10 s) rolls up every profile; the embedded store reads them as four
    // records: ten minutes per agent.
    let embedded = matches!(data, TestStore::Embedded(_));
    let wait_for_roll_ups = |profiles: u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let answer = tree("");
            assert_eq!(answer["profiles"], profiles);
            if answer["rolled_up"] == profiles {
                if embedded {
                    assert_eq!(answer["records"], 4);
                }
                return;
            }
            assert!(std::time::Instant::now() < deadline, "not all rolled up after 60 s: {answer}");
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    assert_eq!(tree("")["profiles"], 240);
    wait_for_roll_ups(240);
    assert_eq!(totals(""), 2 * expected(0..120, None));
    assert_eq!(totals("host=host-1"), expected(0..120, None));
    // A sample label: roll-ups keep them.
    assert_eq!(totals("pod=pod-1"), 2 * expected(0..120, Some(1)));
    assert_eq!(totals("agent=agent-0,pod=pod-0"), expected(0..120, Some(0)));

    // A late profile (sequence 121, 5 minutes in): seen at once, read raw beside the
    // untouched roll-ups; then rolled up again.
    let late = Profile {
        sequence: 121,
        kind: "cpu".into(),
        start_unix_nanos: (start + 300) * NS,
        end_unix_nanos: (start + 310) * NS,
        labels: Default::default(),
        pprof_gzip: two_stack_pprof_gzip(100, "pod-1"),
    };
    runtime.block_on(async {
        let mut client = CollectorClient::connect(format!("http://{address}")).await.unwrap();
        let agent = AgentIdentity { agent_id: "agent-1".into(), hostname: "host-1".into(), ..Default::default() };
        client.push(PushRequest { agent: Some(agent), profiles: vec![late] }).await.unwrap();
    });
    assert_eq!(totals("host=host-1"), expected(0..120, None) + 102);
    let answer = tree("");
    assert_eq!(answer["profiles"], 241);
    assert!(answer["rolled_up"].as_u64().unwrap() < 241, "read raw until rolled up again: {answer}");
    wait_for_roll_ups(241);
    assert_eq!(totals("pod=pod-1"), 2 * expected(0..120, Some(1)) + 100);
    // Roll-ups are kept in the store: a restarted collector reads them at once.
    collector.stop();
    let collector = CollectorProcess::start_with_http(address, http, &data, &[]);
    let answer = tree("");
    assert_eq!((answer["rolled_up"].as_u64(), answer["profiles"].as_u64()), (Some(241), Some(241)));
    if embedded {
        assert_eq!(answer["records"], 4);
    }
    assert_eq!(totals(""), 2 * expected(0..120, None) + 102);
    collector.stop();
}
