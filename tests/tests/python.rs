//! Python frames read from the interpreter's memory by the walk, end to end: every CPython on
//! the machine (Debian's python3, with the interpreter linked into a stripped non-PIE
//! executable, and each pyenv version, a PIE linked to libpython) runs the 70:30 fixture with
//! no flag, the agent runs as its systemd unit does, and the profile must name the fixture's
//! Python functions, in their order, in the fixture's split. Needs root.
use std::{
    collections::{BTreeSet, HashMap, HashSet},
    path::{Path, PathBuf},
    process::Command,
};

use ember_tests::{
    child_running,
    python::{interpreters, py_spy, py_spy_functions},
    kind_path, record_fixtures, record_least_privileged, record_least_privileged_together, require_root, Decoded, Fixture, FixtureRun, Sample, TempDir, JIT_FIXTURES,
};

/// How long the split and lines fixtures run, at 999 Hz: about 8,000 samples, whose split has
/// a standard error of half a point, a quarter of the 2 points allowed. (With 4,000, one of
/// the ten interpreters missed by more than 2 points in about one run of twenty.)
const SECONDS: f64 = 8.0;

/// Records `pid` (the fixture's interpreter, waiting for its start) at 999 Hz with the
/// least-privilege agent, around the fixture's run.
fn record(dir: &TempDir, fixture: Fixture, pid: u32) -> (Vec<Sample>, FixtureRun) {
    record_least_privileged(dir, fixture, pid, SECONDS, 999)
}

/// What the split fixture must show, whatever the interpreter: its samples with Python
/// frames, hot_a and hot_b in their split, each under dispatch under <module>, and below the
/// Python frames one and the same native start-up, complete (the walk keeps it per thread
/// and copies it: a copy of another thread's or an old one would show as a second). Returns
/// the findings as one line, and what is wrong, if anything.
fn split_findings(name: &str, samples: &[Sample], run: &FixtureRun) -> (String, Vec<String>) {
    let python_frame = |s: &Sample, function: &str| s.frames.iter().position(|f| f.function == function && f.mapping == "[python]");
    let total = |filter: &dyn Fn(&Sample) -> bool| -> i64 { samples.iter().filter(|s| filter(s)).map(|s| s.values[0]).sum() };
    let all = total(&|_| true);
    let with_python = total(&|s| s.frames.iter().any(|f| f.mapping == "[python]"));
    let (a, b) = (total(&|s| python_frame(s, "hot_a").is_some()), total(&|s| python_frame(s, "hot_b").is_some()));
    let in_order = |s: &Sample| {
        let hot = python_frame(s, "hot_a").or(python_frame(s, "hot_b"));
        matches!((hot, python_frame(s, "dispatch"), python_frame(s, "<module>")), (Some(h), Some(d), Some(m)) if h < d && d < m)
    };
    let ordered = total(&in_order);
    // The frames below the last Python frame, by weight.
    let mut tails: HashMap<Vec<&str>, i64> = HashMap::new();
    for s in samples {
        if let Some(last) = s.frames.iter().rposition(|f| f.mapping == "[python]") {
            *tails.entry(s.frames[last + 1..].iter().map(|f| f.function.as_str()).collect()).or_default() += s.values[0];
        }
    }
    let (tail, tail_weight) = tails.iter().max_by_key(|(_, &w)| w).map(|(t, &w)| (t.clone(), w)).unwrap_or_default();
    let truth = run.lines[0][1] as f64 / run.lines[0][0] as f64;
    let share = a as f64 / (a + b).max(1) as f64;
    let line = format!("{name}: {all} samples, {with_python} with Python frames, hot_a {a} hot_b {b} ({share:.3}, truth {truth:.3}), {ordered} in order");
    let mut problems = Vec::new();
    if all < 6000 || (with_python as f64) < 0.99 * all as f64 {
        problems.push("too few samples, or too few with Python frames".to_string());
    }
    if (share - truth).abs() > 0.02 {
        problems.push("hot_a's share is not the fixture's".to_string());
    }
    let complete = !tail.is_empty() && !tail.iter().any(|f| f.starts_with("[truncated") || f.starts_with("[walked by"));
    if !complete || (tail_weight as f64) < 0.99 * with_python as f64 {
        let mut shown: Vec<(&Vec<&str>, &i64)> = tails.iter().collect();
        shown.sort_by_key(|(_, &w)| -w);
        let shown: Vec<String> = shown.iter().take(3).map(|(t, w)| format!("{w} x {}", t.join(" < "))).collect();
        problems.push(format!("the native frames below the Python ones are not one complete start-up: {}", shown.join(" | ")));
    }
    if (ordered as f64) < 0.95 * (a + b) as f64 {
        let mut others: Vec<&Sample> = samples.iter().filter(|s| !in_order(s)).collect();
        others.sort_by_key(|s| -s.values[0]);
        let shown: Vec<String> = others.iter().take(3).map(|s| format!("{} x {}", s.values[0], s.frames.iter().map(|f| format!("{}[{}]", f.function, f.mapping)).collect::<Vec<_>>().join(" < "))).collect();
        problems.push(format!("hot_* not under dispatch under <module>; the heaviest other stacks: {}", shown.join(" | ")));
    }
    (line, problems)
}

