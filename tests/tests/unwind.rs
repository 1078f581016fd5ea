//! Unwind tables: what `ember-agent unwind-table` builds from a binary's call frame
//! information must say, at every address binutils' `readelf --debug-dump=frames-interp`
//! lists, what readelf says, and must say "no info" where no FDE covers an address.
use std::{collections::HashMap, path::Path, process::Command};

use ember_tests::agent_bin;

/// The rule at one address, in the words of `ember-agent unwind-table --rows`.
#[derive(Debug, Clone, PartialEq)]
enum Expected {
    Is(String),
    /// readelf prints "u" both for "never saved" and for DW_CFA_undefined: either reading.
    EitherOf(String, String),
}

/// One FDE as readelf interprets it: its range, whether its CIE marks a signal frame, and its
/// rows (address, expected rule).
struct Fde {
    range: std::ops::Range<u64>,
    rows: Vec<(u64, Expected)>,
}

fn readelf_fdes(binary: &Path) -> Vec<Fde> {
    // readelf exits 1 on some distribution libraries (their debug info is elsewhere) while
    // printing the whole table: judge it by what it printed.
    let out = Command::new("readelf").arg("--debug-dump=frames-interp").arg(binary).output().expect("running readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Contents of the"), "readelf printed no frames: {}", String::from_utf8_lossy(&out.stderr));
    let mut signal_cies = HashMap::new();
    let (mut fdes, mut header, mut signal): (Vec<Fde>, Vec<String>, bool) = (vec![], vec![], false);
    let mut in_fde = false;
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 5 && fields[3] == "CIE" {
            signal_cies.insert(fields[0].to_string(), fields[4].contains('S'));
            in_fde = false;
        } else if fields.len() >= 6 && fields[3] == "FDE" {
            let cie = fields[4].trim_start_matches("cie=");
            signal = signal_cies.get(cie).copied().unwrap_or(false);
            let (start, end) = fields[5].trim_start_matches("pc=").split_once("..").expect("pc=a..b");
            let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
            fdes.push(Fde { range: hex(start)..hex(end), rows: vec![] });
            (in_fde, header) = (true, vec![]);
        } else if fields.is_empty() {
            in_fde = false;
        } else if fields.first() == Some(&"LOC") {
            header = fields.iter().map(|s| s.to_string()).collect();
        } else if in_fde && !header.is_empty() && fields.len() == header.len() && u64::from_str_radix(fields[0], 16).is_ok() {
            let column = |name: &str| header.iter().position(|h| h == name).map(|i| fields[i]);
            let expected = expected_rule(column("CFA").unwrap(), column("rbp"), column("ra"), signal);
            fdes.last_mut().unwrap().rows.push((u64::from_str_radix(fields[0], 16).unwrap(), expected));
        }
    }
    fdes
}

fn expected_rule(cfa: &str, rbp: Option<&str>, ra: Option<&str>, signal: bool) -> Expected {
    if signal {
        return Expected::Is("signal".into());
    }
    let cfa = match cfa {
        "exp" => return Expected::EitherOf("plt".into(), "unsupported(CfaExpression)".into()),
        c if c.starts_with("rsp") || c.starts_with("rbp") => c.to_string(),
        _ => return Expected::Is("unsupported(CfaRegister)".into()),
    };
    match ra {
        Some("c-8") => {}
        Some("u") => return Expected::Is("outermost".into()),
        _ => return Expected::Is("unsupported(ReturnAddress)".into()),
    }
    match rbp {
        None | Some("s") => Expected::Is(format!("{cfa} rbp=u")),
        Some("u") => Expected::EitherOf(format!("{cfa} rbp=u"), "unsupported(Rbp)".into()),
        Some(r) if r.starts_with('c') => Expected::Is(format!("{cfa} rbp={r}")),
        Some(_) => Expected::Is("unsupported(Rbp)".into()),
    }
}

/// Ember's rows: (address, rule), sorted.
fn ember_rows(binary: &Path) -> Vec<(u64, String)> {
    let out = Command::new(agent_bin()).args(["unwind-table", "--rows"]).arg(binary).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let (address, rule) = l.split_once(' ').unwrap();
            (u64::from_str_radix(address, 16).unwrap(), rule.to_string())
        })
        .collect()
}

