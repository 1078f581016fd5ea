//! Code objects read out of every CPython interpreter on this machine (pyenv's 3.6-3.13 and
//! the system's), against what the interpreter itself says of them.
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use serde_json::Value;

use super::*;

/// The script every interpreter runs (what it prints is described at its top).
const SCRIPT: &str = include_str!("code_objects.py");
/// The module the script imports from a directory with a non-ASCII name.
const MODULE: &str = include_str!("code_objects_module.py");

/// Interpreters to test: pyenv's 3.6-3.13 and the system's.
fn interpreters() -> Vec<PathBuf> {
    let mut found = Vec::new();
    if let Some(home) = std::env::var_os("HOME") {
        let versions = Path::new(&home).join(".pyenv/versions");
        let mut dirs: Vec<(u32, u32, PathBuf)> = std::fs::read_dir(&versions)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let mut parts = name.split('.');
                let major: u32 = parts.next()?.parse().ok()?;
                let minor: u32 = parts.next()?.parse().ok()?;
                let _patch: u32 = parts.next()?.parse().ok()?;
                if major != 3 || !(6..=13).contains(&minor) {
                    return None;
                }
                let exe = e.path().join(format!("bin/python3.{minor}"));
                exe.is_file().then_some((major, minor, exe))
            })
            .collect();
        dirs.sort();
        found.extend(dirs.into_iter().map(|(_, _, p)| p));
    }
    for minor in 6..=13 {
        let exe = PathBuf::from(format!("/usr/bin/python3.{minor}"));
        if exe.is_file() {
            found.push(exe);
        }
    }
    found
}

/// The interpreter process, killed and reaped when dropped.
struct Interpreter(Child);

impl Drop for Interpreter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Run {
    version: String,
    codes: usize,
    positions: usize,
    no_line: usize,
    failures: Vec<String>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn run_interpreter(exe: &Path, moddir: &Path) -> Result<Run, String> {
    use std::os::unix::ffi::OsStrExt;
    let child = Command::new(exe)
        .arg("-c")
        .arg(SCRIPT)
        .arg(hex(moddir.as_os_str().as_bytes()))
        .env("LC_ALL", "C.UTF-8")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let mut child = Interpreter(child);
    let stdout = child.0.stdout.take().ok_or("no stdout")?;
    let mut lines = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.map_err(|e| format!("reading output: {e}"))?;
        let v = serde_json::from_str::<Value>(&line).map_err(|e| format!("bad JSON ({e}): {line}"))?;
        if v.get("kind").and_then(Value::as_str) == Some("ready") {
            break;
        }
        lines.push(v);
    }
    let version_line = lines.first().ok_or("no output")?;
    if version_line.get("kind").and_then(Value::as_str) != Some("version") {
        return Err("no version line (did the script fail?)".into());
    }
    let v: Vec<i64> = version_line
        .get("version")
        .and_then(Value::as_array)
        .ok_or("bad version")?
        .iter()
        .filter_map(Value::as_i64)
        .collect();
    let version = v
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(".");
    let minor = u8::try_from(v[1]).map_err(|_| "bad minor")?;
    let layout = code_layout(minor).ok_or_else(|| format!("no layout for {version}"))?;
    let mem = ProcessMemory::new(child.0.id() as i32);
    let mut failures = Vec::new();
    let mut fail = |msg: String| failures.push(msg);
    let mut codes = 0;
    let mut positions = 0;
    let mut no_line = 0;
    for obj in &lines[1..] {
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        let id = obj.get("id").and_then(Value::as_i64).unwrap_or(0) as u64;
        match kind {
            "code" => {
                codes += 1;
                let first = obj.get("firstlineno").and_then(Value::as_i64).unwrap_or(-1) as u32;
                let want_name = obj.get("name").and_then(Value::as_str).unwrap_or("?");
                let want_file = obj.get("filename").and_then(Value::as_str).unwrap_or("?");
                let info = match read_code(&mem, &layout, id, Some(first)) {
                    Ok(info) => info,
                    Err(e) => {
                        fail(format!("{want_name}: read_code: {e}"));
                        continue;
                    }
                };
                if info.name != want_name {
                    fail(format!("name {:?}, expected {want_name:?}", info.name));
                }
                if info.filename != want_file {
                    fail(format!(
                        "{want_name}: filename {:?}, expected {want_file:?}",
                        info.filename
                    ));
                }
                if info.firstlineno != first {
                    fail(format!("{want_name}: firstlineno {}", info.firstlineno));
                }
                let pairs = obj
                    .get("pairs")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                if pairs.len() < 2 {
                    fail(format!("{want_name}: no positions"));
                }
                let capi = obj.get("capi").and_then(Value::as_array);
                for (i, pair) in pairs.iter().enumerate() {
                    let p = pair.as_array().map(|p| p.as_slice()).unwrap_or(&[]);
                    let (Some(pos), Some(want)) = (p.first().and_then(Value::as_i64), p.get(1))
                    else {
                        fail(format!("{want_name}: bad pair {pair:?}"));
                        continue;
                    };
                    let want = want.as_i64().map(|l| l as u32);
                    positions += 1;
                    no_line += usize::from(want.is_none());
                    let got = info.line(pos);
                    if got != want {
                        fail(format!(
                            "{want_name}: position {pos}: line {got:?}, expected {want:?}"
                        ));
                    }
                    if let Some(c) = capi.and_then(|c| c.get(i)) {
                        let c = c.as_i64().map(|l| l as u32);
                        if got != c {
                            fail(format!(
                                "{want_name}: position {pos}: line {got:?}, C API says {c:?}"
                            ));
                        }
                    }
                }
                // A reused address: same object, other firstlineno.
                for wrong in [first.wrapping_add(1), first.wrapping_sub(1), 0, u32::MAX] {
                    match read_code(&mem, &layout, id, Some(wrong)) {
                        Err(CodeError::FirstLineMismatch { expected, found }) => {
                            if expected != wrong || found as u32 != first {
                                fail(format!(
                                    "{want_name}: mismatch reported as {expected}/{found}"
                                ));
                            }
                        }
                        other => fail(format!(
                            "{want_name}: firstlineno {wrong} not refused: {other:?}"
                        )),
                    }
                }
            }
            "str" => {
                let want = obj.get("value").and_then(Value::as_str).unwrap_or("?");
                match read_str(&mem, &layout, id, "test") {
                    Ok(s) if s == want => {}
                    other => fail(format!("str {want:?}: {other:?}")),
                }
            }
            "toolong" => match read_str(&mem, &layout, id, "test") {
                Err(CodeError::StringTooLong { .. }) => {}
                other => fail(format!("too long str at {id:#x}: {other:?}")),
            },
            "notstr" => {
                // Bytes objects are refused for sure; other objects must at least not panic.
                let r = read_str(&mem, &layout, id, "test");
                if r.is_ok() && id == lines_first_bytes(&lines) {
                    fail(format!("bytes object read as a str: {r:?}"));
                }
                // Not a code object: firstlineno 0 does not match, or the strings are bad.
                let _ = read_code(&mem, &layout, id, Some(0));
            }
            _ => fail(format!("unexpected line {obj:?}")),
        }
    }
    // Addresses that are not objects.
    for addr in [0u64, 8, 0x1001, u64::MAX - 7, 0xffff_ffff_ffff_f000] {
        if read_code(&mem, &layout, addr, Some(1)).is_ok() {
            fail(format!("read_code at {addr:#x} succeeded"));
        }
    }
    if codes < 20 {
        fail(format!("only {codes} code objects"));
    }
    let mut run = Run {
        version,
        codes,
        positions,
        no_line,
        failures,
    };
    drop(child);
    // The process is gone: reads fault.
    if let Some(obj) = lines
        .iter()
        .find(|o| o.get("kind").and_then(Value::as_str) == Some("code"))
    {
        let id = obj.get("id").and_then(Value::as_i64).unwrap_or(0) as u64;
        let first = obj.get("firstlineno").and_then(Value::as_i64).unwrap_or(0) as u32;
        match read_code(&mem, &layout, id, Some(first)) {
            Err(CodeError::Fault(_)) => {}
            other => run.failures.push(format!("read after exit: {other:?}")),
        }
    }
    Ok(run)
}

