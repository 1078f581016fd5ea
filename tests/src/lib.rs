//! Harness for Ember's end-to-end tests: runs the real `ember-agent` (as root, against the
//! real kernel) and the fixture workloads, and reads the pprof files it writes.
use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use ember_proto::pprof::Profile;
use prost::Message;

pub mod bigdebug;
pub mod browser;
pub mod cgroup_cpu;
pub mod clickhouse;
pub mod kube_api;
pub mod nofp;
pub mod python;
pub mod soak;
pub mod transport;
pub mod usage;

/// The tests load BPF programs: without root they must fail loudly, never skip.
pub fn require_root() {
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "Ember's end-to-end tests load BPF programs and must run as root (CI runs them as root)"
    );
}

/// The ember-agent binary of the same build profile as the running test (target/<profile>/deps)
/// or benchmark (target/<profile>).
pub fn agent_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("own executable path");
    let dir = exe.parent().expect("target/<profile>");
    let profile_dir = if dir.ends_with("deps") { dir.parent().expect("target/<profile>") } else { dir };
    let agent = profile_dir.join("ember-agent");
    assert!(agent.exists(), "{} is missing: run `cargo xtask test` (it builds the agent first)", agent.display());
    agent
}

/// The deployment files (systemd units, Kubernetes manifests, the default config).
pub const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");

/// The JIT fixtures (Node and CPython scripts with hot_a and hot_b, 70:30).
pub const JIT_FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/jit");

/// A CPython of 3.12 or later: on PATH, or one pyenv installed (Debian 12 packages none).
pub fn python_3_12() -> PathBuf {
    let pyenv = std::env::var("HOME").map(|h| PathBuf::from(h).join(".pyenv/versions")).unwrap_or_default();
    let mut candidates: Vec<PathBuf> = ["python3.14", "python3.13", "python3.12"].iter().map(PathBuf::from).collect();
    let mut installed: Vec<PathBuf> = std::fs::read_dir(&pyenv).into_iter().flatten().flatten().map(|e| e.path().join("bin/python3")).collect();
    installed.sort();
    candidates.extend(installed.into_iter().rev());
    let version = |python: &PathBuf| {
        let out = Command::new(python).args(["-c", "import sys; print(sys.version_info[0] * 100 + sys.version_info[1])"]).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse::<u32>().ok()
    };
    candidates.into_iter().find(|p| version(p).is_some_and(|v| v >= 312)).unwrap_or_else(|| {
        panic!("no CPython 3.12 or later on PATH or in {} (`-X perf` needs 3.12): install one", pyenv.display())
    })
}

/// The capabilities the agent's unit grants, as setpriv names them ("+bpf,+perfmon,...").
pub fn unit_capabilities() -> String {
    let unit = std::fs::read_to_string(Path::new(DEPLOY).join("systemd/ember-agent.service")).unwrap();
    let line = unit.lines().find_map(|l| l.strip_prefix("AmbientCapabilities=")).expect("AmbientCapabilities in the unit");
    let bounding = unit.lines().find_map(|l| l.strip_prefix("CapabilityBoundingSet=")).expect("CapabilityBoundingSet in the unit");
    assert_eq!(line, bounding, "the unit grants what it bounds");
    line.split_whitespace().map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase())).collect::<Vec<_>>().join(",")
}

/// The agent as its systemd unit runs it: as nobody, with only the unit's capabilities (no
/// CAP_SYS_ADMIN, so no /proc/<pid>/map_files). Where it writes must be writable by nobody.
pub fn least_privilege_agent() -> Command {
    let caps = unit_capabilities();
    let mut command = Command::new("setpriv");
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs"])
        .args([format!("--inh-caps=-all,{caps}"), format!("--ambient-caps=-all,{caps}"), format!("--bounding-set=-all,{caps}")])
        .arg(agent_bin());
    command
}

