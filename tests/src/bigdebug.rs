//! The big-debug workload (sources in `tests/fixtures/bigdebug`): C++ built for debugging, one
//! binary with about 100 MB of DWARF, busy in thousands of functions. The on-CPU benchmark runs
//! it beside its workers to measure what naming such a binary costs the agent.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
};

const SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/bigdebug");
/// Translation units, each a copy of `unit.cpp` with its own types.
const UNITS: usize = 48;

/// Compiles the workload into `dir` (a minute or two on 2 cores); returns the binary.
pub fn build(dir: &Path) -> PathBuf {
    let declarations: String = (0..UNITS).map(|n| format!("UNIT_DECL({n})\n")).collect();
    std::fs::write(dir.join("units.h"), declarations).expect("writing units.h");
    let jobs = std::thread::available_parallelism().map_or(2, usize::from);
    let objects: Vec<PathBuf> = (0..UNITS).map(|n| dir.join(format!("unit{n}.o"))).collect();
    let mut running: Vec<(Child, String)> = Vec::new();
    for (n, object) in objects.iter().enumerate() {
        if running.len() == jobs {
            wait(running.remove(0));
        }
        let mut command = Command::new("g++");
        command.args(["-std=c++17", "-O0", "-g", &format!("-DUNIT={n}"), "-c", "-o"]).arg(object).arg(Path::new(SOURCES).join("unit.cpp"));
        running.push((command.spawn().expect("running g++ (installed by `cargo xtask setup`)"), format!("unit {n}")));
    }
    running.into_iter().for_each(wait);
    let binary = dir.join("bigdebug");
    let mut link = Command::new("g++");
    link.args(["-std=c++17", "-O0", "-g", "-I"]).arg(dir).arg("-o").arg(&binary).arg(Path::new(SOURCES).join("main.cpp")).args(&objects);
    wait((link.spawn().expect("running g++"), "linking".into()));
    binary
}

fn wait((mut child, what): (Child, String)) {
    let status = child.wait().expect("waiting for g++");
    assert!(status.success(), "g++ failed on the big-debug workload's {what}");
}
