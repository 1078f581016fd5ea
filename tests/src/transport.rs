//! Transport helpers: a real `ember-collector` process, its store's contents, loopback
//! addresses, test certificates, and gRPC health and reflection queries.
use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use crate::{clickhouse::ClickHouseServer, Agent, TempDir};

pub fn collector_bin() -> std::path::PathBuf {
    crate::agent_bin().with_file_name("ember-collector")
}

/// An agent pushing to `collector` every second, spooling in `spool`, identified as
/// `agent_id`, with `extra` arguments; returned once its programs are attached.
pub fn push_agent(collector: SocketAddr, spool: &Path, agent_id: &str, extra: &[&str]) -> Agent {
    let url = format!("http://{collector}");
    let mut args = vec!["run", "-F", "99", "--interval", "1s", "--push", &url, "--agent-id", agent_id];
    args.extend(["--spool-dir", spool.to_str().unwrap()]);
    args.extend(extra);
    let mut agent = Agent::spawn(&args);
    agent.wait_ready();
    agent
}

/// A loopback port nobody listens on.
pub fn free_address() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// Where a test's collectors keep their profiles: the embedded store in a directory, or a
/// database of a ClickHouse server the test started.
pub enum TestStore {
    Embedded(PathBuf),
    /// `cluster`: the server is one of this cluster's, whose tables the collector reads and
    /// writes as Distributed ones (over replicated tables where `replicated`).
    ClickHouse { server: ClickHouseServer, database: String, cluster: Option<String>, replicated: bool },
}

impl TestStore {
    /// The embedded store in `dir`/data.
    pub fn embedded(dir: &TempDir) -> TestStore {
        TestStore::Embedded(dir.path("data"))
    }

    /// A ClickHouse server of its own (Debian's), under `dir`/clickhouse.
    pub fn clickhouse(dir: &TempDir) -> TestStore {
        TestStore::ClickHouse { server: ClickHouseServer::start(&dir.path("clickhouse")), database: "ember_test".into(), cluster: None, replicated: false }
    }

    /// Today's ClickHouse engine (chdb), under `dir`/clickhouse.
    pub fn current_clickhouse(dir: &TempDir) -> TestStore {
        TestStore::ClickHouse { server: ClickHouseServer::current(&dir.path("clickhouse")), database: "ember_test".into(), cluster: None, replicated: false }
    }

    /// The collector's arguments that choose this store (serve, list and query take them).
    pub fn args(&self) -> Vec<String> {
        match self {
            TestStore::Embedded(data) => vec!["--data-dir".into(), data.display().to_string()],
            TestStore::ClickHouse { server, database, cluster, replicated } => {
                let mut args = vec!["--clickhouse".into(), server.url(), "--clickhouse-database".into(), database.clone()];
                args.extend(cluster.iter().flat_map(|name| ["--clickhouse-cluster".to_string(), name.clone()]));
                if *replicated {
                    args.push("--clickhouse-replicated".into());
                }
                args
            }
        }
    }

    /// Where the collectors' logs go: beside the store.
    fn log(&self) -> PathBuf {
        match self {
            TestStore::Embedded(data) => data.with_extension("log"),
            TestStore::ClickHouse { server, .. } => server.dir().join("collector.log"),
        }
    }
}

/// A running collector, stopped (SIGINT) on drop.
pub struct CollectorProcess(Child);

impl CollectorProcess {
    pub fn start(address: SocketAddr, store: &TestStore) -> CollectorProcess {
        CollectorProcess::start_with_http(address, free_address(), store, &[])
    }

    /// Starts a collector whose log goes beside its store, shown if it does not come up.
    pub fn start_with_http(address: SocketAddr, http: SocketAddr, store: &TestStore, extra: &[&str]) -> CollectorProcess {
        let log = store.log();
        let child = Command::new(collector_bin())
            .args(["serve", "--listen", &address.to_string(), "--http", &http.to_string()])
            .args(store.args())
            .args(extra)
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("creating the collector log"))
            .spawn()
            .expect("starting ember-collector");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(address).is_err() {
            let log = || std::fs::read_to_string(&log).unwrap_or_default();
            assert!(Instant::now() < deadline, "collector not listening after 10 s: {}", log());
            std::thread::sleep(Duration::from_millis(50));
        }
        CollectorProcess(child)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    pub fn stop(mut self) {
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let status = self.0.wait().unwrap();
        assert!(status.success(), "collector exited with {status}");
    }
}

impl Drop for CollectorProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// (agent, sequence) of every stored profile.
pub fn stored(store: &TestStore) -> Vec<(String, u64)> {
    let out = Command::new(collector_bin()).arg("list").args(store.args()).output().unwrap();
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

/// Stops an agent the way systemd does and waits for its clean exit.
pub fn stop_agent(agent: Agent) {
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(60));
}

/// Whether a spool directory holds no profile files.
pub fn spool_is_empty(spool: &Path) -> bool {
    std::fs::read_dir(spool).unwrap().flatten().all(|e| e.path().extension().is_none_or(|x| x != "profile"))
}

/// Asks a gRPC server over `channel` for `service`'s health and for the services reflection
/// lists: (serving status, service names).
pub async fn health_and_services(channel: tonic::transport::Channel, service: &str) -> (i32, Vec<String>) {
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    use tonic_reflection::pb::v1::{
        server_reflection_client::ServerReflectionClient, server_reflection_request::MessageRequest,
        server_reflection_response::MessageResponse, ServerReflectionRequest,
    };
    let mut health = HealthClient::new(channel.clone());
    let status = health.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner().status;
    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest { host: String::new(), message_request: Some(MessageRequest::ListServices(String::new())) };
    let mut responses = reflection.server_reflection_info(tokio_stream::iter(vec![request])).await.unwrap().into_inner();
    let response = responses.message().await.unwrap().expect("a reflection response");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else { panic!("not a service list") };
    (status, list.service.into_iter().map(|s| s.name).collect())
}

/// A CA and a certificate it signed for localhost/127.0.0.1 (server and client use), made
/// with openssl: (ca.pem, cert.pem, key.pem).
pub fn make_pki(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
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


/// Runs a test function that takes a store maker over each store, as `test::embedded`,
/// `test::clickhouse` (Debian's 18.16) and `test::current_clickhouse` (today's engine).
#[macro_export]
macro_rules! over_every_store {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            #[test]
            fn embedded() {
                super::$test($crate::transport::TestStore::embedded)
            }

            #[test]
            fn clickhouse() {
                super::$test($crate::transport::TestStore::clickhouse)
            }

            #[test]
            fn current_clickhouse() {
                super::$test($crate::transport::TestStore::current_clickhouse)
            }
        }
    )*};
}
