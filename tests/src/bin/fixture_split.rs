//! Test workload with a known call structure. Built by cargo with `-C force-frame-pointers=yes`
//! (workspace .cargo/config.toml), so every frame from the leaf down to `main` is walkable.
//!
//! Modes (`fixture-split MODE SECONDS`):
//! - `split`: main -> hot_a (70% of CPU) and main -> hot_b (30%), both through `burn`, which
//!   executes the same loop for 7 or 3 units: the split is exact by construction.
//! - `read-zero`: main -> read_zero, reading /dev/zero in 1 MiB blocks (time in the kernel).
//! - `idle`: sleeps (used by tests that need a live, quiet process).
//! With a third argument `--wait`, it first waits for a line on stdin, so that a test can start
//! the profiler before any work happens. Prints the number of completed rounds on exit (the
//! benchmark's throughput).
use std::{
    fs::File,
    hint::black_box,
    io::Read,
    time::{Duration, Instant},
};

/// Iterations of `burn` per unit: a/b round of 10 units takes a few ms in a debug build.
const UNIT: u64 = 200_000;

#[inline(never)]
fn burn(iterations: u64) -> u64 {
    let mut x = 0u64;
    for i in 0..iterations {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

// `black_box` after the call keeps these from becoming tail calls (`jmp burn`), which
// would remove their frames from every profiler's stacks in optimized builds.
#[inline(never)]
fn hot_a() -> u64 {
    black_box(burn(7 * UNIT)) + 1
}

#[inline(never)]
fn hot_b() -> u64 {
    black_box(burn(3 * UNIT)) + 1
}

#[inline(never)]
fn read_zero(file: &mut File, buffer: &mut [u8]) -> usize {
    file.read(buffer).expect("reading /dev/zero")
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "split".into());
    let seconds: f64 = args.next().map_or(5.0, |s| s.parse().expect("SECONDS must be a number"));
    if args.next().as_deref() == Some("--wait") {
        std::io::stdin().read_line(&mut String::new()).expect("reading the start line");
    }
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut rounds = 0u64;
    match mode.as_str() {
        "split" => {
            while Instant::now() < deadline {
                black_box(hot_a());
                black_box(hot_b());
                rounds += 1;
            }
        }
        "read-zero" => {
            let mut file = File::open("/dev/zero").expect("opening /dev/zero");
            let mut buffer = vec![0u8; 1 << 20];
            while Instant::now() < deadline {
                black_box(read_zero(&mut file, &mut buffer));
                rounds += 1;
            }
        }
        "idle" => std::thread::sleep(deadline - Instant::now()),
        other => panic!("unknown mode {other}: use split, read-zero or idle"),
    }
    println!("{rounds}");
}