fn rule_at(rows: &[(u64, String)], address: u64) -> &str {
    let after = rows.partition_point(|(a, _)| *a <= address);
    after.checked_sub(1).map_or("no-info", |i| rows[i].1.as_str())
}

/// Checks every readelf row and every FDE end; returns how many rows were compared.
fn compare(binary: &Path) -> usize {
    let fdes = readelf_fdes(binary);
    let rows = ember_rows(binary);
    assert!(!fdes.is_empty() && !rows.is_empty(), "{}: no call frame information read", binary.display());
    let starts: std::collections::HashSet<u64> = fdes.iter().map(|f| f.range.start).collect();
    let (mut compared, mut wrong) = (0, Vec::new());
    for fde in &fdes {
        for (address, expected) in &fde.rows {
            let ours = rule_at(&rows, *address);
            let ok = match expected {
                Expected::Is(rule) => ours == rule,
                Expected::EitherOf(a, b) => ours == a || ours == b,
            };
            compared += 1;
            if !ok {
                wrong.push(format!("{address:#x}: readelf {expected:?}, ember {ours}"));
            }
        }
        // A function without any FDE may start there, and get the frame-pointer rule.
        let end = rule_at(&rows, fde.range.end);
        if !fde.range.is_empty() && !starts.contains(&fde.range.end) && end != "no-info" && end != FRAME_POINTER {
            wrong.push(format!("{:#x}: the end of an FDE, not covered by another: ember {end}", fde.range.end));
        }
    }
    let shown: Vec<&String> = wrong.iter().take(10).collect();
    assert!(wrong.is_empty(), "{}: {} of {compared} rows differ from readelf, e.g. {shown:#?}", binary.display(), wrong.len());
    compared
}

/// The frame-pointer rule, which functions without call frame information get.
const FRAME_POINTER: &str = "rbp+16 rbp=c-16";

/// The C library every process maps (gcc-built, no frame pointers, PLT and signal frames).
#[test]
fn libc_table_matches_readelf() {
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let compared = compare(libc);
    assert!(compared > 10_000, "only {compared} rows in libc");
    let out = Command::new(agent_bin()).arg("unwind-table").arg(libc).output().unwrap();
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(summary.contains("plt ") && summary.contains("signal "), "libc has PLT stubs and __restore_rt: {summary}");
}

/// A large Rust binary: the agent itself.
#[test]
fn agent_table_matches_readelf() {
    assert!(compare(&agent_bin()) > 10_000);
}

/// Node's V8 builtins have symbols but no FDE: they get the frame-pointer rule over their whole
/// range (V8 keeps frame pointers), while readelf's rows stay as they are.
#[test]
fn functions_without_call_frame_information_get_the_frame_pointer_rule() {
    let node = std::fs::canonicalize(which("node")).unwrap();
    compare(&node);
    let rows = ember_rows(&node);
    let nm = Command::new("nm").args(["--defined-only", "-S"]).arg(&node).output().expect("running nm (binutils)");
    let symbols = String::from_utf8_lossy(&nm.stdout);
    let builtins: Vec<(u64, u64)> = symbols
        .lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [address, size, "t" | "T", name] if name.starts_with("Builtins_JSEntry") => {
                Some((u64::from_str_radix(address, 16).ok()?, u64::from_str_radix(size, 16).ok()?))
            }
            _ => None,
        })
        .collect();
    assert!(builtins.len() >= 2, "node has no Builtins_JSEntry* symbols:\n{}", &symbols[..symbols.len().min(500)]);
    for (address, size) in builtins {
        for at in [address, address + size / 2, address + size - 1] {
            assert_eq!(rule_at(&rows, at), FRAME_POINTER, "{at:#x} in a builtin at {address:#x}");
        }
    }
}

fn which(program: &str) -> std::path::PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| p.exists()).unwrap_or_else(|| panic!("{program} not on PATH (`cargo xtask setup` installs it)"))
}
