//! JIT-compiled code named from perf maps, end to end: real runtimes from the machine (Node,
//! CPython 3.12+) run a fixture with a known call structure and a 70:30 split, the agent runs
//! as its systemd unit does (no CAP_SYS_ADMIN), and the profile must name the script's
//! functions, in their order, with complete stacks. A C program with a JIT of its own checks
//! a pid's two lives, each writing the perf map. Needs root; fails loudly without it.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use ember_tests::{child_running, compile_c, held, python_3_12, record_least_privileged, release, require_root, JIT_FIXTURES, Agent, Decoded, Fixture, FixtureRun, Sample, TempDir};

const SECONDS: f64 = 5.0;

/// Records `pid` (the runtime, started held in `fixture`) at 499 Hz with the least-privilege
/// agent, around the fixture's run.
fn record(dir: &TempDir, fixture: Fixture, pid: u32) -> (Vec<Sample>, FixtureRun) {
    record_least_privileged(dir, fixture, pid, SECONDS, 499)
}

/// Checks what every runtime must show: `hot_a` and `hot_b` named as JIT frames, in the
/// fixture's split, each under `dispatch` (leaf first) under `root`.
fn check(runtime: &str, samples: &[Sample], run: &FixtureRun, root: impl Fn(&str) -> bool) {
    let jit = |s: &Sample, name: &str| s.frames.iter().position(|f| f.function == name && f.mapping == "[jit]");
    let total = |filter: &dyn Fn(&Sample) -> bool| -> i64 { samples.iter().filter(|s| filter(s)).map(|s| s.values[0]).sum() };
    let (a, b) = (total(&|s| jit(s, "hot_a").is_some()), total(&|s| jit(s, "hot_b").is_some()));
    let all = total(&|_| true);
    assert!(a + b >= all / 2, "{runtime}: only {} of {all} samples named hot_a or hot_b", a + b);
    let share = a as f64 / (a + b) as f64;
    let truth = run.lines[0][1] as f64 / run.lines[0][0] as f64;
    assert!((share - truth).abs() <= 0.05, "{runtime}: hot_a has {share:.3} of hot_a + hot_b (a={a}, b={b}), truth {truth:.3}");
    let complete = total(&|s| {
        let hot = jit(s, "hot_a").or(jit(s, "hot_b"));
        let dispatch = jit(s, "dispatch");
        let bottom = s.frames.iter().rposition(|f| root(&f.function));
        matches!((hot, dispatch, bottom), (Some(h), Some(d), Some(r)) if h < d && d < r)
    });
    let share = complete as f64 / (a + b) as f64;
    assert!(share >= 0.95, "{runtime}: {share:.3} of the hot samples have hot_*, dispatch and the runtime's entry in order ({complete}/{})", a + b);
}

/// Node in its own pid and mount namespaces, with a private /tmp: its perf map is
/// /tmp/perf-1.map there, and the host's /tmp/perf-1.map (a decoy here) is another file.
#[test]
fn node_functions_are_named_from_the_perf_map_in_the_process_own_namespaces() {
    require_root();
    let dir = TempDir::new("jit-node");
    let decoy = Path::new("/tmp/perf-1.map");
    assert!(!decoy.exists(), "{} exists already: a test left it, or pid 1 runs a JIT", decoy.display());
    std::fs::write(decoy, "0 7fffffffffff decoy_on_the_host\n").unwrap();
    let _remove = RemoveOnDrop(decoy.to_path_buf());

    // The fixtures are bound on /mnt first: the checkout may be under /tmp, which the tmpfs hides.
    let mut command = Command::new("unshare");
    command
        .args(["--pid", "--fork", "--mount", "--mount-proc", "--propagation", "private", "sh", "-c"])
        .arg("mount --bind \"$0\" /mnt && mount -t tmpfs tmpfs /tmp && exec \"$@\"")
        .arg(JIT_FIXTURES)
        // Without inlining, each function keeps its own frame (V8 would fold hot_a into dispatch).
        // --perf-basic-prof also writes a V8 log into the working directory: not wanted.
        .args(["node", "--perf-basic-prof", "--interpreted-frames-native-stack", "--no-turbo-inlining", "--logfile=/dev/null", "/mnt/split.js"]);
    let fixture = Fixture::spawn_with(command, "split", SECONDS, &[]);
    let node = child_running(fixture.pid(), "node");
    let (samples, run) = record(&dir, fixture, node);

    assert!(!samples.iter().any(|s| s.has_function("decoy_on_the_host")), "the host's /tmp/perf-1.map was read");
    // V8's builtins between the JIT code and the C++ entry have no call frame information:
    // walked by their frame pointers, the stacks reach node's main.
    check("node", &samples, &run, |f| f.starts_with("node::Start("));
}

