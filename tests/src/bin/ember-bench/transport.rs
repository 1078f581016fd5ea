//! `cargo xtask bench transport`: what shipping profiles costs. Real profiles come from
//! ember-agent recording the busy fixture; a gRPC client pushes them to a real collector.
//! Prints bytes on the wire per sample, push latency, ingest rate, and the time to query one
//! hour of 10 s profiles from 10 hosts.
use std::{
    collections::HashMap,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Result;
use ember_proto::ember::{collector_client::CollectorClient, AgentIdentity, Profile, PushRequest};
use ember_tests::{
    transport::{free_address, CollectorProcess, TestStore},
    Decoded,
};
use prost::Message;

use super::{empty_dir, release_bin};

const HOSTS: usize = 10;
const INTERVALS: usize = 360; // one hour of 10 s profiles

/// One real 10 s on-CPU profile of two busy fixture processes at 99 Hz: (gzipped pprof, samples).
fn real_profile(dir: &std::path::Path) -> Result<(Vec<u8>, u64)> {
    let fixture = release_bin("fixture");
    let workers: Vec<Child> = (0..2).map(|_| Command::new(&fixture).args(["split", "11"]).stdout(Stdio::null()).spawn()).collect::<Result<_, _>>()?;
    let out = dir.join("real.pb.gz");
    let status = Command::new(release_bin("ember-agent"))
        .args(["record", "-d", "10s", "-F", "99", "-o"])
        .arg(&out)
        .stderr(Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "ember-agent record failed");
    for mut w in workers {
        w.wait()?;
    }
    let samples = Decoded::read(&out).samples.iter().map(|s| s.values[0] as u64).sum();
    Ok((std::fs::read(&out)?, samples))
}

/// GETs a query; Ok(body size) on 200.
fn query(address: std::net::SocketAddr, path: &str) -> Result<usize> {
    let (status, body) = ember_tests::http_get(address, path);
    anyhow::ensure!(status == 200, "query {path} failed ({status}): {}", String::from_utf8_lossy(&body));
    Ok(body.len())
}

pub fn run() -> Result<()> {
    let dir = empty_dir("transport")?;
    println!("bench transport: recording a real 10 s profile (2 busy processes, 99 Hz)...");
    let (pprof, samples) = real_profile(&dir)?;
    let (grpc, http) = (free_address(), free_address());
    let _collector = CollectorProcess::start_with_http(grpc, http, &TestStore::Embedded(dir.join("data")), &[]);

    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as i64;
    let profile = |host: usize, interval: usize| Profile {
        sequence: interval as u64 + 1,
        kind: "cpu".into(),
        start_unix_nanos: now - (INTERVALS - interval) as i64 * 10_000_000_000,
        end_unix_nanos: now - (INTERVALS - interval - 1) as i64 * 10_000_000_000,
        labels: HashMap::from([("host".to_string(), format!("host-{host}"))]),
        pprof_gzip: pprof.clone(),
    };
    let wire_bytes = PushRequest { agent: None, profiles: vec![profile(0, 0)] }.encoded_len();

    let runtime = tokio::runtime::Runtime::new()?;
    let (latencies, ingest_seconds) = runtime.block_on(async {
        let mut client = CollectorClient::connect(format!("http://{grpc}")).await?;
        let mut latencies = Vec::with_capacity(HOSTS * INTERVALS);
        let started = Instant::now();
        for interval in 0..INTERVALS {
            for host in 0..HOSTS {
                let agent = AgentIdentity { agent_id: format!("host-{host}"), hostname: format!("host-{host}"), version: "bench".into(), ..Default::default() };
                let request = PushRequest { agent: Some(agent), profiles: vec![profile(host, interval)] };
                let sent = Instant::now();
                client.push(request).await?;
                latencies.push(sent.elapsed());
            }
        }
        anyhow::Ok((latencies, started.elapsed().as_secs_f64()))
    })?;
    let mut sorted = latencies.clone();
    sorted.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let pushed = (HOSTS * INTERVALS) as f64;

    let started = Instant::now();
    let size = query(http, "/query?kind=cpu&format=pprof")?;
    let query_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    query(http, "/query?kind=cpu&selector=host=host-3&format=svg")?;
    let one_host_seconds = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);

    println!();
    println!("Command: cargo xtask bench transport");
    println!("| measure | value |");
    println!("|---|---|");
    println!("| samples in one real 10 s profile | {samples} |");
    println!("| bytes on the wire per profile (push request) | {wire_bytes} |");
    println!("| bytes on the wire per sample | {:.1} |", wire_bytes as f64 / samples as f64);
    println!("| push latency, one profile per request: median / p99 | {:.2} ms / {:.2} ms |", ms(sorted[sorted.len() / 2]), ms(sorted[sorted.len() * 99 / 100]));
    println!("| collector ingest (sequential client) | {:.0} profiles/s, {:.0} samples/s |", pushed / ingest_seconds, pushed * samples as f64 / ingest_seconds);
    println!("| query: merge 1 h x {HOSTS} hosts ({} profiles) to pprof | {query_seconds:.2} s ({size} bytes) |", HOSTS * INTERVALS);
    println!("| query: 1 h of one host to SVG | {one_host_seconds:.2} s |");
    Ok(())
}
