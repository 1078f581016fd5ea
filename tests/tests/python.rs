//! Python frames read from the interpreter's memory by the walk, end to end: every CPython on
//! the machine (Debian's python3, with the interpreter linked into a stripped non-PIE
//! executable, and each pyenv version, a PIE linked to libpython) runs the 70:30 fixture with
//! no flag, the agent runs as its systemd unit does, and the profile must name the fixture's
//! Python functions, in their order, in the fixture's split. Needs root.
use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use ember_tests::{least_privilege_agent, record_fixtures, require_root, Agent, Decoded, Fixture, FixtureRun, Sample, TempDir, JIT_FIXTURES};

const SECONDS: f64 = 4.0;

/// Debian's python3 and every pyenv CPython 3.x: (name, path). Fails if there is none.
fn interpreters() -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    if Path::new("/usr/bin/python3").exists() {
        found.push(("debian python3".to_string(), PathBuf::from("/usr/bin/python3")));
    }
    let pyenv = std::env::var("HOME").map(|h| PathBuf::from(h).join(".pyenv/versions")).unwrap_or_default();
    let mut versions: Vec<PathBuf> = std::fs::read_dir(&pyenv).into_iter().flatten().flatten().map(|e| e.path()).collect();
    versions.sort();
    for version in versions {
        let name = version.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("3.") && version.join("bin/python3").exists() {
            found.push((format!("pyenv {name}"), version.join("bin/python3")));
        }
    }
    assert!(!found.is_empty(), "no CPython: install Debian's python3 (cargo xtask setup) or pyenv versions under ~/.pyenv/versions");
    found
}

/// Records the fixture (started held) at 999 Hz (about 4,000 samples: the split's sampling
/// error is then a fifth of the 2 points allowed) with the least-privilege agent.
fn record(dir: &TempDir, python: &Path) -> (Vec<Sample>, FixtureRun, u32) {
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut command = Command::new(python);
    command.arg(Path::new(JIT_FIXTURES).join("split.py"));
    let mut fixture = Fixture::spawn_with(command, "split", SECONDS, &[]);
    let pid = fixture.pid();
    let out = dir.path("p.pb.gz");
    let mut agent_command = least_privilege_agent();
    let duration = format!("{}s", SECONDS + 2.0);
    agent_command.args(["record", "-F", "999", "-d", &duration, "-o", out.to_str().unwrap(), "--pid", &pid.to_string()]);
    let mut agent = Agent::spawn_command(agent_command);
    agent.wait_ready();
    fixture.start();
    let run = fixture.finish();
    agent.wait_success(Duration::from_secs(60));
    let samples = Decoded::read(&out).samples_of(pid).into_iter().cloned().collect();
    (samples, run, pid)
}

#[test]
fn python_functions_are_walked_in_every_cpython_in_their_split_and_order() {
    require_root();
    let mut report = Vec::new();
    for (name, python) in interpreters() {
        let dir = TempDir::new("python-walk");
        let (samples, run, _) = record(&dir, &python);
        let python_frame = |s: &Sample, function: &str| s.frames.iter().position(|f| f.function == function && f.mapping == "[python]");
        let total = |filter: &dyn Fn(&Sample) -> bool| -> i64 { samples.iter().filter(|s| filter(s)).map(|s| s.values[0]).sum() };
        let all = total(&|_| true);
        let with_python = total(&|s| s.frames.iter().any(|f| f.mapping == "[python]"));
        let (a, b) = (total(&|s| python_frame(s, "hot_a").is_some()), total(&|s| python_frame(s, "hot_b").is_some()));
        let ordered = total(&|s| {
            let hot = python_frame(s, "hot_a").or(python_frame(s, "hot_b"));
            matches!((hot, python_frame(s, "dispatch"), python_frame(s, "<module>")), (Some(h), Some(d), Some(m)) if h < d && d < m)
        });
        let truth = run.lines[0][1] as f64 / run.lines[0][0] as f64;
        let share = a as f64 / (a + b).max(1) as f64;
        report.push(format!(
            "{name}: {all} samples, {with_python} with Python frames, hot_a {a} hot_b {b} ({share:.3}, truth {truth:.3}), {ordered} in order"
        ));
        println!("{}", report.last().unwrap());
        assert!(all >= 2000, "{name}: only {all} samples");
        assert!(with_python as f64 >= 0.99 * all as f64, "{}", report.join("\n"));
        assert!((share - truth).abs() <= 0.02, "{}", report.join("\n"));
        assert!(ordered as f64 >= 0.95 * (a + b) as f64, "{}", report.join("\n"));
    }
}

