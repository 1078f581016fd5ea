//! Container file access: the agent as its unit runs it (no CAP_SYS_ADMIN, so no map_files)
//! opens a container's binaries by path inside the container's root, and only the files its
//! processes map. A container that points such a path at a host file by a symlink, or at
//! another file by a mount over it, gets the file refused and counted, not parsed. Needs root.
use std::{
    ffi::CString,
    fs::File,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use ember_tests::{
    compile_c, contain, fetch_metrics, least_privilege_agent, spin_c, metric, require_root, transport::stop_agent, wait_for_metric, Agent, Decoded, TempDir,
};

/// A host file the container must not get the agent to read: an ELF with its own build id.
const HOST_FILE: &str = "int host_secret(void) { return 42; }\nint main(void) { return host_secret(); }\n";
const HOST_BUILD_ID: &str = "0badc0de0badc0de0badc0de0badc0de0badc0de";

/// Compiles `source` statically (the container needs no libraries then) with `build_id`.
fn compile(dir: &TempDir, name: &str, source: &str, build_id: &str) -> PathBuf {
    let (c, out) = (dir.path(&format!("{name}.c")), dir.path(name));
    std::fs::write(&c, source).unwrap();
    compile_c(&c, &out, &["-O1", "-static", &format!("-Wl,--build-id=0x{build_id}")]);
    out
}

/// Runs `/bin/<name>` of `root` as a container does (`contain`). Returns once it runs.
fn run_contained(root: &Path, name: &str) -> Child {
    let mut command = Command::new(format!("/bin/{name}"));
    command.arg("8");
    contain(&mut command, root);
    let child = command.spawn().expect("starting a contained process");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap_or_default().contains(&format!(" /bin/{name}\n")) {
        assert!(Instant::now() < deadline, "{name} did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Bind-mounts `source` over `target`, both paths inside the container of `pid`, in its mount
/// namespace: what the container itself can do.
fn bind_mount_inside(pid: u32, source: &str, target: &str) {
    let namespace = File::open(format!("/proc/{pid}/ns/mnt")).unwrap();
    let (source, target) = (CString::new(source).unwrap(), CString::new(target).unwrap());
    // SAFETY: the child makes only syscalls before _exit; the parent waits for it.
    unsafe {
        let child = libc::fork();
        if child == 0 {
            let ok = libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNS) == 0
                && libc::mount(source.as_ptr(), target.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) == 0;
            libc::_exit(i32::from(!ok));
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(child, &mut status, 0), child);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "bind mount in the container's namespace");
    }
}

#[test]
fn a_containers_symlink_or_mount_over_its_binary_cannot_make_the_agent_read_a_host_file() {
    require_root();
    let dir = TempDir::new("container-files");
    std::fs::set_permissions(&dir.0, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let host_file = compile(&dir, "host-secret", HOST_FILE, HOST_BUILD_ID);
    let spin = compile(&dir, "spin", &spin_c("spin_in_container", ""), "5e1f5e1f5e1f5e1f5e1f5e1f5e1f5e1f5e1f5e1f");
    let root = dir.path("root");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    let names = ["intact", "symlinked", "mounted"];
    for name in names {
        std::fs::copy(&spin, root.join("bin").join(name)).unwrap();
    }
    let mut processes: Vec<Child> = names.iter().map(|name| run_contained(&root, name)).collect();
    let pids: Vec<u32> = processes.iter().map(Child::id).collect();

    // Once running, the container re-points the paths its maps show at the host file:
    // the deleted binary's "(deleted)" name becomes an absolute symlink to it, ...
    std::fs::remove_file(root.join("bin/symlinked")).unwrap();
    std::os::unix::fs::symlink(&host_file, root.join("bin/symlinked (deleted)")).unwrap();
    // ... and the other is covered by a bind mount of a copy of it (the container cannot
    // see the host's) in the container's namespace.
    std::fs::copy(&host_file, root.join("secret")).unwrap();
    bind_mount_inside(pids[2], "/secret", "/bin/mounted");

    let (out, http) = (dir.path("out"), ember_tests::transport::free_address());
    let mut command = least_privilege_agent();
    command.args(["run", "-F", "99", "--interval", "1s", "--output-dir", out.to_str().unwrap(), "--http", &http.to_string()]);
    for pid in &pids {
        command.args(["--pid", &pid.to_string()]);
    }
    let mut agent = Agent::spawn_command(command);
    agent.wait_ready();
    wait_for_metric(http, "ember_intervals_total", Duration::from_secs(10), |n| n >= 3.0);
    let metrics = fetch_metrics(http);
    stop_agent(agent);
    for process in &mut processes {
        process.kill().ok();
        process.wait().ok();
    }

    let profiles = Decoded::read_kind(&out, "cpu");
    for profile in &profiles {
        for mapping in &profile.profile.mapping {
            assert_ne!(profile.string(mapping.build_id), HOST_BUILD_ID, "the agent read the host file as {}", profile.string(mapping.filename));
        }
    }
    let samples_of = |pid: u32| profiles.iter().flat_map(|p| p.samples_of(pid)).collect::<Vec<_>>();
    // The intact binary is opened inside the container's root and named; the others lose
    // their names, not their samples.
    for (name, pid) in names.iter().zip(&pids) {
        let samples = samples_of(*pid);
        assert!(Decoded::total(&samples) > 50, "{name}: {} samples", Decoded::total(&samples));
        let named = samples.iter().any(|s| s.has_function("spin_in_container"));
        assert_eq!(named, *name == "intact", "{name}: frames named from its binary: {named}");
    }
    for reason in ["unreachable", "changed"] {
        assert!(metric(&metrics, &format!("ember_binaries_unopened_total{{reason=\"{reason}\"}}")) >= 1.0, "{reason} not counted");
    }
}
