//! Stripped binaries named from their separate debug info, end to end: a `.gnu_debuglink`
//! next to the binary, a build-id path in a debug directory, and a debuginfod server on
//! loopback, one that answers late and one that never answers. The real agent profiles real
//! processes; the fixture binary is stripped, so without its debug file its hot function has
//! no name at all. Needs root; fails loudly without it.
use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use ember_tests::{
    compile_c, fetch_metrics, held, metric, metric_value, release, spin_c, require_root, transport::stop_agent, Agent, Decoded, TempDir,
};

/// Builds the fixture with `build_id` and debug info, then splits it: returns the stripped
/// binary (`<name>`) and its debug file (`<name>.debug`), both in `dir`.
fn build_split(dir: &Path, name: &str, build_id: &str) -> (PathBuf, PathBuf) {
    let source = dir.join("spin.c");
    // A static function: no dynamic symbol names it.
    std::fs::write(&source, spin_c("debuginfo_hot", "static")).unwrap();
    let full = dir.join(format!("{name}.full"));
    compile_c(&source, &full, &["-O1", "-g", &format!("-Wl,--build-id=0x{build_id}")]);
    let (binary, debug) = (dir.join(name), dir.join(format!("{name}.debug")));
    run(Command::new("objcopy").arg("--only-keep-debug").arg(&full).arg(&debug));
    run(Command::new("strip").arg("--strip-all").arg("-o").arg(&binary).arg(&full));
    std::fs::remove_file(&full).unwrap();
    (binary, debug)
}

fn run(command: &mut Command) {
    let out = command.output().unwrap_or_else(|e| panic!("{command:?}: {e} (binutils is installed by `cargo xtask setup`)"));
    assert!(out.status.success(), "{command:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Samples of `pid` whose stack names `debuginfo_hot`, and all of its samples.
fn named(profiles: &[Decoded], pid: u32) -> (i64, i64) {
    let samples: Vec<_> = profiles.iter().flat_map(|p| p.samples_of(pid)).collect();
    let named = samples.iter().filter(|s| s.has_function("debuginfo_hot")).map(|s| s.values[0]).sum();
    (named, Decoded::total(&samples))
}

/// Whether the profile has a line number for `function` (from DWARF, not a symbol table).
fn has_line(profile: &Decoded, function: &str) -> bool {
    let ids: Vec<u64> = profile.profile.function.iter().filter(|f| profile.string(f.name) == function).map(|f| f.id).collect();
    profile.profile.location.iter().flat_map(|l| &l.line).any(|l| ids.contains(&l.function_id) && l.line > 0)
}

#[test]
fn stripped_binaries_are_named_from_debug_links_and_build_id_directories() {
    require_root();
    let dir = TempDir::new("debuglink");
    // Next to the binary, named by its .gnu_debuglink.
    let (stripped, debug) = build_split(&dir.0, "linked", "1111111111111111111111111111111111111111");
    let linked = dir.path("linked-app");
    run(Command::new("objcopy").arg(format!("--add-gnu-debuglink={}", debug.display())).arg(&stripped).arg(&linked));
    // No link: found by build id in a debug directory given by flag.
    let build_id = "2222222222222222222222222222222222222222";
    let (by_id, debug) = build_split(&dir.0, "byid", build_id);
    let debug_dir = dir.path("debug");
    let in_dir = debug_dir.join(".build-id").join(&build_id[..2]).join(format!("{}.debug", &build_id[2..]));
    std::fs::create_dir_all(in_dir.parent().unwrap()).unwrap();
    std::fs::rename(&debug, &in_dir).unwrap();
    // Neither: its debug file is elsewhere.
    let (alone, _) = build_split(&dir.0, "alone", "3333333333333333333333333333333333333333");

    let mut children: Vec<Child> = [&linked, &by_id, &alone].iter().map(|binary| held(binary, &["3"])).collect();
    let pids: Vec<String> = children.iter().map(|c| c.id().to_string()).collect();
    let out = dir.path("p.pb.gz");
    let mut args = vec!["record", "-F", "499", "-d", "4s", "-o", out.to_str().unwrap(), "--debug-dir", debug_dir.to_str().unwrap()];
    pids.iter().for_each(|pid| args.extend(["--pid", pid]));
    let mut agent = Agent::spawn(&args);
    agent.wait_ready();
    children.iter_mut().for_each(release);
    for child in &mut children {
        assert!(child.wait().unwrap().success());
    }
    agent.wait_success(Duration::from_secs(60));
    let profile = Decoded::read(&out);
    let profiles = std::slice::from_ref(&profile);
    for (name, child) in ["debug link", "build-id directory"].iter().zip(&children) {
        let (named, all) = named(profiles, child.id());
        assert!(all > 500 && named as f64 >= 0.95 * all as f64, "{name}: {named} of {all} samples name debuginfo_hot");
    }
    assert!(has_line(&profile, "debuginfo_hot"), "no line number: the names came from a symbol table, not DWARF");
    let (named_alone, all) = named(profiles, children[2].id());
    assert!(all > 500 && named_alone == 0, "without its debug file the stripped binary cannot name debuginfo_hot ({named_alone} of {all})");
}

/// A debuginfod server on loopback: answers `late_id` after `delay`, holds `hung_id`'s
/// requests open without answering, and has nothing else. Records every request path.
struct Debuginfod {
    address: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Debuginfod {
    fn start(late_id: &str, debug_file: Vec<u8>, delay: Duration, hung_id: &str) -> Debuginfod {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (log, late, hung, body) = (requests.clone(), format!("/buildid/{late_id}/debuginfo"), format!("/buildid/{hung_id}/debuginfo"), Arc::new(debug_file));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (log, late, hung, body) = (log.clone(), late.clone(), hung.clone(), body.clone());
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                    log.lock().unwrap().push(path.clone());
                    let mut stream = stream;
                    if path == hung {
                        std::thread::sleep(Duration::from_secs(120)); // never answers in time
                    } else if path == late {
                        std::thread::sleep(delay);
                        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                        let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(&body));
                    } else {
                        let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                    }
                });
            }
        });
        Debuginfod { address, requests }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

