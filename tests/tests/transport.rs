//! Transport end to end on loopback: agents push to a real collector over gRPC; the collector
//! stores, de-duplicates and merges. Needs root (the agent loads BPF programs).
use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::{Child, Command},
    time::{Duration, Instant},
};

use ember_tests::{http_get, http_get_with, require_root, Agent, Decoded, Fixture, TempDir};

const FIXTURE: &str = env!("CARGO_BIN_EXE_fixture");

fn collector_bin() -> std::path::PathBuf {
    ember_tests::agent_bin().with_file_name("ember-collector")
}

/// A loopback port nobody listens on.
fn free_address() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// A running collector, stopped (SIGINT) on drop.
struct Collector(Child);

impl Collector {
    fn start(address: SocketAddr, data: &Path) -> Collector {
        Collector::start_with_http(address, free_address(), data, &[])
    }

    fn start_with_http(address: SocketAddr, http: SocketAddr, data: &Path, extra: &[&str]) -> Collector {
        let child = Command::new(collector_bin())
            .args(["serve", "--listen", &address.to_string(), "--http", &http.to_string()])
            .args(["--data-dir", data.to_str().unwrap()])
            .args(extra)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting ember-collector");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(address).is_err() {
            assert!(Instant::now() < deadline, "collector not listening after 10 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Collector(child)
    }

    fn stop(mut self) {
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let status = self.0.wait().unwrap();
        assert!(status.success(), "collector exited with {status}");
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// (agent, sequence) of every stored profile.
fn stored(data: &Path) -> Vec<(String, u64)> {
    let out = Command::new(collector_bin()).args(["list", "--data-dir", data.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut rows: Vec<(String, u64)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_string(), f[1].parse().unwrap())
        })
        .collect();
    rows.sort();
    rows
}

fn push_agent(address: SocketAddr, spool: &Path, extra: &[&str]) -> Agent {
    let url = format!("http://{address}");
    let mut args = vec!["run", "-F", "99", "--interval", "1s", "--push", &url, "--agent-id", "test-agent"];
    args.extend(["--spool-dir", spool.to_str().unwrap()]);
    args.extend(extra);
    let mut agent = Agent::spawn(&args);
    agent.wait_ready();
    agent
}

fn stop(agent: Agent) {
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(60));
}

fn spool_is_empty(spool: &Path) -> bool {
    std::fs::read_dir(spool).unwrap().flatten().all(|e| e.path().extension().is_none_or(|x| x != "profile"))
}

#[test]
fn pushed_profiles_are_stored_and_query_returns_the_fixtures_totals() {
    require_root();
    let dir = TempDir::new("push");
    let (address, data, spool, local) = (free_address(), dir.path("data"), dir.path("spool"), dir.path("local"));
    let http = free_address();
    let collector = Collector::start_with_http(address, http, &data, &[]);
    let mut fixture = Fixture::spawn(FIXTURE, "split", 2.0);
    let pid = fixture.pid().to_string();
    let agent = push_agent(address, &spool, &["--pid", &pid, "--output-dir", local.to_str().unwrap()]);
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
    let (status, diff) = http_get(http, &format!("/diff?kind=cpu&base_from=0&base_to={}&from=0&to={}", now + 1, now + 1));
    assert!(status == 200 && String::from_utf8_lossy(&diff).contains("<svg"), "diff: {status}");
    let (status, _) = http_get(http, "/query?kind=offcpu");
    assert_eq!(status, 404, "no off-CPU profiles were pushed");
    collector.stop();

    let out = dir.path("merged.pb.gz");
    let query = Command::new(collector_bin())
        .args(["query", "--data-dir", data.to_str().unwrap(), "--kind", "cpu", "--selector", "agent=test-agent"])
        .args(["--format", "pprof", "-o", out.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(query.success());
    let merged = Decoded::read(&out);
    // The agent also wrote every profile locally: the collector's merge must hold the same.
    let local_total: i64 = std::fs::read_dir(&local)
        .unwrap()
        .flatten()
        .map(|e| Decoded::read(&e.path()))
        .map(|p| Decoded::total(&p.samples_of(fixture_pid(&pid))))
        .sum();
    let merged_total = Decoded::total(&merged.samples_of(fixture_pid(&pid)));
    assert!(merged_total > 100, "the fixture's samples are missing from the query");
    assert_eq!(merged_total, local_total);
    assert!(merged.samples_of(fixture_pid(&pid)).iter().any(|s| s.has_function("fixture::hot_a")));
}

fn fixture_pid(pid: &str) -> u32 {
    pid.parse().unwrap()
}

#[test]
fn collector_outage_and_agent_restart_lose_nothing_and_store_each_profile_once() {
    require_root();
    let dir = TempDir::new("outage");
    let (address, data, spool) = (free_address(), dir.path("data"), dir.path("spool"));
    let collector = Collector::start(address, &data);
    let agent = push_agent(address, &spool, &["--pid", "1"]);
    std::thread::sleep(Duration::from_secs(3));
    collector.stop();
    // 30 s without a collector: the agent keeps profiling into its spool.
    std::thread::sleep(Duration::from_secs(30));
    assert!(!spool_is_empty(&spool), "nothing was spooled during the outage");
    // The agent stops while the collector is still down: its spool must survive the restart.
    stop(agent);
    let collector = Collector::start(address, &data);
    let agent = push_agent(address, &spool, &["--pid", "1"]);
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

#[test]
fn bad_pushes_are_refused_without_crashing_or_losing_what_is_stored() {
    use std::collections::HashMap;

    use ember_proto::{
        ember::{collector_client::CollectorClient, AgentIdentity, Profile, PushRequest},
        pprof,
    };
    use tonic::Code;

    let dir = TempDir::new("bad-push");
    let (address, data) = (free_address(), dir.path("data"));
    let collector = Collector::start(address, &data);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
    let valid_pprof = {
        let profile = pprof::Profile { string_table: vec![String::new()], ..Default::default() };
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, &prost::Message::encode_to_vec(&profile)).unwrap();
        gz.finish().unwrap()
    };
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
            let agent = AgentIdentity { agent_id: "bad-test".into(), hostname: "h".into(), version: "0".into() };
            client.push(PushRequest { agent: Some(agent), profiles: vec![profile] }).await
        })
    };

