//! Test workloads with a known structure. Built by cargo with `-C force-frame-pointers=yes`
//! (workspace .cargo/config.toml). Blocking calls go through `raw_syscall`, an inline
//! `syscall` instruction in a frame-pointer function, so no frame-pointer-less libc code sits
//! between the kernel and our frames and every frame down to `main` or the thread function
//! is walkable.
//!
//! `fixture MODE SECONDS [--wait] [ARGS...]`. With `--wait` it first reads a line on stdin, so
//! a test can start the profiler before any work happens. Modes, and what they print:
//! - `split`: main -> hot_a or hot_b, chosen at random per unit with p(a) = 0.7 (or ARGS[0]
//!   percent), both through the same `burn`. Prints "<units> <a units>": the exact truth.
//! - `exit-large`: writes ARGS[0] MiB (default 1024), runs `hot_a` in a loop, and exits
//!   without freeing them: the kernel tears them down on its way out, after the exit
//!   tracepoint, while the process is still sampled. Prints nothing.
//! - `read-zero`: main -> read_zero, reading /dev/zero in 1 MiB blocks. Prints rounds.
//! - `faults`: maps ARGS[0] MiB (default 100) of fresh memory, without huge pages, and
//!   touches each page once: 70% of them from `touch_most`, 30% from `touch_rest`, in
//!   alternating runs of 64 pages; then idles until SECONDS. Prints "<pages most> <pages rest>".
//! - `fault-loop`: maps 64 MiB of fresh memory, touches each page once from `touch_most`,
//!   unmaps it, and again until SECONDS: a page fault per page, as fast as the kernel
//!   gives them. Prints pages touched.
//! - `requests`: asks the kernel for memory it never touches: 70 anonymous 1 MiB mappings
//!   from `ask_most`, 30 from `ask_rest`, interleaved, and grows the heap by 2 x 4 MiB from
//!   `grow_heap` (brk); then idles until SECONDS. Prints "<MiB most> <MiB rest> <MiB heap>".
//! - `stacks`: main -> descend -> descend -> ... (1 to 48 deep, cycling) -> burn: many short
//!   distinct stacks, for stressing the stack maps. Prints rounds.
//! - `block`: thread `sleeper` loops on nanosleep(10 ms); thread `reader` blocks in read()
//!   on a pipe that thread `writer` feeds every 5 ms. Prints each thread's "<tid> <wall ns>".
//! - `sleepers`: ARGS[0] threads `sleeper`, each looping on nanosleep(10 ms). Prints nothing.
//! - `half`: thread `half_busy` alternates 10 ms of CPU and 10 ms of sleep. Prints
//!   "<tid> <wall ns> <cpu ns> <busy ns>" (busy: the wall time of its busy turns, which a
//!   clock sampler sees, stolen time included, unlike the CPU time).
//! - `pingpong`: two `ping_pong` threads hand a turn to each other through pipes, each busy
//!   ARGS[0] microseconds (default 20) per turn: a context switch at every hand-over. Prints
//!   each thread's "<tid> <wall ns> <cpu ns> <turns> <busy ns>".
//! - `tcp-recv`: accepts one connection on ARGS[0] (addr:port), reads until EOF (pausing
//!   ARGS[1] microseconds after each read of up to 64 KiB, if given). Prints bytes.
//! - `tcp-send`: connects to ARGS[0], sends ARGS[1] bytes from `send_all`, closes once the
//!   peer has acknowledged them. Prints "<tid> <bytes> <payload bytes transmitted>" (the
//!   last counts retransmissions: what the network tracepoints see).
//! - `udp-closed`: sends ARGS[0] datagrams of 100 bytes to 127.0.0.1:9 (nothing listens).
//! - `forks`: main -> hot_b until SIGUSR1, then ARGS[0] children (default 10) forked one
//!   after the other, each main -> hot_a for 200 ms with nothing mapped beyond its parent's.
//!   Prints each child's pid.
use std::{
    hint::black_box,
    io::Read,
    net::{TcpListener, TcpStream, UdpSocket},
    os::fd::AsRawFd,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

/// Iterations of `burn` per unit (about 0.5 ms in a debug build, 0.05 ms optimized).
const UNIT: u64 = 50_000;

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
    black_box(burn(UNIT)) + 1
}

