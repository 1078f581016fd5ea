//! Resolve: turns a drained interval's kernel ids (tgid, stack ids, cgroup id) into what the
//! later stages need: processes, thread names, cgroup paths and user addresses as binary +
//! file offset. Runs right after the drain, while short-lived processes may still exist.
use std::{collections::HashMap, sync::Arc, time::SystemTime};

use agent_common::{kind, python_stop, stack_status, unwind_stop, SampleKey, SampleValue};

use super::{
    procs::{ProcessTable, UserAddress},
    python::{PythonFrame, Pythons},
    relabel::Labels,
    targets::Targets,
};
use crate::{
    kernel::{Counters, HostActivity, Overhead, RawInterval, SamplingRates, Stack},
    ops::losses::Losses,
};

/// A frame position that holds no address: why a stack is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Marker {
    UserCollision,
    UserError,
    KernelCollision,
    KernelError,
    /// A stack id whose stack was not in the stack map.
    StackMissing,
    /// Neither a user nor a kernel stack was captured.
    NoStack,
    /// The user stack's walk stopped early (`agent_common::unwind_stop`): the root of a
    /// truncated stack.
    Truncated(u32),
    /// The Python walk stopped early (`agent_common::python_stop`): below the Python frames
    /// it found.
    PythonTruncated(u32),
    /// The user stack was walked before the process's tables were loaded: the root of a
    /// stack that may lack the callers of functions without frame pointers.
    FramePointersOnly,
}

impl Marker {
    pub fn label(self) -> &'static str {
        match self {
            Marker::UserCollision => "[user stack lost: stack map hash collision]",
            Marker::UserError => "[user stack lost: capture error]",
            Marker::KernelCollision => "[kernel stack lost: stack map hash collision]",
            Marker::KernelError => "[kernel stack lost: capture error]",
            Marker::StackMissing => "[stack lost: not in stack map]",
            Marker::NoStack => "[no stack]",
            Marker::Truncated(stop) => match stop {
                unwind_stop::DEPTH => "[truncated: depth limit]",
                unwind_stop::READ_FAULT => "[truncated: stack unreadable]",
                unwind_stop::NO_INFO => "[truncated: no unwind info]",
                unwind_stop::UNSUPPORTED => "[truncated: unsupported unwind rule]",
                unwind_stop::SIGNAL => "[truncated: signal frame]",
                unwind_stop::BAD_FRAME => "[truncated: bad frame]",
                _ => "[truncated]",
            },
            Marker::PythonTruncated(stop) => match stop {
                python_stop::NO_THREAD => "[python truncated: thread state not found]",
                python_stop::READ_FAULT => "[python truncated: interpreter memory unreadable]",
                python_stop::DEPTH => "[python truncated: depth limit]",
                _ => "[python truncated]",
            },
            Marker::FramePointersOnly => "[walked by frame pointers: tables not loaded yet]",
        }
    }
}

#[derive(Debug, Clone)]
pub enum Site {
    User(UserAddress),
    /// A Python function, in place of the evaluation loop's native frame that ran it.
    Python(Arc<PythonFrame>),
    Kernel(u64),
    Marker(Marker),
}

#[derive(Debug, Clone)]
pub struct ResolvedSample {
    /// One of `agent_common::kind`.
    pub kind: u8,
    pub tgid: u32,
    pub pid: u32,
    pub comm: String,
    pub process: String,
    /// The target's labels: cgroup, and what the cgroup path and pod metadata say.
    pub labels: Arc<Labels>,
    /// Network device, for network kinds.
    pub device: String,
    /// Off-CPU: `block_state`. Transmits: `attribution`. Else 0.
    pub state: u32,
    /// kfree_skb: the drop reason's name.
    pub reason: Option<String>,
    /// Leaf first: kernel frames, then user frames.
    pub stack: Vec<Site>,
    pub value: SampleValue,
}

#[derive(Debug, Clone, Default)]
pub struct ResolvedInterval {
    pub start: Option<SystemTime>,
    pub end: Option<SystemTime>,
    pub samples: Vec<ResolvedSample>,
    pub counters: Counters,
    /// The rates the interval was sampled at (the first one's, after `merge`).
    pub rates: SamplingRates,
    /// What profiling cost over the interval, when a CPU budget governs it.
    pub overhead: Option<Overhead>,
    /// Events of targets that relabel rules dropped.
    pub relabel_dropped: u64,
    /// Processes that exited before their mappings could be read (their frames unnamed).
    pub processes_unread: u64,
    /// What the host did over the interval: CPU time run and stolen, switches, processes.
    pub host: HostActivity,
}

impl ResolvedInterval {
    /// Appends a later interval (record drains several times into one profile).
    pub fn merge(&mut self, other: ResolvedInterval) {
        if self.rates == SamplingRates::default() {
            self.rates = other.rates;
        }
        self.start = self.start.min(other.start).or(self.start).or(other.start);
        self.end = self.end.max(other.end);
        // Memory in use is a snapshot: the later one replaces the earlier.
        self.samples.retain(|sample| sample.kind != kind::LIVE_ALLOCATION);
        self.samples.extend(other.samples);
        for (total, add) in self.counters.0.iter_mut().zip(other.counters.0) {
            *total += add;
        }
        self.relabel_dropped += other.relabel_dropped;
        self.processes_unread += other.processes_unread;
        self.host.add(other.host);
    }

    /// What the loss report needs of this interval.
    pub fn losses(&self) -> Losses<'_> {
        Losses { counters: &self.counters.0, relabel_dropped: self.relabel_dropped, processes_unread: self.processes_unread }
    }

    pub fn counter(&self, index: u32) -> u64 {
        self.counters.0[index as usize]
    }
}

