//! The A/B drain under stress: at 9999 Hz on every CPU, with two processes making many short
//! distinct stacks and maps too small for them, over several drains. Every sample the
//! programs accepted is either kept or counted as dropped, and no kept sample points at a
//! stack that is missing or belongs to another place. Needs root.
use ember_tests::{record_fixtures, require_root, Decoded, Fixture, TempDir};

const FIXTURE: &str = env!("CARGO_BIN_EXE_fixture");

#[test]
fn at_9999_hz_kept_plus_dropped_is_every_sample_and_no_stack_is_missing_or_foreign() {
    require_root();
    let dir = TempDir::new("drain-stress");
    let fixtures = vec![Fixture::spawn(FIXTURE, "stacks", 6.0), Fixture::spawn(FIXTURE, "stacks", 6.0)];
    let pids: Vec<u32> = fixtures.iter().map(Fixture::pid).collect();
    // `record` drains once a second: six drains under load. The maps hold far fewer keys and
    // stacks than the workload makes, so both the drop and the collision paths run.
    let args = ["-F", "9999", "--max-keys", "32", "--max-stacks", "128"];
    let (path, _) = record_fixtures(&dir, fixtures, 6.0, &args);
    let profile = Decoded::read(&path);
    let (seen, dropped) = (profile.counter("samples"), profile.counter("map_full"));
    let kept = Decoded::total(&profile.samples.iter().collect::<Vec<_>>()) as u64;
    assert!(seen > 50_000, "only {seen} samples at 9999 Hz on busy CPUs");
    assert!(dropped > 0, "32 keys must overflow with ~100 distinct stacks per process");
    assert!(kept >= 1000, "only {kept} of {seen} samples kept");
    assert_eq!(kept + dropped, seen, "kept {kept} + dropped {dropped} must be every accepted sample ({seen})");

    let missing = profile.samples.iter().filter(|s| s.has_function("[stack lost: not in stack map]")).count();
    assert_eq!(missing, 0, "samples whose stack id had no stack");
    // A stack taken from another place would put foreign frames under the fixture, or
    // addresses its own mappings do not cover. So: the sampled pc (the leaf user frame) is
    // always resolved; every stack through the fixture's code runs down to the program's
    // `main`, through no other mode's functions. (Stacks sampled in libc's start-up or exit
    // code, which has no frame pointers, end where its frame pointers do.)
    for pid in pids {
        assert!(Decoded::total(&profile.samples_of(pid)) >= 100, "no kept samples of fixture {pid}");
        for sample in profile.samples_of(pid) {
            let user: Vec<&str> = sample.frames.iter().filter(|f| f.mapping != "[kernel.kallsyms]").map(|f| f.function.as_str()).collect();
            if user.iter().any(|f| f.starts_with("[user stack lost")) || user.is_empty() {
                continue; // a counted collision, or a sample in the kernel only
            }
            let context = format!("unread {}, announcements lost {}: {:?}", profile.counter("process_exited_unread"), profile.counter("process_event_lost"), &user[..3.min(user.len())]);
            assert!(!user[0].starts_with("[unmapped]"), "a fixture sample whose own pc was not resolved ({context})");
            if user.iter().any(|f| f.starts_with("fixture::")) {
                assert!(user.contains(&"main"), "a fixture stack without main ({context})");
            }
            let foreign: Vec<&&str> = user.iter().filter(|f| f.starts_with("fixture::") && !["fixture::main", "fixture::descend", "fixture::burn"].contains(f)).collect();
            assert!(foreign.is_empty(), "frames of another fixture mode in this one's stack: {foreign:?}");
        }
    }
}
