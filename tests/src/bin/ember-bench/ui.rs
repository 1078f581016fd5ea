//! `cargo xtask bench ui`: the web UI in headless Chromium over a collector that holds one hour
//! of 10 s profiles from 10 hosts (3600 profiles, pushed over gRPC). The profiles are
//! synthetic and deterministic, with the stack diversity of a busy service: each host draws
//! its samples from 3000 stacks 6 to 28 frames deep through a call graph of 2000 functions,
//! so the merged tree has far more than the 50,000 nodes the page asks for. Prints the time to
//! the first render (navigation to the drawn flame graph), the API calls behind it, the frame
//! time and handler time while the mouse moves over the 50,000-node graph, a full redraw,
//! and the page's weight.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use anyhow::{ensure, Result};
use ember_proto::ember::{collector_client::CollectorClient, AgentIdentity, Profile};
use ember_tests::{
    browser::Browser,
    http_get,
    transport::{collector_bin, free_address, CollectorProcess, TestStore},
    usage,
};
use prost::Message as _;
use serde_json::json;

use super::{
    empty_dir,
    pushing::push_batches,
    wait_for_rollups,
    synthetic::{profile, stacks, Random},
};

const HOSTS: usize = 10;
const INTERVALS: usize = 360;
/// Page loads timed, after one that warms the collector's page cache.
const LOADS: usize = 3;

/// Pushes the hour of profiles; returns how many bytes of gzipped pprof they were.
fn fill(grpc: std::net::SocketAddr) -> Result<usize> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as i64;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let mut client = CollectorClient::connect(format!("http://{grpc}")).await?;
        let mut bytes = 0;
        for host in 0..HOSTS {
            let (stacks, mut random) = (stacks(host), Random(host as u64 + 7));
            let agent = AgentIdentity { agent_id: format!("host-{host}"), hostname: format!("host-{host}"), version: "bench".into(), ..Default::default() };
            let mut profiles = Vec::new();
            for interval in 0..INTERVALS {
                let start = now - (INTERVALS - interval) as i64 * 10_000_000_000;
                let pprof_gzip = ember_tests::gzip(&profile(&stacks, &mut random).encode_to_vec());
                bytes += pprof_gzip.len();
                profiles.push(Profile {
                    sequence: interval as u64 + 1,
                    kind: "cpu".into(),
                    start_unix_nanos: start,
                    end_unix_nanos: start + 10_000_000_000,
                    labels: HashMap::from([("service".to_string(), "checkout".to_string())]),
                    pprof_gzip,
                });
            }
            push_batches(&mut client, &agent, profiles, 60).await?;
        }
        anyhow::Ok(bytes)
    })
}

/// Seconds one GET takes, and its body's size.
fn timed_get(http: std::net::SocketAddr, path: &str) -> Result<(f64, usize)> {
    let started = Instant::now();
    let (status, body) = http_get(http, path);
    ensure!(status == 200, "GET {path}: {status} {}", String::from_utf8_lossy(&body));
    Ok((started.elapsed().as_secs_f64(), body.len()))
}

/// Records, in the page, each animation frame's time and each mousemove handler's time.
const RECORDER: &str = "
    window.bench = { frames: [], handlers: [], started: 0 };
    const frame = (t) => { bench.frames.push(t); requestAnimationFrame(frame); };
    requestAnimationFrame(frame);
    const canvas = document.getElementById('flame');
    canvas.addEventListener('mousemove', () => (bench.started = performance.now()), { capture: true });
    window.addEventListener('mousemove', () => bench.handlers.push(performance.now() - bench.started));";

fn percentiles(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.95), *values.last().unwrap())
}

