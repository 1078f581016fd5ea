//! Off-CPU and wall-clock profiles end to end: threads with known blocking behaviour, the
//! real sched_switch tracepoint, real pprof files. Needs root.
use ember_tests::{
    kind_path, record_fixtures, require_root,
    usage::{sampled_range, HostTimes},
    Decoded, Fixture, TempDir,
};

const FIXTURE: &str = env!("CARGO_BIN_EXE_fixture");

#[test]
fn off_cpu_time_of_each_blocking_stack_matches_the_threads_wall_time() {
    require_root();
    let dir = TempDir::new("offcpu");
    let fixture = Fixture::spawn(FIXTURE, "block", 3.0);
    let pid = fixture.pid().to_string();
    let (out, runs) = record_fixtures(&dir, vec![fixture], 3.0, &["--events", "offcpu", "--pid", &pid]);
    let profile = Decoded::read(&out);
    // The fixture prints "<tid> <wall ns>" for the sleeper, then for the reader.
    assert_eq!(runs[0].lines.len(), 2, "the fixture's threads: {:?}", runs[0].lines);
    for (line, function) in runs[0].lines.iter().zip(["fixture::sleeper", "fixture::reader"]) {
        let (tid, wall_ns) = (line[0].to_string(), line[1] as f64);
        let thread = profile.samples_labelled("tid", &tid);
        let blocking: Vec<_> = thread
            .iter()
            .copied()
            .filter(|s| s.has_function(function) && s.frames.iter().any(|f| f.function == "schedule" && f.mapping == "[kernel.kallsyms]"))
            .collect();
        let off_ns = Decoded::sum(&blocking, 1) as f64;
        let error = (off_ns - wall_ns).abs() / wall_ns;
        assert!(
            error <= 0.05,
            "{function} (tid {tid}): {:.3}s off-CPU in its blocking stacks, wall time {:.3}s",
            off_ns / 1e9,
            wall_ns / 1e9
        );
        // Mostly asleep; a woken thread may also be preempted on its way back to user space.
        let asleep: Vec<_> = blocking.iter().copied().filter(|s| s.labels.get("state").is_some_and(|v| v == "sleeping")).collect();
        assert!(Decoded::sum(&asleep, 1) as f64 >= 0.9 * off_ns, "{function}: sleeping is not the main state");
    }
    assert!(profile.counter("off_cpu_blocks") > 0);
}

#[test]
fn wall_profile_splits_a_half_busy_thread_truthfully() {
    require_root();
    let dir = TempDir::new("wall");
    let fixture = Fixture::spawn(FIXTURE, "half", 4.0);
    let pid = fixture.pid().to_string();
    let args = ["--events", "cpu,offcpu", "-F", "499", "--pid", &pid];
    let host = HostTimes::now();
    let (out, runs) = record_fixtures(&dir, vec![fixture], 4.0, &args);
    let steal = HostTimes::now().steal_since(&host);
    for kind in ["cpu", "offcpu", "wall"] {
        assert!(kind_path(&out, kind).exists(), "no {kind} profile");
    }
    let wall = Decoded::read(&kind_path(&out, "wall"));
    let (tid, wall_ns, cpu_ns, busy_ns) = (runs[0].lines[0][0].to_string(), runs[0].lines[0][1], runs[0].lines[0][2], runs[0].lines[0][3]);
    let thread = wall.samples_labelled("tid", &tid);
    let on: Vec<_> = thread.iter().copied().filter(|s| s.labels.get("state").is_some_and(|v| v == "on-cpu")).collect();
    let (on_ns, all_ns) = (Decoded::sum(&on, 0) as f64, Decoded::sum(&thread, 0) as f64);
    let share = on_ns / all_ns;
    // What a clock sampler sees of it, with what the hypervisor stole (see sampled_range).
    let (low, high) = sampled_range(busy_ns as f64, cpu_ns as f64, steal);
    let (low, high) = (low / wall_ns as f64, high / wall_ns as f64);
    let report = format!(
        "on-CPU share {share:.3}, truth {low:.3}-{high:.3} (busy {:.3}, CPU {:.3} of the wall time; {:.1}% of the host's busy time stolen)",
        busy_ns as f64 / wall_ns as f64,
        cpu_ns as f64 / wall_ns as f64,
        steal * 100.0
    );
    println!("{report}");
    assert!(share >= low - 0.05 && share <= high + 0.05, "{report}");
    // The two views add up to the thread's wall time.
    assert!((all_ns - wall_ns as f64).abs() / (wall_ns as f64) <= 0.05, "wall {all_ns} ns vs {wall_ns} ns");
    assert_eq!(wall.profile.sample_type.len(), 1);
    assert_eq!(wall.string(wall.profile.sample_type[0].unit), "nanoseconds");
}

#[test]
fn a_full_blocked_thread_table_counts_what_it_cannot_measure() {
    require_root();
    let dir = TempDir::new("offcpu-full");
    // 16 threads that block, room for 4: the others' blocks are counted as lost, not silently
    // evicted (the table used to be an LRU, whose evictions nothing counted).
    let fixture = Fixture::spawn_with(std::process::Command::new(FIXTURE), "sleepers", 2.0, &["16"]);
    let pid = fixture.pid().to_string();
    let args = ["--events", "offcpu", "--pid", &pid, "--offcpu-max-threads", "4"];
    let (out, _) = record_fixtures(&dir, vec![fixture], 2.0, &args);
    let profile = Decoded::read(&out);
    let (full, blocks) = (profile.counter("off_cpu_table_full"), profile.counter("off_cpu_blocks"));
    assert!(full > 100, "only {full} blocks counted as lost with 16 sleepers and room for 4");
    assert!(blocks > 100, "the 4 tracked threads' blocks are still measured: {blocks}");
    assert!(profile.samples.iter().any(|s| s.has_function("fixture::sleeper")));
}