/// Two interpreters at a time under one agent: a core each, so each still gives some 4,000
/// samples, for half the agent starts.
#[test]
fn python_functions_are_walked_in_every_cpython_in_their_split_and_order() {
    require_root();
    let (mut report, mut problems) = (Vec::new(), Vec::new());
    for pair in interpreters().chunks(2) {
        let dir = TempDir::new("python-walk");
        let fixtures = pair
            .iter()
            .map(|(_, python)| {
                let mut command = Command::new(python);
                command.arg(Path::new(JIT_FIXTURES).join("split.py"));
                let fixture = Fixture::spawn_with(command, "split", SECONDS, &[]);
                let pid = fixture.pid();
                (fixture, pid)
            })
            .collect();
        for ((name, _), (samples, run)) in pair.iter().zip(record_least_privileged_together(&dir, fixtures, SECONDS, 999)) {
            let (line, found) = split_findings(name, &samples, &run);
            println!("{line}");
            problems.extend(found.into_iter().map(|p| format!("{name}: {p}")));
            report.push(line);
        }
        // Each thread's start-up is walked once per CPU, then copied.
        let recorded = Decoded::read(&dir.path("p.pb.gz"));
        let (kept, walks) = (recorded.counter("unwind_tails_kept"), recorded.counter("python_complete"));
        let line = format!("{}: {kept} of {walks} complete Python walks copied the frames below the evaluation loop", pair.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(" and "));
        println!("{line}");
        if (kept as f64) < 0.9 * walks as f64 {
            problems.push(line);
        }
    }
    assert!(problems.is_empty(), "{}\n{}", problems.join("\n"), report.join("\n"));
}

/// Debian's python3.11 exec'd by a shell once the agent runs, in a pid and mount namespace of
/// its own, where its executable is at a path only that namespace has (/mnt/python3.11): the
/// agent reads it through the process's root, and walks it like any other.
#[test]
fn python_execd_in_its_own_namespaces_after_the_agent_started_is_walked() {
    require_root();
    let debian = Path::new("/usr/bin/python3.11");
    assert!(debian.exists(), "no Debian python3.11: run `cargo xtask setup`");
    let dir = TempDir::new("python-namespaces");
    let mut command = Command::new("unshare");
    command
        .args(["--pid", "--fork", "--mount", "--mount-proc", "--propagation", "private", "sh", "-c"])
        .arg(concat!(
            "mount -t tmpfs tmpfs /mnt && touch /mnt/python3.11 && mkdir /mnt/fixtures && ",
            "mount --bind /usr/bin/python3.11 /mnt/python3.11 && mount --bind \"$FIXTURES\" /mnt/fixtures && ",
            "read line && exec /mnt/python3.11 /mnt/fixtures/split.py \"$0\" \"$@\" < /dev/null"
        ))
        .env("FIXTURES", JIT_FIXTURES);
    let fixture = Fixture::spawn_with(command, "split", SECONDS, &[]);
    let shell = child_running(fixture.pid(), "sh");
    let (samples, run) = record(&dir, fixture, shell);
    let (line, problems) = split_findings("python3.11 in its own namespaces", &samples, &run);
    println!("{line}");
    assert!(problems.is_empty(), "{line}: {}", problems.join("; "));
}

