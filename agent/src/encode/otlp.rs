//! OTLP encoding: each pprof profile becomes one OTLP profile per sample type (OTLP profiles
//! carry one value each), all sharing one deduplicated dictionary per request. The OTLP sink
//! (`ship::otlp`) sends what this builds.
use std::collections::HashMap;

use anyhow::{Context as _, Result};
use ember_proto::{ember, pprof};
use ember_pprof::StringIndex;
use opentelemetry_proto::tonic::{
    collector::profiles::v1development::ExportProfilesServiceRequest,
    common::v1::{any_value::Value, AnyValue, InstrumentationScope, KeyValue},
    profiles::v1development::{
        Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesDictionary, ResourceProfiles,
        Sample, ScopeProfiles, Stack, ValueType,
    },
    resource::v1::Resource,
};

/// A spooled profile may decompress to at most this much.
const MAX_DECOMPRESSED: u64 = 256 << 20;
/// OpenTelemetry's semantic convention for a GNU build id.
const BUILD_ID_ATTRIBUTE: &str = "process.executable.build_id.gnu";

/// The OTLP dictionary of one request: every table starts with its zero value at index 0,
/// and nothing appears twice.
#[derive(Default)]
struct Dictionary {
    tables: ProfilesDictionary,
    strings: StringIndex,
    mappings: HashMap<(u64, u64, u64, i32, i32), i32>,
    functions: HashMap<(i32, i32, i32, i64), i32>,
    locations: HashMap<(i32, u64, Vec<(i32, i64)>), i32>,
    stacks: HashMap<Vec<i32>, i32>,
    attributes: HashMap<(i32, String, i64, i32), i32>,
}

fn index(len: usize) -> i32 {
    i32::try_from(len).expect("OTLP tables are indexed by i32")
}

impl Dictionary {
    fn new() -> Dictionary {
        let mut d = Dictionary::default();
        d.string("");
        d.tables.mapping_table.push(Mapping::default());
        d.tables.function_table.push(Function::default());
        d.tables.location_table.push(Location::default());
        d.tables.stack_table.push(Stack::default());
        d.tables.attribute_table.push(KeyValueAndUnit::default());
        d.tables.link_table.push(Link::default());
        d
    }

    fn string(&mut self, s: &str) -> i32 {
        index(self.strings.intern(&mut self.tables.string_table, s) as usize)
    }

    /// A string attribute (`num` is None) or an integer one with an optional unit.
    fn attribute(&mut self, key: &str, text: &str, num: Option<i64>, unit: &str) -> i32 {
        let (key, unit) = (self.string(key), self.string(unit));
        let id = (key, text.to_string(), num.unwrap_or(i64::MIN), unit);
        if let Some(&i) = self.attributes.get(&id) {
            return i;
        }
        let value = match num {
            Some(n) => Value::IntValue(n),
            None => Value::StringValue(text.to_string()),
        };
        let i = index(self.tables.attribute_table.len());
        self.tables.attribute_table.push(KeyValueAndUnit { key_strindex: key, value: Some(AnyValue { value: Some(value) }), unit_strindex: unit });
        self.attributes.insert(id, i);
        i
    }

    fn intern<K: std::hash::Hash + Eq, T>(map: &mut HashMap<K, i32>, table: &mut Vec<T>, key: K, make: impl FnOnce() -> T) -> i32 {
        *map.entry(key).or_insert_with(|| {
            table.push(make());
            index(table.len() - 1)
        })
    }

    /// Adds one pprof profile's tables; returns its location ids mapped to OTLP indices.
    fn add_locations(&mut self, profile: &pprof::Profile) -> HashMap<u64, i32> {
        let text = |i| text(profile, i);
        let mut mappings = HashMap::new();
        for m in &profile.mapping {
            let filename = self.string(text(m.filename));
            let build_id = text(m.build_id);
            let attributes = if build_id.is_empty() { vec![] } else { vec![self.attribute(BUILD_ID_ATTRIBUTE, build_id, None, "")] };
            let key = (m.memory_start, m.memory_limit, m.file_offset, filename, attributes.first().copied().unwrap_or(0));
            let i = Self::intern(&mut self.mappings, &mut self.tables.mapping_table, key, || Mapping {
                memory_start: m.memory_start,
                memory_limit: m.memory_limit,
                file_offset: m.file_offset,
                filename_strindex: filename,
                attribute_indices: attributes,
            });
            mappings.insert(m.id, i);
        }
        let mut functions = HashMap::new();
        for f in &profile.function {
            let (name, system_name, filename) = (self.string(text(f.name)), self.string(text(f.system_name)), self.string(text(f.filename)));
            let i = Self::intern(&mut self.functions, &mut self.tables.function_table, (name, system_name, filename, f.start_line), || Function {
                name_strindex: name,
                system_name_strindex: system_name,
                filename_strindex: filename,
                start_line: f.start_line,
            });
            functions.insert(f.id, i);
        }
        let mut locations = HashMap::new();
        for l in &profile.location {
            let mapping = mappings.get(&l.mapping_id).copied().unwrap_or(0);
            let lines: Vec<(i32, i64)> = l.line.iter().map(|line| (functions.get(&line.function_id).copied().unwrap_or(0), line.line)).collect();
            let i = Self::intern(&mut self.locations, &mut self.tables.location_table, (mapping, l.address, lines.clone()), || Location {
                mapping_index: mapping,
                address: l.address,
                lines: lines.iter().map(|&(function_index, line)| Line { function_index, line, column: 0 }).collect(),
                attribute_indices: vec![],
            });
            locations.insert(l.id, i);
        }
        locations
    }