pub fn run() -> Result<()> {
    let dir = empty_dir("ui")?;
    let (grpc, http) = (free_address(), free_address());
    let collector = CollectorProcess::start_with_http(grpc, http, &TestStore::Embedded(dir.join("data")), &[]);
    println!("bench ui: pushing 1 h of 10 s profiles from {HOSTS} hosts ({} profiles)...", HOSTS * INTERVALS);
    let cpu_before = usage::process_cpu_seconds(collector.pid());
    let pushed = fill(grpc)?;
    let fill_cpu = usage::process_cpu_seconds(collector.pid()) - cpu_before;
    let (rolled_after, rollup_cpu) = wait_for_rollups(collector.pid(), Duration::from_secs(300))?;

    let (tree_seconds, tree_bytes) = timed_get(http, "/api/tree?kind=cpu")?;
    let (series_seconds, _) = timed_get(http, "/api/series?kind=cpu")?;
    let full = serde_json::from_slice::<serde_json::Value>(&http_get(http, "/api/tree?kind=cpu&max_nodes=200000").1)?;
    let (nodes, cut) = (full["nodes"]["name"].as_array().map_or(0, Vec::len), full["cut_nodes"].as_u64().unwrap_or(0));
    let records = full["records"].as_u64().unwrap_or(0);
    let mut weight = 0;
    for asset in ["/", "/ui/app.css", "/ui/app.js", "/ui/flame.js", "/ui/uPlot.min.js", "/ui/uPlot.min.css"] {
        weight += timed_get(http, asset)?.1;
    }

    let browser = Browser::start();
    let url = format!("http://{http}/");
    let mut renders = Vec::new();
    for load in 0..=LOADS {
        browser.goto(&url);
        browser.wait_until("first render", "return document.body.dataset.state === 'ready'", Duration::from_secs(60));
        let ms = browser.run("return performance.getEntriesByName('ember-ready')[0].startTime", json!([])).as_f64().unwrap_or(f64::NAN);
        if load > 0 {
            renders.push(ms);
        }
    }
    let drawn = browser.run("return [flame.drawn.length, tree.nodes.name.length]", json!([]));
    let redraw_ms = browser.run("const t = performance.now(); for (let i = 0; i < 10; i++) flame.draw(); return (performance.now() - t) / 10", json!([])).as_f64().unwrap();

    // The mouse crosses the graph along a row deep in it, 300 moves of 16 ms.
    browser.run(RECORDER, json!([]));
    let rect = browser.run("const r = flame.canvas.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]", json!([]));
    let [left, top, width, height] = [0, 1, 2, 3].map(|i| rect[i].as_f64().unwrap());
    let y = top + (height * 0.4).min(12.0 * 18.0) + 9.0;
    let moves: Vec<(f64, f64)> = (0..300).map(|i| (left + 2.0 + (width - 4.0) * i as f64 / 299.0, y)).collect();
    browser.hover_path(&moves, 16);
    let recorded = browser.run("return [bench.frames, bench.handlers]", json!([]));
    let numbers = |v: &serde_json::Value| v.as_array().unwrap().iter().filter_map(|x| x.as_f64()).collect::<Vec<f64>>();
    let frames: Vec<f64> = numbers(&recorded[0]).windows(2).map(|w| w[1] - w[0]).collect();
    let handlers = numbers(&recorded[1]);
    ensure!(!handlers.is_empty() && frames.len() > 10, "the hover recorded nothing: {recorded}");
    let errors: Vec<String> = browser.console().into_iter().filter(|m| m.starts_with("SEVERE")).collect();
    ensure!(errors.is_empty(), "JavaScript errors: {errors:?}");
    // What the store holds, from the stopped collector's data directory.
    let store_bytes = std::fs::metadata(dir.join("data/profiles.redb"))?.len();
    collector.stop();
    let listed = std::process::Command::new(collector_bin()).args(["list", "--data-dir"]).arg(dir.join("data")).output()?;
    let summary = String::from_utf8_lossy(&listed.stderr).trim().to_string();
    let _ = std::fs::remove_dir_all(&dir);

    let (frame_p50, frame_p95, frame_max) = percentiles(frames);
    let (handler_p50, handler_p95, handler_max) = percentiles(handlers.clone());
    let renders_text = renders.iter().map(|ms| format!("{ms:.0}")).collect::<Vec<_>>().join(", ");
    println!();
    println!("Command: cargo xtask bench ui");
    println!("| measure | value |");
    println!("|---|---|");
    println!("| profiles in the hour ({HOSTS} hosts) | {} ({:.1} MB of gzipped pprof) |", HOSTS * INTERVALS, pushed as f64 / 1e6);
    println!("| collector CPU: the fill (ingest checks, storing, roll-ups meanwhile) / roll-ups after it (done {rolled_after:.0} s after the fill) | {fill_cpu:.1} s / {rollup_cpu:.1} s |");
    println!("| records a 1 h query decodes (roll-ups and raw profiles) | {records} |");
    println!("| store file (redb grows it by doubling) / what it holds | {:.1} MB / {summary} |", store_bytes as f64 / 1e6);
    println!("| merged tree: nodes, before the cut to the page's 50,000 | {} |", nodes + cut as usize);
    println!("| GET /api/tree (1 h, 50,000 nodes) | {:.0} ms, {:.1} MB of JSON |", tree_seconds * 1e3, tree_bytes as f64 / 1e6);
    println!("| GET /api/series (1 h) | {:.0} ms |", series_seconds * 1e3);
    println!("| first render, navigation to drawn flame graph ({LOADS} loads) | {renders_text} ms |");
    println!("| boxes drawn / nodes in the page | {} / {} |", drawn[0], drawn[1]);
    println!("| full redraw (zoom, search) | {redraw_ms:.1} ms |");
    println!("| frame time while hovering, p50 / p95 / max ({} moves) | {frame_p50:.1} / {frame_p95:.1} / {frame_max:.1} ms |", moves.len());
    println!("| mousemove handler, p50 / p95 / max ({} events) | {handler_p50:.2} / {handler_p95:.2} / {handler_max:.2} ms |", handlers.len());
    println!("| page weight (HTML, CSS, JS, uPlot) | {:.1} KB |", weight as f64 / 1e3);
    Ok(())
}