    let first = push(profile(1)).expect("a valid push is stored").into_inner();
    assert_eq!((first.stored_through, first.duplicates), (1, 0));

    let refused = |p: Profile, codes: &[Code], what: &str| {
        let status = push(p).expect_err(what);
        assert!(codes.contains(&status.code()), "{what}: {status:?}");
    };
    refused(Profile { pprof_gzip: b"not a profile".to_vec(), ..profile(2) }, &[Code::InvalidArgument], "malformed pprof");
    refused(Profile { kind: "gpu".into(), ..profile(2) }, &[Code::InvalidArgument], "unknown kind");
    let tomorrow = now + 86_400_000_000_000;
    refused(Profile { start_unix_nanos: tomorrow, end_unix_nanos: tomorrow + 1, ..profile(2) }, &[Code::InvalidArgument], "clock skew");
    refused(Profile { end_unix_nanos: now - 20_000_000_000, ..profile(2) }, &[Code::InvalidArgument], "end before start");
    refused(Profile { pprof_gzip: vec![7; 5 << 20], ..profile(2) }, &[Code::ResourceExhausted, Code::OutOfRange], "oversized message");
    let labels: HashMap<String, String> = (0..1_000_000).map(|i| (format!("k{i}"), "v".into())).collect();
    refused(Profile { labels, ..profile(2) }, &[Code::ResourceExhausted, Code::OutOfRange, Code::InvalidArgument], "a million labels");

    // A retry of what is stored is acknowledged and dropped.
    let retry = push(profile(1)).expect("a retry is not an error").into_inner();
    assert_eq!((retry.stored_through, retry.duplicates), (1, 1));
    collector.stop();
    assert_eq!(stored(&data), [("bad-test".to_string(), 1)]);
}