const SHAPES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/python/shapes.py");

/// Runs `shapes.py MODE` on every interpreter under `ember-agent record ARGS`, and hands each
/// profile, the fixture's truth and pid to `check`, which says what is wrong, if anything.
/// Fails with every interpreter's findings at once.
fn each_interpreter(mode: &str, seconds: f64, args: &[&str], check: impl Fn(&str, &Decoded, &FixtureRun) -> Vec<String>) {
    require_root();
    let mut problems = Vec::new();
    for (name, python) in interpreters() {
        let dir = TempDir::new(&format!("python-{mode}"));
        let mut command = Command::new(&python);
        command.arg(SHAPES);
        let fixture = Fixture::spawn_with(command, mode, seconds, &[]);
        let pid = fixture.pid().to_string();
        let mut all = vec!["--pid", &pid];
        all.extend(args);
        let (out, runs) = record_fixtures(&dir, vec![fixture], seconds, &all);
        let found = check(&name, &Decoded::read(&out), &runs[0]);
        println!("{name}: {}", if found.is_empty() { "ok".to_string() } else { found.join("; ") });
        problems.extend(found.into_iter().map(|p| format!("{name}: {p}")));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The innermost Python frame of a sample.
fn leaf_python(sample: &Sample) -> Option<&ember_tests::Frame> {
    sample.frames.iter().find(|f| f.mapping == "[python]")
}

#[test]
fn python_lines_are_named_in_their_split() {
    each_interpreter("lines", 4.0, &["-F", "999"], |_, profile, run| {
        let (line_a, line_b, truth) = (run.lines[0][0] as i64, run.lines[0][1] as i64, run.lines[0][2] as f64 / run.lines[0][3] as f64);
        let in_function: Vec<&Sample> = profile.samples.iter().filter(|s| leaf_python(s).is_some_and(|f| f.function == "two_lines")).collect();
        let on_line = |line| Decoded::total(&in_function.iter().copied().filter(|s| leaf_python(s).is_some_and(|f| f.line == line)).collect::<Vec<_>>());
        let (a, b, all) = (on_line(line_a), on_line(line_b), Decoded::total(&in_function));
        let share = a as f64 / (a + b).max(1) as f64;
        let mut problems = Vec::new();
        if all < 2000 || ((a + b) as f64) < 0.9 * all as f64 {
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
    each_interpreter("callback", 3.0, &["-F", "499"], |_, profile, _| {
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
    each_interpreter("threads", 3.0, &["-F", "499"], |_, profile, run| {
        let mut problems = Vec::new();
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

#[test]
fn python_blocked_time_is_shown_under_its_python_caller() {
    each_interpreter("block", 3.0, &["--events", "offcpu"], |_, profile, run| {
        let mut problems = Vec::new();
        for (line, function) in run.lines.iter().zip(["sleeper", "reader"]) {
            let (tid, blocked_ns) = (line[0].to_string(), line[1] as f64);
            let thread = profile.samples_labelled("tid", &tid);
            let under: Vec<&Sample> = thread.iter().copied().filter(|s| s.frames.iter().any(|f| f.function == function && f.mapping == "[python]")).collect();
            let off_ns = Decoded::sum(&under, 1) as f64;
            let error = (off_ns - blocked_ns).abs() / blocked_ns;
            if error > 0.02 {
                let mut elsewhere: Vec<(i64, String)> = thread
                    .iter()
                    .filter(|s| !under.iter().any(|u| std::ptr::eq(*u, **s)))
                    .map(|s| (s.values[1], s.frames.iter().map(|f| f.function.as_str()).collect::<Vec<_>>().join(";")))
                    .collect();
                elsewhere.sort_by(|a, b| b.0.cmp(&a.0));
                elsewhere.truncate(3);
                problems.push(format!(
                    "{function}: {:.3} s off-CPU under it, {:.3} s blocked; the thread's heaviest other stacks: {elsewhere:?}",
                    off_ns / 1e9,
                    blocked_ns / 1e9
                ));
            }
        }
        problems
    });
}

#[test]
fn python_functions_have_their_qualified_names_from_3_11() {
    each_interpreter("names", 3.0, &["-F", "499"], |_, profile, _| {
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
