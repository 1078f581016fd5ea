//! The collector's web UI in a real browser (Debian's headless Chromium, through chromedriver):
//! a real agent profiles the fixture while its split changes (70% hot_a, then 30%), pushing to
//! a real collector over loopback; the page must show what the fixture did, and follow a
//! user's search, click, drag and view changes. Screenshots go to target/ui-screenshots/.
//! Needs root (the agent loads BPF programs).
use std::{
    net::SocketAddr,
    path::PathBuf,
    process::Command,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use ember_tests::{
    browser::Browser,
    http_get, require_root,
    over_every_store,
    transport::{free_address, push_agent, stop_agent, CollectorProcess, TestStore},
    Decoded, Fixture, TempDir,
};
use serde_json::{json, Value};

const FIXTURE: &str = env!("CARGO_BIN_EXE_fixture");
const SECONDS: f64 = 8.0;

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// What the fixture did, and where: the collector's HTTP address and the two phases' ranges
/// (unix seconds of profile starts) with hot_a's true share in each.
struct Recorded {
    http: SocketAddr,
    phases: [((u64, u64), f64); 2],
    _collector: CollectorProcess,
    _store: TestStore,
    _dir: TempDir,
}

/// Runs the fixture at 70% hot_a, pauses 3 s, runs it at 30%, all profiled by an agent
/// pushing 1 s profiles to a collector.
fn record(store: fn(&TempDir) -> TestStore) -> Recorded {
    let dir = TempDir::new("ui");
    let (address, http) = (free_address(), free_address());
    let store = store(&dir);
    let collector = CollectorProcess::start_with_http(address, http, &store, &[]);
    let fixtures = [70, 30].map(|percent| Fixture::spawn_with(Command::new(FIXTURE), "split", SECONDS, &[&percent.to_string()]));
    let pids: Vec<String> = fixtures.iter().map(|f| f.pid().to_string()).collect();
    let agent = push_agent(address, &dir.path("spool"), "ui-agent", &["--pid", &pids[0], "--pid", &pids[1]]);
    let mut phases = Vec::new();
    for mut fixture in fixtures {
        let started = now();
        fixture.start();
        let run = fixture.finish();
        let (units, a) = (run.lines[0][0], run.lines[0][1]);
        // A 1 s profile that starts within a second before the phase holds some of it; the
        // 3 s pause keeps the phases' ranges apart.
        phases.push(((started as u64 - 1, now().ceil() as u64), a as f64 / units as f64));
        std::thread::sleep(Duration::from_secs(3));
    }
    stop_agent(agent);
    Recorded { http, phases: [phases[0], phases[1]], _collector: collector, _store: store, _dir: dir }
}

fn json_get(http: SocketAddr, path: &str) -> Value {
    let (status, body) = http_get(http, path);
    assert_eq!(status, 200, "GET {path}: {}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

fn screenshots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/ui-screenshots")
}

/// The boxes the flame graph drew last, with their names and parents, in viewport pixels.
const BOXES: &str = "
    const canvas = arguments[0] ? document.getElementById(arguments[0]) : flame.canvas;
    const graph = arguments[0] === 'callers' ? callersGraph : arguments[0] === 'callees' ? calleesGraph : flame;
    const rect = canvas.getBoundingClientRect();
    return graph.drawn.map((b) => ({
        node: b.node,
        parent: graph.layout.parent[b.node],
        name: graph.tree.names[graph.tree.nodes.name[b.node]],
        x: rect.left + b.x, y: rect.top + b.y, w: b.w, canvas_width: rect.width,
    }));";

fn boxes(browser: &Browser, canvas: &str) -> Vec<Value> {
    browser.run(BOXES, json!([canvas])).as_array().expect("boxes").clone()
}

fn named<'b>(boxes: &'b [Value], name: &str) -> &'b Value {
    boxes.iter().find(|b| b["name"] == name).unwrap_or_else(|| panic!("no {name} box among {:?}", boxes.iter().map(|b| &b["name"]).collect::<Vec<_>>()))
}

fn center(b: &Value) -> (f64, f64) {
    (b["x"].as_f64().unwrap() + b["w"].as_f64().unwrap() / 2.0, b["y"].as_f64().unwrap() + 9.0)
}

/// Opens the page at `query` and waits for its data.
fn open(browser: &Browser, http: SocketAddr, query: &str) {
    browser.goto(&format!("http://{http}/?{query}"));
    browser.wait_until(&format!("page {query} loaded"), "return document.body.dataset.state === 'ready'", Duration::from_secs(20));
}