/// The address of the first non-string object (a bytes object of zeros).
fn lines_first_bytes(lines: &[Value]) -> u64 {
    lines
        .iter()
        .find(|o| o.get("kind").and_then(Value::as_str) == Some("notstr"))
        .and_then(|o| o.get("id"))
        .and_then(Value::as_i64)
        .unwrap_or(0) as u64
}

#[test]
fn real_interpreters() {
    let exes = interpreters();
    assert!(
        !exes.is_empty(),
        "no Python interpreter found (~/.pyenv/versions/3.*, /usr/bin/python3.*)"
    );
    let base = std::env::temp_dir().join(format!("pyread-test-{}", std::process::id()));
    let moddir = base.join("d\u{e9}j\u{e0} \u{65e5}\u{672c}");
    std::fs::create_dir_all(&moddir).unwrap();
    std::fs::write(moddir.join("pyread_test_module.py"), MODULE).unwrap();
    let mut report = Vec::new();
    let mut failed = false;
    for exe in &exes {
        match run_interpreter(exe, &moddir) {
            Ok(run) => {
                report.push(format!(
                    "{} ({}): {} code objects, {} positions ({} without a line): {}",
                    run.version,
                    exe.display(),
                    run.codes,
                    run.positions,
                    run.no_line,
                    if run.failures.is_empty() {
                        "ok".to_string()
                    } else {
                        format!("{} FAILURES", run.failures.len())
                    }
                ));
                for f in run.failures.iter().take(20) {
                    report.push(format!("    {f}"));
                }
                failed |= !run.failures.is_empty();
            }
            Err(e) => {
                report.push(format!("{}: ERROR {e}", exe.display()));
                failed = true;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&base);
    let report = report.join("\n");
    println!("{report}");
    assert!(!failed, "{report}");
}