#[test]
fn collector_answers_grpc_health_checks_and_reflection() {
    use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest};
    use tonic_reflection::pb::v1::{
        server_reflection_client::ServerReflectionClient, server_reflection_request::MessageRequest,
        server_reflection_response::MessageResponse, ServerReflectionRequest,
    };

    let dir = TempDir::new("health");
    let address = free_address();
    let collector = Collector::start(address, &dir.path("data"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (status, services) = runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap().connect().await.unwrap();
        let mut health = HealthClient::new(channel.clone());
        let request = HealthCheckRequest { service: "ember.v1.Collector".into() };
        let status = health.check(request).await.unwrap().into_inner().status;
        let mut reflection = ServerReflectionClient::new(channel);
        let request = ServerReflectionRequest { host: String::new(), message_request: Some(MessageRequest::ListServices(String::new())) };
        let mut responses = reflection.server_reflection_info(tokio_stream::iter(vec![request])).await.unwrap().into_inner();
        let response = responses.message().await.unwrap().expect("a reflection response");
        let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else { panic!("not a service list") };
        (status, list.service.into_iter().map(|s| s.name).collect::<Vec<_>>())
    });
    assert_eq!(status, ServingStatus::Serving as i32);
    assert!(services.contains(&"ember.v1.Collector".to_string()), "{services:?}");
    assert!(services.contains(&"grpc.health.v1.Health".to_string()), "{services:?}");
    collector.stop();
}

