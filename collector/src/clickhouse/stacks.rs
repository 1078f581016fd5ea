//! A pprof profile as rows and back: each sample's stack becomes a value of its own, hashed,
//! stored once (see `schema`), and the sample a row of labels, stack hash and values; a merged
//! answer's rows become a pprof profile again, frames, inlined lines and mappings as they were.
use anyhow::{Context as _, Result};
use ember_pprof::{string, ById, FastMap, StringIndex};
use ember_proto::pprof::{Function, Label, Line, Location, Mapping, Profile, Sample};

use super::row_binary::{Reader, Writer};

/// A stack, leaf first: one entry per line of each frame (see `schema`'s stacks table).
#[derive(Default, Clone, PartialEq, Eq, Hash, Debug)]
pub struct Stack {
    pub functions: Vec<String>,
    pub files: Vec<String>,
    /// -1: a frame without lines (not symbolized).
    pub lines: Vec<i64>,
    pub binaries: Vec<String>,
    pub build_ids: Vec<String>,
    pub addresses: Vec<u64>,
    /// The frame each entry belongs to, counted from the leaf.
    pub locations: Vec<u64>,
}

/// One entry of a stack: function, file, line, binary, build id, address, frame; its strings
/// as `S` (text, string table indexes, or their hashes).
type Entry<S> = (S, S, i64, S, S, u64, u64);

/// A frame's hash, fed its entries with each string hashed alone (`string_hash`), so that a
/// profile's strings are hashed once each however many frames share them: every collector
/// computes it alike. A stack's hash mixes its frames' in order (`mix`), so that each frame of
/// a profile is hashed once however many stacks hold it.
struct FrameHash(u64);

impl FrameHash {
    fn new() -> FrameHash {
        FrameHash(0xcbf2_9ce4_8422_2325)
    }

    fn entry(&mut self, (function, file, line, binary, build_id, address, _): Entry<u64>) {
        for word in [function, file, line as u64, binary, build_id, address] {
            self.0 = mix(self.0, word);
        }
    }
}

