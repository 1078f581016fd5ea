//! Builds the BPF object (agent-ebpf) for bpfel-unknown-none and leaves it in OUT_DIR, where
//! src/bpf.rs embeds it.
use std::{env, path::PathBuf, process::Command};

use anyhow::{bail, Context as _};

const TOOLCHAIN: &str = "1.95.0";

fn main() -> anyhow::Result<()> {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("..");
    let ebpf_dir = root.join("agent-ebpf");
    println!("cargo:rerun-if-changed={}", root.join("agent-common/src").display());
    println!("cargo:rerun-if-env-changed=PATH");
    preflight()?;
    // -Z build-std=core needs unstable cargo on the pinned stable toolchain. Set here, it only
    // reaches the nested eBPF build, never the host build.
    env::set_var("RUSTC_BOOTSTRAP", "1");
    let ebpf_dir = ebpf_dir.to_str().context("non-UTF-8 path")?;
    aya_build::build_ebpf(
        [aya_build::Package { name: "agent-ebpf", root_dir: ebpf_dir, ..Default::default() }],
        aya_build::Toolchain::Custom(TOOLCHAIN),
    )
    .context("building the BPF object (agent-ebpf) failed; run `cargo xtask setup` if a tool is missing")
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
