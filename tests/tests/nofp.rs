//! Complete stacks without frame pointers. Fixtures: C built at -O2 -fomit-frame-pointer that
//! spends known shares of its CPU time in phases calling through Debian's libc (a qsort
//! comparator, bsearch), a shared library built the same way and recursion 100 deep, as a PIE
//! and a non-PIE executable; and a Rust release binary without frame pointers. Ember and
//! `perf record --call-graph dwarf` profile them at the same time; Ember's stacks must reach
//! `main` at least as often (to 1%) as perf's, and split the time as the fixture measured it.
//! Off-CPU (usleep) and network (sendto) stacks through libc must be complete too. A binary
//! left out of the table budget is walked by frame pointers, and counted, until room appears.
//! Rows the walker keeps per CPU never serve another process with code at the same address.
//! Needs root, gcc, rustc and perf.
use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use ember_tests::{
    compile_c, fetch_metrics, held, kind_path, metric,
    nofp::{self, PHASES},
    perf_script, record_fixtures, release, require_root, transport::free_address, wait_for_metric, Agent, Decoded, Fixture, Sample, TempDir,
};

const SECONDS: f64 = 6.0;

/// `perf record --call-graph dwarf` attached to `pids` until they exit.
fn perf_dwarf(pids: &[u32], out: &Path) -> Child {
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let child = Command::new("perf")
        .args(["record", "--call-graph", "dwarf", "-F", "499", "-q", "-o"])
        .arg(out)
        .args(["-p", &pids.join(",")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting perf record");
    // perf attaches within a few hundred milliseconds; the fixtures wait for their start.
    std::thread::sleep(Duration::from_secs(2));
    child
}

fn wait_or_stop(mut perf: Child) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while perf.try_wait().expect("waiting for perf").is_none() {
        if Instant::now() > deadline {
            unsafe { libc::kill(perf.id() as i32, libc::SIGINT) };
            perf.wait().expect("waiting for perf");
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn reaches(frames: &[String], main: &str) -> bool {
    frames.iter().any(|f| f == main)
}

fn names(sample: &Sample) -> Vec<String> {
    sample.frames.iter().map(|f| f.function.clone()).collect()
}

/// The share of `stacks` that reach `main`.
fn share_reaching<'a>(stacks: impl Iterator<Item = &'a Vec<String>>, main: &str) -> (f64, usize) {
    let (mut all, mut reached) = (0, 0);
    for frames in stacks {
        all += 1;
        reached += usize::from(reaches(frames, main));
    }
    (reached as f64 / all.max(1) as f64, all)
}

/// Sample counts weighted (a pprof sample may stand for several).
fn weighted(samples: &[&Sample], keep: impl Fn(&[String]) -> bool) -> (i64, i64) {
    let total = Decoded::total(samples);
    let kept: i64 = samples.iter().filter(|s| keep(&names(s))).map(|s| s.values[0]).sum();
    (kept, total)
}

fn has_prefix(frames: &[String], prefix: &str) -> bool {
    frames.iter().any(|f| f.starts_with(prefix))
}

#[test]
fn stacks_without_frame_pointers_are_complete_and_split_time_truthfully() {
    require_root();
    let dir = TempDir::new("nofp");
    let built = nofp::build(&dir.path(""));
    let fixtures = vec![
        Fixture::spawn(built.pie.to_str().unwrap(), "phases", SECONDS),
        Fixture::spawn(built.no_pie.to_str().unwrap(), "phases", SECONDS),
        Fixture::spawn(built.rust.to_str().unwrap(), "phases", SECONDS),
    ];
    let pids: Vec<u32> = fixtures.iter().map(Fixture::pid).collect();
    let perf_data = dir.path("perf.data");
    let perf = perf_dwarf(&pids, &perf_data);
    let mut args = vec!["--events", "cpu,offcpu,net", "--net-events", "net:net_dev_queue", "-F", "999"];
    let pid_args: Vec<String> = pids.iter().map(u32::to_string).collect();
    for pid in &pid_args {
        args.extend(["--pid", pid.as_str()]);
    }
    let (out, runs) = record_fixtures(&dir, fixtures, SECONDS, &args);
    wait_or_stop(perf);
    let perf: Vec<(u32, Vec<String>)> = perf_script(&perf_data, "pid")
        .expect("reading perf's samples")
        .into_iter()
        .filter_map(|(pid, frames)| Some((pid.parse().ok()?, frames)))
        .collect();
    let cpu = Decoded::read(&kind_path(&out, "cpu"));

    // Complete stacks: as often as perf's DWARF unwinding, per fixture.
    for (pid, main) in [(pids[0], "main"), (pids[1], "main"), (pids[2], "rust_phases::main")] {
        let samples = cpu.samples_of(pid);
        let (reached, total) = weighted(&samples, |frames| reaches(frames, main));
        let ember = reached as f64 / total.max(1) as f64;
        for sample in samples.iter().filter(|s| !reaches(&names(s), main)).take(5) {
            println!("pid {pid}, incomplete: {:?}", names(sample));
        }
        let (perf_share, perf_samples) = share_reaching(perf.iter().filter(|(p, _)| *p == pid).map(|(_, f)| f), main);
        println!("pid {pid}: {reached}/{total} Ember samples reach {main} ({ember:.4}); perf --call-graph dwarf {perf_share:.4} of {perf_samples}");
        assert!(total >= 1000, "pid {pid}: only {total} samples");
        assert!(perf_samples >= 200, "pid {pid}: perf recorded only {perf_samples} samples");
        assert!(ember >= 0.99 * perf_share, "pid {pid}: {ember:.4} of Ember's stacks reach {main}, perf's {perf_share:.4}");
    }

    // The time split the C fixtures measured, over both, within 2 points.
    let c_samples: Vec<&Sample> = cpu.samples_of(pids[0]).into_iter().chain(cpu.samples_of(pids[1])).collect();
    let in_phase = |frames: &[String], phase: &str| has_prefix(frames, phase) && reaches(frames, "main");
    let phase_samples: Vec<i64> = PHASES.iter().map(|p| weighted(&c_samples, |f| in_phase(f, p)).0).collect();
    // Each printed its rounds, then the CPU time of each phase.
    let phase_ns: Vec<u64> = (1..=PHASES.len()).map(|i| runs[0].lines[i][0] + runs[1].lines[i][0]).collect();
    let (all_samples, all_ns) = (phase_samples.iter().sum::<i64>() as f64, phase_ns.iter().sum::<u64>() as f64);
    for (i, phase) in PHASES.iter().enumerate() {
        let (share, truth) = (phase_samples[i] as f64 / all_samples, phase_ns[i] as f64 / all_ns);
        println!("{phase}: {share:.4} of samples, {truth:.4} of the fixture's CPU time");
        assert!((share - truth).abs() <= 0.02, "{phase}: {share:.4} of samples, truth {truth:.4}");
    }

    // The comparator's callers through libc, without frame pointers in either.
    let sorted: Vec<&Sample> = c_samples.iter().copied().filter(|s| names(s).first().is_some_and(|f| f == "by_value")).filter(|s| has_prefix(&names(s), "phase_qsort")).collect();
    assert!(sorted.len() >= 50, "only {} comparator samples under qsort", sorted.len());
    for sample in &sorted {
        let frames = names(sample);
        let caller = frames.iter().position(|f| f.starts_with("phase_qsort")).unwrap();
        let between = &sample.frames[1..caller];
        assert!(
            between.iter().any(|f| f.mapping.contains("libc.so")) && frames.iter().any(|f| f.contains("qsort")),
            "no libc frames between the comparator and its caller: {frames:?}"
        );
    }
    // The library's two frames, then its caller.
    let library: Vec<&Sample> = c_samples.iter().copied().filter(|s| names(s).first().is_some_and(|f| f.starts_with("lib_inner"))).collect();
    assert!(!library.is_empty(), "no samples in the library");
    for sample in &library {
        let frames = names(sample);
        assert!(frames.get(1).is_some_and(|f| f.starts_with("lib_work")) && has_prefix(&frames, "phase_library") && reaches(&frames, "main"), "{frames:?}");
    }
    // Recursion 100 deep: 101 frames of descend, and main below them.
    let deepest = c_samples.iter().map(|s| names(s)).filter(|f| reaches(f, "main")).map(|f| f.iter().filter(|n| n.starts_with("descend")).count()).max();
    assert_eq!(deepest, Some(101), "the deepest complete stack in the recursion");

    // Off the CPU and on the network, stacks through libc are complete too.
    for (kind, phase) in [("offcpu", "phase_nap"), ("net-tx", "phase_send")] {
        let profile = Decoded::read(&kind_path(&out, kind));
        let samples: Vec<&Sample> = pids[..2].iter().flat_map(|pid| profile.samples_of(*pid)).filter(|s| has_prefix(&names(s), phase)).collect();
        let (reached, total) = weighted(&samples, |frames| reaches(frames, "main"));
        println!("{kind}: {reached}/{total} events under {phase} reach main");
        assert!(total > 0 && reached as f64 >= 0.99 * total as f64, "{kind}: {reached} of {total} events under {phase} reach main");
    }
    assert!(cpu.counter("unwind_complete") > 0);
}

#[test]
fn binaries_beyond_a_tiny_table_budget_are_walked_by_frame_pointers_and_counted() {
    require_root();
    let dir = TempDir::new("nofp-budget");
    let built = nofp::build(&dir.path(""));
    let mut fixture = Fixture::spawn(built.pie.to_str().unwrap(), "phases", 3.0);
    let (out, http) = (dir.path("profiles"), free_address());
    let pid = fixture.pid().to_string();
    // 0.01 MiB holds 1310 rows: the fixture's own tables (tens of rows), not libc's (~28K).
    let args = ["run", "--pid", &pid, "-F", "499", "--interval", "1s", "--unwind-table-mib", "0.01"];
    let mut agent = Agent::spawn(&[&args[..], &["--output-dir", out.to_str().unwrap(), "--http", &http.to_string()]].concat());
    agent.wait_ready();
    let over_budget = wait_for_metric(http, "ember_unwind_over_budget", Duration::from_secs(10), |n| n >= 1.0);
    let tables = metric(&fetch_metrics(http), "ember_unwind_tables");
    fixture.start();
    fixture.finish();
    std::thread::sleep(Duration::from_millis(1500));
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(30));
    assert!(over_budget >= 1.0 && tables >= 2.0, "{over_budget} binaries over budget, {tables} tables loaded");
    let samples: Vec<Sample> = Decoded::read_kind(&out, "cpu").into_iter().flat_map(|p| p.samples).collect();
    let samples: Vec<&Sample> = samples.iter().filter(|s| s.labels.get("pid") == Some(&pid)).collect();
    // The fixture's own code still unwinds from its table, up to main...
    let spin: Vec<&Sample> = samples.iter().copied().filter(|s| has_prefix(&names(s), "phase_spin")).collect();
    let (reached, total) = weighted(&spin, |frames| reaches(frames, "main"));
    assert!(total > 0 && reached as f64 >= 0.99 * total as f64, "{reached} of {total} samples in phase_spin reach main");
    // ...while libc's code, left out, is walked by frame pointers, which it has none of.
    let sorting: Vec<&Sample> = samples.iter().copied().filter(|s| names(s).first().is_some_and(|f| f == "by_value")).collect();
    let (through, total) = weighted(&sorting, |frames| has_prefix(frames, "phase_qsort"));
    assert!(total > 0 && (through as f64) < 0.1 * total as f64, "{through} of {total} comparator samples got through libc without its table");
}

/// Rows of `binary`'s table in the kernel, as `ember-agent unwind-table` reports them.
fn table_rows(binary: &Path) -> u64 {
    let out = Command::new(ember_tests::agent_bin()).arg("unwind-table").arg(binary).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let rows = text.split("in the kernel: ").nth(1).and_then(|rest| rest.split(' ').next()).and_then(|n| n.parse().ok());
    rows.unwrap_or_else(|| panic!("no row count for {}: {text}", binary.display()))
}

/// The phases fixture `binary`, held until `release` (see `ember_tests::held`).
fn launcher(binary: &Path, seconds: &str) -> Child {
    held(binary, &["split", seconds])
}

fn launch_and_wait(child: &mut Child) {
    release(child);
    assert!(child.wait().unwrap().success());
}

/// Profiles `workload` with `ember-agent record` for 3 s at 499 Hz into `out`, then stops it.
fn record_three_seconds(workload: &mut Child, out: &Path) -> Decoded {
    let pid = workload.id().to_string();
    let agent = Agent::spawn(&["record", "-d", "3s", "-F", "499", "--pid", &pid, "-o", out.to_str().unwrap()]);
    agent.wait_success(Duration::from_secs(30));
    workload.kill().ok();
    workload.wait().ok();
    Decoded::read(out)
}

#[test]
fn stacks_through_the_vdso_are_complete_and_named() {
    require_root();
    let dir = TempDir::new("nofp-vdso");
    let clock = nofp::build_program(&dir.path(""), "clock");
    let mut workload = Command::new(&clock).arg("8").spawn().unwrap();
    let profile = record_three_seconds(&mut workload, &dir.path("clock.pb.gz"));
    let samples = profile.samples_of(workload.id());
    let in_vdso: Vec<&Sample> = samples.iter().copied().filter(|s| s.frames.first().is_some_and(|f| f.mapping == "[vdso]")).collect();
    let (total, vdso) = (Decoded::total(&samples), Decoded::total(&in_vdso));
    assert!(total > 500 && vdso * 2 > total, "{vdso} of {total} samples in the vDSO");
    let unnamed: Vec<&str> = in_vdso.iter().map(|s| s.frames[0].function.as_str()).filter(|f| !f.contains("clock_gettime")).collect();
    assert!(unnamed.is_empty(), "vDSO frames not named from the vDSO's symbols: {unnamed:?}");
    let (reached, total) = weighted(&samples, |frames| reaches(frames, "main"));
    assert!(reached as f64 >= 0.995 * total as f64, "{reached} of {total} samples reach main");
}

/// A process whose main thread has left (pthread_exit) while a worker runs on shows no
/// mappings under /proc/<pid> any more. The agent, started after that, must read them
/// through the worker: otherwise no table is loaded for it and no frame is named.
#[test]
fn a_process_whose_main_thread_has_exited_is_unwound_and_named() {
    require_root();
    let dir = TempDir::new("nofp-leaderless");
    let leaderless = nofp::build_program(&dir.path(""), "leaderless");
    let mut workload = Command::new(&leaderless).arg("8").spawn().unwrap();
    let pid = workload.id().to_string();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the fixture's main thread did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
    let profile = record_three_seconds(&mut workload, &dir.path("leaderless.pb.gz"));
    let samples = profile.samples_of(workload.id());
    let (reached, total) = weighted(&samples, |frames| reaches(frames, "worker"));
    assert!(total > 500 && reached as f64 >= 0.99 * total as f64, "{reached} of {total} samples reach the worker");
    // The comparator's callers, leaf first: libc's qsort, then the fixture's own frames.
    let comparing: Vec<&Sample> = samples.iter().copied().filter(|s| names(s).first().is_some_and(|f| f == "compare_ints")).collect();
    let complete = |frames: &[String]| {
        let at = |name: &str| frames.iter().position(|f| f.contains(name));
        matches!((at("qsort"), at("sort_often"), at("worker")), (Some(qsort), Some(sort), Some(worker)) if qsort < sort && sort < worker)
    };
    let (shown, all) = weighted(&comparing, complete);
    let example = comparing.iter().map(|s| names(s)).find(|frames| !complete(frames));
    // Samples before the agent has loaded the process's mappings are walked by frame
    // pointers (none here), as in the other tests: hence 99%, not all.
    assert!(all > 50 && shown as f64 >= 0.99 * all as f64, "{shown} of {all} samples in the comparator show qsort, sort_often and the worker above it; one that does not: {example:?}");
}

/// A library loaded with dlopen after the process's mappings were read (at its first sample,
/// before the dlopen): the walker finds code it has no mapping for and asks for the mappings
/// again, so that stacks through the library are complete within the same interval, not
/// only after the next drain. The interval (60 s) outlasts the test: one drain, at the end.
#[test]
fn stacks_through_a_library_loaded_after_the_first_sample_are_complete_at_once() {
    require_root();
    let dir = TempDir::new("nofp-late");
    let (late, library) = nofp::build_late(&dir.path(""));
    let profile = one_interval(&dir, &mut held(&late, &[library.to_str().unwrap(), "4"]));
    let in_library: Vec<&Sample> = profile.samples.iter().filter(|s| has_prefix(&names(s), "lib_")).collect();
    let (complete, total) = weighted(&in_library, |frames| {
        let from_main: Vec<&str> = frames.iter().map(String::as_str).skip_while(|f| f.starts_with("lib_")).collect();
        frames.contains(&"lib_work".to_string()) && from_main.starts_with(&["call_late_library", "main"])
    });
    // 3 s in the library at 499 Hz. (A failure says how the leaves were named, and what
    // the interval counted: CI once saw none named in the library.)
    assert!(total > 1000, "{total} samples in the library; leaves {:?}; {:?}", leaves(&profile), comments(&profile));
    assert!(complete as f64 >= 0.99 * total as f64, "{complete} of {total} samples in the library reach main through it");
}

/// Profiles `workload` (held) with `ember-agent run` at 499 Hz, in one interval (60 s
/// outlasts it: one drain, at the end), until it exits: the interval's on-CPU profile.
fn one_interval(dir: &TempDir, workload: &mut Child) -> Decoded {
    let (out, pid) = (dir.path("profiles"), workload.id().to_string());
    let mut agent = Agent::spawn(&["run", "-F", "499", "--interval", "60s", "--pid", &pid, "--output-dir", out.to_str().unwrap()]);
    agent.wait_ready();
    launch_and_wait(workload);
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(30));
    let mut profiles = Decoded::read_kind(&out, "cpu");
    assert_eq!(profiles.len(), 1, "one interval");
    profiles.remove(0)
}

/// The profile's leaf functions (with their mappings), each once.
fn leaves(profile: &Decoded) -> Vec<String> {
    let mut leaves: Vec<String> = profile.samples.iter().filter_map(|s| s.frames.first()).map(|f| format!("{} ({})", f.function, f.mapping)).collect();
    leaves.sort();
    leaves.dedup();
    leaves
}

fn comments(profile: &Decoded) -> Vec<&str> {
    profile.profile.comment.iter().map(|&c| profile.string(c)).collect()
}

/// A library closed and another loaded where it was: code at the same addresses, with other
/// names and another frame size. The kernel sees the room found for the second over the
/// first's code, and the process starts a new life: the second library's samples are named
/// and walked from its own mappings and table, while the first's, drained at the same end of
/// interval (60 s outlasts the test), are still named from the first.
#[test]
fn a_library_loaded_where_a_closed_one_was_is_named_and_walked_as_itself() {
    require_root();
    let dir = TempDir::new("nofp-swap");
    let (swap, [first, second]) = nofp::build_swap(&dir.path(""));
    let profile = one_interval(&dir, &mut held(&swap, &[first.to_str().unwrap(), second.to_str().unwrap(), "4"]));
    let in_libraries: Vec<&Sample> = profile.samples.iter().filter(|s| has_prefix(&names(s), "lib_work")).collect();
    let total = Decoded::total(&in_libraries);
    // 2 s in each library at 499 Hz.
    assert!(total > 1500, "{total} samples in the libraries; leaves {:?}", leaves(&profile));
    for (inner, library, other) in [("a_inner", "libswap_a.so", "b_inner"), ("b_inner", "libswap_b.so", "a_inner")] {
        let (complete, _) = weighted(&in_libraries, |frames| {
            let through: Vec<&str> = frames.iter().map(String::as_str).take(5).collect();
            through == [inner, "lib_work", "call_library", "run_library", "main"]
        });
        let mapped = Decoded::total(&in_libraries.iter().copied().filter(|s| s.frames.first().is_some_and(|f| f.mapping.ends_with(library))).collect::<Vec<_>>());
        let mixed = Decoded::total(&in_libraries.iter().copied().filter(|s| { let frames = names(s); frames.contains(&inner.to_string()) && frames.contains(&other.to_string()) }).collect::<Vec<_>>());
        let example = in_libraries.iter().map(|s| names(s)).find(|frames| frames.contains(&inner.to_string()) && !frames.contains(&"main".to_string()));
        println!("{inner}: {complete} of {total} samples in the libraries reach main through it, {mapped} have their leaf in {library}");
        // Half the time in each. Samples walked between the replacement and the load of the
        // new mappings go by frame pointers (marked): a few.
        assert!(complete as f64 >= 0.45 * total as f64, "{complete} of {total} samples in the libraries reach main through {inner}; one that does not: {example:?}");
        assert!(mapped as f64 >= 0.45 * total as f64, "{mapped} of {total} samples have their leaf in {library}");
        assert_eq!(mixed, 0, "samples with both {inner} and {other}");
    }
    assert!(profile.counter("code_replaced") > 0, "no code replacement counted");
}

/// Builds the fixtures into `dir`, and a table budget (`--unwind-table-mib`) with room for the
/// PIE fixture and its library, and for the non-PIE one only once the PIE's tables are idle
/// and evicted (libc and ld.so are left out: walked by frame pointers).
fn pie_then_no_pie_budget(dir: &TempDir) -> (nofp::Workloads, String) {
    let built = nofp::build(&dir.path(""));
    let rows = table_rows(&built.pie) + table_rows(&dir.path("libphases.so")) + table_rows(&built.no_pie) - 1;
    let mib = format!("{:.9}", rows as f64 * 8.0 / 1048576.0);
    (built, mib)
}

#[test]
fn a_binary_left_out_of_the_budget_is_loaded_once_room_appears() {
    require_root();
    let dir = TempDir::new("nofp-readmit");
    let (built, mib) = pie_then_no_pie_budget(&dir);
    let (mut first, mut later) = (launcher(&built.pie, "2"), launcher(&built.no_pie, "10"));
    let (out, http) = (dir.path("profiles"), free_address());
    let later_pid = later.id().to_string();
    let args = ["run", "-F", "499", "--interval", "1s", "--unwind-table-mib", &mib, "--http", &http.to_string()];
    let pids = ["--pid", &first.id().to_string(), "--pid", &later_pid];
    let mut agent = Agent::spawn(&[&args[..], &pids, &["--output-dir", out.to_str().unwrap()]].concat());
    agent.wait_ready();
    let counter = |name: &str| metric(&fetch_metrics(http), name);
    let limit = Duration::from_secs(10);

    release(&mut first);
    wait_for_metric(http, "ember_unwind_tables", limit, |n| n >= 2.0);
    let left_out = counter("ember_unwind_over_budget");
    // While the PIE runs, the non-PIE binary's table does not fit.
    release(&mut later);
    wait_for_metric(http, "ember_unwind_over_budget", limit, |n| n > left_out);
    assert!(first.wait().unwrap().success());
    // The PIE's tables go idle, then evictable: the left-out table is built and the running
    // process loaded again with it.
    wait_for_metric(http, "ember_unwind_tables_readmitted_total", limit, |n| n >= 1.0);
    let readmitted_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
    assert!(later.wait().unwrap().success());
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(30));

    let profiles = Decoded::read_kind(&out, "cpu");
    // Intervals that ended before the readmission was seen, and those that began after it.
    let reach = |after: bool| {
        let samples: Vec<&Sample> = profiles
            .iter()
            .filter(|p| if after { p.profile.time_nanos >= readmitted_at } else { p.profile.time_nanos + p.profile.duration_nanos <= readmitted_at })
            .flat_map(|p| p.samples.iter())
            .filter(|s| s.labels.get("pid") == Some(&later_pid) && has_prefix(&names(s), "phase_spin"))
            .collect();
        weighted(&samples, |frames| reaches(frames, "main"))
    };
    let ((before, before_total), (after, after_total)) = (reach(false), reach(true));
    assert!(before_total > 0 && (before as f64) < 0.1 * before_total as f64, "{before} of {before_total} samples reached main while left out");
    assert!(after_total > 0 && after as f64 >= 0.99 * after_total as f64, "{after} of {after_total} samples reached main once loaded");
}

