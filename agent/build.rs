//! Builds the BPF object (agent-ebpf) for bpfel-unknown-none and leaves it in OUT_DIR, where
//! the loader embeds it. The nested cargo's output goes to a log file, not to cargo's
//! `warning:` lines: a newcomer's build stays quiet, and a failure quotes the compiler's errors.
use std::{
    env, fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _};

const TOOLCHAIN: &str = "1.95.0";
const TARGET: &str = "bpfel-unknown-none";

fn main() -> anyhow::Result<()> {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("..");
    for dir in ["agent-common/src", "agent-ebpf/src", "agent-ebpf/Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    println!("cargo:rerun-if-env-changed=PATH");
    preflight()?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let object = build_ebpf(&root, &out_dir)?;
    fs::copy(&object, out_dir.join("ember")).with_context(|| format!("copying {}", object.display()))?;
    Ok(())
}

/// `cargo build` of agent-ebpf in its own target dir (cargo would otherwise wait on its own
/// lock). Returns the linked object.
fn build_ebpf(root: &Path, out_dir: &Path) -> anyhow::Result<PathBuf> {
    let target_dir = out_dir.join("ebpf-target");
    let log = out_dir.join("ebpf-build.log");
    let log_file = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let status = Command::new("rustup")
        .args(["run", TOOLCHAIN, "cargo", "build", "--package", "agent-ebpf", "--bins", "--release"])
        .args(["--target", TARGET, "-Z", "build-std=core", "--color", "never"])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(root)
        // -Z build-std needs unstable cargo on the pinned stable toolchain: allowed for this
        // child build only, never for the host build.
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_ENCODED_RUSTFLAGS", ["--cfg=bpf_target_arch=\"x86_64\"", "-Cdebuginfo=2", "-Clink-arg=--btf"].join("\x1f"))
        // The host build's compiler and wrappers are not the BPF build's.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .stdout(Stdio::from(log_file.try_clone()?))
        .stderr(Stdio::from(log_file))
        .status()
        .context("starting `rustup run cargo` for the BPF object")?;
    let output = fs::read_to_string(&log).unwrap_or_default();
    if !status.success() {
        let errors: Vec<&str> = output.lines().filter(|l| !l.trim_start().starts_with("Compiling")).collect();
        let tail = errors[errors.len().saturating_sub(40)..].join("\n");
        bail!("building the BPF object (agent-ebpf) failed; full log: {}\n{tail}", log.display());
    }
    // The BPF crate is ours: a compiler warning there is worth one line, not the whole log.
    let warnings = output.lines().filter(|l| l.starts_with("warning:") && !l.contains("generated")).count();
    if warnings > 0 {
        println!("cargo:warning=agent-ebpf: {warnings} compiler warning(s), see {}", log.display());
    }
    Ok(target_dir.join(TARGET).join("release/ember"))
}

/// Fail with the fix in the message rather than with a linker error deep in the child build.
fn preflight() -> anyhow::Result<()> {
    let linker = Command::new("bpf-linker").arg("--version").output();
    if !matches!(&linker, Ok(out) if out.status.success()) {
        bail!("bpf-linker 0.10.4 is not installed (needed to build the BPF object): run `cargo xtask setup`");
    }
    let sysroot = Command::new("rustup").args(["run", TOOLCHAIN, "rustc", "--print", "sysroot"]).output();
    let src = sysroot
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("lib/rustlib/src/rust/library/core"));
    if !src.is_some_and(|p| p.exists()) {
        bail!("rust-src for toolchain {TOOLCHAIN} is missing (needed to build core for BPF): run `cargo xtask setup`");
    }
    Ok(())
}
