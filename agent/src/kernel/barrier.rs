//! A barrier against BPF programs still running: after `wait` returns, every program that
//! started before it was called has finished. The drain uses it between switching the active
//! buffer set and reading the idle one, so that no program can still write to a set being
//! read and cleared (a sleep would only make that unlikely).
//!
//! The kernel gives this guarantee on every update of a map-of-maps: it runs
//! `synchronize_rcu()` before returning, "so that userspace knows that all non-sleepable
//! programs that could be running use the new map value" (kernel/bpf/syscall.c,
//! `maybe_wait_bpf_programs`). Perf-event and tracepoint programs are non-sleepable and run
//! inside RCU read-side sections, so that wait covers every one of Ember's programs.
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};

use anyhow::{bail, Result};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_TYPE_ARRAY_OF_MAPS: u32 = 12;
/// `union bpf_attr` is larger than what either command reads; the kernel wants the rest zero.
const ATTR_SIZE: usize = 128;

pub struct ProgramBarrier {
    /// A one-slot array of maps, never read by any program: only its updates matter.
    outer: OwnedFd,
    /// The map stored in that slot at every update (any array map will do).
    inner: RawFd,
}

fn bpf(command: libc::c_long, attr: &[u8; ATTR_SIZE]) -> std::io::Result<i64> {
    // SAFETY: `attr` is a zero-padded bpf_attr of the size passed, valid for the call.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, command, attr.as_ptr(), ATTR_SIZE as u32) };
    if ret < 0 { Err(std::io::Error::last_os_error()) } else { Ok(ret) }
}

impl ProgramBarrier {
    /// `inner` must stay open as long as the barrier (it is one of the loaded maps).
    pub fn new(inner: RawFd) -> Result<ProgramBarrier> {
        let mut attr = [0u8; ATTR_SIZE];
        // map_type, key_size, value_size, max_entries, map_flags, inner_map_fd (u32 each).
        for (i, value) in [BPF_MAP_TYPE_ARRAY_OF_MAPS, 4, 4, 1, 0, inner as u32].into_iter().enumerate() {
            attr[i * 4..i * 4 + 4].copy_from_slice(&value.to_ne_bytes());
        }
        let fd = match bpf(BPF_MAP_CREATE, &attr) {
            Ok(fd) => fd as RawFd,
            Err(e) => bail!("creating the drain's program barrier (an array of maps) failed: {e}"),
        };
        // SAFETY: the kernel just returned this fd, and nothing else owns it.
        let outer = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(ProgramBarrier { outer, inner })
    }

    /// Returns once every BPF program that was running when it was called has finished.
    pub fn wait(&self) -> Result<()> {
        let (key, value) = (0u32, self.inner as u32);
        let mut attr = [0u8; ATTR_SIZE];
        // map_fd (u32), padding, key pointer (u64), value pointer (u64), flags (u64).
        attr[0..4].copy_from_slice(&(self.outer.as_raw_fd() as u32).to_ne_bytes());
        attr[8..16].copy_from_slice(&(&key as *const u32 as u64).to_ne_bytes());
        attr[16..24].copy_from_slice(&(&value as *const u32 as u64).to_ne_bytes());
        if let Err(e) = bpf(BPF_MAP_UPDATE_ELEM, &attr) {
            bail!("waiting for running BPF programs (array-of-maps update) failed: {e}");
        }
        Ok(())
    }
}
