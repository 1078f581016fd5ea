//! Encode: builds the pprof profile of one interval, the unit that leaves the agent.
//! Locations, functions and mappings are deduplicated; identical samples (same stack and
//! labels) are merged. User locations are keyed by binary + file offset, so the same code in
//! different processes shares one location.
use std::{collections::HashMap, time::UNIX_EPOCH};

use agent_common::{counter, kind};
use ember_proto::pprof::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};
use ember_pprof::{StringIndex, JIT_MAPPING, KERNEL_MAPPING, PYTHON_MAPPING};

use super::kinds::{attribution_label, call_label, state_label, tracepoint_label, ProfileKind};
use crate::{
    kernel::Event,
    resolve::{PythonFrame, ResolvedInterval, Site, UserAddress},
    symbolize::{jit_frame, Frame, Symbolizer},
};

pub struct ProfileInfo {
    pub event: Event,
}

#[derive(Hash, PartialEq, Eq)]
enum LocationKey {
    User((u64, u64), u64),
    Special(String, u64),
    Jit(std::sync::Arc<str>, u64),
    Python(std::sync::Arc<PythonFrame>),
    Unmapped(u64),
    Kernel(u64),
    Marker(&'static str),
}

#[derive(Default)]
struct Builder {
    profile: Profile,
    strings: StringIndex,
    functions: HashMap<(String, String), u64>,
    locations: HashMap<LocationKey, u64>,
    mappings: HashMap<String, u64>,
    samples: HashMap<(Vec<u64>, Vec<(i64, i64, i64)>), usize>,
}

impl Builder {
    fn string(&mut self, s: &str) -> i64 {
        self.strings.intern(&mut self.profile.string_table, s)
    }

    fn function(&mut self, frame: &Frame) -> u64 {
        let key = (frame.function.clone(), frame.file.clone());
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let (name, filename) = (self.string(&frame.function), self.string(&frame.file));
        self.profile.function.push(Function { id, name, system_name: name, filename, start_line: 0 });
        self.functions.insert(key, id);
        id
    }