fn assert_near(what: &str, measured: f64, truth: f64, points: f64) {
    assert!((measured - truth).abs() <= points / 100.0, "{what}: {:.1}% against {:.1}% (allowed {points} points)", measured * 100.0, truth * 100.0);
}

over_every_store!(the_page_shows_the_profile_and_follows_search_zoom_drag_diff_and_tables);

fn the_page_shows_the_profile_and_follows_search_zoom_drag_diff_and_tables(store: fn(&TempDir) -> TestStore) {
    require_root();
    let recorded = record(store);
    let http = recorded.http;
    let [((a_from, a_to), a_share), ((b_from, b_to), b_share)] = recorded.phases;
    let a_range = format!("from={a_from}&to={a_to}");

    // The API on its own: labels, a series whose sum is the tree's total, and its bounds.
    let labels = json_get(http, &format!("/api/labels?kind=cpu&from={a_from}&to={b_to}"));
    assert_eq!(labels["labels"]["agent"], json!(["ui-agent"]));
    assert!(labels["labels"]["comm"].as_array().expect("comm values").contains(&json!("fixture")), "{labels}");
    let tree = json_get(http, &format!("/api/tree?kind=cpu&{a_range}"));
    let series = json_get(http, &format!("/api/series?kind=cpu&{a_range}"));
    let series_total: i64 = series["lines"][0]["values"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).sum();
    assert!(series_total > 200, "too few samples in phase A: {series_total}");
    assert_eq!(series_total, tree["nodes"]["total"][0].as_i64().unwrap(), "the series and the tree count the same samples");
    // Grouped by a sample label, the series decodes the profiles instead of reading the totals
    // stored at ingest: the same sum.
    let by_comm = json_get(http, &format!("/api/series?kind=cpu&{a_range}&group_by=comm"));
    assert_eq!(by_comm["lines"][0]["name"], "fixture", "{by_comm}");
    let comm_total: i64 = by_comm["lines"][0]["values"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).sum();
    assert_eq!(comm_total, series_total);
    assert_eq!(http_get(http, &format!("/api/tree?{a_range}&max_nodes=0")).0, 400);
    assert_eq!(http_get(http, "/api/series?from=0&to=4000000000").0, 400, "a range past the query limit");

    let browser = Browser::start();
    let shots = screenshots();

    // The flame graph: hot_a about as wide, against its caller, as the fixture's true split.
    open(&browser, http, &a_range);
    let drawn = boxes(&browser, "");
    let hot_a = named(&drawn, "fixture::hot_a");
    let caller = drawn.iter().find(|b| b["node"] == hot_a["parent"]).expect("hot_a's caller is drawn");
    assert_near("hot_a against its caller", hot_a["w"].as_f64().unwrap() / caller["w"].as_f64().unwrap(), a_share, 6.0);
    browser.screenshot(&shots.join("flame.png"));

    // Search: hot_b's share of all samples.
    browser.type_into("#search", "hot_b");
    browser.wait_until("search result", "return document.getElementById('search-result').textContent !== ''", Duration::from_secs(5));
    let result = browser.run("return document.getElementById('search-result').textContent", json!([]));
    let share: f64 = result.as_str().unwrap().split_whitespace().nth(1).unwrap().trim_end_matches('%').parse().unwrap();
    assert_near("search hot_b", share / 100.0, 1.0 - a_share, 6.0);
    assert!(browser.url().contains("search=hot_b"), "the search is in the URL: {}", browser.url());
    browser.screenshot(&shots.join("search.png"));

    // A click on hot_a zooms to it: it fills the width, and the URL says so.
    browser.click(center(hot_a));
    browser.wait_until("zoom in the URL", "return location.search.includes('focus=')", Duration::from_secs(5));
    let zoomed = boxes(&browser, "");
    let hot_a = named(&zoomed, "fixture::hot_a");
    assert!((hot_a["w"].as_f64().unwrap() - hot_a["canvas_width"].as_f64().unwrap()).abs() < 1.0, "zoomed hot_a: {hot_a}");
    browser.screenshot(&shots.join("zoom.png"));

    // A drag across the chart narrows the range: in the URL, and in the data.
    open(&browser, http, &format!("from={a_from}&to={b_to}"));
    let before = browser.run("return tree.profiles", json!([])).as_i64().unwrap();
    let chart = browser.run("const r = document.querySelector('#chart .u-over').getBoundingClientRect(); return [r.left, r.top, r.width, r.height]", json!([]));
    let [left, top, width, height] = [0, 1, 2, 3].map(|i| chart[i].as_f64().unwrap());
    browser.drag((left + width * 0.05, top + height / 2.0), (left + width * 0.45, top + height / 2.0));
    browser.wait_until(
        "the range narrowed by a drag",
        &format!("return document.body.dataset.state === 'ready' && tree.profiles !== {before}"),
        Duration::from_secs(20),
    );
    let url = browser.url();
    let param = |name: &str| -> u64 {
        let value = url.split(['?', '&']).find_map(|p| p.strip_prefix(&format!("{name}="))).unwrap_or_else(|| panic!("no {name} in {url}"));
        value.parse().unwrap()
    };
    assert!(param("from") >= a_from && param("to") < b_to && param("to") > param("from"), "dragged range in {url}");
    let after = browser.run("return tree.profiles", json!([])).as_i64().unwrap();
    assert!(after < before, "the dragged range merges fewer profiles: {after} against {before}");
    browser.screenshot(&shots.join("drag.png"));

    // The diff of phase B against phase A: hot_a shrank (blue), hot_b grew (red).
    open(&browser, http, &format!("view=diff&from={b_from}&to={b_to}&base_from={a_from}&base_to={a_to}"));
    let drawn = boxes(&browser, "");
    let pixel = |b: &Value| -> Vec<i64> {
        let (x, y) = center(b);
        let script = "const c = flame.canvas, r = c.getBoundingClientRect(), k = c.width / r.width;
            return Array.from(c.getContext('2d').getImageData((arguments[0] - r.left) * k, (arguments[1] - r.top) * k, 1, 1).data);";
        browser.run(script, json!([x, y])).as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect()
    };
    let (shrank, grew) = (pixel(named(&drawn, "fixture::hot_a")), pixel(named(&drawn, "fixture::hot_b")));
    assert!(shrank[2] > shrank[0] + 60, "hot_a went from {:.0}% to {:.0}%: blue expected, got {shrank:?}", a_share * 100.0, b_share * 100.0);
    assert!(grew[0] > grew[2] + 60, "hot_b grew: red expected, got {grew:?}");
    browser.screenshot(&shots.join("diff.png"));

    // The top table's totals are the pprof query's.
    open(&browser, http, &format!("view=top&{a_range}"));
    let cell = |name: &str, column: usize| -> i64 {
        let script = "const row = [...document.querySelectorAll('#top tbody tr')].find((r) => r.dataset.name === arguments[0]);
            return row ? Number(row.cells[arguments[1]].dataset.value) : null;";
        browser.run(script, json!([name, column])).as_i64().unwrap_or_else(|| panic!("no row for {name} in the top table"))
    };
    let (status, pprof) = http_get(http, &format!("/query?kind=cpu&{a_range}&format=pprof"));
    assert_eq!(status, 200);
    let merged = Decoded::from_gzip(&pprof);
    for function in ["fixture::hot_a", "fixture::hot_b", "fixture::burn"] {
        let with: Vec<_> = merged.samples.iter().filter(|s| s.has_function(function)).collect();
        assert_eq!(cell(function, 4), Decoded::total(&with), "total of {function}");
        let leaf: Vec<_> = merged.samples.iter().filter(|s| s.frames.first().is_some_and(|f| f.function == function)).collect();
        assert_eq!(cell(function, 2), Decoded::total(&leaf), "self of {function}");
    }
    browser.screenshot(&shots.join("top.png"));

    // A click on a row opens its sandwich: main calls hot_a, hot_a calls burn.
    let row = browser.run("const r = [...document.querySelectorAll('#top tbody tr')].find((r) => r.dataset.name === 'fixture::hot_a').getBoundingClientRect(); return [r.left + 20, r.top + r.height / 2]", json!([]));
    browser.click((row[0].as_f64().unwrap(), row[1].as_f64().unwrap()));
    browser.wait_until("the sandwich", "return location.search.includes('view=sandwich') && callersGraph.drawn.length > 1", Duration::from_secs(5));
    named(&boxes(&browser, "callers"), "fixture::main");
    named(&boxes(&browser, "callees"), "fixture::burn");
    browser.screenshot(&shots.join("sandwich.png"));

    let errors: Vec<String> = browser.console().into_iter().filter(|m| m.starts_with("SEVERE")).collect();
    assert!(errors.is_empty(), "JavaScript errors: {errors:?}");
}
