//! Resolve: turns a drained interval's kernel ids (tgid, stack ids, cgroup id) into what the
//! later stages need: processes, thread names, cgroup paths and user addresses as binary +
//! file offset. Runs right after the drain, while short-lived processes may still exist.
use std::time::SystemTime;

use agent_common::{counter, stack_status, SampleKey};

use crate::{
    cgroups::CgroupNames,
    procs::{ProcessTable, UserAddress},
    sampler::RawInterval,
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
        }
    }
}

#[derive(Debug, Clone)]
pub enum Site {
    User(UserAddress),
    Kernel(u64),
    Marker(Marker),
}

#[derive(Debug, Clone)]
pub struct ResolvedSample {
    pub tgid: u32,
    pub pid: u32,
    pub comm: String,
    pub process: String,
    pub cgroup: String,
    /// Leaf first: kernel frames, then user frames.
    pub stack: Vec<Site>,
    pub count: u64,
}

#[derive(Debug, Clone, Default)]
pub struct ResolvedInterval {
    pub start: Option<SystemTime>,
    pub end: Option<SystemTime>,
    pub samples: Vec<ResolvedSample>,
    pub counters: [u64; counter::COUNT as usize],
}

impl ResolvedInterval {
    /// Appends a later interval (record drains several times into one profile).
    pub fn merge(&mut self, other: ResolvedInterval) {
        self.start = self.start.min(other.start).or(self.start).or(other.start);
        self.end = self.end.max(other.end);
        self.samples.extend(other.samples);
        for (total, add) in self.counters.iter_mut().zip(other.counters) {
            *total += add;
        }
    }

    pub fn counter(&self, index: u32) -> u64 {
        self.counters[index as usize]
    }
}

pub fn resolve(raw: RawInterval, procs: &mut ProcessTable, cgroups: &mut CgroupNames) -> ResolvedInterval {
    let samples = raw
        .counts
        .iter()
        .map(|(key, count)| {
            let process = procs.get(key.tgid).map(|p| p.name.clone()).unwrap_or_default();
            ResolvedSample {
                tgid: key.tgid,
                pid: key.pid,
                comm: comm(key),
                process,
                cgroup: cgroups.name(key.cgroup_id),
                stack: stack(key, &raw, procs),
                count: *count,
            }
        })
        .collect();
    ResolvedInterval { start: raw.start, end: raw.end, samples, counters: raw.counters }
}

fn comm(key: &SampleKey) -> String {
    let len = key.comm.iter().position(|&b| b == 0).unwrap_or(key.comm.len());
    String::from_utf8_lossy(&key.comm[..len]).into_owned()
}

fn stack(key: &SampleKey, raw: &RawInterval, procs: &mut ProcessTable) -> Vec<Site> {
    let mut sites = Vec::new();
    push_stack(&mut sites, raw, key.kernel_stack_id, false, |addr| Site::Kernel(addr));
    push_stack(&mut sites, raw, key.user_stack_id, true, |addr| Site::User(procs.resolve(key.tgid, addr)));
    if sites.is_empty() {
        sites.push(Site::Marker(Marker::NoStack));
    }
    sites
}

fn push_stack(sites: &mut Vec<Site>, raw: &RawInterval, id: i32, user: bool, mut site: impl FnMut(u64) -> Site) {
    match id {
        stack_status::NONE => {}
        stack_status::COLLISION => {
            sites.push(Site::Marker(if user { Marker::UserCollision } else { Marker::KernelCollision }))
        }
        id if id < 0 => sites.push(Site::Marker(if user { Marker::UserError } else { Marker::KernelError })),
        id => match raw.stacks.get(&(id as u32)) {
            // Frames above the leaf are return addresses: step back into the call instruction
            // so that the call site, not the next line, is symbolized.
            Some(ips) => sites.extend(ips.iter().enumerate().map(|(i, &ip)| site(if i == 0 { ip } else { ip - 1 }))),
            None => sites.push(Site::Marker(Marker::StackMissing)),
        },
    }
}
