//! The agent's and the collector's modules are layered along the data flow, and imports only
//! point down: commands -> stages (later stages above earlier ones) -> shared modules. This
//! reads every source file's `crate::` paths and fails on any import that points up, so the
//! tree keeps reading as the data flow (design.md).
use std::{collections::BTreeSet, path::Path};

/// The agent's top-level modules, lowest layer first. A module may use its own layer and the
/// layers below it. Names not listed (items of lib.rs) belong to the commands; `fuzz` (the fuzz
/// targets' entry points) sits with them.
const AGENT: &[&[&str]] = &[
    &["ops"],
    &["kernel"],
    &["unwind"],
    &["resolve"],
    &["symbolize"],
    &["encode"],
    &["ship"],
    &["pipeline", "governor", "drain_schedule"],
    &["main", "lib", "fuzz", "cli", "settings", "run", "record", "unwind_table"],
];

const COLLECTOR: &[&[&str]] = &[
    &["buckets", "store", "tree"],
    &["query", "service", "labels", "series", "rollup"],
    &["pull", "https"],
    &["http", "api", "ui"],
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

/// (file, module it belongs to, module it imports) for every upward import under `src`.
fn upward_imports(src: &Path, layers: &[&[&str]]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap();
            let first = relative.components().next().unwrap().as_os_str().to_string_lossy();
            let module = first.trim_end_matches(".rs").to_string();
            let text = std::fs::read_to_string(&path).unwrap();
            for used in crate_references(&text) {
                if layer(layers, &used) > layer(layers, &module) {
                    problems.push(format!("{}: {module} imports crate::{used}, a higher layer", relative.display()));
                }
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
