//! `cargo xtask fuzz`: builds the fuzz targets (`fuzz/`, libFuzzer through libfuzzer-sys)
//! with coverage instrumentation, then runs each for a number of inputs.
//!
//! Each target starts from its committed corpus (`fuzz/corpus/<target>/`: seeds, and every
//! crash found so far, kept as a regression case) and a working corpus under the target dir
//! that grows from run to run. A crash stops the run; its input is saved under
//! `target/fuzz/crashes/<target>/`, to be fixed and then committed to the corpus.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, Context as _, Result};

use crate::{cargo, run, step, workspace_root};

/// What cargo-fuzz passes rustc: libFuzzer's coverage counters and comparison tracing, plus
/// the checks a release build drops (overflow, debug assertions) and the fuzz entry points.
const RUSTFLAGS: &[&str] = &[
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "-Cdebug-assertions",
    "-Coverflow-checks",
    "--cfg=fuzzing",
];

fn fuzz_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace_root().join("target"), Into::into).join("fuzz")
}

/// The targets: one source file each in fuzz/fuzz_targets.
fn targets() -> Result<Vec<String>> {
    let dir = workspace_root().join("fuzz/fuzz_targets");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".rs").map(str::to_string))
        .collect();
    names.sort();
    Ok(names)
}

fn host_triple() -> Result<String> {
    let out = Command::new("rustc").arg("-vV").output().context("running rustc -vV")?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| l.strip_prefix("host: ").map(str::to_string)).context("rustc -vV names no host")
}

/// Builds the targets and runs `runs` inputs through each of `only` (all if empty).
pub fn fuzz(runs: u64, only: &[String]) -> Result<()> {
    let all = targets()?;
    if let Some(unknown) = only.iter().find(|t| !all.contains(t)) {
        bail!("unknown fuzz target {unknown}: the targets are {}", all.join(", "));
    }
    let chosen: Vec<&String> = all.iter().filter(|t| only.is_empty() || only.contains(t)).collect();
    step("building the fuzz targets with coverage instrumentation (about 5 minutes on 2 cores the first time, into target/fuzz)");
    let (dir, triple) = (fuzz_dir(), host_triple()?);
    // An explicit --target keeps the instrumentation off build scripts and proc macros.
    run(cargo()
        .args(["build", "--release", "--package", "ember-fuzz", "--target", &triple, "--target-dir"])
        .arg(&dir)
        .env("RUSTFLAGS", RUSTFLAGS.join(" ")))?;
    let binaries = dir.join(&triple).join("release");
    println!("{:<16} {:>10} {:>8} {:>9}", "target", "runs", "seconds", "coverage");
    for target in chosen {
        fuzz_one(&binaries.join(target), target, runs, &dir)?;
    }
    Ok(())
}

fn fuzz_one(binary: &Path, target: &str, runs: u64, dir: &Path) -> Result<()> {
    let (working, crashes) = (dir.join("corpus").join(target), dir.join("crashes").join(target));
    let committed = workspace_root().join("fuzz/corpus").join(target);
    for d in [&working, &crashes] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let started = Instant::now();
    let out = Command::new(binary)
        .arg(format!("-runs={runs}"))
        // Far above what one input should cost: a hang or a memory blow-up is a crash.
        .args(["-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1"])
        .arg(format!("-artifact_prefix={}/", crashes.display()))
        .arg(&working)
        .args(committed.is_dir().then_some(&committed))
        .output()
        .with_context(|| format!("running {}", binary.display()))?;
    let log = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let tail: Vec<&str> = log.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect();
        eprintln!("{}", tail.join("\n"));
        bail!(
            "fuzz target {target} crashed ({}); the input is in {}. Fix the cause, then add the input to fuzz/corpus/{target}/ as a regression case",
            out.status,
            crashes.display()
        );
    }
    let stat = |name: &str| log.lines().find_map(|l| l.strip_prefix(&format!("stat::{name}:"))).map_or("?", str::trim).to_string();
    let coverage = log.lines().rev().find_map(|l| l.split_once(" cov: ")).and_then(|(_, rest)| rest.split_whitespace().next()).unwrap_or("?");
    println!("{target:<16} {:>10} {:>8.1} {coverage:>9}", stat("number_of_executed_units"), started.elapsed().as_secs_f64());
    Ok(())
}