#[test]
fn idle_tables_are_kept_for_the_next_run_and_evicted_when_space_is_needed() {
    require_root();
    let dir = TempDir::new("nofp-idle");
    let (built, mib) = pie_then_no_pie_budget(&dir);
    let (mut first, mut again, mut other) = (launcher(&built.pie, "1.5"), launcher(&built.pie, "1.5"), launcher(&built.no_pie, "1.5"));
    let pids: Vec<String> = [&first, &again, &other].iter().map(|c| c.id().to_string()).collect();
    let (out, http) = (dir.path("profiles"), free_address());
    let mut args = vec!["run", "-F", "499", "--interval", "1s", "--unwind-table-mib", &mib, "--http"];
    let http_arg = http.to_string();
    args.extend([http_arg.as_str(), "--output-dir", out.to_str().unwrap()]);
    for pid in &pids {
        args.extend(["--pid", pid.as_str()]);
    }
    let mut agent = Agent::spawn(&args);
    agent.wait_ready();
    let counter = |name: &str| metric(&fetch_metrics(http), name);

    // Tables become idle at the drain after their last process is forgotten, and evictable
    // one drain later (no walk can still read them then).
    let idle = || {
        wait_for_metric(http, "ember_unwind_tables_idle", Duration::from_secs(10), |n| n >= 2.0);
        std::thread::sleep(Duration::from_millis(1200));
    };
    launch_and_wait(&mut first);
    idle();
    let built_before = counter("ember_unwind_tables_built_total");
    launch_and_wait(&mut again);
    idle();
    assert_eq!(counter("ember_unwind_tables_built_total"), built_before, "the second run of the same binary rebuilt tables");
    launch_and_wait(&mut other);
    std::thread::sleep(Duration::from_millis(1500));
    let metrics = fetch_metrics(http);
    let evicted = ember_tests::metric_value(&metrics, "ember_unwind_tables_evicted_total").unwrap_or(0.0);
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(30));
    assert!(evicted >= 1.0, "no idle table was evicted for the non-PIE binary:\n{metrics}");
    let samples: Vec<Sample> = Decoded::read_kind(&out, "cpu").into_iter().flat_map(|p| p.samples).collect();
    for (run, pid) in ["second run", "non-PIE run"].iter().zip(&pids[1..]) {
        let spin: Vec<&Sample> = samples.iter().filter(|s| s.labels.get("pid") == Some(pid) && has_prefix(&names(s), "phase_spin")).collect();
        let (reached, total) = weighted(&spin, |frames| reaches(frames, "main"));
        assert!(total > 0 && reached as f64 >= 0.99 * total as f64, "{run}: {reached} of {total} samples in phase_spin reach main");
    }
}