/// Compiles a C fixture with gcc and `flags` (a test's own workload, built at run time).
/// Makes `command` run as a container's process: in a mount namespace of its own whose root is
/// `root` (pivot_root, so that its maps show paths inside it). The program's path is then
/// looked up inside `root`.
pub fn contain(command: &mut Command, root: &Path) {
    use std::os::unix::{ffi::OsStrExt as _, process::CommandExt as _};
    let dir = std::ffi::CString::new(root.as_os_str().as_bytes()).expect("a root path without NUL");
    // SAFETY: only syscalls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let check = |result: i64| if result < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) };
            let none = std::ptr::null::<libc::c_char>();
            check(libc::unshare(libc::CLONE_NEWNS).into())?;
            check(libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()).into())?;
            check(libc::mount(dir.as_ptr(), dir.as_ptr(), none, libc::MS_BIND | libc::MS_REC, std::ptr::null()).into())?;
            check(libc::chdir(dir.as_ptr()).into())?;
            // pivot_root(".", "."), then detach the old root stacked under the new one.
            check(libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()))?;
            check(libc::umount2(c".".as_ptr(), libc::MNT_DETACH).into())?;
            check(libc::chdir(c"/".as_ptr()).into())
        });
    }
}

pub fn compile_c(source: &Path, out: &Path, flags: &[&str]) {
    let output = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(source)
        .output()
        .unwrap_or_else(|e| panic!("running gcc (installed by `cargo xtask setup`) on {}: {e}", source.display()));
    assert!(output.status.success(), "gcc {}: {}", source.display(), String::from_utf8_lossy(&output.stderr));
}

/// C source of a program that spins in `function` (noinline, with `qualifiers` such as
/// "static") for argv[1] seconds: a known frame under `main`.
pub fn spin_c(function: &str, qualifiers: &str) -> String {
    format!(
        r#"#include <stdlib.h>
#include <time.h>
__attribute__((noinline)) {qualifiers} double {function}(double seconds) {{
    struct timespec start, now;
    double x = 0;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {{
        for (int i = 0; i < 100000; i++) x += i * 0.5;
        clock_gettime(CLOCK_MONOTONIC, &now);
    }} while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    return x;
}}
int main(int argc, char **argv) {{ return {function}(atof(argv[1])) == 0.25; }}
"#
    )
}

/// A shell that waits for a line on stdin, then execs `program args` (output discarded): its
/// pid is known before the program runs (for --pid, or to move it into a cgroup), and stays the
/// same across the exec. `release` lets it go.
pub fn held(program: &Path, args: &[&str]) -> Child {
    Command::new("sh")
        .args(["-c", "read line; exec \"$0\" \"$@\" > /dev/null"])
        .arg(program)
        .args(args)
        .stdin(Stdio::piped())
        .spawn()
        .expect("starting sh")
}

pub fn release(child: &mut Child) {
    child.stdin.take().expect("a held child").write_all(b"go\n").expect("releasing a held child");
}

/// The host pid of the first child of `parent` once it runs `comm` (a held process execs).
pub fn child_running(parent: u32, comm: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).unwrap_or_default();
        if let Some(pid) = children.split_whitespace().next().and_then(|p| p.parse::<u32>().ok()) {
            if std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm) {
                return pid;
            }
        }
        assert!(Instant::now() < deadline, "no child of {parent} running {comm} after 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The cgroup2 mount (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts).
pub fn cgroup2_root() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/mounts").expect("reading /proc/mounts");
    mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[2] == "cgroup2")
        .map(|f| PathBuf::from(f[1]))
        .expect("no cgroup2 filesystem mounted")
}

/// cgroups a test makes under the cgroup2 root, inside a parent of its own (named for the
/// test process and numbered: tests of one binary run at once), removed deepest first on drop
/// (after the processes in them have exited).
pub struct TestCgroups {
    root: PathBuf,
    made: Vec<PathBuf>,
}

impl TestCgroups {
    pub fn new() -> TestCgroups {
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        TestCgroups { root: cgroup2_root().join(format!("ember-test-{}-{n}", std::process::id())), made: vec![] }
    }

