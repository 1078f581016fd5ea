//! The agent's and the collector's modules are layered along the data flow, and imports only
//! point down: commands -> stages (later stages above earlier ones) -> shared modules. This
//! reads every source file's `crate::` paths and fails on any import that points up, so the
//! tree keeps reading as the data flow (design.md).
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

/// The agent's top-level modules, lowest layer first. A module may use its own layer and the
/// layers below it. Names not listed (items of lib.rs) belong to the commands; `fuzz` (the fuzz
/// targets' entry points) sits with them.
const AGENT: &[&[&str]] = &[
    &["ops", "maps_line", "pod_selector"],
    &["kernel"],
    &["unwind"],
    &["resolve"],
    &["symbolize"],
    &["encode"],
    &["ship"],
    &["pipeline", "governor", "drain_schedule"],
    &["main", "lib", "fuzz", "cli", "settings", "duration", "run", "record", "unwind_table"],
];

const COLLECTOR: &[&[&str]] = &[
    &["allocations", "buckets", "embedded", "store", "tree"],
    &["query", "service", "labels", "series", "rollup"],
    &["clickhouse", "embedded_store", "pull", "https", "request"],
    &["api", "store_choice", "ui"],
    &["http"],
    &["offline", "server"],
    &["main", "lib", "fuzz"],
];

/// The top-level module names a source text refers to through `crate::`, including every name
/// in a `use crate::{a, b::c}` group.
fn crate_references(text: &str) -> BTreeSet<String> {
    let code: String = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut item_start) = (0, true);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_alphanumeric() || c == '_') => {
                        item_start = false;
                        names.insert(identifier(&group[i..]));
                    }
                    _ => {}
                }
            }
        } else {
            names.insert(identifier(rest));
        }
    }
    names
}

fn identifier(text: &str) -> String {
    text.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

fn layer(layers: &[&[&str]], module: &str) -> usize {
    layers.iter().position(|names| names.contains(&module)).unwrap_or(layers.len() - 1)
}

/// Every Rust source file under `src`: its path relative to `src`, and its text.
fn source_files(src: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push((path.strip_prefix(src).unwrap().to_path_buf(), std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    files
}

/// (file, module it belongs to, module it imports) for every upward import under `src`.
fn upward_imports(src: &Path, layers: &[&[&str]]) -> Vec<String> {
    let mut problems = Vec::new();
    for (relative, text) in source_files(src) {
        let first = relative.components().next().unwrap().as_os_str().to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        for used in crate_references(&text) {
            if layer(layers, &used) > layer(layers, &module) {
                problems.push(format!("{}: {module} imports crate::{used}, a higher layer", relative.display()));
            }
        }
    }
    problems.sort();
    problems
}

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

#[test]
fn agent_imports_point_down_the_data_flow() {
    let problems = upward_imports(&workspace().join("agent/src"), AGENT);
    assert!(problems.is_empty(), "imports that point up the data flow:\n{}", problems.join("\n"));
}

#[test]
fn collector_imports_point_down() {
    let problems = upward_imports(&workspace().join("collector/src"), COLLECTOR);
    assert!(problems.is_empty(), "imports that point up:\n{}", problems.join("\n"));
}

#[test]
fn every_top_level_module_has_a_layer() {
    for (src, layers) in [("agent/src", AGENT), ("collector/src", COLLECTOR)] {
        for entry in std::fs::read_dir(workspace().join(src)).unwrap().map(Result::unwrap) {
            let name = entry.file_name().to_string_lossy().trim_end_matches(".rs").to_string();
            assert!(layers.iter().any(|l| l.contains(&name.as_str())), "{src}/{name} is in no layer of tests/tests/layout.rs");
        }
    }
}

/// The check itself: an upward import is found, in a group or on its own, and a comment is not.
#[test]
fn references_are_read_from_groups_and_paths() {
    let text = "use crate::{ops::metrics, resolve::{Site, Marker}};\n// crate::ship\nfn f() { crate::encode::x(); }";
    let names: Vec<String> = crate_references(text).into_iter().collect();
    assert_eq!(names, ["encode", "ops", "resolve"]);
}

/// A source file's module path under its crate's `src`: `kernel/load.rs` is `kernel::load`,
/// `kernel/mod.rs` is `kernel`, `lib.rs` and `main.rs` the crate root.
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Every path a source text names from `crate::` or `super::`, with use groups expanded
/// (`crate::{a::b, c}` gives `a::b` and `c`), made absolute from `module` (the file's path).
/// A file's unit tests (`#[cfg(test)] mod tests`, at its end) are left out: their `super` is
/// the file itself.
fn referenced_paths(text: &str, module: &[String]) -> Vec<Vec<String>> {
    let text = text
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default();
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let tokens = tokens(&code);
    let is = |at: usize, token: &str| tokens.get(at).is_some_and(|t| t == token);
    let mut paths = Vec::new();
    let mut at = 0;
    while at < tokens.len() {
        if at > 0 && is(at - 1, "::") || !is(at + 1, "::") {
            at += 1;
        } else if is(at, "crate") {
            at = use_tree(&tokens, at + 2, Vec::new(), &mut paths);
        } else if is(at, "super") {
            // One level up per `super`: `super` of `kernel::load` is `kernel`.
            let mut base = module.to_vec();
            while is(at, "super") && is(at + 1, "::") {
                base.pop();
                at += 2;
            }
            at = use_tree(&tokens, at, base, &mut paths);
        } else {
            at += 1;
        }
    }
    paths
}

/// Identifiers, `::`, braces and commas; anything else ends a path.
fn tokens(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
            continue;
        }
        if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".into());
            i += 2;
            continue;
        }
        if !c.is_whitespace() {
            out.push(c.to_string());
        }
        i += 1;
    }
    out
}

