//! Transport security end to end on loopback: TLS and mutual TLS in both directions (agents
//! pushing, collectors pulling), the collector's HTTPS query API, tokens on pulls, and the
//! refusal of plaintext off this host. Certificates are made with openssl per test.
use std::{path::Path, process::Command, time::Duration};

use ember_tests::{
    require_root,
    transport::{collector_bin, free_address, make_pki, spool_is_empty, stop_agent as stop, stored, CollectorProcess, TestStore},
    Agent, TempDir,
};

#[test]
fn tls_and_mutual_tls_accept_the_right_certificates_and_refuse_the_wrong_ones() {
    require_root();
    use ember_proto::ember::{collector_client::CollectorClient, AgentIdentity, PushRequest};
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

    let dir = TempDir::new("tls");
    let (ca, cert, key) = make_pki(&dir.0, "good");
    let (other_ca, other_cert, other_key) = make_pki(&dir.0, "other");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let push = |address: std::net::SocketAddr, ca: &Path, identity: Option<(&Path, &Path)>| {
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
    let collector = CollectorProcess::start_with_http(address, free_address(), &TestStore::Embedded(dir.path("data1")), &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(push(address, &ca, None), Ok(()));
    assert!(push(address, &other_ca, None).is_err(), "a collector certificate from an unknown CA was accepted");
    collector.stop();

    // Mutual TLS: only agents with a certificate from the client CA get in.
    let address = free_address();
    let args = tls_args(true);
    let collector = CollectorProcess::start_with_http(address, free_address(), &TestStore::Embedded(dir.path("data2")), &args.iter().map(String::as_str).collect::<Vec<_>>());
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
    assert!(stored(&TestStore::Embedded(dir.path("data2"))).iter().filter(|(agent, _)| agent == "tls-agent").count() >= 3);
}

#[test]
fn plaintext_off_this_host_must_be_asked_for() {
    let agent = Command::new(ember_tests::agent_bin())
        .args(["run", "--push", "http://collector.invalid:7070", "--pid", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&agent.stderr);
    assert!(!agent.status.success() && stderr.contains("refusing plaintext gRPC to"), "{stderr}");
    let collector = Command::new(collector_bin()).args(["serve", "--listen", "0.0.0.0:0"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&collector.stderr);
    assert!(!collector.status.success() && stderr.contains("refusing plaintext gRPC"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    let collector = Command::new(collector_bin()).args(["serve", "--listen", "127.0.0.1:0", "--http", "0.0.0.0:0"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&collector.stderr);
    assert!(!collector.status.success() && stderr.contains("refusing plaintext HTTP"), "{stderr}");
    let agent = Command::new(ember_tests::agent_bin()).args(["run", "--serve", "0.0.0.0:7072", "--pid", "1"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&agent.stderr);
    assert!(!agent.status.success() && stderr.contains("refusing plaintext gRPC on"), "{stderr}");
}

#[test]
fn collectors_pull_over_mutual_tls_with_the_token_and_are_refused_without() {
    require_root();
    let dir = TempDir::new("pull-tls");
    let (ca, cert, key) = make_pki(&dir.0, "good");
    let (other_ca, other_cert, other_key) = make_pki(&dir.0, "other");
    let (token, wrong_token) = (dir.path("token"), dir.path("wrong-token"));
    std::fs::write(&token, "pull-s3cret\n").unwrap();
    std::fs::write(&wrong_token, "not-it\n").unwrap();
    let agent_address = free_address().to_string();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let mut agent = Agent::spawn(&[
        "run", "-F", "99", "--interval", "1s", "--serve", &agent_address, "--agent-id", "tls-pulled", "--pid", "1",
        "--spool-dir", &s(&dir.path("spool")), "--tls-cert", &s(&cert), "--tls-key", &s(&key), "--tls-ca", &s(&ca),
        "--token-file", &s(&token),
    ]);
    agent.wait_ready();
    let url = format!("https://localhost:{}", agent_address.rsplit(':').next().unwrap());
    let pull = |data: &str, ca: &Path, cert: &Path, key: &Path, token: &Path| {
        let args = ["--pull", &url, "--pull-tls-ca", &s(ca), "--pull-tls-cert", &s(cert), "--pull-tls-key", &s(key), "--pull-token-file", &s(token)];
        CollectorProcess::start_with_http(free_address(), free_address(), &TestStore::Embedded(dir.path(&format!("data-{data}"))), &args)
    };
    let collectors = [
        pull("good", &ca, &cert, &key, &token),
        pull("foreign-client-cert", &ca, &other_cert, &other_key, &token),
        pull("distrusts-agent", &other_ca, &cert, &key, &token),
        pull("wrong-token", &ca, &cert, &key, &wrong_token),
    ];
    std::thread::sleep(Duration::from_secs(4));
    for collector in collectors {
        collector.stop();
    }
    stop(agent);
    let good = stored(&TestStore::Embedded(dir.path("data-good")));
    assert!(good.len() >= 3 && good.iter().all(|(agent, _)| agent == "tls-pulled"), "{good:?}");
    for refused in ["foreign-client-cert", "distrusts-agent", "wrong-token"] {
        assert_eq!(stored(&TestStore::Embedded(dir.path(&format!("data-{refused}")))), [], "{refused}: profiles pulled without the right certificates and token");
    }
}

#[test]
fn the_query_api_serves_https_with_the_collectors_certificate() {
    let dir = TempDir::new("https");
    let (ca, cert, key) = make_pki(&dir.0, "good");
    let (other_ca, _, _) = make_pki(&dir.0, "other");
    let (address, http) = (free_address(), free_address());
    let args = ["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()];
    let collector = CollectorProcess::start_with_http(address, http, &TestStore::Embedded(dir.path("data")), &args);
    let curl = |ca: &Path, scheme: &str| {
        let url = format!("{scheme}://localhost:{}/healthz", http.port());
        Command::new("curl").args(["-sS", "--max-time", "5", "--cacert", ca.to_str().unwrap(), &url]).output().expect("running curl")
    };
    let good = curl(&ca, "https");
    assert!(good.status.success(), "{}", String::from_utf8_lossy(&good.stderr));
    assert_eq!(good.stdout, b"ok\n");
    assert!(!curl(&other_ca, "https").status.success(), "a certificate from an unknown CA was trusted");
    let plain = curl(&ca, "http");
    assert!(!plain.status.success() && plain.stdout.is_empty(), "plaintext HTTP was answered on the TLS port");
    collector.stop();
}