    fn stack(&mut self, locations: Vec<i32>) -> i32 {
        Self::intern(&mut self.stacks, &mut self.tables.stack_table, locations.clone(), || Stack { location_indices: locations })
    }
}

/// The OTLP form of spooled profiles: one resource per profile (its labels), one OTLP profile
/// per pprof sample type.
pub fn export_request(spooled: &[ember::Profile]) -> Result<ExportProfilesServiceRequest> {
    let mut d = Dictionary::new();
    let mut resource_profiles = Vec::new();
    for item in spooled {
        let profile = ember_pprof::decode_gzip(&item.pprof_gzip, MAX_DECOMPRESSED)
            .with_context(|| format!("spooled profile {} is not a valid pprof", item.sequence))?;
        let text = |i| text(&profile, i);
        let locations = d.add_locations(&profile);
        let samples: Vec<(i32, Vec<i32>, &Vec<i64>)> = profile
            .sample
            .iter()
            .map(|s| {
                let stack = d.stack(s.location_id.iter().map(|id| locations.get(id).copied().unwrap_or(0)).collect());
                let labels = s.label.iter().map(|l| label_attribute(&mut d, &profile, l)).collect();
                (stack, labels, &s.value)
            })
            .collect();
        // Ember's loss counters and notes ("key=value" comments) stay with each profile.
        let mut notes = vec![d.attribute("ember.profile.kind", &item.kind, None, "")];
        for comment in &profile.comment {
            if let Some((key, value)) = text(*comment).split_once('=') {
                notes.push(match value.parse::<i64>() {
                    Ok(n) => d.attribute(key, "", Some(n), ""),
                    Err(_) => d.attribute(key, value, None, ""),
                });
            }
        }
        let period_type = profile.period_type.as_ref().map(|t| value_type(&mut d, text(t.r#type), text(t.unit)));
        let profiles = profile
            .sample_type
            .iter()
            .enumerate()
            .map(|(v, sample_type)| Profile {
                sample_type: Some(value_type(&mut d, text(sample_type.r#type), text(sample_type.unit))),
                samples: samples
                    .iter()
                    .filter(|(_, _, values)| values.get(v).is_some_and(|&x| x != 0))
                    .map(|(stack, labels, values)| Sample {
                        stack_index: *stack,
                        attribute_indices: labels.clone(),
                        values: vec![values[v]],
                        ..Default::default()
                    })
                    .collect(),
                time_unix_nano: profile.time_nanos.max(0) as u64,
                duration_nano: profile.duration_nanos.max(0) as u64,
                period_type,
                period: profile.period,
                profile_id: profile_id(item, v),
                attribute_indices: notes.clone(),
                ..Default::default()
            })
            .collect();
        let mut labels: Vec<(&String, &String)> = item.labels.iter().collect();
        labels.sort();
        let mut attributes: Vec<KeyValue> = labels.iter().map(|(k, v)| string_key_value(k, v)).collect();
        if let Some(host) = item.labels.get("host") {
            attributes.push(string_key_value("host.name", host));
        }
        resource_profiles.push(ResourceProfiles {
            resource: Some(Resource { attributes, ..Default::default() }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope { name: "ember".into(), version: env!("CARGO_PKG_VERSION").into(), ..Default::default() }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        });
    }
    Ok(ExportProfilesServiceRequest { resource_profiles, dictionary: Some(d.tables) })
}

fn value_type(d: &mut Dictionary, kind: &str, unit: &str) -> ValueType {
    ValueType { type_strindex: d.string(kind), unit_strindex: d.string(unit) }
}

/// A pprof string by index ("" when out of range: decode_gzip validated the profile).
fn text(profile: &pprof::Profile, index: i64) -> &str {
    profile.string_table.get(index as usize).map_or("", String::as_str)
}

fn label_attribute(d: &mut Dictionary, profile: &pprof::Profile, label: &pprof::Label) -> i32 {
    let text = |i| text(profile, i);
    if label.str != 0 {
        d.attribute(text(label.key), text(label.str), None, "")
    } else {
        d.attribute(text(label.key), "", Some(label.num), text(label.num_unit))
    }
}

fn string_key_value(key: &str, value: &str) -> KeyValue {
    KeyValue { key: key.to_string(), value: Some(AnyValue { value: Some(Value::StringValue(value.to_string())) }), ..Default::default() }
}

/// 16 bytes, never all zero: the profile's start time, sequence and sample type.
fn profile_id(item: &ember::Profile, value_index: usize) -> Vec<u8> {
    let mut id = (item.start_unix_nanos as u64).to_be_bytes().to_vec();
    id.extend_from_slice(&((item.sequence << 8) | value_index as u64 | 1 << 63).to_be_bytes());
    id
}
