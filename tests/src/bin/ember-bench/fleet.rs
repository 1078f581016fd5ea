//! `cargo xtask bench fleet`: the collector as a fleet's store. Ingest: synthetic 10 s
//! profiles (see `synthetic`) pushed by many simulated hosts at once, one profile a push as a
//! caught-up agent pushes, for `--seconds`, into the embedded store through one collector and
//! into ClickHouse through one and two collectors; prints the profiles stored per second, the
//! CPU each side spent, and the disk per stored sample.
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::Result;
use ember_proto::ember::{collector_client::CollectorClient, AgentIdentity, Profile};
use ember_tests::{
    clickhouse::ClickHouseServer,
    transport::{free_address, CollectorProcess, TestStore},
    usage,
};
use prost::Message as _;

use super::{
    empty_dir,
    pushing::push_batches,
    synthetic::{profile, stacks, Random},
};

/// Simulated hosts pushing at once, per collector: each host's pushes wait for the previous
/// answer, as an agent's do. As many as keep a collector busy while each push waits for its
/// gathering of inserts (see the collector's `clickhouse::inserts`).
const HOSTS_PER_COLLECTOR: usize = 1024;
/// Connections per collector the hosts' pushes share (HTTP/2 streams over each).
const CONNECTIONS: usize = 16;
/// Distinct profiles, reused round-robin (generating is not what is measured).
const DISTINCT: usize = 64;
/// Profiles per push: one interval's, as a host's agent pushes once it is caught up.
const BATCH: usize = 1;

/// What one configuration achieved.
struct Ingest {
    profiles: u64,
    samples: u64,
    seconds: f64,
    collector_cpu: f64,
    clickhouse_cpu: f64,
    disk_bytes: u64,
}

/// DISTINCT gzipped profiles and their sample counts.
fn distinct_profiles() -> Vec<(Vec<u8>, u64)> {
    let stacks = stacks(0);
    let mut random = Random(11);
    (0..DISTINCT)
        .map(|_| {
            let pprof = profile(&stacks, &mut random);
            (ember_tests::gzip(&pprof.encode_to_vec()), pprof.sample.len() as u64)
        })
        .collect()
}

/// Pushes from HOSTS_PER_COLLECTOR hosts per collector for `seconds`; returns (profiles,
/// samples) the collectors acknowledged.
fn push_for(collectors: &[SocketAddr], profiles: &Arc<Vec<(Vec<u8>, u64)>>, seconds: u64) -> Result<(u64, u64, f64)> {
    let runtime = tokio::runtime::Runtime::new()?;
    let (stored, samples) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for (c, &address) in collectors.iter().enumerate() {
            let mut connections = Vec::new();
            for _ in 0..CONNECTIONS {
                connections.push(CollectorClient::connect(format!("http://{address}")).await?);
            }
            for h in 0..HOSTS_PER_COLLECTOR {
                let host = c * HOSTS_PER_COLLECTOR + h;
                let (profiles, stored, samples) = (profiles.clone(), stored.clone(), samples.clone());
                let mut client = connections[h % CONNECTIONS].clone();
                tasks.push(tokio::spawn(async move {
                    let agent = AgentIdentity { agent_id: format!("host-{host}"), hostname: format!("host-{host}"), spool_id: host as u64 + 1, ..Default::default() };
                    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as i64;
                    let mut sequence = 0u64;
                    while Instant::now() < deadline {
                        let mut batch = Vec::with_capacity(BATCH);
                        let mut batch_samples = 0;
                        for _ in 0..BATCH {
                            sequence += 1;
                            let (bytes, count) = &profiles[(host * 7 + sequence as usize) % profiles.len()];
                            // Ten-second profiles back from now, as a host's day would be.
                            let start = now - 86_400_000_000_000 + sequence as i64 * 10_000_000_000;
                            batch.push(Profile {
                                sequence,
                                kind: "cpu".into(),
                                start_unix_nanos: start,
                                end_unix_nanos: start + 10_000_000_000,
                                labels: HashMap::from([("service".to_string(), "checkout".to_string())]),
                                pprof_gzip: bytes.clone(),
                            });
                            batch_samples += count;
                        }
                        stored.fetch_add(push_batches(&mut client, &agent, batch, BATCH).await?, Ordering::Relaxed);
                        samples.fetch_add(batch_samples, Ordering::Relaxed);
                    }
                    anyhow::Ok(())
                }));
            }
        }
        for task in tasks {
            task.await??;
        }
        anyhow::Ok(())
    })?;
    Ok((stored.load(Ordering::Relaxed), samples.load(Ordering::Relaxed), started.elapsed().as_secs_f64()))
}

