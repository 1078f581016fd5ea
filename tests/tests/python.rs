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

use ember_tests::{least_privilege_agent, require_root, Agent, Decoded, Fixture, FixtureRun, Sample, TempDir, JIT_FIXTURES};

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
