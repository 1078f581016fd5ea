//! Merges profiles of one kind (e.g. an hour of 10 s intervals from ten hosts) into one:
//! strings, functions, mappings and locations are re-interned; samples with the same stack
//! and labels are summed.
use anyhow::{ensure, Context as _, Result};
use ember_proto::pprof::{Function, Label, Line, Location, Mapping, Profile, Sample};

use crate::{FastMap, StringIndex};

#[derive(Default)]
struct Merger {
    out: Profile,
    strings: StringIndex,
    functions: FastMap<(i64, i64), u64>,
    mappings: FastMap<(i64, i64), u64>,
    locations: FastMap<(u64, u64, Vec<(u64, i64)>), u64>,
    samples: FastMap<(Vec<u64>, Vec<(i64, i64, i64)>), usize>,
}

impl Merger {
    fn string(&mut self, s: &str) -> i64 {
        self.strings.intern(&mut self.out.string_table, s)
    }

    fn add(&mut self, p: &Profile) -> Result<()> {
        let s = |i: i64| crate::string(&p.string_table, i);
        let mut function_ids = FastMap::default();
        for f in &p.function {
            let (name, filename) = (self.string(s(f.name)), self.string(s(f.filename)));
            let next = self.out.function.len() as u64 + 1;
            let id = *self.functions.entry((name, filename)).or_insert(next);
            if id == next {
                self.out.function.push(Function { id, name, system_name: name, filename, start_line: f.start_line });
            }
            function_ids.insert(f.id, id);
        }
        let mut mapping_ids = FastMap::default();
        for m in &p.mapping {
            let (filename, build_id) = (self.string(s(m.filename)), self.string(s(m.build_id)));
            let next = self.out.mapping.len() as u64 + 1;
            let id = *self.mappings.entry((filename, build_id)).or_insert(next);
            if id == next {
                self.out.mapping.push(Mapping { id, filename, build_id, ..m.clone() });
            }
            mapping_ids.insert(m.id, id);
        }
        let mut location_ids = FastMap::default();
        for l in &p.location {
            let mapping_id = mapping_ids.get(&l.mapping_id).copied().unwrap_or(0);
            let line: Vec<Line> = l
                .line
                .iter()
                .map(|line| Line { function_id: function_ids.get(&line.function_id).copied().unwrap_or(0), ..*line })
                .collect();
            let key = (mapping_id, l.address, line.iter().map(|x| (x.function_id, x.line)).collect());
            let next = self.out.location.len() as u64 + 1;
            let id = *self.locations.entry(key).or_insert(next);
            if id == next {
                self.out.location.push(Location { id, mapping_id, address: l.address, line, is_folded: l.is_folded });
            }
            location_ids.insert(l.id, id);
        }
        for sample in &p.sample {
            let location_id: Vec<u64> = sample.location_id.iter().filter_map(|id| location_ids.get(id).copied()).collect();
            let label: Vec<Label> = sample
                .label
                .iter()
                .map(|l| Label { key: self.string(s(l.key)), str: if l.str == 0 { 0 } else { self.string(s(l.str)) }, ..*l })
                .collect();
            let key = (location_id, label.iter().map(|l| (l.key, l.str, l.num)).collect());
            match self.samples.get(&key) {
                Some(&i) => {
                    for (total, v) in self.out.sample[i].value.iter_mut().zip(&sample.value) {
                        *total = total.checked_add(*v).context("sample values overflow when merged")?;
                    }
                }
                None => {
                    self.samples.insert(key.clone(), self.out.sample.len());
                    self.out.sample.push(Sample { location_id: key.0, value: sample.value.clone(), label });
                }
            }
        }
        Ok(())
    }
}

/// All profiles must have the same sample types (the same kind).
pub fn merge(profiles: &[Profile]) -> Result<Profile> {
    let mut merger = Merger::default();
    merger.string("");
    let Some(first) = profiles.first() else { return Ok(merger.out) };
    let types = |p: &Profile| -> Vec<(String, String)> {
        let s = |i: i64| p.string_table.get(i as usize).cloned().unwrap_or_default();
        p.sample_type.iter().map(|t| (s(t.r#type), s(t.unit))).collect()
    };
    let sample_types = types(first);
    for p in profiles {
        ensure!(types(p) == sample_types, "cannot merge profiles with different sample types");
    }
    merger.out.sample_type = sample_types
        .iter()
        .map(|(t, u)| ember_proto::pprof::ValueType { r#type: merger.string(t), unit: merger.string(u) })
        .collect();
    merger.out.period_type = first.period_type.map(|pt| {
        let s = |i: i64| first.string_table.get(i as usize).cloned().unwrap_or_default();
        ember_proto::pprof::ValueType { r#type: merger.string(&s(pt.r#type)), unit: merger.string(&s(pt.unit)) }
    });
    merger.out.period = first.period;
    let start = profiles.iter().map(|p| p.time_nanos).min().unwrap_or(0);
    let ends = profiles.iter().map(|p| p.time_nanos.checked_add(p.duration_nanos).context("profile end time overflows"));
    let end = ends.collect::<Result<Vec<i64>>>()?.into_iter().max().unwrap_or(0);
    for p in profiles {
        merger.add(p)?;
    }
    merger.out.time_nanos = start;
    merger.out.duration_nanos = end.checked_sub(start).context("profile time range overflows")?;
    Ok(merger.out)
}