/// One configuration: `collectors` collectors over `store`.
fn ingest(store: &TestStore, collectors: usize, profiles: &Arc<Vec<(Vec<u8>, u64)>>, seconds: u64, clickhouse_pid: Option<u32>) -> Result<Ingest> {
    let grpc: Vec<SocketAddr> = (0..collectors).map(|_| free_address()).collect();
    let running: Vec<CollectorProcess> = grpc.iter().map(|&g| CollectorProcess::start_with_http(g, free_address(), store, &["--rollup-delay-seconds", "86400"])).collect();
    let cpu = |pids: &[u32]| pids.iter().map(|&p| usage::process_cpu_seconds(p)).sum::<f64>();
    let collector_pids: Vec<u32> = running.iter().map(CollectorProcess::pid).collect();
    let clickhouse_pids: Vec<u32> = clickhouse_pid.into_iter().collect();
    let before = (cpu(&collector_pids), cpu(&clickhouse_pids));
    let (stored, samples, elapsed) = push_for(&grpc, profiles, seconds)?;
    let after = (cpu(&collector_pids), cpu(&clickhouse_pids));
    for collector in running {
        collector.stop();
    }
    let disk_bytes = match store {
        TestStore::Embedded(dir) => std::fs::read_dir(dir)?.flatten().map(|e| e.metadata().map_or(0, |m| m.len())).sum(),
        TestStore::ClickHouse { server, database, .. } => {
            server.query(&format!("OPTIMIZE TABLE {database}.samples FINAL"));
            server.query(&format!("SELECT sum(bytes_on_disk) FROM system.parts WHERE database = '{database}' AND active")).trim().parse()?
        }
    };
    Ok(Ingest { profiles: stored, samples, seconds: elapsed, collector_cpu: after.0 - before.0, clickhouse_cpu: after.1 - before.1, disk_bytes })
}

pub fn run(seconds: u64) -> Result<()> {
    let dir = empty_dir("fleet")?;
    println!("bench fleet: {DISTINCT} synthetic 10 s profiles, {HOSTS_PER_COLLECTOR} hosts per collector pushing {BATCH} profile a push for {seconds} s each...");
    let profiles = Arc::new(distinct_profiles());
    let embedded = ingest(&TestStore::Embedded(dir.join("embedded")), 1, &profiles, seconds, None)?;
    let mut rows = vec![("embedded (redb)", 1, embedded)];
    for collectors in [1, 2] {
        let server = ClickHouseServer::start(&dir.join(format!("clickhouse-{collectors}")));
        let pid = server.pid();
        let store = TestStore::ClickHouse { server, database: "ember_bench".into(), cluster: None, replicated: false };
        rows.push(("ClickHouse 18.16", collectors, ingest(&store, collectors, &profiles, seconds, Some(pid))?));
    }
    let base = rows[0].2.profiles as f64 / rows[0].2.seconds;
    println!();
    println!("Command: cargo xtask bench fleet --seconds {seconds}");
    println!("| store | collectors | profiles/s | samples/s | x embedded | collector CPU s per 1000 profiles | ClickHouse CPU s per 1000 profiles | disk bytes per sample |");
    println!("|---|---|---|---|---|---|---|---|");
    for (store, collectors, r) in &rows {
        let rate = r.profiles as f64 / r.seconds;
        let per_thousand = |cpu: f64| cpu * 1000.0 / r.profiles.max(1) as f64;
        println!(
            "| {store} | {collectors} | {rate:.0} | {:.0} | {:.2} | {:.2} | {} | {:.1} |",
            r.samples as f64 / r.seconds,
            rate / base,
            per_thousand(r.collector_cpu),
            if r.clickhouse_cpu > 0.0 { format!("{:.2}", per_thousand(r.clickhouse_cpu)) } else { "-".into() },
            r.disk_bytes as f64 / r.samples.max(1) as f64
        );
    }
    println!("Goal: 10,000 profiles of 10 s per second in total (a fleet of 100,000 hosts at one profile per host every 10 s).");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