/// CPython's perf trampolines name the Python functions, and are walked through by their own
/// rule (they keep no frame pointer and have no call frame information).
#[test]
fn python_functions_are_named_and_walked_through_the_perf_trampolines() {
    require_root();
    let dir = TempDir::new("jit-python");
    let mut command = Command::new(python_3_12());
    command.args(["-X", "perf"]).arg(Path::new(JIT_FIXTURES).join("split.py"));
    let fixture = Fixture::spawn_with(command, "split", SECONDS, &[]);
    let pid = fixture.pid();
    // `-X perf` writes the map, and leaves it when it exits.
    let _remove = RemoveOnDrop(PathBuf::from(format!("/tmp/perf-{pid}.map")));
    let (samples, run) = record(&dir, fixture, pid);
    check("python", &samples, &run, |f| f == "<module>");
}

/// One pid, two lives, each with a JIT of its own (`two_lives.c`), in one interval. The
/// first life's last function is named only in perf map lines the second life overwrites
/// after its exec: its samples keep the first life's names (its map was read one last time
/// when the second life was seen), and the second life's get the second's. The second life
/// maps its code where the first had its own, after its mappings were read, and exits before
/// the interval ends: the walks through that code make the agent read them again in time.
#[test]
fn a_perf_map_rewritten_by_the_next_life_keeps_naming_the_earlier_life() {
    require_root();
    let dir = TempDir::new("jit-two-lives");
    let program = dir.path("two_lives");
    compile_c(&Path::new(JIT_FIXTURES).join("two_lives.c"), &program, &["-O2", "-fno-omit-frame-pointer"]);
    let out = dir.path("profiles");
    let mut workload = held(&program, &["first", "4"]);
    let pid = workload.id();
    let _remove = RemoveOnDrop(PathBuf::from(format!("/tmp/perf-{pid}.map")));
    // One interval (60 s outlasts the test): nothing is named before both lives have run.
    let mut agent = Agent::spawn(&["run", "-F", "499", "--interval", "60s", "--pid", &pid.to_string(), "--output-dir", out.to_str().unwrap()]);
    agent.wait_ready();
    release(&mut workload);
    assert!(workload.wait().unwrap().success(), "two_lives failed");
    agent.signal(libc::SIGTERM);
    agent.wait_success(Duration::from_secs(30));
    let profiles = Decoded::read_kind(&out, "cpu");
    assert_eq!(profiles.len(), 1, "one interval");
    let samples = profiles[0].samples_of(pid);

    // Samples with a JIT leaf, by the native function that called it.
    let leaves_under = |caller: &str| -> HashMap<String, i64> {
        let mut leaves = HashMap::new();
        for s in samples.iter().filter(|s| s.has_function(caller) && s.frames[0].mapping == "[jit]") {
            *leaves.entry(s.frames[0].function.clone()).or_default() += s.values[0];
        }
        leaves
    };
    let (first, second) = (leaves_under("run_first"), leaves_under("run_second"));
    println!("JIT leaves under run_first {first:?}, under run_second {second:?}");
    // At 499 Hz: first_a 3 s, first_b 1 s, second 2 s.
    let count = |leaves: &HashMap<String, i64>, name: &str| leaves.get(name).copied().unwrap_or(0);
    assert!(count(&first, "first_a") > 1000, "first_a: {first:?}");
    assert!(count(&first, "first_b") > 300, "the first life's last function lost its name: {first:?}");
    assert!(count(&second, "second") > 600, "the second life's JIT code was not named (its mapping not read in time): {second:?}");
    assert_eq!(first.len(), 2, "the first life's code named otherwise: {first:?}");
    assert_eq!(second.len(), 1, "the second life's code named otherwise: {second:?}");
}

/// A file the test made outside its own directory, removed at its end.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
