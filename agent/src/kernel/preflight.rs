//! Checks that turn the usual set-up problems into one clear line, before anything is loaded.
use std::{fs, path::Path};

use anyhow::{bail, Result};

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

fn effective_capabilities() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

pub fn check() -> Result<()> {
    let caps = effective_capabilities();
    let has = |cap: u32| caps & (1 << cap) != 0;
    if !(has(CAP_BPF) && has(CAP_PERFMON)) && !has(CAP_SYS_ADMIN) {
        let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
            .into_iter()
            .filter(|(cap, _)| !has(*cap))
            .map(|(_, name)| name)
            .collect();
        bail!(
            "missing privilege {}: run ember-agent as root, or grant CAP_BPF and CAP_PERFMON (see deploy/systemd)",
            missing.join(" and ")
        );
    }
    if !Path::new("/proc/sys/kernel/perf_event_paranoid").exists() {
        bail!("this kernel has no perf events (CONFIG_PERF_EVENTS is off): ember-agent cannot sample CPUs here");
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        // The user-stack walker finds a task's user registers through BTF-typed helpers.
        bail!("this kernel has no BTF (/sys/kernel/btf/vmlinux; CONFIG_DEBUG_INFO_BTF is off), which Ember's user-stack walker needs");
    }
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut version = release.trim().split(['.', '-']).map(|n| n.parse::<u32>().unwrap_or(0));
    if (version.next().unwrap_or(0), version.next().unwrap_or(0)) < (5, 17) {
        bail!("kernel {} is too old: Ember needs 5.17 or later (its user-stack walker uses bpf_loop)", release.trim());
    }
    ensure_tracefs()
}

/// Tracepoints are attached by id from tracefs; mount it if the host has not.
fn ensure_tracefs() -> Result<()> {
    for dir in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if Path::new(dir).join("events").is_dir() {
            return Ok(());
        }
    }
    let result = unsafe {
        libc::mount(
            c"tracefs".as_ptr(),
            c"/sys/kernel/tracing".as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if result != 0 {
        let error = std::io::Error::last_os_error();
        bail!("tracefs is not mounted and mounting it failed ({error}): run `mount -t tracefs tracefs /sys/kernel/tracing`");
    }
    tracing::info!("mounted tracefs at /sys/kernel/tracing");
    Ok(())
}