/// Names of kfree_skb drop reasons (from its tracepoint format), by value.
pub type DropReasons = HashMap<u32, String>;

pub fn resolve(raw: RawInterval, procs: &mut ProcessTable, pythons: &mut Pythons, targets: &mut Targets, reasons: &DropReasons) -> ResolvedInterval {
    let mut labels: HashMap<u64, Option<Arc<Labels>>> = HashMap::new();
    let mut relabel_dropped = 0;
    let samples = raw
        .counts
        .iter()
        .filter_map(|(key, value)| {
            let Some(labels) = labels.entry(key.cgroup_id).or_insert_with(|| targets.labels(key.cgroup_id)).clone() else {
                relabel_dropped += value.count;
                return None;
            };
            let process = procs.get(key.tgid, key.process_tag).map(|p| p.name.clone()).unwrap_or_default();
            let reason = (key.kind == kind::KFREE_SKB)
                .then(|| reasons.get(&key.aux).cloned().unwrap_or_else(|| format!("reason {}", key.aux)));
            Some(ResolvedSample {
                kind: key.kind,
                tgid: key.tgid,
                pid: key.pid,
                comm: c_string(&key.comm),
                process,
                labels,
                device: c_string(&key.device),
                state: key.aux,
                reason,
                stack: stack(key, &raw, procs, pythons),
                value: *value,
            })
        })
        .collect();
    ResolvedInterval {
        start: raw.start,
        end: raw.end,
        samples,
        counters: raw.counters,
        rates: raw.rates,
        overhead: None,
        relabel_dropped,
        processes_unread: 0,
        host: HostActivity::default(),
    }
}

fn c_string(bytes: &[u8]) -> String {
    let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..len]).into_owned()
}

fn stack(key: &SampleKey, raw: &RawInterval, procs: &mut ProcessTable, pythons: &mut Pythons) -> Vec<Site> {
    let mut sites = Vec::new();
    push_stack(&mut sites, raw, key.stack_set, key.kernel_stack_id, false, |addr| Site::Kernel(addr));
    let user = sites.len();
    let user_stack = push_stack(&mut sites, raw, key.stack_set, key.user_stack_id, true, |addr| Site::User(procs.resolve(key.tgid, key.process_tag, addr)));
    if let Some((frames, stop)) = user_stack.and_then(|stack| stack.python.as_ref()) {
        let native = sites.split_off(user);
        sites.extend(interleave(native, key.tgid, frames, *stop, pythons));
    }
    if sites.is_empty() {
        sites.push(Site::Marker(Marker::NoStack));
    }
    sites
}

/// The user stack with its Python frames: each run of the evaluation loop (innermost first)
/// in place of its native frame. Runs beyond the native frames found (a native walk cut
/// short) go below them, before the markers at the root.
fn interleave(mut native: Vec<Site>, tgid: u32, python: &[u64], stop: u32, pythons: &mut Pythons) -> Vec<Site> {
    let mut runs = vec![Vec::new()];
    for &word in python {
        let (frame, last_of_run) = pythons.frame(tgid, word);
        runs.last_mut().expect("one run at least").push(Site::Python(frame));
        if last_of_run {
            runs.push(Vec::new());
        }
    }
    let mut runs = runs.into_iter().filter(|run| !run.is_empty());
    let frames = native.len() - native.iter().rev().take_while(|site| matches!(site, Site::Marker(_))).count();
    let root_markers = native.split_off(frames);
    let mut sites = Vec::with_capacity(native.len() + python.len() + root_markers.len() + 1);
    for site in native {
        let evaluates = matches!(&site, Site::User(UserAddress::File { binary, file_offset }) if pythons.evaluates(tgid, binary.id, *file_offset));
        match if evaluates { runs.next() } else { None } {
            Some(run) => sites.extend(run),
            None => sites.push(site),
        }
    }
    sites.extend(runs.flatten());
    if stop != python_stop::END {
        sites.push(Site::Marker(Marker::PythonTruncated(stop)));
    }
    sites.extend(root_markers);
    sites
}

/// Pushes the sites of one stack (or the marker of why it is missing), and returns the stack.
fn push_stack<'r>(sites: &mut Vec<Site>, raw: &'r RawInterval, set: u8, id: i32, user: bool, mut site: impl FnMut(u64) -> Site) -> Option<&'r Stack> {
    let marker = match id {
        stack_status::NONE => return None,
        stack_status::COLLISION => if user { Marker::UserCollision } else { Marker::KernelCollision },
        id if id < 0 => if user { Marker::UserError } else { Marker::KernelError },
        id => match raw.stacks.get(&(user, set, id as u32)) {
            Some(stack) => {
                // Frames above the leaf are return addresses: step back into the call
                // instruction so that the call site, not the next line, is symbolized.
                let frames = stack.frames.iter().enumerate();
                sites.extend(frames.map(|(i, &ip)| site(if i == 0 { ip } else { ip.saturating_sub(1) })));
                let reason = stack.stop & !unwind_stop::FRAME_POINTERS_ONLY;
                if reason != unwind_stop::END {
                    sites.push(Site::Marker(Marker::Truncated(reason)));
                }
                if stack.stop & unwind_stop::FRAME_POINTERS_ONLY != 0 {
                    sites.push(Site::Marker(Marker::FramePointersOnly));
                }
                return Some(stack);
            }
            None => Marker::StackMissing,
        },
    };
    sites.push(Site::Marker(marker));
    None
}