#[test]
fn debuginfod_fills_names_in_later_intervals_and_a_hung_server_stalls_nothing() {
    require_root();
    let dir = TempDir::new("debuginfod");
    let (late_id, hung_id) = ("4444444444444444444444444444444444444444", "5555555555555555555555555555555555555555");
    let (late_binary, late_debug) = build_split(&dir.0, "late", late_id);
    let (hung_binary, _) = build_split(&dir.0, "hung", hung_id);
    const DELAY: Duration = Duration::from_millis(2500);
    let server = Debuginfod::start(late_id, std::fs::read(&late_debug).unwrap(), DELAY, hung_id);
    std::fs::remove_file(&late_debug).unwrap();

    let mut children: Vec<Child> = [&late_binary, &hung_binary].iter().map(|binary| held(binary, &["9"])).collect();
    let (out, cache, http) = (dir.path("out"), dir.path("cache"), ember_tests::transport::free_address());
    let (url, http_address) = (format!("http://{}", server.address), http.to_string());
    let mut args = vec!["run", "-F", "199", "--interval", "1s", "--output-dir", out.to_str().unwrap(), "--http", &http_address];
    args.extend(["--debuginfod-urls", &url, "--debuginfod-cache", cache.to_str().unwrap(), "--debuginfod-timeout", "3s"]);
    let pids: Vec<String> = children.iter().map(|c| c.id().to_string()).collect();
    pids.iter().for_each(|pid| args.extend(["--pid", pid]));
    let mut agent = Agent::spawn(&args);
    agent.wait_ready();
    let started = Instant::now();
    children.iter_mut().for_each(release);
    for child in &mut children {
        assert!(child.wait().unwrap().success());
    }
    let elapsed = started.elapsed().as_secs_f64();
    let metrics = fetch_metrics(http);
    stop_agent(agent);

    // Drains went on at their pace while one server held its request and the other was slow.
    let intervals = metric(&metrics, "ember_intervals_total");
    assert!(intervals >= elapsed - 2.0, "{intervals} intervals in {elapsed:.1} s: the drain stalled");
    assert!(metric(&metrics, "ember_frames_awaiting_debuginfo_total") > 0.0, "no frame was counted as waiting for its debug info");
    assert_eq!(metric_value(&metrics, "ember_debuginfod_fetches_total{result=\"found\"}"), Some(1.0));
    assert_eq!(metric_value(&metrics, "ember_debuginfod_fetches_total{result=\"failed\"}"), Some(1.0), "the hung fetch times out once");
    // Each build id once (the C library, stripped with no debug file here, is asked for too).
    let requests = server.requests();
    for id in [late_id, hung_id] {
        assert_eq!(requests.iter().filter(|r| **r == format!("/buildid/{id}/debuginfo")).count(), 1, "{id} in {requests:?}");
    }
    let distinct: std::collections::HashSet<&String> = requests.iter().collect();
    assert_eq!(distinct.len(), requests.len(), "a build id asked for twice: {requests:?}");
    assert!(cache.join(late_id).join("debuginfo").is_file(), "the fetched file is not in the cache");

    // The late binary is unnamed while its debug info is on its way, then named.
    let mut files: Vec<PathBuf> = std::fs::read_dir(&out).unwrap().flatten().map(|e| e.path()).filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("cpu-")).collect();
    files.sort();
    let profiles: Vec<Decoded> = files.iter().map(|f| Decoded::read(f)).collect();
    let late_pid = children[0].id();
    let first = profiles.iter().position(|p| !p.samples_of(late_pid).is_empty()).expect("the late binary was sampled");
    assert_eq!(named(&profiles[first..=first], late_pid).0, 0, "named before its debug info arrived?");
    let last = &profiles[profiles.len() - 2..]; // the very last may hold only the exit
    let (named_late, all_late) = named(last, late_pid);
    assert!(all_late > 0 && named_late as f64 >= 0.95 * all_late as f64, "after the fetch: {named_late} of {all_late} named");
    let (named_hung, all_hung) = named(&profiles, children[1].id());
    assert!(all_hung > 1000 && named_hung == 0, "the hung binary: {named_hung} of {all_hung} named");
}