/// FNV-1a of a string.
fn string_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, b| (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// A stack's hash so far, and its next frame's.
fn mix(stack: u64, frame: u64) -> u64 {
    (stack.rotate_left(27) ^ frame).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl Stack {
    /// The hash `rows` gave it (the tests check they agree).
    #[cfg(test)]
    fn hash(&self) -> u64 {
        let (mut stack, mut frame) = (0, FrameHash::new());
        for i in 0..self.functions.len() {
            let h = |texts: &[String]| string_hash(&texts[i]);
            frame.entry((h(&self.functions), h(&self.files), self.lines[i], h(&self.binaries), h(&self.build_ids), self.addresses[i], self.locations[i]));
            if self.locations.get(i + 1) != Some(&self.locations[i]) {
                stack = mix(stack, frame.0);
                frame = FrameHash::new();
            }
        }
        stack
    }

    fn push(&mut self, (function, file, line, binary, build_id, address, frame): Entry<&str>) {
        self.functions.push(function.to_string());
        self.files.push(file.to_string());
        self.lines.push(line);
        self.binaries.push(binary.to_string());
        self.build_ids.push(build_id.to_string());
        self.addresses.push(address);
        self.locations.push(frame);
    }

    /// The stacks table's columns after (day, stack).
    pub fn write(&self, w: &mut Writer) {
        w.strs(self.functions.iter().map(String::as_str)).strs(self.files.iter().map(String::as_str)).i64s(&self.lines);
        w.strs(self.binaries.iter().map(String::as_str)).strs(self.build_ids.iter().map(String::as_str));
        w.u64s(&self.addresses).u64s(&self.locations);
    }

    pub fn read(r: &mut Reader) -> Result<Stack> {
        let stack = Stack {
            functions: r.strs()?,
            files: r.strs()?,
            lines: r.i64s()?,
            binaries: r.strs()?,
            build_ids: r.strs()?,
            addresses: r.u64s()?,
            locations: r.u64s()?,
        };
        let n = stack.functions.len();
        let same = [stack.files.len(), stack.lines.len(), stack.binaries.len(), stack.build_ids.len(), stack.addresses.len(), stack.locations.len()];
        anyhow::ensure!(same.iter().all(|&m| m == n), "a stored stack's columns differ in length");
        Ok(stack)
    }
}

/// A sample's labels: string labels as (key, value), numeric ones as (key, number).
#[derive(Default, Clone, PartialEq, Eq, Hash, Debug)]
pub struct SampleLabels {
    pub keys: Vec<String>,
    pub values: Vec<String>,
    pub num_keys: Vec<String>,
    pub nums: Vec<i64>,
}

/// A profile's samples as rows: its distinct stacks by hash, and each sample's (stack hash,
/// labels, values).
#[derive(Default)]
pub struct Rows {
    pub stacks: FastMap<u64, Stack>,
    pub samples: Vec<(u64, SampleLabels, Vec<i64>)>,
}

/// The profile's rows; of its stacks, only those `wanted` (by hash) are built.
pub fn rows(profile: &Profile, wanted: &dyn Fn(u64) -> bool) -> Rows {
    let s = |i: i64| string(&profile.string_table, i);
    let functions = ById::new(&profile.function, |f| f.id);
    let mappings = ById::new(&profile.mapping, |m| m.id);
    let locations = ById::new(&profile.location, |l| l.id);
    // Hands each entry of a frame (the `frame`th of its stack) to `visit`, its strings as
    // string table indexes (0 is "").
    let entries = |location: &Location, frame: u64, visit: &mut dyn FnMut(Entry<i64>)| {
        let mapping = mappings.get(location.mapping_id);
        let (binary, build_id) = (mapping.map_or(0, |m| m.filename), mapping.map_or(0, |m| m.build_id));
        if location.line.is_empty() {
            visit((0, 0, -1, binary, build_id, location.address, frame));
        }
        for line in &location.line {
            let function = functions.get(line.function_id);
            // A line below 0 is no line (0), not the -1 of a frame without lines.
            visit((function.map_or(0, |f| f.name), function.map_or(0, |f| f.filename), line.line.max(0), binary, build_id, location.address, frame));
        }
    };
    let string_hashes: Vec<u64> = profile.string_table.iter().map(|text| string_hash(text)).collect();
    let h = |i: i64| usize::try_from(i).ok().and_then(|i| string_hashes.get(i).copied()).unwrap_or_else(|| string_hash(""));
    // By the location's position among the profile's locations.
    let frame_hashes: Vec<u64> = profile
        .location
        .iter()
        .map(|location| {
            let mut hash = FrameHash::new();
            entries(location, 0, &mut |(function, file, line, binary, build_id, address, frame)| {
                hash.entry((h(function), h(file), line, h(binary), h(build_id), address, frame))
            });
            hash.0
        })
        .collect();
    let mut out = Rows::default();
    let mut known: FastMap<&[u64], u64> = FastMap::default();
    for sample in &profile.sample {
        let hash = match known.get(sample.location_id.as_slice()) {
            Some(&hash) => hash,
            None => {
                let hash = sample.location_id.iter().filter_map(|&id| locations.position(id)).fold(0, |stack, at| mix(stack, frame_hashes[at]));
                if wanted(hash) && !out.stacks.contains_key(&hash) {
                    let mut stack = Stack::default();
                    for (frame, location) in sample.location_id.iter().filter_map(|&id| locations.get(id)).enumerate() {
                        entries(location, frame as u64, &mut |(function, file, line, binary, build_id, address, frame)| {
                            stack.push((s(function), s(file), line, s(binary), s(build_id), address, frame))
                        });
                    }
                    out.stacks.insert(hash, stack);
                }
                known.insert(&sample.location_id, hash);
                hash
            }
        };
        let mut labels = SampleLabels::default();
        for label in &sample.label {
            if label.str != 0 || label.num == 0 {
                labels.keys.push(s(label.key).to_string());
                labels.values.push(s(label.str).to_string());
            } else {
                labels.num_keys.push(s(label.key).to_string());
                labels.nums.push(label.num);
            }
        }
        out.samples.push((hash, labels, sample.value.clone()));
    }
    out
}

/// A pprof profile assembled from merged rows: strings, functions, mappings and frames each
/// once.
#[derive(Default)]
pub struct Builder {
    pub profile: Profile,
    strings: StringIndex,
    functions: FastMap<(i64, i64), u64>,
    mappings: FastMap<(i64, i64), u64>,
    locations: FastMap<(u64, u64, Vec<(u64, i64)>), u64>,
    /// Stack hash -> its frames' location ids, leaf first.
    stacks: FastMap<u64, Vec<u64>>,
}

impl Builder {
    pub fn string(&mut self, text: &str) -> i64 {
        if self.profile.string_table.is_empty() {
            self.strings.intern(&mut self.profile.string_table, "");
        }
        self.strings.intern(&mut self.profile.string_table, text)
    }

    /// Makes the frames of a stack known under its hash.
    pub fn stack(&mut self, hash: u64, stack: &Stack) {
        let mut frames: Vec<u64> = Vec::new();
        let mut i = 0;
        while i < stack.functions.len() {
            let end = (i..stack.functions.len()).find(|&j| stack.locations[j] != stack.locations[i]).unwrap_or(stack.functions.len());
            let (filename, build_id) = (self.string(&stack.binaries[i]), self.string(&stack.build_ids[i]));
            let next = self.profile.mapping.len() as u64 + 1;
            let mapping_id = if stack.binaries[i].is_empty() { 0 } else { *self.mappings.entry((filename, build_id)).or_insert(next) };
            if mapping_id == next {
                self.profile.mapping.push(Mapping { id: next, filename, build_id, ..Default::default() });
            }
            let mut lines = Vec::new();
            for j in (i..end).filter(|&j| stack.lines[j] >= 0) {
                let (name, file) = (self.string(&stack.functions[j]), self.string(&stack.files[j]));
                let next = self.profile.function.len() as u64 + 1;
                let function_id = *self.functions.entry((name, file)).or_insert(next);
                if function_id == next {
                    self.profile.function.push(Function { id: next, name, system_name: name, filename: file, start_line: 0 });
                }
                lines.push(Line { function_id, line: stack.lines[j], column: 0 });
            }
            let key = (mapping_id, stack.addresses[i], lines.iter().map(|l| (l.function_id, l.line)).collect());
            let next = self.profile.location.len() as u64 + 1;
            let id = *self.locations.entry(key).or_insert(next);
            if id == next {
                self.profile.location.push(Location { id, mapping_id, address: stack.addresses[i], line: lines, is_folded: false });
            }
            frames.push(id);
            i = end;
        }
        self.stacks.insert(hash, frames);
    }

    /// Adds a merged row: a stack made known before, its labels and its values.
    pub fn sample(&mut self, hash: u64, labels: &SampleLabels, value: Vec<i64>) -> Result<()> {
        let location_id = self.stacks.get(&hash).with_context(|| format!("stack {hash:016x} is not stored"))?.clone();
        let mut label = Vec::new();
        for (key, text) in labels.keys.iter().zip(&labels.values) {
            label.push(Label { key: self.string(key), str: self.string(text), ..Default::default() });
        }
        for (key, &num) in labels.num_keys.iter().zip(&labels.nums) {
            label.push(Label { key: self.string(key), num, ..Default::default() });
        }
        self.profile.sample.push(Sample { location_id, value, label });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile with an inlined frame, an unsymbolized one, two mappings and both kinds of
    /// label, through rows and back: the same folded stacks and labels.
    #[test]
    fn a_profile_survives_rows_and_back() {
        let strings = ["", "samples", "count", "main", "inner", "outer", "a.c", "/bin/a", "thread", "t1", "bytes", "[kernel.kallsyms]", "schedule"];
        let profile = Profile {
            string_table: strings.iter().map(|s| s.to_string()).collect(),
            sample_type: vec![ember_proto::pprof::ValueType { r#type: 1, unit: 2 }],
            mapping: vec![Mapping { id: 1, filename: 7, ..Default::default() }, Mapping { id: 2, filename: 11, ..Default::default() }],
            function: (3..=5).chain([12]).enumerate().map(|(i, name)| Function { id: i as u64 + 1, name, filename: 6, ..Default::default() }).collect(),
            location: vec![
                Location { id: 1, mapping_id: 1, address: 0x10, line: vec![Line { function_id: 1, line: 3, column: 0 }], ..Default::default() },
                Location { id: 2, mapping_id: 1, address: 0x20, line: vec![Line { function_id: 2, line: 9, column: 0 }, Line { function_id: 3, line: 4, column: 0 }], ..Default::default() },
                Location { id: 3, mapping_id: 1, address: 0x30, ..Default::default() },
                Location { id: 4, mapping_id: 2, address: 0x40, line: vec![Line { function_id: 4, line: 0, column: 0 }], ..Default::default() },
            ],
            sample: vec![
                Sample { location_id: vec![2, 3, 1], value: vec![5], label: vec![Label { key: 8, str: 9, ..Default::default() }, Label { key: 10, num: 64, ..Default::default() }] },
                Sample { location_id: vec![4, 1], value: vec![2], label: vec![] },
            ],
            ..Default::default()
        };
        assert!(rows(&profile, &|_| false).stacks.is_empty());
        let rows = rows(&profile, &|_| true);
        assert_eq!(rows.stacks.len(), 2);
        assert!(rows.stacks.iter().all(|(hash, stack)| stack.hash() == *hash));
        let mut builder = Builder::default();
        let count = builder.string("count");
        builder.profile.sample_type = vec![ember_proto::pprof::ValueType { r#type: builder.string("samples"), unit: count }];
        for (hash, stack) in &rows.stacks {
            builder.stack(*hash, stack);
        }
        for (hash, labels, values) in rows.samples {
            builder.sample(hash, &labels, values).unwrap();
        }
        let folded = |p: &Profile| ember_pprof::folded(p, 0, &["thread"]).unwrap();
        assert_eq!(folded(&builder.profile), folded(&profile));
        assert_eq!(folded(&profile), ["[unknown];main;schedule_[k] 2", "t1;main;outer;inner_[i] 5"]);
        assert_eq!(builder.profile.sample[0].label.iter().find(|l| l.num == 64).map(|l| string(&builder.profile.string_table, l.key)), Some("bytes"));
        assert!(builder.sample(7, &SampleLabels::default(), vec![1]).is_err());
    }
}
