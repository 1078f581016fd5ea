//! ClickHouse servers for the tests, each started on loopback ports of its own with its data in
//! the test's directory, and killed when dropped: Debian's `clickhouse-server` (18.16,
//! installed by setup), or today's ClickHouse engine (chdb, installed by setup from PyPI)
//! behind the part of ClickHouse's HTTP interface the collector speaks
//! (`fixtures/clickhouse/chdb_http.py`), so that the collector's SQL is checked on both.
//! Replicas keep in step through a ZooKeeper of the test's own (Debian's `zookeeper`).
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::transport::free_address;

pub struct ClickHouseServer {
    child: Child,
    pub http: SocketAddr,
    dir: PathBuf,
    engine: Engine,
}

#[derive(Clone, Copy)]
enum Engine {
    Debian,
    Current,
}

const CHDB_HTTP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/clickhouse/chdb_http.py");

impl ClickHouseServer {
    /// Starts a server with its data under `dir`.
    pub fn start(dir: &Path) -> ClickHouseServer {
        ClickHouseServer::start_configured(dir, "")
    }

    /// A server under `dir` with `xml` added to its configuration.
    pub fn start_configured(dir: &Path, xml: &str) -> ClickHouseServer {
        ClickHouseServer::start_on(dir, [free_address(), free_address(), free_address()], xml.to_string())
    }

    /// Today's ClickHouse engine (chdb) with its data under `dir`, answering over HTTP.
    pub fn current(dir: &Path) -> ClickHouseServer {
        std::fs::create_dir_all(dir).unwrap();
        let http = free_address();
        let mut server = ClickHouseServer { child: ClickHouseServer::spawn(dir, Engine::Current, http), http, dir: dir.to_path_buf(), engine: Engine::Current };
        server.wait_ready();
        let version = server.query("SELECT version()");
        println!("current ClickHouse engine: {} (chdb)", version.trim());
        server
    }

    /// `shards` servers under `dir`/shard-N, each one shard of the cluster `name`.
    pub fn cluster(dir: &Path, name: &str, shards: usize) -> Vec<ClickHouseServer> {
        let ports: Vec<[SocketAddr; 3]> = (0..shards).map(|_| [free_address(), free_address(), free_address()]).collect();
        let shard = |p: &[SocketAddr; 3]| format!("<shard><replica><host>127.0.0.1</host><port>{}</port></replica></shard>", p[1].port());
        let remote_servers = format!("<remote_servers><{name}>{}</{name}></remote_servers>", ports.iter().map(shard).collect::<String>());
        ports.iter().enumerate().map(|(i, p)| ClickHouseServer::start_on(&dir.join(format!("shard-{i}")), *p, remote_servers.clone())).collect()
    }