/// A held stripped fixture `name` (build id `id`) whose debug info only a debuginfod server on
/// loopback has, answering after `delay`; and the agent's flags for it, each fetch bounded by
/// `timeout`.
fn stripped_behind_debuginfod(dir: &TempDir, name: &str, id: &str, delay: Duration, timeout: &str) -> (Child, Debuginfod, Vec<String>) {
    let (binary, debug) = build_split(&dir.0, name, id);
    let server = Debuginfod::start(id, std::fs::read(&debug).unwrap(), delay, "none");
    std::fs::remove_file(&debug).unwrap();
    let child = held(&binary, &["3"]);
    let flags = vec![
        "--pid".to_string(),
        child.id().to_string(),
        "--debuginfod-urls".to_string(),
        format!("http://{}", server.address),
        "--debuginfod-cache".to_string(),
        dir.path("cache").to_str().unwrap().to_string(),
        "--debuginfod-timeout".to_string(),
        timeout.to_string(),
    ];
    (child, server, flags)
}

/// `record` starts the fetch when it opens the binary (at its exec), and waits for a fetch
/// still in flight when the recording ends: a fetch that takes longer than the recording still
/// names the profile. The server answers 2 s after the 2 s recording ends, well past the
/// programs' detach (about 0.4 s here), so the fetch is still in flight when the agent checks.
#[test]
fn record_names_a_stripped_binary_from_debug_info_that_arrives_after_the_recording() {
    require_root();
    let dir = TempDir::new("debuginfod-record");
    let (mut child, _server, flags) = stripped_behind_debuginfod(&dir, "late", "6666666666666666666666666666666666666666", Duration::from_millis(4000), "10s");
    let out = dir.path("p.pb.gz");
    let mut args = vec!["record", "-F", "499", "-d", "2s", "-o", out.to_str().unwrap()];
    args.extend(flags.iter().map(String::as_str));
    let mut agent = Agent::spawn(&args);
    agent.wait_ready();
    let started = Instant::now();
    release(&mut child);
    let stderr = agent.wait_success(Duration::from_secs(30));
    let took = started.elapsed();
    let _ = child.kill();
    let _ = child.wait();
    let (named, all) = named(&[Decoded::read(&out)], child.id());
    assert!(all > 300 && named as f64 >= 0.95 * all as f64, "{named} of {all} samples name debuginfo_hot\n{stderr}");
    assert!(stderr.contains("waiting for debug info"), "the recording did not say it waited:\n{stderr}");
    assert!(took < Duration::from_secs(10), "the recording took {took:?}");
}