/// Reads one use tree from `at` (after `prefix::`), adding each path it names; returns where it
/// ended.
fn use_tree(
    tokens: &[String],
    mut at: usize,
    mut prefix: Vec<String>,
    paths: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        match tokens.get(at).map(String::as_str) {
            Some("{") => {
                at += 1;
                loop {
                    at = use_tree(tokens, at, prefix.clone(), paths);
                    match tokens.get(at).map(String::as_str) {
                        Some(",") => at += 1,
                        Some("}") => return at + 1,
                        _ => return at,
                    }
                    if tokens.get(at).is_some_and(|t| t == "}") {
                        return at + 1;
                    }
                }
            }
            Some("self") => {
                paths.push(prefix);
                return at + 1;
            }
            Some(name) if name.chars().all(|c| c.is_alphanumeric() || c == '_') => {
                prefix.push(name.to_string());
                if tokens.get(at + 1).is_some_and(|t| t == "::") {
                    at += 2;
                } else {
                    paths.push(prefix);
                    return at + 1;
                }
            }
            _ => {
                paths.push(prefix);
                return at;
            }
        }
    }
}

/// Pairs (and longer rings) of source files that import each other, in `src`. A file and the
/// module folder it sits in (`kernel/mod.rs` and `kernel/load.rs`) are one unit and not
/// counted; siblings and cousins are.
fn import_cycles(src: &Path) -> Vec<String> {
    let (paths, texts): (Vec<PathBuf>, Vec<String>) = source_files(src).into_iter().unzip();
    let files: Vec<Vec<String>> = paths.iter().map(|p| module_path(p)).collect();
    let related = |a: &[String], b: &[String]| a.starts_with(b) || b.starts_with(a);
    let edges: Vec<BTreeSet<usize>> = files
        .iter()
        .zip(&texts)
        .map(|(module, text)| {
            let mut targets = BTreeSet::new();
            for path in referenced_paths(text, module) {
                // The deepest file the path reaches.
                let target = (0..=path.len())
                    .rev()
                    .find_map(|n| files.iter().position(|f| f[..] == path[..n]));
                if let Some(target) = target.filter(|&t| !related(&files[t], module)) {
                    targets.insert(target);
                }
            }
            targets
        })
        .collect();
    // A file in a cycle reaches itself.
    let mut cycles = BTreeSet::new();
    for start in 0..files.len() {
        let mut seen = vec![false; files.len()];
        let mut stack: Vec<(usize, Vec<usize>)> = vec![(start, vec![start])];
        while let Some((node, trail)) = stack.pop() {
            for &next in &edges[node] {
                if next == start {
                    let mut ring: Vec<String> =
                        trail.iter().map(|&f| files[f].join("::")).collect();
                    let first = ring
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, n)| n.as_str())
                        .unwrap()
                        .0;
                    ring.rotate_left(first);
                    cycles.insert(ring.join(" -> "));
                } else if !seen[next] {
                    seen[next] = true;
                    let mut longer = trail.clone();
                    longer.push(next);
                    stack.push((next, longer));
                }
            }
        }
    }
    cycles.into_iter().collect()
}

#[test]
fn no_two_files_import_each_other() {
    for src in [
        "agent/src",
        "agent-ebpf/src",
        "agent-common/src",
        "collector/src",
        "pprof/src",
        "proto/src",
        "xtask/src",
    ] {
        let dir = workspace().join(src);
        if !dir.is_dir() {
            continue;
        }
        let cycles = import_cycles(&dir);
        assert!(
            cycles.is_empty(),
            "{src}: files that import each other:\n{}",
            cycles.join("\n")
        );
    }
}

/// The check itself: groups, `super` and `self` are followed, and a cycle is found.
#[test]
fn import_paths_are_read_through_groups_and_super() {
    let module = vec!["kernel".to_string(), "load".to_string()];
    let text = "use super::{rates::{Sampling, self}, events::Event};\nuse crate::ops::metrics;\nfn f() { super::super::cli::x(); }";
    let paths: Vec<String> = referenced_paths(text, &module)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        paths,
        [
            "kernel::rates::Sampling",
            "kernel::rates",
            "kernel::events::Event",
            "ops::metrics",
            "cli::x"
        ]
    );
    let dir = std::env::temp_dir().join(format!("ember-layout-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("kernel")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod kernel;").unwrap();
    std::fs::write(
        dir.join("kernel/mod.rs"),
        "mod load; mod rates; pub use load::Sampler;",
    )
    .unwrap();
    std::fs::write(dir.join("kernel/load.rs"), "use super::rates::Rates;").unwrap();
    std::fs::write(
        dir.join("kernel/rates.rs"),
        "use crate::kernel::{load::Sampler};",
    )
    .unwrap();
    let cycles = import_cycles(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(cycles, ["kernel::load -> kernel::rates"]);
}