    fn mapping(&mut self, filename: &str, build_id: Option<&str>, start: u64, limit: u64) -> u64 {
        if let Some(&id) = self.mappings.get(filename) {
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        let (name, build_id) = (self.string(filename), self.string(build_id.unwrap_or("")));
        self.profile.mapping.push(Mapping {
            id,
            memory_start: start,
            memory_limit: limit,
            file_offset: 0,
            filename: name,
            build_id,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        });
        self.mappings.insert(filename.to_string(), id);
        id
    }

    fn location(&mut self, site: &Site, symbols: &Symbolizer) -> u64 {
        let key = match site {
            Site::User(UserAddress::File { binary, file_offset }) => LocationKey::User(binary.id, *file_offset),
            Site::User(UserAddress::Special { name, offset }) => LocationKey::Special(name.clone(), *offset),
            Site::User(UserAddress::Jit(symbol)) => LocationKey::Jit(symbol.name.clone(), symbol.start),
            Site::User(UserAddress::Unmapped(addr)) => LocationKey::Unmapped(*addr),
            Site::Python(frame) => LocationKey::Python(frame.clone()),
            Site::Kernel(addr) => LocationKey::Kernel(*addr),
            Site::Marker(marker) => LocationKey::Marker(marker.label()),
        };
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let plain = |name: String| vec![Frame { function: name, file: String::new(), line: 0 }];
        // User locations carry the file offset as address, in a mapping spanning the file.
        let (mapping_id, address, frames) = match site {
            Site::User(UserAddress::File { binary, file_offset }) => {
                let frames = symbols.user(binary, *file_offset).map(|f| f.to_vec());
                let frames = frames.unwrap_or_else(|| plain(format!("{}+{file_offset:#x}", binary.name())));
                (self.mapping(&binary.path, binary.build_id.as_deref(), 0, binary.size), *file_offset, frames)
            }
            Site::User(UserAddress::Special { name, offset }) => (0, *offset, plain(format!("{name}+{offset:#x}"))),
            // One location per function: a perf map names functions, not instructions.
            Site::User(UserAddress::Jit(symbol)) => (self.mapping(JIT_MAPPING, None, 0, u64::MAX), symbol.start, vec![jit_frame(&symbol.name)]),
            Site::User(UserAddress::Unmapped(addr)) => (0, *addr, plain(format!("[unmapped]+{addr:#x}"))),
            Site::Python(frame) => {
                let frames = vec![Frame { function: frame.name.to_string(), file: frame.file.to_string(), line: frame.line }];
                (self.mapping(PYTHON_MAPPING, None, 0, 0), 0, frames)
            }
            Site::Kernel(addr) => {
                let frames = symbols.kernel(*addr).map(|f| f.to_vec());
                let frames = frames.unwrap_or_else(|| plain(format!("[kernel]+{addr:#x}")));
                (self.mapping(KERNEL_MAPPING, None, 0xffff_8000_0000_0000, u64::MAX), *addr, frames)
            }
            Site::Marker(marker) => (0, 0, plain(marker.label().to_string())),
        };
        let line = frames
            .iter()
            .map(|frame| Line { function_id: self.function(frame), line: frame.line as i64, column: 0 })
            .collect();
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(Location { id, mapping_id, address, line, is_folded: false });
        self.locations.insert(key, id);
        id
    }

    fn label_str(&mut self, key: &str, value: &str) -> Label {
        Label { key: self.string(key), str: self.string(value), num: 0, num_unit: 0 }
    }

    fn label_num(&mut self, key: &str, value: i64) -> Label {
        Label { key: self.string(key), str: 0, num: value, num_unit: 0 }
    }
}

/// Builds the interval's profile of one kind.
pub fn build(interval: &ResolvedInterval, symbols: &Symbolizer, info: &ProfileInfo, kind: ProfileKind) -> Profile {
    let mut b = Builder::default();
    b.string("");
    let rates = interval.rates;
    let period = 1_000_000_000 / rates.frequency.max(1) as i64;
    let nominal_period = (!info.event.is_clock()).then_some(period);
    b.profile.sample_type =
        kind.sample_types().iter().map(|(t, u)| ValueType { r#type: b.string(t), unit: b.string(u) }).collect();
    if kind == ProfileKind::Cpu {
        b.profile.period_type = b.profile.sample_type.get(1).copied();
        b.profile.period = period;
    }
    if kind == ProfileKind::Heap {
        // pprof shows a heap profile's memory in use first, as Go's.
        b.profile.default_sample_type = b.string("inuse_space");
    }
    let prefix = kind.task_label_prefix();

    for sample in interval.samples.iter().filter(|s| kind.includes(s.kind)) {
        let location_id: Vec<u64> = sample.stack.iter().map(|site| b.location(site, symbols)).collect();
        let mut label = vec![
            b.label_num(&format!("{prefix}pid"), sample.tgid as i64),
            b.label_num(&format!("{prefix}tid"), sample.pid as i64),
            b.label_str(&format!("{prefix}comm"), &sample.comm),
            b.label_str(&format!("{prefix}process"), &sample.process),
        ];
        for (key, value) in sample.labels.iter() {
            label.push(b.label_str(key, value));
        }
        match kind {
            ProfileKind::OffCpu | ProfileKind::Wall => label.push(b.label_str("state", state_label(sample.kind, sample.state))),
            ProfileKind::NetTx | ProfileKind::NetRx => {
                label.push(b.label_str("device", &sample.device));
                label.push(b.label_str("tracepoint", tracepoint_label(sample.kind)));
                if kind == ProfileKind::NetTx {
                    label.push(b.label_str("attributed_to", attribution_label(sample.state)));
                }
            }
            ProfileKind::NetDrop => label.push(b.label_str("reason", sample.reason.as_deref().unwrap_or(""))),
            ProfileKind::MemoryRequests => label.push(b.label_str("call", call_label(sample.state))),
            ProfileKind::Heap if sample.kind == kind::LIVE_ALLOCATION && sample.state == 1 => label.push(b.label_str("leak", "suspected")),
            ProfileKind::Cpu | ProfileKind::NetRetransmit | ProfileKind::Faults | ProfileKind::Heap => {}
        }
        let values = kind.values(sample, nominal_period);
        let key = (location_id, label.iter().map(|l| (l.key, l.str, l.num)).collect());
        if let Some(&index) = b.samples.get(&key) {
            for (total, add) in b.profile.sample[index].value.iter_mut().zip(values) {
                *total += add;
            }
        } else {
            b.samples.insert(key.clone(), b.profile.sample.len());
            b.profile.sample.push(Sample { location_id: key.0, value: values, label });
        }
    }

    let nanos = |t: Option<std::time::SystemTime>| {
        t.and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos() as i64)
    };
    b.profile.time_nanos = nanos(interval.start);
    b.profile.duration_nanos = (nanos(interval.end) - b.profile.time_nanos).max(0);
    let mut comments = vec![format!(
        "ember.kind={} ember.event={} ember.frequency={} ember.off_cpu_ratio={} ember.net_ratio={} ember.fault_ratio={}",
        kind.name(),
        info.event.name(),
        rates.frequency,
        rates.off_cpu_ratio,
        rates.net_ratio,
        rates.fault_ratio
    )];
    if let Some(overhead) = interval.overhead {
        comments.push(format!(
            "ember.cpu_budget={:.4} ember.overhead.agent={:.4} ember.overhead.bpf={:.4} ember.overhead.probes={:.4} ember.paused={} ember.unseen.context_switches={} ember.unseen.processes_started={}",
            overhead.budget, overhead.agent, overhead.bpf, overhead.probes, rates.paused.names(), overhead.unseen.switches, overhead.unseen.processes
        ));
    }
    comments.extend(kind.comment().map(str::to_string));
    comments.extend(counter::NAMES.iter().map(|(i, name)| format!("ember.counter.{name}={}", interval.counter(*i))));
    comments.push(format!("ember.counter.relabel_dropped={}", interval.relabel_dropped));
    comments.push(format!("ember.counter.process_exited_unread={}", interval.processes_unread));
    comments.push(format!("ember.host.cpu_steal={:.4}", interval.host.steal_share()));
    b.profile.comment = comments.iter().map(|c| b.string(c)).collect();
    b.profile
}