/// In `run`, a binary whose debug info is fetched during an interval is named in that interval.
#[test]
fn run_names_a_stripped_binary_in_the_interval_its_debug_info_arrived_in() {
    require_root();
    let dir = TempDir::new("debuginfod-run");
    let (mut child, _server, flags) = stripped_behind_debuginfod(&dir, "quick", "7777777777777777777777777777777777777777", Duration::from_millis(200), "3s");
    let out = dir.path("out");
    let mut args = vec!["run", "-F", "499", "--interval", "5s", "--output-dir", out.to_str().unwrap()];
    args.extend(flags.iter().map(String::as_str));
    let mut agent = Agent::spawn(&args);
    agent.wait_ready();
    release(&mut child);
    assert!(child.wait().unwrap().success());
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(30));
    let profiles = Decoded::read_kind(&out, "cpu");
    let first = profiles.iter().position(|p| !p.samples_of(child.id()).is_empty()).expect("the binary was sampled");
    let (named, all) = named(&profiles[first..=first], child.id());
    assert!(all > 300 && named as f64 >= 0.95 * all as f64, "its first interval: {named} of {all} samples name debuginfo_hot");
}

/// Past the debug-info budget a binary is never parsed whole: its functions are named from its
/// symbol table (no lines), and it is counted; within the budget it keeps its lines.
#[test]
fn a_binary_beyond_the_debug_info_budget_is_named_from_its_symbol_table() {
    require_root();
    let dir = TempDir::new("budget");
    let source = dir.path("spin.c");
    std::fs::write(&source, spin_c("budget_hot", "static")).unwrap();
    let binary = dir.path("spin");
    compile_c(&source, &binary, &["-O1", "-g"]);
    let record = |budget: &str| -> (Decoded, f64) {
        let mut child = held(&binary, &["3"]);
        let (out, http) = (dir.path(&format!("out-{budget}")), ember_tests::transport::free_address());
        let (pid, http_address) = (child.id().to_string(), http.to_string());
        let args = ["run", "-F", "499", "--interval", "1s", "--output-dir", out.to_str().unwrap(), "--http", &http_address, "--pid", &pid, "--debug-info-mib", budget];
        let mut agent = Agent::spawn(&args);
        agent.wait_ready();
        release(&mut child);
        assert!(child.wait().unwrap().success());
        std::thread::sleep(Duration::from_millis(1500)); // one more drain
        let over = metric_value(&fetch_metrics(http), "ember_binaries_over_debug_info_budget").unwrap_or(0.0);
        stop_agent(agent);
        let profiles = Decoded::read_kind(&out, "cpu");
        let named = profiles.into_iter().find(|p| p.samples.iter().any(|s| s.has_function("budget_hot"))).expect("budget_hot named");
        (named, over)
    };
    // 0.001 MiB: every binary is beyond it.
    let (tight, over) = record("0.001");
    assert!(!has_line(&tight, "budget_hot"), "named with a line number: its DWARF was read past the budget");
    assert!(over >= 1.0, "no binary counted over the budget");
    let (roomy, _) = record("16");
    assert!(has_line(&roomy, "budget_hot"), "within the budget the DWARF's line numbers are lost");
}
