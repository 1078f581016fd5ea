//! The CPythons on the machine and py-spy, the peer Python frames are compared with: shared by
//! the Python tests and `cargo xtask bench python`.
use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    process::Command,
};

/// Debian's python3 and every pyenv CPython 3.x: (name, path). Fails if there is none.
pub fn interpreters() -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    if Path::new("/usr/bin/python3").exists() {
        found.push(("debian python3".to_string(), PathBuf::from("/usr/bin/python3")));
    }
    let pyenv = std::env::var("HOME").map(|h| PathBuf::from(h).join(".pyenv/versions")).unwrap_or_default();
    let mut versions: Vec<PathBuf> = std::fs::read_dir(&pyenv).into_iter().flatten().flatten().map(|e| e.path()).collect();
    versions.sort();
    for version in versions {
        let name = version.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("3.") && version.join("bin/python3").exists() {
            found.push((format!("pyenv {name}"), version.join("bin/python3")));
        }
    }
    assert!(!found.is_empty(), "no CPython: install Debian's python3 (cargo xtask setup) or pyenv versions under ~/.pyenv/versions");
    found
}

/// py-spy (from PyPI, installed by `cargo xtask setup` beside python3).
pub fn py_spy() -> PathBuf {
    let out = Command::new("python3").args(["-c", "import sysconfig; print(sysconfig.get_path('scripts'))"]).output();
    let scripts = out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
    let path = Path::new(&scripts).join("py-spy");
    assert!(path.is_file(), "no py-spy beside python3 ({}): run `cargo xtask setup`", path.display());
    path
}

/// Samples per Python function, every function on a sample's stack counted once: from py-spy's
/// raw output ("frame;frame count", each frame "function (file:line)").
pub fn py_spy_functions(raw: &str) -> HashMap<String, i64> {
    let mut functions = HashMap::new();
    for line in raw.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else { continue };
        let count: i64 = count.parse().expect("py-spy counts");
        let names: HashSet<&str> = stack.split(';').map(|frame| frame.split(" (").next().unwrap_or(frame)).collect();
        for name in names {
            *functions.entry(name.to_string()).or_default() += count;
        }
    }
    functions
}
