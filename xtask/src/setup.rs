//! `cargo xtask setup`: installs what the build, tests and benchmarks need, and only what is
//! missing, so it is quick the second time.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::run;

const TOOLCHAIN: &str = "1.95.0";
const BPF_LINKER: &str = "0.10.4";
/// (program, Debian package): the benchmarks' peers (perf, bpftrace) and the tools the tests
/// drive (setpriv, curl, openssl, systemd-analyze). The list is a file so that `.ci/run` can
/// hide each program while it builds xtask.
const APT_TOOLS: &str = include_str!("../tools.txt");

fn apt_packages() -> Vec<(&'static str, &'static str)> {
    APT_TOOLS
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split_once(' '))
        .collect()
}

/// (shared library, Debian package): the allocators the heap tests preload, in the
/// multiarch library directory (`library_dir`).
const APT_LIBRARIES: [(&str, &str); 3] =
    [("libjemalloc.so.2", "libjemalloc2"), ("libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"), ("libtcmalloc.so.4", "libgoogle-perftools4")];

/// Debian's multiarch library directory of this machine's architecture.
fn library_dir() -> PathBuf {
    PathBuf::from(format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH))
}

/// (PyPI package, version): the deploy tests validate the Kubernetes manifests with
/// kubernetes-validate; the store tests run the collector's SQL on today's ClickHouse engine
/// with chdb, beside Debian's 18.16 (chdb-core is its engine, which chdb does not pin).
/// Present means installed at that version: a package's leftovers still import.
const PIP_PACKAGES: [(&str, &str); 3] = [("kubernetes-validate", "1.37.0"), ("chdb-core", "26.9.0"), ("chdb", "4.4.0")];

/// (program, PyPI package): py-spy, the peer the Python tests and benchmark compare with. pip
/// puts it beside python3 (`sysconfig`'s scripts directory), where the tests look for it.
const PIP_PROGRAMS: [(&str, &str); 1] = [("py-spy", "py-spy==0.4.0")];

/// The web UI's npm packages: "name version integrity" lines (see collector/build.rs).
const UI_PACKAGES: &str = include_str!("../../collector/ui/vendor.txt");

/// Fetches each UI package missing from target/ui-deps with npm, at its pinned version, and
/// refuses one whose integrity is not the pinned one.
fn ui_packages() -> Result<()> {
    let deps = crate::workspace_root().join("target/ui-deps");
    for line in UI_PACKAGES.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let [name, version, integrity] = line.split_whitespace().collect::<Vec<_>>()[..] else {
            bail!("collector/ui/vendor.txt: {line:?} is not \"name version integrity\"");
        };
        let dir = deps.join(format!("{name}-{version}"));
        if dir.join("package/package.json").is_file() {
            println!("setup: ok    {name} {version} (npm)");
            continue;
        }
        println!("setup: fetching {name} {version} (npm)");
        let download = deps.join("download");
        std::fs::create_dir_all(&download)?;
        let packed = Command::new("npm")
            .args(["pack", &format!("{name}@{version}"), "--json", "--pack-destination"])
            .arg(&download)
            .output()
            .context("running npm")?;
        let report = String::from_utf8_lossy(&packed.stdout);
        if !packed.status.success() {
            bail!("npm pack {name}@{version} failed: {}", String::from_utf8_lossy(&packed.stderr).trim());
        }
        if !report.contains(&format!("\"integrity\": \"{integrity}\"")) {
            bail!("npm's {name}@{version} does not have the integrity pinned in collector/ui/vendor.txt: {report}");
        }
        let partial = deps.join(format!("{name}-{version}.partial"));
        let _ = std::fs::remove_dir_all(&partial);
        std::fs::create_dir_all(&partial)?;
        run(Command::new("tar").arg("-xzf").arg(download.join(format!("{name}-{version}.tgz"))).arg("-C").arg(&partial))?;
        std::fs::rename(&partial, &dir)?;
    }
    Ok(())
}

fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn setup() -> Result<()> {
    let sysroot = output("rustup", &["run", TOOLCHAIN, "rustc", "--print", "sysroot"])
        .with_context(|| format!("toolchain {TOOLCHAIN} is missing: run `rustup toolchain install {TOOLCHAIN}`"))?;
    if Path::new(sysroot.trim()).join("lib/rustlib/src/rust/library/core").exists() {
        println!("setup: ok    rust-src ({TOOLCHAIN})");
    } else {
        println!("setup: installing rust-src for {TOOLCHAIN}");
        run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", TOOLCHAIN]))?;
    }

    if output("bpf-linker", &["--version"]).is_some_and(|v| v.contains(BPF_LINKER)) {
        println!("setup: ok    bpf-linker {BPF_LINKER}");
    } else {
        println!("setup: installing bpf-linker {BPF_LINKER} (about a minute on 2 cores)");
        run(Command::new("rustup").args(["run", TOOLCHAIN, "cargo", "install", "--locked", "--force"]).arg(format!("bpf-linker@{BPF_LINKER}")))?;
    }

    let packages = apt_packages();
    let programs_missing = packages.iter().filter(|(program, _)| output("which", &[program]).is_none());
    let libraries_missing = APT_LIBRARIES.iter().filter(|(library, _)| !library_dir().join(library).is_file());
    let missing: Vec<&str> = programs_missing.chain(libraries_missing).map(|(_, package)| *package).collect();
    if missing.is_empty() {
        let present = packages.iter().chain(&APT_LIBRARIES).map(|(p, _)| *p);
        println!("setup: ok    {}", present.collect::<Vec<_>>().join(", "));
    } else {
        println!("setup: installing {} (apt)", missing.join(" "));
        run(Command::new("apt-get").args(["update", "-qq"]))?;
        run(Command::new("apt-get").args(["install", "-y", "-qq", "--no-install-recommends"]).args(&missing).env("DEBIAN_FRONTEND", "noninteractive"))?;
    }

    let scripts = output("python3", &["-c", "import sysconfig; print(sysconfig.get_path('scripts'))"]).unwrap_or_default();
    let installed = |package: &str| output("python3", &["-c", &format!("import importlib.metadata as m; print(m.version({package:?}))")]);
    let pip = PIP_PACKAGES.iter().map(|&(package, version)| {
        (package, format!("{package}=={version}"), installed(package).is_some_and(|v| v.trim() == version))
    });
    let programs = PIP_PROGRAMS.iter().map(|&(program, package)| (program, package.to_string(), Path::new(scripts.trim()).join(program).is_file()));
    for (name, package, present) in pip.chain(programs) {
        if present {
            println!("setup: ok    {name}");
        } else {
            println!("setup: installing {package} (pip)");
            run(Command::new("python3").args(["-m", "pip", "install", "--quiet", &package]))?;
        }
    }

    ui_packages()?;

    if Path::new("/sys/kernel/tracing/events").is_dir() {
        println!("setup: ok    tracefs");
    } else {
        println!("setup: mounting tracefs at /sys/kernel/tracing");
        run(Command::new("mount").args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"]))
            .context("mounting tracefs (needs root)")?;
    }
    Ok(())
}