/// The walker keeps the rows it found, per CPU, for the walks that follow there; a kept row
/// holds for the process whose mappings it was found under, and no other. Two programs with
/// the same code at the same addresses, but frames of different sizes, take turns on one CPU:
/// each must be walked by its own rows, or its callers are read from the wrong place.
#[test]
fn rows_kept_for_one_process_are_never_used_for_another_at_the_same_address() {
    require_root();
    let dir = TempDir::new("nofp-frame-size");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/nofp/frame_size.c");
    let programs: Vec<PathBuf> = [16, 64]
        .iter()
        .map(|size| {
            let out = dir.path(&format!("frame_{size}"));
            compile_c(&source, &out, &["-O2", "-fomit-frame-pointer", "-no-pie", &format!("-DFRAME={size}")]);
            out
        })
        .collect();
    let symbols = |program: &Path| {
        let out = Command::new("nm").arg("-S").arg(program).output().expect("running nm");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut wanted: Vec<String> = text.lines().filter(|l| [" hot", " outer", " main"].iter().any(|s| l.ends_with(s))).map(String::from).collect();
        wanted.sort();
        wanted
    };
    let (first, second) = (symbols(&programs[0]), symbols(&programs[1]));
    assert!(first.len() == 3 && first == second, "the two builds do not share their code's addresses and sizes: {first:?} {second:?}");

    let mut workloads: Vec<Child> = programs.iter().map(|program| on_cpu_zero(program, "8")).collect();
    let out = dir.path("p.pb.gz");
    let pids: Vec<String> = workloads.iter().map(|w| w.id().to_string()).collect();
    let agent = Agent::spawn(&["record", "-d", "4s", "-F", "999", "--pid", &pids[0], "--pid", &pids[1], "-o", out.to_str().unwrap()]);
    agent.wait_success(Duration::from_secs(30));
    for workload in &mut workloads {
        workload.kill().ok();
        workload.wait().ok();
    }
    let profile = Decoded::read(&out);
    for workload in &workloads {
        let samples = profile.samples_of(workload.id());
        let (walked, total) = weighted(&samples, |frames| frames.windows(3).any(|w| w == ["hot", "outer", "main"]));
        println!("pid {}: {walked} of {total} samples through hot, outer and main", workload.id());
        assert!(total > 500, "only {total} samples of pid {}", workload.id());
        assert!(walked as f64 >= 0.99 * total as f64, "{walked} of {total} samples of pid {} walk through hot, outer and main", workload.id());
    }
}

/// `program seconds`, on CPU 0 only.
fn on_cpu_zero(program: &Path, seconds: &str) -> Child {
    let mut command = Command::new(program);
    command.arg(seconds);
    // SAFETY: only an async-signal-safe system call between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            match libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        })
    };
    command.spawn().unwrap_or_else(|e| panic!("starting {}: {e}", program.display()))
}