/// Writes one byte in each page of `pages`: a page fault each, the first time.
#[inline(never)]
fn touch_most(pages: &mut [u8]) {
    for page in pages.chunks_mut(4096) {
        unsafe { std::ptr::write_volatile(page.as_mut_ptr(), 1) };
    }
}

// Different code from touch_most (the value written): identical functions get merged.
#[inline(never)]
fn touch_rest(pages: &mut [u8]) {
    for page in pages.chunks_mut(4096) {
        unsafe { std::ptr::write_volatile(page.as_mut_ptr(), 2) };
    }
}

/// Maps `mib` MiB of anonymous memory, 1 MiB a call, and leaves it mapped.
#[inline(never)]
fn ask_most(mib: usize) {
    for _ in 0..mib {
        let memory = unsafe { libc::mmap(std::ptr::null_mut(), 1 << 20, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
        assert_ne!(memory, libc::MAP_FAILED);
    }
}

// Different code from ask_most (no write access): identical functions get merged.
#[inline(never)]
fn ask_rest(mib: usize) {
    for _ in 0..mib {
        let memory = unsafe { libc::mmap(std::ptr::null_mut(), 1 << 20, libc::PROT_READ, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
        assert_ne!(memory, libc::MAP_FAILED);
    }
}

/// Allocates a block of `size` bytes and writes its first byte; the caller frees it.
#[inline(never)]
fn alloc_most(size: usize) -> *mut u8 {
    let block = unsafe { libc::malloc(size) }.cast::<u8>();
    assert!(!block.is_null());
    unsafe { std::ptr::write_volatile(block, 1) };
    block
}

// Different code from alloc_most (the value written): identical functions get merged.
#[inline(never)]
fn alloc_rest(size: usize) -> *mut u8 {
    let block = unsafe { libc::malloc(size) }.cast::<u8>();
    assert!(!block.is_null());
    unsafe { std::ptr::write_volatile(block, 2) };
    block
}

/// The size of the `alloc` mode's leaked blocks: four of the test's sampling means, so that
/// nearly each is sampled and the leak's estimate is tight.
const LEAK_BLOCK: usize = 256 << 10;

/// How many blocks `mode` keeps to its end, for the room made before the start line:
/// `alloc`'s leak (its first argument, in MiB), `alloc-hold`'s count (its first), the 56 of
/// `alloc-calls`.
fn kept_blocks(mode: &str, rest: &[String]) -> usize {
    match mode {
        "alloc" => (rest.first().map_or(64, |m| m.parse::<usize>().expect("alloc leak MiB")) << 20) / LEAK_BLOCK,
        "alloc-hold" => rest.first().map_or(100_000, |c| c.parse().expect("alloc-hold count")),
        "alloc-calls" => 56,
        _ => 0,
    }
}

/// Allocates and frees `mib` MiB, a MiB at a time, before the measured allocations: an
/// allocator that samples itself may leave its first megabytes unsampled (tcmalloc draws its
/// first sampling point before it reads its sampling period, and then waits 16 MiB).
#[inline(never)]
fn warm_up(mib: usize) {
    for _ in 0..mib {
        unsafe { libc::free(black_box(libc::malloc(1 << 20))) };
    }
}

/// Allocates `blocks` blocks of `block` bytes into `kept` (room made by the caller) and
/// never frees them.
#[inline(never)]
fn leak(kept: &mut Vec<*mut u8>, blocks: usize, block: usize) {
    assert!(kept.capacity() - kept.len() >= blocks, "the caller makes the room");
    for _ in 0..blocks {
        let b = unsafe { libc::malloc(block) }.cast::<u8>();
        assert!(!b.is_null());
        kept.push(b);
    }
}

/// Each allocation call that is not `malloc`, 16 blocks of 256 KiB each, kept (4 MiB a
/// function): `realloc` from NULL (glibc's calls its own `malloc`) and then grown.
#[inline(never)]
fn via_calloc(kept: &mut Vec<*mut u8>) {
    kept.extend((0..16).map(|_| unsafe { libc::calloc(64, 4096) }.cast::<u8>()));
}

#[inline(never)]
fn via_realloc(kept: &mut Vec<*mut u8>) {
    kept.extend((0..8).map(|_| unsafe { libc::realloc(libc::realloc(std::ptr::null_mut(), 256 << 10), 512 << 10) }.cast::<u8>()));
}

#[inline(never)]
fn via_posix_memalign(kept: &mut Vec<*mut u8>) {
    let one = || {
        let mut block = std::ptr::null_mut();
        assert_eq!(unsafe { libc::posix_memalign(&mut block, 64, 256 << 10) }, 0);
        block.cast::<u8>()
    };
    kept.extend((0..16).map(|_| one()));
}

#[inline(never)]
fn via_aligned_alloc(kept: &mut Vec<*mut u8>) {
    kept.extend((0..16).map(|_| unsafe { libc::aligned_alloc(4096, 256 << 10) }.cast::<u8>()));
}

/// Blocks given back by `realloc(p, 0)` (which may return a block of no size, freed here),
/// and `free(NULL)`: nothing stays.
#[inline(never)]
fn freed_by_realloc() {
    for _ in 0..16 {
        // Through black_box: the compiler may drop a malloc whose block nothing uses.
        let block = black_box(unsafe { libc::malloc(256 << 10) });
        unsafe { libc::free(libc::realloc(block, 0)) };
        unsafe { libc::free(std::ptr::null_mut()) };
    }
}

/// Moves the heap's end up by `mib` MiB, with brk.
#[inline(never)]
fn grow_heap(mib: usize) {
    assert_ne!(unsafe { libc::sbrk((mib << 20) as libc::intptr_t) }, usize::MAX as *mut libc::c_void, "sbrk");
}

// Different code from hot_a (+ 2): identical functions get merged in optimized builds,
// and every profiler would then see one of them only.
#[inline(never)]
fn hot_b() -> u64 {
    black_box(burn(UNIT)) + 2
}

/// A system call made right here, with this function's frame pointer in place.
#[inline(never)]
fn raw_syscall(number: i64, a: u64, b: u64, c: u64) -> i64 {
    let ret: i64;
    unsafe {
        std::arch::asm!("syscall", inlateout("rax") number => ret, in("rdi") a, in("rsi") b, in("rdx") c,
            lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret
}

fn gettid() -> i64 {
    raw_syscall(libc::SYS_gettid, 0, 0, 0)
}

#[inline(never)]
fn read_zero(fd: i32, buffer: &mut [u8]) -> i64 {
    // black_box: without it, optimized builds make this a tail call and drop read_zero's frame.
    black_box(raw_syscall(libc::SYS_read, fd as u64, buffer.as_mut_ptr() as u64, buffer.len() as u64))
}

/// `depth` nested frames of itself, then a short burn; `black_box` keeps every call a real one.
#[inline(never)]
fn descend(depth: u32) -> u64 {
    if depth == 0 {
        return black_box(burn(1));
    }
    black_box(descend(black_box(depth - 1))) + 1
}

#[inline(never)]
fn sleeper(deadline: Instant) -> String {
    let start = Instant::now();
    let ten_ms = libc::timespec { tv_sec: 0, tv_nsec: 10_000_000 };
    while Instant::now() < deadline {
        raw_syscall(libc::SYS_nanosleep, &ten_ms as *const _ as u64, 0, 0);
    }
    format!("{} {}", gettid(), start.elapsed().as_nanos())
}

#[inline(never)]
fn reader(fd: i32) -> String {
    let start = Instant::now();
    let mut byte = [0u8; 1];
    while raw_syscall(libc::SYS_read, fd as u64, byte.as_mut_ptr() as u64, 1) == 1 {}
    format!("{} {}", gettid(), start.elapsed().as_nanos())
}

#[inline(never)]
fn writer(fd: i32, deadline: Instant) {
    let five_ms = libc::timespec { tv_sec: 0, tv_nsec: 5_000_000 };
    while Instant::now() < deadline {
        raw_syscall(libc::SYS_write, fd as u64, b"x".as_ptr() as u64, 1);
        raw_syscall(libc::SYS_nanosleep, &five_ms as *const _ as u64, 0, 0);
    }
    unsafe { libc::close(fd) };
}

/// One side of a ping-pong: busy `busy` long, hand the turn over, block until it comes back.
/// Prints "<tid> <wall ns> <cpu ns> <turns>". Ends when either side's deadline passes (a
/// closed pipe ends the other side).
#[inline(never)]
fn ping_pong(turn_in: i32, turn_out: i32, busy: Duration, deadline: Instant) -> String {
    let start = Instant::now();
    let (mut byte, mut turns, mut busy_ns) = ([0u8; 1], 0u64, 0u128);
    while Instant::now() < deadline {
        let turn = Instant::now();
        while turn.elapsed() < busy {
            black_box(burn(100));
        }
        busy_ns += turn.elapsed().as_nanos();
        turns += 1;
        if raw_syscall(libc::SYS_write, turn_out as u64, b"x".as_ptr() as u64, 1) != 1
            || raw_syscall(libc::SYS_read, turn_in as u64, byte.as_mut_ptr() as u64, 1) != 1
        {
            break;
        }
    }
    unsafe { libc::close(turn_out) };
    let mut cpu = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut cpu) };
    let cpu_ns = cpu.tv_sec as u128 * 1_000_000_000 + cpu.tv_nsec as u128;
    format!("{} {} {cpu_ns} {turns} {busy_ns}", gettid(), start.elapsed().as_nanos())
}

#[inline(never)]
fn half_busy(deadline: Instant) -> String {
    let start = Instant::now();
    let ten_ms = libc::timespec { tv_sec: 0, tv_nsec: 10_000_000 };
    let mut busy_ns = 0u128;
    while Instant::now() < deadline {
        let turn = Instant::now();
        while turn.elapsed() < Duration::from_millis(10) {
            black_box(burn(1000));
        }
        busy_ns += turn.elapsed().as_nanos();
        raw_syscall(libc::SYS_nanosleep, &ten_ms as *const _ as u64, 0, 0);
    }
    let mut cpu = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut cpu) };
    let cpu_ns = cpu.tv_sec as u128 * 1_000_000_000 + cpu.tv_nsec as u128;
    format!("{} {} {cpu_ns} {busy_ns}", gettid(), start.elapsed().as_nanos())
}

#[inline(never)]
fn send_all(fd: i32, mut bytes: u64) {
    let chunk = vec![7u8; 64 * 1024];
    while bytes > 0 {
        let n = bytes.min(chunk.len() as u64);
        let sent = raw_syscall(libc::SYS_write, fd as u64, chunk.as_ptr() as u64, n);
        assert!(sent > 0, "write failed: {sent}");
        bytes -= sent as u64;
    }
}

/// Waits (up to 5 s) until every byte written has left and the peer has acknowledged it,
/// then returns the payload bytes the socket transmitted, retransmissions included
/// (`tcpi_bytes_sent`): on a loaded host a loopback receiver's backlog can overflow, and the
/// segments it dropped leave twice.
fn acknowledged_transmit(fd: i32) -> u64 {
    // `struct tcp_info` (uapi/linux/tcp.h): tcpi_unacked at byte 24, tcpi_notsent_bytes at
    // 144, tcpi_bytes_sent at 200.
    let info = || {
        let mut info = [0u8; 280];
        let mut len = info.len() as libc::socklen_t;
        let got = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, info.as_mut_ptr().cast(), &mut len) };
        assert!(got == 0 && len >= 208, "TCP_INFO: {got}, {len} bytes");
        let u32_at = |at: usize| u32::from_ne_bytes(info[at..at + 4].try_into().unwrap());
        (u32_at(24) + u32_at(144), u64::from_ne_bytes(info[200..208].try_into().unwrap()))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while info().0 != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    info().1
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "split".into());
    let seconds: f64 = args.next().map_or(5.0, |s| s.parse().expect("SECONDS must be a number"));
    let mut rest: Vec<String> = args.collect();
    let wait = rest.first().map(String::as_str) == Some("--wait");
    if wait {
        rest.remove(0);
    }
    // The receiver listens before the start line, so a sender started at the same moment
    // always finds it.
    let listener = (mode == "tcp-recv").then(|| TcpListener::bind(&rest[0]).expect("binding"));
    // What a heap profile of a mode must not see is made before the start line, while no
    // probe is on yet: stdout's buffer, and the room for the addresses of the blocks the mode
    // keeps (made by a counted function, it would be sampled now and then as its own call;
    // made later in `main`, as a leak of `main`).
    let _ = std::io::stdout();
    let mut kept: Vec<*mut u8> = Vec::with_capacity(kept_blocks(&mode, &rest));
    if wait {
        std::io::stdin().read_line(&mut String::new()).expect("reading the start line");
    }
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    match mode.as_str() {
        "exit-large" => {
            let mib: usize = rest.first().map_or(1024, |m| m.parse().expect("exit-large MIB"));
            // Written: every page is the process's own, for the exit path to free.
            let held = vec![1u8; mib << 20];
            while Instant::now() < deadline {
                black_box(hot_a());
            }
            black_box(&held);
            // Not through `main`'s end, which would free them first.
            std::process::exit(0)
        }
        "split" => {
            let percent_a: u64 = rest.first().map_or(70, |p| p.parse().expect("the percent of hot_a must be an integer"));
            let (mut units, mut a, mut random) = (0u64, 0u64, 0x9e37_79b9_7f4a_7c15u64);
            while Instant::now() < deadline {
                for _ in 0..16 {
                    // xorshift64: a fresh choice per unit, so no period for sampling to lock on.
                    random ^= random << 13;
                    random ^= random >> 7;
                    random ^= random << 17;
                    if random % 100 < percent_a {
                        black_box(hot_a());
                        a += 1;
                    } else {
                        black_box(hot_b());
                    }
                    units += 1;
                }
            }
            println!("{units} {a}");
        }
        "stacks" => {
            let mut rounds = 0u64;
            while Instant::now() < deadline {
                black_box(descend((rounds % 48) as u32 + 1));
                rounds += 1;
            }
            println!("{rounds}");
        }
        "faults" => {
            let mib: usize = rest.first().map_or(100, |m| m.parse().expect("faults MiB"));
            let length = mib << 20;
            let memory = unsafe { libc::mmap(std::ptr::null_mut(), length, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
            assert_ne!(memory, libc::MAP_FAILED, "mapping {mib} MiB");
            // A huge page would take 512 pages' worth in one fault.
            assert_eq!(unsafe { libc::madvise(memory, length, libc::MADV_NOHUGEPAGE) }, 0);
            let memory = unsafe { std::slice::from_raw_parts_mut(memory as *mut u8, length) };
            // Runs of 64 pages, 7 of every 10 to touch_most: sampling every N faults cannot
            // lock on to one of them.
            let (mut most, mut rest_pages) = (0usize, 0usize);
            for (run, pages) in memory.chunks_mut(64 * 4096).enumerate() {
                if run % 10 < 7 {
                    touch_most(pages);
                    most += pages.len() / 4096;
                } else {
                    touch_rest(pages);
                    rest_pages += pages.len() / 4096;
                }
            }
            println!("{most} {rest_pages}");
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
        }
        "fault-loop" => {
            const LENGTH: usize = 64 << 20;
            let mut pages = 0u64;
            while Instant::now() < deadline {
                let memory = unsafe { libc::mmap(std::ptr::null_mut(), LENGTH, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
                assert_ne!(memory, libc::MAP_FAILED);
                assert_eq!(unsafe { libc::madvise(memory, LENGTH, libc::MADV_NOHUGEPAGE) }, 0);
                touch_most(unsafe { std::slice::from_raw_parts_mut(memory as *mut u8, LENGTH) });
                assert_eq!(unsafe { libc::munmap(memory, LENGTH) }, 0);
                pages += (LENGTH / 4096) as u64;
            }
            println!("{pages}");
        }
        "alloc" => {
            // 16 KiB blocks, a quarter of the test's sampling mean.
            const BLOCK: usize = 16 << 10;
            if let Some(mib) = rest.get(1) {
                warm_up(mib.parse().expect("alloc warm-up MiB"));
            }
            leak(&mut kept, kept_blocks(&mode, &rest), LEAK_BLOCK);
            // 700 MiB through the two sites, in runs of 10 blocks, 7 to alloc_most: freed
            // at once, as most allocations are.
            let (mut most, mut rest_bytes) = (0usize, 0usize);
            for run in 0..(700 << 20) / BLOCK / 10 {
                for i in 0..10 {
                    let block = if (run + i) % 10 < 7 {
                        most += BLOCK;
                        alloc_most(BLOCK)
                    } else {
                        rest_bytes += BLOCK;
                        alloc_rest(BLOCK)
                    };
                    unsafe { libc::free(block.cast()) };
                }
            }
            println!("{most} {rest_bytes} {}", kept.len() * LEAK_BLOCK);
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            black_box(kept);
        }
        "forks" => {
            static GO: AtomicBool = AtomicBool::new(false);
            extern "C" fn go(_: libc::c_int) {
                GO.store(true, Ordering::Relaxed);
            }
            unsafe { libc::signal(libc::SIGUSR1, go as *const () as libc::sighandler_t) };
            let children: usize = rest.first().map_or(10, |c| c.parse().expect("forks children"));
            while !GO.load(Ordering::Relaxed) && Instant::now() < deadline {
                black_box(hot_b());
            }
            for _ in 0..children {
                match unsafe { libc::fork() } {
                    0 => {
                        let until = Instant::now() + Duration::from_millis(200);
                        while Instant::now() < until {
                            black_box(hot_a());
                        }
                        unsafe { libc::_exit(0) }
                    }
                    -1 => panic!("fork: {}", std::io::Error::last_os_error()),
                    child => {
                        let mut status = 0;
                        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
                        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child {child}: {status}");
                        println!("{child}");
                    }
                }
            }
        }
        "alloc-loop" => {
            // malloc and free of `size` bytes, as fast as they go: what a probe adds a pair.
            let size: usize = rest.first().map_or(64, |s| s.parse().expect("alloc-loop size"));
            let mut pairs = 0u64;
            while Instant::now() < deadline {
                for _ in 0..256 {
                    unsafe { libc::free(black_box(libc::malloc(size))) };
                }
                pairs += 256;
            }
            println!("{pairs}");
        }
        "alloc-hold" => {
            // `count` blocks of `size` bytes, held to the end.
            let size: usize = rest.get(1).map_or(32 << 10, |s| s.parse().expect("alloc-hold size"));
            leak(&mut kept, kept_blocks(&mode, &rest), size);
            println!("{}", kept.len());
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            black_box(kept);
        }
        "alloc-calls" => {
            via_calloc(&mut kept);
            via_realloc(&mut kept);
            via_posix_memalign(&mut kept);
            via_aligned_alloc(&mut kept);
            assert!(kept.len() == 56 && kept.iter().all(|b| !b.is_null()));
            freed_by_realloc();
            println!("{}", 4 << 20);
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            black_box(kept);
        }
        "requests" => {
            for round in 0..10 {
                ask_most(7);
                ask_rest(3);
                if round % 5 == 0 {
                    grow_heap(4);
                }
            }
            println!("70 30 8");
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
        }
        "read-zero" => {
            let file = std::fs::File::open("/dev/zero").expect("opening /dev/zero");
            let mut buffer = vec![0u8; 1 << 20];
            let mut rounds = 0u64;
            while Instant::now() < deadline {
                black_box(read_zero(file.as_raw_fd(), &mut buffer));
                rounds += 1;
            }
            println!("{rounds}");
        }
        "block" => {
            let mut fds = [0i32; 2];
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            let (read_end, write_end) = (fds[0], fds[1]);
            let sleeping = std::thread::spawn(move || sleeper(deadline));
            let reading = std::thread::spawn(move || reader(read_end));
            let writing = std::thread::spawn(move || writer(write_end, deadline));
            writing.join().unwrap();
            println!("{}", sleeping.join().unwrap());
            println!("{}", reading.join().unwrap());
        }
        "sleepers" => {
            let count: usize = rest[0].parse().expect("sleepers THREADS");
            let threads: Vec<_> = (0..count).map(|_| std::thread::spawn(move || sleeper(deadline))).collect();
            threads.into_iter().for_each(|t| drop(t.join().unwrap()));
        }
        "pingpong" => {
            // Two threads hand a turn back and forth through pipes: a context switch at every
            // hand-over, tens of thousands a second.
            let busy = Duration::from_micros(rest.first().map_or(20, |us| us.parse().expect("pingpong BUSY_US")));
            let pipe = || {
                let mut fds = [0i32; 2];
                assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
                (fds[0], fds[1])
            };
            let ((a_in, b_out), (b_in, a_out)) = (pipe(), pipe());
            let a = std::thread::spawn(move || ping_pong(a_in, a_out, busy, deadline));
            let b = std::thread::spawn(move || ping_pong(b_in, b_out, busy, deadline));
            println!("{}", a.join().unwrap());
            println!("{}", b.join().unwrap());
        }
        "half" => println!("{}", std::thread::spawn(move || half_busy(deadline)).join().unwrap()),
        "tcp-recv" => {
            let (mut stream, _) = listener.expect("bound above").accept().expect("accepting");
            let pause = rest.get(1).map(|us| Duration::from_micros(us.parse().expect("pause in us")));
            let (mut total, mut buffer) = (0u64, vec![0u8; 1 << 16]);
            loop {
                match stream.read(&mut buffer).expect("reading") {
                    0 => break,
                    n => total += n as u64,
                }
                if let Some(pause) = pause {
                    std::thread::sleep(pause);
                }
            }
            println!("{total}");
        }
        "tcp-send" => {
            let stream = TcpStream::connect(&rest[0]).expect("connecting");
            let bytes: u64 = rest[1].parse().expect("byte count");
            send_all(stream.as_raw_fd(), bytes);
            stream.shutdown(std::net::Shutdown::Write).expect("shutting down");
            let transmitted = acknowledged_transmit(stream.as_raw_fd());
            drop(stream);
            // Stay a moment: the agent reads a process's mappings when it is first seen (here,
            // at its first packet), and on a loaded machine a sender that exits within a few
            // ms of that could be gone first. Attribution, not that race, is under test here.
            std::thread::sleep(Duration::from_millis(500));
            println!("{} {bytes} {transmitted}", gettid());
        }
        "udp-closed" => {
            let socket = UdpSocket::bind("127.0.0.1:0").expect("binding");
            let count: u64 = rest[0].parse().expect("datagram count");
            for _ in 0..count {
                // Refused (ICMP port unreachable) errors are expected: nothing listens.
                let _ = socket.send_to(&[0u8; 100], "127.0.0.1:9");
            }
            println!("{count}");
        }
        other => panic!("unknown mode {other}"),
    }
}
