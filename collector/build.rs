//! Points the UI's embedding at the packages `cargo xtask setup` fetched from the npm registry
//! (listed in ui/vendor.txt): they are never copied into the repository.
use std::{env, path::PathBuf};

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let vendor = manifest.join("ui/vendor.txt");
    println!("cargo:rerun-if-changed={}", vendor.display());
    let list = std::fs::read_to_string(&vendor).expect("reading ui/vendor.txt");
    let (name, version) = list
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.split_whitespace().collect::<Vec<_>>().get(..2).map(|p| (p[0].to_string(), p[1].to_string())))
        .expect("ui/vendor.txt lists uplot");
    let dist = manifest.join("../target/ui-deps").join(format!("{name}-{version}/package/dist"));
    for file in ["uPlot.iife.min.js", "uPlot.min.css"] {
        let path = dist.join(file);
        if !path.is_file() {
            eprintln!("{name} {version} is missing ({}): run `cargo xtask setup`, which fetches it from the npm registry", path.display());
            std::process::exit(1);
        }
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rustc-env=EMBER_UPLOT_DIST={}", dist.display());
}