const SHAPES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/python/shapes.py");

/// Runs `shapes.py MODE` on every interpreter under `ember-agent record ARGS`, and hands each
/// interpreter's recording, the fixture's truth and pid to `check`, which says what is wrong,
/// if anything. Fails with every interpreter's findings at once.
fn each_interpreter(mode: &str, seconds: f64, args: &[&str], check: impl Fn(&str, &Recorded, &FixtureRun) -> Vec<String>) {
    on_interpreters(interpreters(), mode, seconds, args, check)
}

/// `each_interpreter` on the given interpreters, two at a time under one agent (a core each,
/// so each gives as many samples as alone, for half the agent starts).
fn on_interpreters(interpreters: Vec<(String, PathBuf)>, mode: &str, seconds: f64, args: &[&str], check: impl Fn(&str, &Recorded, &FixtureRun) -> Vec<String>) {
    require_root();
    let mut problems = Vec::new();
    for pair in interpreters.chunks(2) {
        let dir = TempDir::new(&format!("python-{mode}"));
        let fixtures: Vec<Fixture> = pair
            .iter()
            .map(|(_, python)| {
                let mut command = Command::new(python);
                command.arg(SHAPES);
                Fixture::spawn_with(command, mode, seconds, &[])
            })
            .collect();
        let pids: Vec<String> = fixtures.iter().map(|f| f.pid().to_string()).collect();
        let mut all: Vec<&str> = pids.iter().flat_map(|pid| ["--pid", pid.as_str()]).collect();
        all.extend(args);
        let (out, runs) = record_fixtures(&dir, fixtures, seconds, &all);
        for (((name, _), pid), run) in pair.iter().zip(&pids).zip(&runs) {
            let found = check(name, &Recorded { out: &out, pid }, run);
            println!("{name}: {}", if found.is_empty() { "ok".to_string() } else { found.join("; ") });
            problems.extend(found.into_iter().map(|p| format!("{name}: {p}")));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// One interpreter's part of a recording of several.
struct Recorded<'a> {
    out: &'a Path,
    pid: &'a str,
}

impl Recorded<'_> {
    /// The profile of `kind` (None: the recording's first), with this interpreter's samples
    /// only.
    fn profile(&self, kind: Option<&str>) -> Decoded {
        let mut profile = Decoded::read(&kind.map_or_else(|| self.out.to_path_buf(), |kind| kind_path(self.out, kind)));
        profile.samples.retain(|s| s.labels.get("pid").is_some_and(|pid| pid == self.pid));
        profile
    }
}

/// The innermost Python frame of a sample.
fn leaf_python(sample: &Sample) -> Option<&ember_tests::Frame> {
    sample.frames.iter().find(|f| f.mapping == "[python]")
}

#[test]
fn python_lines_are_named_in_their_split() {
    each_interpreter("lines", SECONDS, &["-F", "999"], |_, recorded, run| {
        let profile = &recorded.profile(None);
        let (line_a, line_b, truth) = (run.lines[0][0] as i64, run.lines[0][1] as i64, run.lines[0][2] as f64 / run.lines[0][3] as f64);
        let in_function: Vec<&Sample> = profile.samples.iter().filter(|s| leaf_python(s).is_some_and(|f| f.function == "two_lines")).collect();
        let on_line = |line| Decoded::total(&in_function.iter().copied().filter(|s| leaf_python(s).is_some_and(|f| f.line == line)).collect::<Vec<_>>());
        let (a, b, all) = (on_line(line_a), on_line(line_b), Decoded::total(&in_function));
        let share = a as f64 / (a + b).max(1) as f64;
        let mut problems = Vec::new();
        if all < 6000 || ((a + b) as f64) < 0.9 * all as f64 {
            problems.push(format!("of {all} samples in two_lines, {a} on line {line_a} and {b} on line {line_b}"));
        }
        if (share - truth).abs() > 0.02 {
            problems.push(format!("line {line_a} has {share:.3} of the two lines' samples, truth {truth:.3}"));
        }
        problems
    });
}

#[test]
fn python_called_from_c_sits_above_the_c_and_its_python_caller() {
    each_interpreter("callback", 3.0, &["-F", "499"], |_, recorded, _| {
        let profile = &recorded.profile(None);
        let position = |s: &Sample, name: &str| s.frames.iter().position(|f| f.function == name && f.mapping == "[python]");
        let keyed: Vec<&Sample> = profile.samples.iter().filter(|s| position(s, "key").is_some()).collect();
        let layered = keyed.iter().copied().filter(|s| {
            let (Some(key), Some(caller)) = (position(s, "key"), position(s, "sort_with_key")) else { return false };
            key < caller && s.frames[key..caller].iter().any(|f| f.mapping != "[python]")
        });
        let (layered, all) = (Decoded::total(&layered.collect::<Vec<_>>()), Decoded::total(&keyed));
        if all < 200 || (layered as f64) < 0.95 * all as f64 {
            vec![format!("{layered} of {all} samples in key() have C frames, then sort_with_key() below it")]
        } else {
            Vec::new()
        }
    });
}

#[test]
fn python_threads_each_show_their_own_function() {
    each_interpreter("threads", 3.0, &["-F", "499"], |_, recorded, run| {
        let profile = &recorded.profile(None);
        let mut problems = Vec::new();
        if run.lines.len() != 4 {
            problems.push(format!("{} threads reported", run.lines.len()));
        }
        for (i, line) in run.lines.iter().enumerate() {
            let thread = profile.samples_labelled("tid", &line[0].to_string());
            let own = format!("spin_{i}");
            let spinning: Vec<&Sample> = thread.iter().copied().filter(|s| s.frames.iter().any(|f| f.mapping == "[python]" && f.function.starts_with("spin_"))).collect();
            let theirs = Decoded::total(&spinning.iter().copied().filter(|s| s.has_function(&own)).collect::<Vec<_>>());
            let all = Decoded::total(&spinning);
            if all < 50 || theirs != all {
                problems.push(format!("thread {} ({own}): {theirs} of {all} samples in a spin_ function are in its own", line[0]));
            }
        }
        problems
    });
}

/// A thread blocked in `time.sleep` and one in `socket.recv`: each one's blocked time is under
/// its Python function, in the off-CPU profile and in the wall-clock one (its time on CPU,
/// sampled, added to its blocked time).
#[test]
fn python_blocked_time_is_shown_under_its_python_caller() {
    each_interpreter("block", 3.0, &["--events", "cpu,offcpu"], |_, recorded, run| {
        let mut problems = Vec::new();
        if run.lines.len() != 2 || run.lines.iter().any(|line| line[1] < 1_000_000_000) {
            return vec![format!("the fixture's truth: {:?}", run.lines)];
        }
        for (kind, nanoseconds) in [("offcpu", 1), ("wall", 0)] {
            let profile = recorded.profile(Some(kind));
            for (line, function) in run.lines.iter().zip(["sleeper", "reader"]) {
                let (tid, blocked_ns) = (line[0].to_string(), line[1] as f64);
                let thread = profile.samples_labelled("tid", &tid);
                let under: Vec<&Sample> = thread.iter().copied().filter(|s| s.frames.iter().any(|f| f.function == function && f.mapping == "[python]")).collect();
                let under_ns = Decoded::sum(&under, nanoseconds) as f64;
                let error = (under_ns - blocked_ns).abs() / blocked_ns;
                if error > 0.02 {
                    let mut elsewhere: Vec<(i64, String)> = thread
                        .iter()
                        .filter(|s| !under.iter().any(|u| std::ptr::eq(*u, **s)))
                        .map(|s| (s.values[nanoseconds], s.frames.iter().map(|f| f.function.as_str()).collect::<Vec<_>>().join(";")))
                        .collect();
                    elsewhere.sort_by(|a, b| b.0.cmp(&a.0));
                    elsewhere.truncate(3);
                    problems.push(format!(
                        "{kind}: {function}: {:.3} s under it, {:.3} s blocked; the thread's heaviest other stacks: {elsewhere:?}",
                        under_ns / 1e9,
                        blocked_ns / 1e9
                    ));
                }
            }
        }
        problems
    });
}

/// 8 MiB sent over TCP on loopback from a Python function: the network profile's transmits of
/// the process are under it, every byte, on a CPython with frame objects (the oldest here) and
/// on one with interpreter frames (Debian's). The walk is the one every kind shares: the other
/// versions are covered by the other kinds.
#[test]
fn python_network_stacks_carry_the_sending_function() {
    let all = interpreters();
    let oldest_pyenv = all.iter().filter(|(name, _)| name.starts_with("pyenv 3.")).min_by_key(|(name, _)| name.split('.').nth(1).and_then(|m| m.parse::<u32>().ok()));
    let chosen: Vec<(String, PathBuf)> = all.iter().take(1).chain(oldest_pyenv).cloned().collect();
    let args = ["--events", "net", "--net-events", "net:net_dev_queue"];
    on_interpreters(chosen, "send", 3.0, &args, |_, recorded, run| {
        let (tid, transmitted) = (run.lines[0][0].to_string(), run.lines[0][2] as i64);
        if transmitted < 8 << 20 {
            return vec![format!("{transmitted} bytes transmitted")];
        }
        let profile = recorded.profile(None);
        let sent: Vec<&Sample> = profile
            .samples_labelled("tid", &tid)
            .into_iter()
            .filter(|s| s.labels.get("device").is_some_and(|d| d == "lo") && s.frames.iter().any(|f| f.function == "sender" && f.mapping == "[python]"))
            .collect();
        // Payload: bytes less each packet's Ethernet, IPv4 and TCP (with timestamps) headers.
        let payload = Decoded::sum(&sent, 1) - Decoded::sum(&sent, 0) * 66;
        let error = (payload - transmitted).abs() as f64 / transmitted as f64;
        if error > 0.02 {
            vec![format!("{payload} bytes of payload under sender(), {transmitted} transmitted")]
        } else {
            Vec::new()
        }
    });
}

#[test]
fn python_functions_have_their_qualified_names_from_3_11() {
    each_interpreter("names", 3.0, &["-F", "499"], |_, recorded, _| {
        let profile = &recorded.profile(None);
        let qualified = profile.samples.iter().any(|s| s.frames.iter().any(|f| f.mapping == "[python]" && f.function.contains('.')));
        let (method, inner) = if qualified { ("Outer.method", "outer.<locals>.inner") } else { ("method", "inner") };
        let named = |name: &str| Decoded::total(&profile.samples.iter().filter(|s| leaf_python(s).is_some_and(|f| f.function == name)).collect::<Vec<_>>());
        let (m, i) = (named(method), named(inner));
        let mut problems = Vec::new();
        if m < 200 || i < 200 {
            problems.push(format!("{m} samples in {method}, {i} in {inner}"));
        }
        problems
    });
}

/// Code compiled at run time, freed once it has run and its memory reused while the process
/// lives on across a drain: the samples taken while it ran keep its name (a frame holds its
/// code object, so the samples saw it alive), not "unreadable". (Only where it ran, directly
/// under main: code first sampled as the interpreter exits, and gone before the next drain,
/// cannot be named at all.)
#[test]
fn python_code_freed_before_the_drain_keeps_its_name() {
    each_interpreter("freed", 4.0, &["-F", "499"], |_, recorded, _| {
        let profile = &recorded.profile(None);
        let frames = || profile.samples.iter().flat_map(|s| s.frames.iter().map(move |f| (s, f))).filter(|(_, f)| f.mapping == "[python]");
        let ran = frames().filter(|(_, f)| f.file == "freed_code").map(|(s, _)| s.values[0]).sum::<i64>();
        let under_main = |s: &Sample| {
            let python: Vec<&str> = s.frames.iter().filter(|f| f.mapping == "[python]").map(|f| f.function.as_str()).collect();
            python.windows(2).any(|w| w[0].contains("unreadable") && w[1] == "main")
        };
        let unreadable = profile.samples.iter().filter(|s| under_main(s)).map(|s| s.values[0]).sum::<i64>();
        let mut problems = Vec::new();
        if ran < 500 {
            problems.push(format!("{ran} samples in freed_code"));
        }
        if unreadable > 0 {
            problems.push(format!("{unreadable} samples with an unreadable code object ({ran} named in freed_code)"));
        }
        problems
    });
}

/// The same workload profiled by the agent and by py-spy at once, both at 999 Hz for 8 s (the
/// difference of the two shares then has a sampling error near half a point): the same Python
/// functions (each with at least 1% of the samples), and hot_a's share of hot_a + hot_b within
/// 2 points.
#[test]
fn python_functions_and_split_match_py_spy() {
    const SECONDS: f64 = 8.0;
    require_root();
    let (name, python) = interpreters().remove(0);
    // py-spy in --nonblocking mode (the mode that leaves the process running, as Ember does),
    // with --function: py-spy 0.4 panics in a third of runs here decoding a line table it read
    // while the interpreter changed it, and the comparison needs functions, not lines.
    let dir = TempDir::new("python-py-spy");
    let mut command = Command::new(&python);
    command.arg(Path::new(JIT_FIXTURES).join("split.py"));
    let fixture = Fixture::spawn_with(command, "split", SECONDS, &[]);
    let pid = fixture.pid().to_string();
    let raw = dir.path("py-spy.txt");
    let spy = Command::new(py_spy())
        .args(["record", "--function", "--format", "raw", "-r", "999", "--nonblocking", "-o", raw.to_str().unwrap(), "--pid", &pid])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting py-spy");
    let (out, _) = record_fixtures(&dir, vec![fixture], SECONDS, &["-F", "999", "--pid", &pid]);
    let spied = spy.wait_with_output().expect("py-spy");
    let said = |bytes: &[u8]| String::from_utf8_lossy(bytes).trim().to_string();
    assert!(spied.status.success(), "py-spy {}: {} {}", spied.status, said(&spied.stdout), said(&spied.stderr));
    let theirs = py_spy_functions(&std::fs::read_to_string(&raw).expect("py-spy's output"));
    let profile = Decoded::read(&out);
    let mut ours: HashMap<String, i64> = HashMap::new();
    for sample in &profile.samples {
        let names: HashSet<&str> = sample.frames.iter().filter(|f| f.mapping == "[python]").map(|f| f.function.as_str()).collect();
        for function in names {
            *ours.entry(function.to_string()).or_default() += sample.values[0];
        }
    }
    let significant = |functions: &HashMap<String, i64>| -> BTreeSet<String> {
        let all = functions.values().copied().max().unwrap_or(0);
        functions.iter().filter(|(_, &n)| n as f64 >= 0.01 * all as f64).map(|(f, _)| f.clone()).collect()
    };
    let share = |functions: &HashMap<String, i64>| {
        let (a, b) = (functions.get("hot_a").copied().unwrap_or(0), functions.get("hot_b").copied().unwrap_or(0));
        a as f64 / (a + b).max(1) as f64
    };
    println!("{name}: ours {ours:?}\npy-spy {theirs:?}");
    let hot = |f: &HashMap<String, i64>| f.get("hot_a").copied().unwrap_or(0) + f.get("hot_b").copied().unwrap_or(0);
    assert!(hot(&ours) >= 2000 && hot(&theirs) >= 2000, "samples in hot_a and hot_b: ours {}, py-spy's {}", hot(&ours), hot(&theirs));
    assert_eq!(significant(&ours), significant(&theirs), "{name}: the Python functions differ");
    assert!((share(&ours) - share(&theirs)).abs() <= 0.02, "{name}: hot_a's share {:.3}, py-spy's {:.3}", share(&ours), share(&theirs));
}
