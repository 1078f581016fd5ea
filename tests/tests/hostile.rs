//! Processes that shape the files the agent reads about them as a hostile process would
//! (`tests/fixtures/hostile/hostile.c`): a perf map or a mapped binary that is a FIFO, a sparse
//! 20 GiB file, 16 MiB without a newline, a file that grows while read, a symlink loop. The
//! agent runs as its unit does (no map_files: it opens the mapped path) and must finish its
//! recording on time, under its memory budget, with every process's samples, and keep naming
//! the well-behaved ones. Needs root; fails loudly without it.
use std::{
    io::{BufRead, BufReader},
    os::unix::fs::PermissionsExt,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use ember_tests::{compile_c, least_privilege_agent, require_root, usage::status_kib, Agent, Decoded, TempDir};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/hostile/hostile.c");
const MODES: [&str; 6] = ["plain", "fifo", "sparse", "no_newline", "growing", "loop"];
/// Peak resident memory allowed: half the unit's MemoryMax (256M). The agent peaks near 30 MiB.
const MEMORY_BUDGET_MIB: u64 = 128;

/// A hostile process, ready (its file made), with what it shapes.
struct Hostile {
    child: Child,
    place: &'static str,
    mode: &'static str,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let pid = self.child.id();
        let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
        let _ = std::fs::remove_dir_all(format!("/tmp/ember-hostile-{pid}"));
    }
}

fn start(program: &Path, place: &'static str, mode: &'static str) -> Hostile {
    let mut child = Command::new(program).args([place, mode, "30"]).stdout(Stdio::piped()).spawn().expect("starting hostile");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let hostile = Hostile { child, place, mode };
    assert_eq!(line.trim(), "ready", "hostile {place} {mode} did not start");
    hostile
}

/// The process's peak resident memory; None once it has exited (a zombie shows none).
fn peak_mib(pid: u32) -> Option<u64> {
    let kib = status_kib(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?, "VmHWM:");
    (kib > 0).then_some(kib / 1024)
}

#[test]
fn hostile_perf_maps_and_binaries_neither_hang_the_agent_nor_exhaust_its_memory() {
    require_root();
    let dir = TempDir::new("hostile");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let program = dir.path("hostile");
    compile_c(Path::new(FIXTURE), &program, &["-O2"]);
    let hostiles: Vec<Hostile> = ["perf_map", "binary"].iter().flat_map(|place| MODES.map(|mode| (*place, mode))).map(|(p, m)| start(&program, p, m)).collect();

    let out = dir.path("p.pb.gz");
    let mut command = least_privilege_agent();
    command.args(["record", "-F", "99", "-d", "4s", "-o", out.to_str().unwrap()]);
    for hostile in &hostiles {
        command.args(["--pid", &hostile.child.id().to_string()]);
    }
    let started = Instant::now();
    let mut agent = Agent::spawn_command(command);
    agent.wait_ready();
    let mut peak = 0;
    // 4 s of recording; the rest is start-up, the last drain and writing. Before the files were
    // read as hostile, a FIFO hung the agent for ever and the sparse map took 6 GiB.
    while started.elapsed() < Duration::from_secs(15) {
        match peak_mib(agent.pid()) {
            Some(mib) => peak = peak.max(mib),
            None => break,
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    agent.wait_success(Duration::from_secs(1));
    let took = started.elapsed();
    println!("recorded in {took:?}, peak {peak} MiB");
    assert!(peak > 0 && peak <= MEMORY_BUDGET_MIB, "the agent peaked at {peak} MiB");

    let profile = Decoded::read(&out);
    for hostile in &hostiles {
        let samples = profile.samples_of(hostile.child.id());
        let total: i64 = samples.iter().map(|s| s.values[0]).sum();
        // 12 spinning processes on 2 CPUs at 99 Hz for 4 s: about 65 samples each.
        assert!(total >= 20, "{} {}: {total} samples", hostile.place, hostile.mode);
        if (hostile.place, hostile.mode) == ("perf_map", "plain") {
            let named: i64 = samples.iter().filter(|s| s.frames[0].function == "jit_spin").map(|s| s.values[0]).sum();
            assert!(named * 10 >= total * 9, "a well-behaved perf map beside hostile ones: {named} of {total} samples named jit_spin");
        }
    }
}
