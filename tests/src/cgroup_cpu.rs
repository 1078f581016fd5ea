//! A cgroup of its own for a measured process, counting all the CPU time it uses: threads that
//! have ended and children included. `usage::cpu_ns` reads live threads only, so a thread that
//! does its work and ends (the agent loads its programs on one) drops out of it.
use std::{
    ffi::CString,
    fs, io,
    os::unix::{ffi::OsStrExt, process::CommandExt},
    path::PathBuf,
    process::Command,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};

pub struct CgroupCpu {
    dir: PathBuf,
    /// cgroup v2 counts in `cpu.stat` (µs), v1's cpuacct in `cpuacct.usage` (ns).
    v2: bool,
}

impl CgroupCpu {
    /// An empty cgroup under the cgroup2 hierarchy, or else under v1's cpuacct one.
    pub fn new(name: &str) -> Result<CgroupCpu> {
        let mounts = fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
        let mount = |kind: &str, option: Option<&str>| {
            mounts.lines().find_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let fits = f.len() >= 4 && f[2] == kind && option.is_none_or(|o| f[3].split(',').any(|x| x == o));
                fits.then(|| PathBuf::from(f[1]))
            })
        };
        let (root, v2) = match (mount("cgroup2", None), mount("cgroup", Some("cpuacct"))) {
            (Some(root), _) => (root, true),
            (None, Some(root)) => (root, false),
            (None, None) => bail!("no cgroup2 or cpuacct hierarchy is mounted: the CPU time of a measured process cannot be counted whole"),
        };
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = root.join(format!("ember-measure-{name}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        fs::create_dir(&dir).with_context(|| format!("creating the cgroup {}", dir.display()))?;
        Ok(CgroupCpu { dir, v2 })
    }

    /// `command`'s process enters the cgroup before it runs anything of its own.
    pub fn enter_on_exec(&self, command: &mut Command) {
        let procs = CString::new(self.dir.join("cgroup.procs").as_os_str().as_bytes()).expect("a path without NUL");
        // SAFETY: between fork and exec the closure calls only open, write and close, which are
        // async-signal-safe, and allocates nothing.
        unsafe {
            command.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // "0" is the writer itself.
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                let error = io::Error::last_os_error();
                libc::close(fd);
                if written == 1 {
                    Ok(())
                } else {
                    Err(error)
                }
            })
        };
    }

    /// CPU time used in the cgroup so far, in ns.
    pub fn cpu_ns(&self) -> Result<u64> {
        let (file, scale, prefix) = if self.v2 { ("cpu.stat", 1000, "usage_usec ") } else { ("cpuacct.usage", 1, "") };
        let path = self.dir.join(file);
        let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let value = text.lines().find_map(|l| l.strip_prefix(prefix)).and_then(|v| v.trim().parse::<u64>().ok());
        Ok(value.with_context(|| format!("no CPU usage in {}", path.display()))? * scale)
    }
}

impl Drop for CgroupCpu {
    /// Removed once its processes are gone; the kernel may take a moment after the last one.
    fn drop(&mut self) {
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
