fn main() {
    // Rebuild the object when bpf-linker changes (e.g. after `cargo xtask setup`).
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