    /// `replicas` servers under `dir`/replica-N, the replicas of the one shard of the cluster
    /// `name`, in step through `zookeeper`.
    pub fn replicas(dir: &Path, name: &str, replicas: usize, zookeeper: &ZooKeeper) -> Vec<ClickHouseServer> {
        let ports: Vec<[SocketAddr; 3]> = (0..replicas).map(|_| [free_address(), free_address(), free_address()]).collect();
        let replica = |p: &[SocketAddr; 3]| format!("<replica><host>127.0.0.1</host><port>{}</port></replica>", p[1].port());
        // One replica takes each insert, and the others copy it.
        let shard = format!("<shard><internal_replication>true</internal_replication>{}</shard>", ports.iter().map(replica).collect::<String>());
        // A replica killed is taken for alive until its session ends: short, so that it rejoins
        // soon after it is back.
        let keeper = format!(
            "<zookeeper><node><host>127.0.0.1</host><port>{}</port></node><session_timeout_ms>3000</session_timeout_ms></zookeeper>",
            zookeeper.port
        );
        let common = format!("<remote_servers><{name}>{shard}</{name}></remote_servers>{keeper}<interserver_http_host>127.0.0.1</interserver_http_host>");
        ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let macros = format!("<macros><shard>0</shard><replica>replica-{i}</replica></macros>");
                ClickHouseServer::start_on(&dir.join(format!("replica-{i}")), *p, format!("{common}{macros}"))
            })
            .collect()
    }

    /// A server on (http, tcp, interserver) ports; `extra` is XML put in its config as is
    /// (the clusters it knows, its ZooKeeper and macros, limits).
    fn start_on(dir: &Path, [http, tcp, interserver]: [SocketAddr; 3], extra: String) -> ClickHouseServer {
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let d = dir.display();
        let config = format!(
            "<yandex>
  <logger><level>warning</level><log>{d}/server.log</log><errorlog>{d}/error.log</errorlog></logger>
  <listen_host>127.0.0.1</listen_host>
  <http_port>{}</http_port><tcp_port>{}</tcp_port><interserver_http_port>{}</interserver_http_port>
  <path>{d}/data/</path><tmp_path>{d}/tmp/</tmp_path>
  <users_config>/etc/clickhouse-server/users.xml</users_config>
  <default_profile>default</default_profile><default_database>default</default_database>
  <mark_cache_size>5368709120</mark_cache_size>
  {extra}
</yandex>
",
            http.port(),
            tcp.port(),
            interserver.port()
        );
        std::fs::write(dir.join("config.xml"), config).unwrap();
        let mut server = ClickHouseServer { child: ClickHouseServer::spawn(dir, Engine::Debian, http), http, dir: dir.to_path_buf(), engine: Engine::Debian };
        server.wait_ready();
        server
    }

    fn spawn(dir: &Path, engine: Engine, http: SocketAddr) -> Child {
        let log = |name: &str| std::fs::OpenOptions::new().create(true).append(true).open(dir.join(name)).unwrap();
        match engine {
            Engine::Debian => Command::new("clickhouse-server")
                .arg(format!("--config-file={}", dir.join("config.xml").display()))
                .stdout(Stdio::null())
                .stderr(log("stderr.log"))
                .spawn()
                .expect("starting clickhouse-server (`cargo xtask setup` installs Debian's clickhouse-server)"),
            // Its errors (chdb missing, say) go where `wait_ready` looks.
            Engine::Current => Command::new("python3")
                .arg(CHDB_HTTP)
                .arg(http.port().to_string())
                .arg(dir.join("data"))
                .stdout(log("error.log"))
                .stderr(log("error.log"))
                .spawn()
                .expect("starting python3 for chdb"),
        }
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.try_query("SELECT 1").as_deref() != Ok("1\n") {
            let log = std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default();
            let what = match self.engine {
                Engine::Debian => "clickhouse-server",
                Engine::Current => "chdb (`cargo xtask setup` installs it from PyPI)",
            };
            assert!(Instant::now() < deadline, "{what} did not answer within 30 s: {}", log.lines().last().unwrap_or(""));
            assert!(self.child.try_wait().unwrap().is_none(), "{what} exited: {}", log.lines().last().unwrap_or(""));
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.http)
    }

    /// Runs one statement; its answer as text, or the server's error.
    pub fn try_query(&self, sql: &str) -> Result<String, String> {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "60", "--data-binary", sql, "-w", "\n%{http_code}", &self.url()])
            .output()
            .expect("running curl");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, status) = text.rsplit_once('\n').unwrap_or(("", ""));
        match status {
            "200" => Ok(body.to_string()),
            _ => Err(format!("{status}: {body}{}", String::from_utf8_lossy(&out.stderr))),
        }
    }

    pub fn query(&self, sql: &str) -> String {
        self.try_query(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Stops the server at once (SIGKILL), as a crash or a lost host would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on its ports and data.
    pub fn restart(&mut self) {
        self.kill();
        self.child = ClickHouseServer::spawn(&self.dir, self.engine, self.http);
        self.wait_ready();
    }
}

/// A ZooKeeper of one server on a loopback port, its data under a directory of the test's;
/// killed when dropped.
pub struct ZooKeeper {
    child: Child,
    pub port: u16,
}

const ZK_SERVER: &str = "/usr/share/zookeeper/bin/zkServer.sh";

impl ZooKeeper {
    pub fn start(dir: &Path) -> ZooKeeper {
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let port = free_address().port();
        // Ticks of 500 ms: sessions may then be as short as a second (two ticks).
        let config = format!(
            "tickTime=500\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
4lw.commands.whitelist=ruok\nmaxClientCnxns=0\n",
            dir.join("data").display()
        );
        std::fs::write(dir.join("zoo.cfg"), config).unwrap();
        let log = std::fs::File::create(dir.join("zookeeper.log")).unwrap();
        let child = Command::new(ZK_SERVER)
            .arg("start-foreground")
            .arg(dir.join("zoo.cfg"))
            .env("ZOO_LOG_DIR", dir)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {ZK_SERVER} (`cargo xtask setup` installs Debian's zookeeper): {e}"));
        let mut zookeeper = ZooKeeper { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !zookeeper.is_ok() {
            let log = std::fs::read_to_string(dir.join("zookeeper.log")).unwrap_or_default();
            assert!(zookeeper.child.try_wait().unwrap().is_none(), "zookeeper exited: {}", log.lines().last().unwrap_or(""));
            assert!(Instant::now() < deadline, "zookeeper did not answer within 30 s: {}", log.lines().last().unwrap_or(""));
            std::thread::sleep(Duration::from_millis(100));
        }
        zookeeper
    }

    /// Whether it answers `ruok` with `imok`.
    fn is_ok(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else { return false };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let mut answer = String::new();
        stream.write_all(b"ruok").is_ok() && stream.read_to_string(&mut answer).is_ok() && answer == "imok"
    }
}

impl Drop for ZooKeeper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ClickHouseServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