#[test]
fn a_collector_with_a_token_refuses_pushes_and_queries_without_it() {
    require_root();
    use ember_proto::ember::{collector_client::CollectorClient, AgentIdentity, PushRequest};

    let dir = TempDir::new("token");
    let (address, http, data, spool) = (free_address(), free_address(), dir.path("data"), dir.path("spool"));
    let (token_file, wrong_file) = (dir.path("token"), dir.path("wrong"));
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    std::fs::write(&wrong_file, "not-the-token\n").unwrap();
    let collector = Collector::start_with_http(address, http, &data, &["--token-file", token_file.to_str().unwrap()]);

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
    let agent = push_agent(address, &spool, &["--pid", "1", "--token-file", wrong_file.to_str().unwrap()]);
    std::thread::sleep(Duration::from_secs(3));
    stop(agent);
    assert!(!spool_is_empty(&spool), "refused profiles must stay spooled");
    let agent = push_agent(address, &spool, &["--pid", "1", "--token-file", token_file.to_str().unwrap()]);
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
    let (agent_address, data, spool) = (free_address(), dir.path("data"), dir.path("spool"));
    let serve = agent_address.to_string();
    let args = ["run", "-F", "99", "--interval", "1s", "--serve", &serve, "--agent-id", "pulled-agent", "--pid", "1"];
    let mut agent = Agent::spawn(&[&args[..], &["--spool-dir", spool.to_str().unwrap()]].concat());
    agent.wait_ready();
    let pull = format!("http://{agent_address}");
    let collector = Collector::start_with_http(free_address(), free_address(), &data, &["--pull", &pull]);
    std::thread::sleep(Duration::from_secs(4));
    collector.stop();
    // The agent keeps profiling while no collector pulls; the restarted one resumes.
    std::thread::sleep(Duration::from_secs(4));
    let collector = Collector::start_with_http(free_address(), free_address(), &data, &["--pull", &pull]);
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

/// A CA and a certificate it signed for localhost/127.0.0.1 (server and client use), made
/// with openssl: (ca.pem, cert.pem, key.pem).
fn make_pki(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let path = |file: &str| dir.join(format!("{name}-{file}"));
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().expect("running openssl");
        assert!(out.status.success(), "openssl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    };
    let s = |p: &std::path::PathBuf| p.to_str().unwrap().to_string();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl(&[&["req", "-x509"][..], &ec, &["-keyout", &s(&path("ca.key")), "-out", &s(&path("ca.pem")), "-days", "1", "-subj", &format!("/CN=ember-test-{name}-ca"), "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]].concat());
    std::fs::write(path("ext.cnf"), "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n").unwrap();
    openssl(&[&["req"][..], &ec, &["-keyout", &s(&path("key.pem")), "-out", &s(&path("csr.pem")), "-subj", "/CN=localhost"]].concat());
    openssl(&[
        "x509", "-req", "-in", &s(&path("csr.pem")), "-CA", &s(&path("ca.pem")), "-CAkey", &s(&path("ca.key")),
        "-CAcreateserial", "-out", &s(&path("cert.pem")), "-days", "1", "-extfile", &s(&path("ext.cnf")),
    ]);
    (path("ca.pem"), path("cert.pem"), path("key.pem"))
}

#[test]
fn tls_and_mutual_tls_accept_the_right_certificates_and_refuse_the_wrong_ones() {
    require_root();
    use ember_proto::ember::{collector_client::CollectorClient, AgentIdentity, PushRequest};
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

    let dir = TempDir::new("tls");
    let (ca, cert, key) = make_pki(&dir.0, "good");
    let (other_ca, other_cert, other_key) = make_pki(&dir.0, "other");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let push = |address: SocketAddr, ca: &Path, identity: Option<(&Path, &Path)>| {
        runtime.block_on(async {
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap())).domain_name("localhost");
            if let Some((cert, key)) = identity {
                tls = tls.identity(Identity::from_pem(std::fs::read(cert).unwrap(), std::fs::read(key).unwrap()));
            }
            let endpoint = Endpoint::from_shared(format!("https://localhost:{}", address.port())).unwrap().tls_config(tls).unwrap();
            let channel = endpoint.connect().await.map_err(|e| e.to_string())?;
            let agent = AgentIdentity { agent_id: "tls-test".into(), ..Default::default() };
            CollectorClient::new(channel).push(PushRequest { agent: Some(agent), profiles: vec![] }).await.map(|_| ()).map_err(|s| s.to_string())
        })
    };
    let tls_args = |mutual: bool| {
        let mut args = vec!["--tls-cert".to_string(), cert.display().to_string(), "--tls-key".into(), key.display().to_string()];
        if mutual {
            args.extend(["--tls-client-ca".into(), ca.display().to_string()]);
        }
        args
    };

    // Server TLS: the right CA verifies the collector; another CA does not.
    let address = free_address();
    let args = tls_args(false);
    let collector = Collector::start_with_http(address, free_address(), &dir.path("data1"), &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(push(address, &ca, None), Ok(()));
    assert!(push(address, &other_ca, None).is_err(), "a collector certificate from an unknown CA was accepted");
    collector.stop();

    // Mutual TLS: only agents with a certificate from the client CA get in.
    let address = free_address();
    let args = tls_args(true);
    let collector = Collector::start_with_http(address, free_address(), &dir.path("data2"), &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(push(address, &ca, Some((&cert, &key))), Ok(()));
    assert!(push(address, &ca, None).is_err(), "an agent without a certificate was accepted");
    assert!(push(address, &ca, Some((&other_cert, &other_key))).is_err(), "an agent certificate from another CA was accepted");

    // The real agent pushes over mutual TLS.
    let spool = dir.path("spool");
    let url = format!("https://localhost:{}", address.port());
    let agent_args = [
        "run", "-F", "99", "--interval", "1s", "--push", &url, "--agent-id", "tls-agent", "--pid", "1", "--spool-dir",
        spool.to_str().unwrap(), "--tls-ca", ca.to_str().unwrap(), "--tls-cert", cert.to_str().unwrap(), "--tls-key",
        key.to_str().unwrap(),
    ];
    let mut agent = Agent::spawn(&agent_args);
    agent.wait_ready();
    std::thread::sleep(Duration::from_secs(3));
    stop(agent);
    assert!(spool_is_empty(&spool), "the agent could not push over mutual TLS");
    collector.stop();
    assert!(stored(&dir.path("data2")).iter().filter(|(agent, _)| agent == "tls-agent").count() >= 3);
}

#[test]
fn plaintext_off_this_host_must_be_asked_for() {
    let agent = Command::new(ember_tests::agent_bin())
        .args(["run", "--push", "http://collector.invalid:7070", "--pid", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&agent.stderr);
    assert!(!agent.status.success() && stderr.contains("refusing to push plaintext"), "{stderr}");
    let collector = Command::new(collector_bin()).args(["serve", "--listen", "0.0.0.0:0"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&collector.stderr);
    assert!(!collector.status.success() && stderr.contains("refusing plaintext gRPC"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}
