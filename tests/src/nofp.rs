//! Workloads built without frame pointers (sources in `tests/fixtures/nofp`), compiled into a
//! directory at run time: the tests and the unwinding benchmark share them.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

const SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/nofp");

/// `phases.c` as a PIE and a non-PIE executable (with `libphases.so`), and `rust_phases.rs`.
pub struct Workloads {
    pub pie: PathBuf,
    pub no_pie: PathBuf,
    pub rust: PathBuf,
}

/// The phases of `phases`, in the order it prints their CPU time (after its round count).
pub const PHASES: [&str; 5] = ["phase_qsort", "phase_bsearch", "phase_spin", "phase_library", "phase_recursion"];

fn run(command: &mut Command) {
    let out = command.output().unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    assert!(out.status.success(), "{command:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// Compiles the workloads into `dir`: C with gcc at -O2 -fomit-frame-pointer, Rust with
/// rustc -C opt-level=3 -C force-frame-pointers=no.
pub fn build(dir: &Path) -> Workloads {
    let library = build_library(dir);
    let (pie, no_pie) = (dir.join("phases"), dir.join("phases-no-pie"));
    for (out, flag) in [(&pie, "-pie"), (&no_pie, "-no-pie")] {
        compile_phases(out, &["-O2", "-fomit-frame-pointer", flag], &library);
    }
    let rust = dir.join("rust_phases");
    run(Command::new("rustc")
        .args(["-C", "opt-level=3", "-C", "force-frame-pointers=no", "-o"])
        .arg(&rust)
        .arg(Path::new(SOURCES).join("rust_phases.rs")));
    Workloads { pie, no_pie, rust }
}

/// Compiles `phases.c` into `dir` with frame pointers: the same code and stacks as the
/// workloads without, for profilers that walk frame pointers only. (Its library has none,
/// as in `build`.)
pub fn build_with_frame_pointers(dir: &Path) -> PathBuf {
    let out = dir.join("phases-fp");
    compile_phases(&out, &["-O2", "-fno-omit-frame-pointer"], &build_library(dir));
    out
}

/// Compiles `phases.c` into `out` with gcc `flags`, linked to `library`, which it finds in its
/// directory at run time.
fn compile_phases(out: &Path, flags: &[&str], library: &Path) {
    let dir = library.parent().expect("the library is in a directory");
    run(Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(Path::new(SOURCES).join("phases.c"))
        .arg(library)
        .arg(format!("-Wl,-rpath,{}", dir.display())));
}

/// Compiles `late.c` (which loads libphases.so with dlopen once it has run a while) and the
/// library into `dir`, as the other C workloads: the program and the library.
pub fn build_late(dir: &Path) -> (PathBuf, PathBuf) {
    let out = dir.join("late");
    crate::compile_c(&Path::new(SOURCES).join("late.c"), &out, &["-O2", "-fomit-frame-pointer"]);
    (out, build_library(dir))
}

/// Compiles `swap.c` and its two libraries (`swap_library.c`, the second with `SWAP_B`)
/// into `dir`, as the other C workloads: the program, and the libraries in the order it
/// loads them.
pub fn build_swap(dir: &Path) -> (PathBuf, [PathBuf; 2]) {
    let out = dir.join("swap");
    crate::compile_c(&Path::new(SOURCES).join("swap.c"), &out, &["-O2", "-fomit-frame-pointer"]);
    let libraries = [("libswap_a.so", None), ("libswap_b.so", Some("-DSWAP_B"))].map(|(name, define)| {
        let library = dir.join(name);
        let flags = ["-O2", "-fomit-frame-pointer", "-fPIC", "-shared"].into_iter().chain(define).collect::<Vec<_>>();
        crate::compile_c(&Path::new(SOURCES).join("swap_library.c"), &library, &flags);
        library
    });
    (out, libraries)
}

/// Compiles libphases.so (`library.c`) into `dir`, without frame pointers: its path.
fn build_library(dir: &Path) -> PathBuf {
    let library = dir.join("libphases.so");
    crate::compile_c(&Path::new(SOURCES).join("library.c"), &library, &["-O2", "-fomit-frame-pointer", "-fPIC", "-shared"]);
    library
}

/// Compiles the single-file C program `name`.c into `dir` (at -O2 -fomit-frame-pointer, as
/// the other C workloads): `clock` loops on clock_gettime, which runs in the vDSO; the main
/// thread of `leaderless` leaves with pthread_exit while a worker sorts.
pub fn build_program(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    crate::compile_c(&Path::new(SOURCES).join(format!("{name}.c")), &out, &["-O2", "-fomit-frame-pointer"]);
    out
}