    /// The parent's path relative to the cgroup2 root, as the agent labels it.
    pub fn parent(&self) -> String {
        format!("/{}", self.root.file_name().unwrap().to_string_lossy())
    }

    /// Makes `relative` (and its missing parents) under the test's parent; returns its path
    /// relative to the cgroup2 root.
    pub fn create(&mut self, relative: &str) -> String {
        let mut dir = self.root.clone();
        for part in std::iter::once("").chain(relative.split('/')) {
            dir = dir.join(part);
            if !dir.exists() {
                std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating cgroup {}: {e}", dir.display()));
                self.made.push(dir.clone());
            }
        }
        format!("{}/{relative}", self.parent())
    }

    /// The directory of a cgroup made by `create`.
    pub fn dir(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    /// Moves a process into a cgroup made by `create`.
    pub fn enter(&self, relative: &str, pid: u32) {
        let procs = self.dir(relative).join("cgroup.procs");
        std::fs::write(&procs, pid.to_string()).unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", procs.display()));
    }
}

impl Default for TestCgroups {
    fn default() -> Self {
        TestCgroups::new()
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        for dir in self.made.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Two network namespaces made for a test, joined by a veth pair (`ember-va` in `a` with
/// 10.77.1.1/24, `ember-vb` in `b` with 10.77.1.2/24); removed on drop. Traffic between
/// them never leaves this machine.
pub struct NetnsPair {
    pub a: String,
    pub b: String,
}

impl NetnsPair {
    pub const ADDRESS_B: &str = "10.77.1.2";

    pub fn create(tag: &str) -> NetnsPair {
        let id = std::process::id();
        let pair = NetnsPair { a: format!("ember-{tag}-a-{id}"), b: format!("ember-{tag}-b-{id}") };
        let ip = |args: &[&str]| {
            let status = Command::new("ip").args(args).status().expect("running ip (iproute2)");
            assert!(status.success(), "ip {} failed", args.join(" "));
        };
        ip(&["netns", "add", &pair.a]);
        ip(&["netns", "add", &pair.b]);
        ip(&["link", "add", "ember-va", "netns", &pair.a, "type", "veth", "peer", "name", "ember-vb", "netns", &pair.b]);
        for (ns, dev, addr) in [(&pair.a, "ember-va", "10.77.1.1/24"), (&pair.b, "ember-vb", "10.77.1.2/24")] {
            ip(&["-n", ns, "addr", "add", addr, "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        pair
    }

    /// A command that runs `program` inside namespace `ns`.
    pub fn command(ns: &str, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", ns, program]);
        command
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// GET over plain HTTP/1.1 (loopback); returns (status, body).
pub fn http_get(address: std::net::SocketAddr, path: &str) -> (u16, Vec<u8>) {
    http_get_with(address, path, "")
}

/// GET with extra header lines (each ending in \r\n).
pub fn http_get_with(address: std::net::SocketAddr, path: &str, headers: &str) -> (u16, Vec<u8>) {
    http_request(address, "GET", path, headers, b"")
}

/// One HTTP/1.1 request over loopback, the connection closed after it; returns (status, body).
pub fn http_request(address: std::net::SocketAddr, method: &str, path: &str, headers: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut stream = std::net::TcpStream::connect(address).expect("connecting");
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let length = if body.is_empty() && method == "GET" { String::new() } else { format!("Content-Length: {}\r\n", body.len()) };
    write!(stream, "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{headers}{length}Connection: close\r\n\r\n").unwrap();
    stream.write_all(body).unwrap();
    // Read to the end of the body: its Content-Length if it has one (a server may keep the
    // connection open after it), else until the server closes.
    let (mut response, mut buffer) = (Vec::new(), [0u8; 65536]);
    let mut expected = None;
    loop {
        if expected.is_none() {
            if let Some(split) = response.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&response[..split]).to_ascii_lowercase();
                let length = head.lines().find_map(|l| l.strip_prefix("content-length:")).map(|n| n.trim().parse::<usize>().expect("numeric length"));
                expected = Some(length.map(|n| split + 4 + n));
            }
        }
        if let Some(Some(end)) = expected {
            if response.len() >= end {
                break;
            }
        }
        match stream.read(&mut buffer).expect("reading the response") {
            0 => break,
            n => response.extend_from_slice(&buffer[..n]),
        }
    }
    let split = response.windows(4).position(|w| w == b"\r\n\r\n").expect("HTTP header end");
    let head = String::from_utf8_lossy(&response[..split]).to_string();
    let status = head.split_whitespace().nth(1).expect("status").parse().expect("numeric status");
    let mut body = response[split + 4..].to_vec();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    (status, body)
}

/// Sum of the counts of folded stacks ("root;...;leaf count" lines).
pub fn folded_total(text: &str) -> i64 {
    text.lines().map(|l| l.rsplit_once(' ').expect("folded line ends in a count").1.parse::<i64>().expect("numeric count")).sum()
}

/// The value of one series ("name{labels}") in Prometheus text, or None if it is absent.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The value of a series that must be there.
pub fn metric(text: &str, series: &str) -> f64 {
    metric_value(text, series).unwrap_or_else(|| panic!("no {series} in the metrics:\n{text}"))
}

/// An agent's /metrics, as text.
pub fn fetch_metrics(status: std::net::SocketAddr) -> String {
    let (code, body) = http_get(status, "/metrics");
    assert_eq!(code, 200, "GET /metrics");
    String::from_utf8(body).expect("utf-8 metrics")
}

/// A valid gzipped pprof profile with nothing in it.
pub fn empty_pprof_gzip() -> Vec<u8> {
    gzip(&Profile { string_table: vec![String::new()], ..Default::default() }.encode_to_vec())
}

/// A gzipped pprof of one sample with no frames, of `value` samples.
pub fn one_sample_pprof_gzip(value: i64) -> Vec<u8> {
    use ember_proto::pprof::{Sample, ValueType};
    let profile = Profile {
        string_table: vec![String::new(), "samples".into(), "count".into()],
        sample_type: vec![ValueType { r#type: 1, unit: 2 }],
        sample: vec![Sample { value: vec![value], ..Default::default() }],
        ..Default::default()
    };
    gzip(&profile.encode_to_vec())
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// Whether `done` holds within `limit`, looked at every 50 ms.
pub fn within(limit: Duration, done: impl Fn() -> bool) -> bool {
    let end = Instant::now() + limit;
    while !done() {
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// Polls an agent's /metrics until `series` satisfies `ok` (bounded); returns its value.
pub fn wait_for_metric(status: std::net::SocketAddr, series: &str, limit: Duration, ok: impl Fn(f64) -> bool) -> f64 {
    let deadline = Instant::now() + limit;
    loop {
        let text = fetch_metrics(status);
        match metric_value(&text, series) {
            Some(value) if ok(value) => return value,
            last => assert!(Instant::now() < deadline, "{series} still {last:?} after {limit:?}:\n{text}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n").expect("chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&data[..line_end]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[line_end + 2..line_end + 2 + size]);
        data = &data[line_end + 2 + size + 2..];
    }
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("ember-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating temp dir");
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running ember-agent whose stderr is collected.
pub struct Agent {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Agent {
    pub fn spawn(args: &[&str]) -> Agent {
        let mut command = Command::new(agent_bin());
        command.args(args);
        Agent::spawn_command(command)
    }

    /// Runs the agent as `command` says (e.g. under setpriv with fewer privileges).
    pub fn spawn_command(mut command: Command) -> Agent {
        let mut child = command
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting ember-agent");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let pipe = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut all = sink.lock().unwrap();
                all.push_str(&line);
                all.push('\n');
            }
        });
        Agent { child, stderr }
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the programs are attached (the agent logs "profiling every CPU").
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.stderr().contains("profiling every CPU") {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("ember-agent exited ({status}) before it was ready:\n{}", self.stderr());
            }
            assert!(Instant::now() < deadline, "ember-agent not ready after 30 s:\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn signal(&self, signal: i32) {
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Waits for exit (bounded) and asserts success.
    pub fn wait_success(mut self, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for ember-agent") {
                std::thread::sleep(Duration::from_millis(50)); // let the stderr reader finish
                let stderr = self.stderr();
                assert!(status.success(), "ember-agent failed ({status}):\n{stderr}");
                return stderr;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("ember-agent still running after {limit:?}:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fixture process from `fixture-split` that waits for `start()` before working.
pub struct Fixture {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Set once wait4 has collected it: its pid may belong to another process after that.
    reaped: bool,
}

impl Fixture {
    pub fn spawn(bin: &str, mode: &str, seconds: f64) -> Fixture {
        Fixture::spawn_with(Command::new(bin), mode, seconds, &[])
    }

    /// `command` is the fixture binary, possibly wrapped (e.g. `ip netns exec NS fixture`).
    pub fn spawn_with(mut command: Command, mode: &str, seconds: f64, args: &[&str]) -> Fixture {
        let mut child = command
            .args([mode, &seconds.to_string(), "--wait"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting fixture");
        let stdin = child.stdin.take();
        Fixture { child, stdin, reaped: false }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn start(&mut self) {
        let mut stdin = self.stdin.take().expect("fixture started twice");
        stdin.write_all(b"go\n").expect("starting fixture");
    }

    /// Waits (at most a minute) for the fixture to exit; returns what it printed and the
    /// CPU it used.
    pub fn finish(mut self) -> FixtureRun {
        let pid = self.child.id() as i32;
        let (mut status, deadline) = (0, Instant::now() + Duration::from_secs(60));
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        while unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) } == 0 {
            if Instant::now() > deadline {
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("fixture {pid} still running after 60 s: killed");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.reaped = true;
        let mut out = String::new();
        self.child.stdout.take().expect("stdout").read_to_string(&mut out).expect("fixture output");
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "fixture failed: {status}");
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        let lines = out
            .lines()
            .map(|l| l.split_whitespace().map(|n| n.parse().expect("fixture prints numbers")).collect())
            .collect();
        FixtureRun { lines, cpu_seconds: secs(usage.ru_utime) + secs(usage.ru_stime) }
    }
}

impl Drop for Fixture {
    /// A test that fails early must not leave its fixture running.
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a fixture printed (one row of numbers per line) and the CPU time it used.
#[derive(Debug, Clone)]
pub struct FixtureRun {
    pub lines: Vec<Vec<u64>>,
    pub cpu_seconds: f64,
}

/// Runs `ember-agent record -o <dir>/p.pb.gz <args>` around the fixtures: they start once
/// the agent is attached and finish before it stops. Returns the output path and the runs.
pub fn record_fixtures(dir: &TempDir, fixtures: Vec<Fixture>, seconds: f64, args: &[&str]) -> (PathBuf, Vec<FixtureRun>) {
    let out = dir.path("p.pb.gz");
    let duration = format!("{}s", seconds + 2.0);
    let mut all = vec!["record", "-d", &duration, "-o", out.to_str().expect("UTF-8 temp path")];
    all.extend(args);
    let mut agent = Agent::spawn(&all);
    agent.wait_ready();
    let mut fixtures = fixtures;
    fixtures.iter_mut().for_each(Fixture::start);
    let runs = fixtures.into_iter().map(Fixture::finish).collect();
    agent.wait_success(Duration::from_secs(60));
    (out, runs)
}

/// Records `pid` (a runtime waiting in `fixture` for its start) at `hz` with the agent as its
/// systemd unit runs it (least privilege), around the fixture's run of `seconds`: the
/// process's samples, and what the fixture printed.
pub fn record_least_privileged(dir: &TempDir, fixture: Fixture, pid: u32, seconds: f64, hz: u32) -> (Vec<Sample>, FixtureRun) {
    record_least_privileged_together(dir, vec![(fixture, pid)], seconds, hz).remove(0)
}

/// The same for several runtimes at once, under one agent: each one's samples and run, in
/// order.
pub fn record_least_privileged_together(dir: &TempDir, fixtures: Vec<(Fixture, u32)>, seconds: f64, hz: u32) -> Vec<(Vec<Sample>, FixtureRun)> {
    std::fs::set_permissions(&dir.0, std::os::unix::fs::PermissionsExt::from_mode(0o777)).expect("opening the temp dir to the agent's user");
    let out = dir.path("p.pb.gz");
    let mut command = least_privilege_agent();
    let duration = format!("{}s", seconds + 2.0);
    command.args(["record", "-F", &hz.to_string(), "-d", &duration, "-o", out.to_str().expect("UTF-8 temp path")]);
    for (_, pid) in &fixtures {
        command.args(["--pid", &pid.to_string()]);
    }
    let mut agent = Agent::spawn_command(command);
    agent.wait_ready();
    let (mut fixtures, pids): (Vec<Fixture>, Vec<u32>) = fixtures.into_iter().unzip();
    fixtures.iter_mut().for_each(Fixture::start);
    let runs: Vec<FixtureRun> = fixtures.into_iter().map(Fixture::finish).collect();
    agent.wait_success(Duration::from_secs(60));
    let recorded = Decoded::read(&out);
    pids.iter().zip(runs).map(|(&pid, run)| (recorded.samples_of(pid).into_iter().cloned().collect(), run)).collect()
}

/// The file of one kind of a multi-kind recording ("p.pb.gz" -> "p-offcpu.pb.gz").
pub fn kind_path(path: &Path, kind: &str) -> PathBuf {
    let name = path.file_name().unwrap().to_string_lossy().replacen('.', &format!("-{kind}."), 1);
    path.with_file_name(name)
}

/// The samples of a `perf record` file as `perf script` prints them, with the `header` field
/// (e.g. "pid" or "comm") before each call chain: (header, function names leaf first).
pub fn perf_script(data: &Path, header: &str) -> anyhow::Result<Vec<(String, Vec<String>)>> {
    let out = Command::new("perf").args(["script", "-F", &format!("{header},ip,sym"), "-i"]).arg(data).output()?;
    anyhow::ensure!(out.status.success(), "perf script: {}", String::from_utf8_lossy(&out.stderr));
    let samples = String::from_utf8_lossy(&out.stdout)
        .split("\n\n")
        .filter_map(|block| {
            let mut lines = block.lines().filter(|l| !l.trim().is_empty());
            let header = lines.next()?.trim().to_string();
            Some((header, lines.filter_map(|l| l.split_whitespace().nth(1).map(str::to_string)).collect()))
        })
        .collect();
    Ok(samples)
}

/// One frame of a decoded sample, leaf first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub function: String,
    pub mapping: String,
    /// The function's file name, and the line (0: not known).
    pub file: String,
    pub line: i64,
}

#[derive(Debug, Clone)]
pub struct Sample {
    pub frames: Vec<Frame>,
    pub values: Vec<i64>,
    pub labels: HashMap<String, String>,
}

/// A decoded pprof profile, with every reference checked while decoding.
pub struct Decoded {
    pub profile: Profile,
    pub samples: Vec<Sample>,
}

impl Decoded {
    pub fn read(path: &Path) -> Decoded {
        Decoded::from_gzip(&std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display())))
    }

    pub fn from_gzip(bytes: &[u8]) -> Decoded {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..]).read_to_end(&mut raw).expect("profile is gzipped");
        let profile = Profile::decode(&raw[..]).expect("profile decodes as profile.proto");
        let strings = &profile.string_table;
        assert_eq!(strings.first().map(String::as_str), Some(""), "string_table[0] must be empty");
        let s = |i: i64| strings.get(i as usize).unwrap_or_else(|| panic!("string index {i} out of range")).clone();
        let functions: HashMap<u64, (String, String)> = profile.function.iter().map(|f| (f.id, (s(f.name), s(f.filename)))).collect();
        let mappings: HashMap<u64, String> = profile.mapping.iter().map(|m| (m.id, s(m.filename))).collect();
        let locations: HashMap<u64, Vec<Frame>> = profile
            .location
            .iter()
            .map(|loc| {
                let mapping = if loc.mapping_id == 0 {
                    String::new()
                } else {
                    mappings.get(&loc.mapping_id).unwrap_or_else(|| panic!("mapping {} missing", loc.mapping_id)).clone()
                };
                assert!(!loc.line.is_empty(), "location {} has no function", loc.id);
                let frames = loc
                    .line
                    .iter()
                    .map(|line| {
                        let (function, file) = functions.get(&line.function_id).unwrap_or_else(|| panic!("function {} missing", line.function_id));
                        Frame { function: function.clone(), mapping: mapping.clone(), file: file.clone(), line: line.line }
                    })
                    .collect();
                (loc.id, frames)
            })
            .collect();
        let samples = profile
            .sample
            .iter()
            .map(|sample| Sample {
                frames: sample
                    .location_id
                    .iter()
                    .flat_map(|id| locations.get(id).unwrap_or_else(|| panic!("location {id} missing")).clone())
                    .collect(),
                values: sample.value.clone(),
                labels: sample
                    .label
                    .iter()
                    .map(|l| (s(l.key), if l.str != 0 { s(l.str) } else { l.num.to_string() }))
                    .collect(),
            })
            .collect();
        Decoded { profile, samples }
    }

    /// Every profile of one kind the daemon wrote into `dir` (`<kind>-<UTC start>.pb.gz`),
    /// whole ones only: not a file it is writing at the moment, which ends in `.tmp` until it
    /// is renamed.
    pub fn read_kind(dir: &Path, kind: &str) -> Vec<Decoded> {
        let prefix = format!("{kind}-");
        std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .flatten()
            .filter(|e| e.file_name().to_str().is_some_and(|name| name.starts_with(&prefix) && name.ends_with(".pb.gz")))
            .map(|e| Decoded::read(&e.path()))
            .collect()
    }

    pub fn string(&self, index: i64) -> &str {
        &self.profile.string_table[index as usize]
    }

    /// A counter the agent wrote in the comments ("ember.counter.<name>=<value>").
    pub fn counter(&self, name: &str) -> u64 {
        let value = self.comment_field(&format!("ember.counter.{name}"));
        value.unwrap_or_else(|| panic!("profile has no counter {name}")).parse().expect("counter value")
    }

    /// A `key=value` field of the comments (several may share one comment, space-separated).
    pub fn comment_field(&self, key: &str) -> Option<&str> {
        let prefix = format!("{key}=");
        self.profile.comment.iter().flat_map(|&c| self.string(c).split(' ')).find_map(|field| field.strip_prefix(&prefix))
    }

    pub fn samples_of(&self, pid: u32) -> Vec<&Sample> {
        self.samples_labelled("pid", &pid.to_string())
    }

    pub fn samples_labelled(&self, key: &str, value: &str) -> Vec<&Sample> {
        self.samples.iter().filter(|s| s.labels.get(key).map(String::as_str) == Some(value)).collect()
    }

    /// Sum of value `index` over samples.
    pub fn sum(samples: &[&Sample], index: usize) -> i64 {
        samples.iter().map(|s| s.values[index]).sum()
    }

    pub fn total(samples: &[&Sample]) -> i64 {
        Decoded::sum(samples, 0)
    }
}

impl Sample {
    pub fn has_function(&self, name: &str) -> bool {
        self.frames.iter().any(|f| f.function == name)
    }
}
