//! The `faults` group end to end: a process touches 100 MiB of fresh memory, one page fault
//! a page, 70% of the pages from one function and 30% from another. Its page-fault profile
//! adds up to the bytes it touched, split between the two functions as they touched them.
//! Calls that ask the kernel for memory (brk, anonymous mmap) are counted exactly. Needs root.
use std::time::Duration;

use ember_tests::{require_root, Agent, Decoded, Fixture, FixtureRun, TempDir};

const FIXTURE: &str = env!("CARGO_BIN_EXE_fixture");
const MIB: u64 = 100;
/// One fault in 16: some 1,600 samples of the fixture's 25,600 faults.
const PERIOD: &str = "16";

/// Runs the fixture in `mode` under the agent's faults group (with `period`), started after
/// the agent. Its work starts a second after its exec: by then the agent has read the
/// libraries the loader mapped (events before that are walked by frame pointers, which skip
/// the caller of libc's `mmap`). Returns its profiles of `kind`, its pid, what it printed,
/// and the agent's log.
fn profile_fixture(name: &str, period: &str, mode: &str, args: &[&str], kind: &str) -> (Vec<Decoded>, u32, FixtureRun, String) {
    let dir = TempDir::new(name);
    let out = dir.path("profiles");
    let agent_args = ["run", "--events", "faults", "--fault-period", period, "--interval", "1s", "--output-dir", out.to_str().unwrap()];
    let mut agent = Agent::spawn(&agent_args);
    agent.wait_ready();
    let mut fixture = Fixture::spawn_with(std::process::Command::new(FIXTURE), mode, 2.0, args);
    let pid = fixture.pid();
    std::thread::sleep(Duration::from_secs(1));
    fixture.start();
    let run = fixture.finish();
    std::thread::sleep(Duration::from_millis(1500));
    agent.signal(libc::SIGINT);
    let stderr = agent.wait_success(Duration::from_secs(30));
    let profiles = Decoded::read_kind(&out, kind);
    assert!(!profiles.is_empty(), "no {kind} profile was written:\n{stderr}");
    (profiles, pid, run, stderr)
}

#[test]
fn page_faults_add_up_to_the_memory_touched_and_split_by_where() {
    require_root();
    let (profiles, pid, run, _) = profile_fixture("faults", PERIOD, "faults", &[&MIB.to_string()], "faults");
    let (most_pages, rest_pages) = (run.lines[0][0], run.lines[0][1]);
    assert_eq!((most_pages + rest_pages) * 4096, MIB << 20, "the fixture touched every page: {:?}", run.lines);

    let samples: Vec<_> = profiles.iter().flat_map(|p| p.samples_of(pid)).collect();
    let bytes_in = |function: &str| Decoded::sum(&samples.iter().copied().filter(|s| s.has_function(function)).collect::<Vec<_>>(), 1) as f64;
    let (total, most, rest) = (Decoded::sum(&samples, 1) as f64, bytes_in("fixture::touch_most"), bytes_in("fixture::touch_rest"));
    let touched = (MIB << 20) as f64;
    println!(
        "{} samples: {:.1} MiB of faults ({:.1} in touch_most, {:.1} in touch_rest), {MIB} MiB touched ({most_pages} and {rest_pages} pages)",
        samples.len(), total / 1048576.0, most / 1048576.0, rest / 1048576.0
    );
    // The process's own start-up faults (loader, libc, stack) come on top: a few hundred KiB.
    assert!((total - touched).abs() <= 0.05 * touched, "page faults add up to {:.1} MiB; {MIB} MiB were touched", total / 1048576.0);
    let share = most / (most + rest);
    let truth = most_pages as f64 / (most_pages + rest_pages) as f64;
    assert!((share - truth).abs() <= 0.02, "touch_most took {share:.3} of the two functions' faults; it touched {truth:.3} of the pages");
    assert!(most + rest >= 0.95 * touched, "{:.1} MiB of faults named the two functions", (most + rest) / 1048576.0);
}

/// The memory-request half of the group: every brk and anonymous mmap call is recorded with
/// its stacks and the bytes it asked for, exactly, by call.
#[test]
fn memory_requests_are_counted_exactly_by_call_and_caller() {
    require_root();
    // The default period: the calls are not sampled.
    let (profiles, pid, run, stderr) = profile_fixture("memory-requests", "1000", "requests", &[], "memory-requests");
    let asked: Vec<u64> = run.lines[0].iter().map(|mib| mib << 20).collect();
    let samples: Vec<_> = profiles.iter().flat_map(|p| p.samples_of(pid)).collect();
    let in_fn = |function: &str, call: &str| {
        let of = samples.iter().copied().filter(|s| s.has_function(function) && s.labels.get("call").is_some_and(|c| c == call)).collect::<Vec<_>>();
        (Decoded::sum(&of, 0), Decoded::sum(&of, 1) as u64)
    };
    let (most, rest, heap) = (in_fn("fixture::ask_most", "mmap"), in_fn("fixture::ask_rest", "mmap"), in_fn("fixture::grow_heap", "brk"));
    println!("ask_most {most:?}, ask_rest {rest:?}, grow_heap {heap:?} (calls, bytes); asked {asked:?}");
    if most.0 != 70 {
        for sample in &samples {
            let frames: Vec<&str> = sample.frames.iter().map(|f| f.function.as_str()).collect();
            println!("  {:?} {:?} {frames:?}", sample.values, sample.labels.get("call"));
        }
        println!("{} profiles; agent log:\n{stderr}", profiles.len());
    }
    assert_eq!((most.0, most.1), (70, asked[0]), "ask_most's mmap calls");
    assert_eq!((rest.0, rest.1), (30, asked[1]), "ask_rest's mmap calls");
    assert_eq!((heap.0, heap.1), (2, asked[2]), "grow_heap's brk calls");
}
