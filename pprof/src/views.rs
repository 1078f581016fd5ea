//! Views of a pprof profile: folded stacks (one "root;...;leaf count" line per stack, as
//! inferno and Brendan Gregg's tools read them) and an SVG flame graph.
use std::collections::{BTreeMap, HashMap};

use anyhow::{Context as _, Result};
use ember_proto::pprof::Profile;

use crate::string;

/// How one kind of profile is viewed: the sample value that weighs its stacks, and the labels
/// shown as its root frames. The agent's local views and the collector's queries share it.
pub struct View {
    pub value: usize,
    pub roots: &'static [&'static str],
}

/// The view of a profile kind ("cpu", "offcpu", "wall", "net-tx", ...).
pub fn view(kind: &str) -> View {
    match kind {
        // Off-CPU and network stacks weigh by nanoseconds and bytes, not by event counts.
        "offcpu" => View { value: 1, roots: &["comm", "state"] },
        "wall" => View { value: 0, roots: &["comm", "state"] },
        "net-tx" => View { value: 1, roots: &["comm", "device"] },
        // Receive, retransmit and drop events name the task they ran on, not an owner.
        "net-rx" => View { value: 1, roots: &["ran_on_comm", "device"] },
        "net-retransmit" => View { value: 0, roots: &["ran_on_comm"] },
        "net-drop" => View { value: 0, roots: &["reason", "ran_on_comm"] },
        // Memory grows by bytes.
        "faults" => View { value: 1, roots: &["comm"] },
        "memory-requests" => View { value: 1, roots: &["comm", "call"] },
        // What sampled allocations still hold (inuse_space).
        "heap" => View { value: 3, roots: &["comm"] },
        _ => View { value: 0, roots: &["comm"] },
    }
}

impl View {
    pub fn folded(&self, profile: &Profile) -> Result<Vec<String>> {
        folded(profile, self.value, self.roots)
    }

    /// Unit of the weighing value, from the profile's own sample types.
    pub fn unit<'p>(&self, profile: &'p Profile) -> &'p str {
        unit(profile, self.value)
    }
}

/// Unit of sample value `value` ("count", "nanoseconds", "bytes"), from the profile's own
/// sample types; "" if it has no such value.
pub fn unit(profile: &Profile, value: usize) -> &str {
    string(&profile.string_table, profile.sample_type.get(value).map_or(0, |t| t.unit))
}

/// Name of the mapping that holds kernel frames (as perf names it).
pub const KERNEL_MAPPING: &str = "[kernel.kallsyms]";

/// Name of the mapping that holds JIT-compiled functions, named from perf maps.
pub const JIT_MAPPING: &str = "[jit]";

/// Name of the mapping that holds Python functions (their file names and lines in their
/// functions and lines).
pub const PYTHON_MAPPING: &str = "[python]";

/// Folded stacks of the profile's value `value_index`, rooted at the values of
/// `root_labels` (e.g. the thread name). Kernel frames carry the `_[k]` suffix, JIT frames
/// `_[j]` and inlined functions `_[i]`, as perf's folded output does.
/// Fails only if a stack's total overflows (possible only in merges of hostile profiles).
pub fn folded(profile: &Profile, value_index: usize, root_labels: &[&str]) -> Result<Vec<String>> {
    let s = |i: i64| string(&profile.string_table, i);
    let functions: HashMap<u64, &str> = profile.function.iter().map(|f| (f.id, s(f.name))).collect();
    let mappings_named = |name: &str| -> Vec<u64> { profile.mapping.iter().filter(|m| s(m.filename) == name).map(|m| m.id).collect() };
    let (kernel_mappings, jit_mappings) = (mappings_named(KERNEL_MAPPING), mappings_named(JIT_MAPPING));
    let locations: HashMap<u64, Vec<String>> = profile
        .location
        .iter()
        .map(|loc| {
            let kernel = kernel_mappings.contains(&loc.mapping_id);
            let jit = jit_mappings.contains(&loc.mapping_id);
            // Lines are innermost first; folded stacks go root to leaf.
            let names = loc
                .line
                .iter()
                .enumerate()
                .rev()
                .map(|(i, line)| {
                    let name = functions.get(&line.function_id).copied().unwrap_or("[unknown]");
                    let suffix = if kernel {
                        "_[k]"
                    } else if jit {
                        "_[j]"
                    } else if i + 1 < loc.line.len() { "_[i]" } else { "" };
                    format!("{}{suffix}", name.replace(';', ":"))
                })
                .collect();
            (loc.id, names)
        })
        .collect();
    let root_keys: Vec<Option<i64>> =
        root_labels.iter().map(|name| profile.string_table.iter().position(|k| k == name).map(|i| i as i64)).collect();
    let mut stacks: BTreeMap<String, i64> = BTreeMap::new();
    for sample in &profile.sample {
        let mut frames: Vec<String> = root_keys
            .iter()
            .map(|key| {
                let value = sample.label.iter().find(|l| Some(l.key) == *key).map_or("", |l| s(l.str));
                if value.is_empty() { "[unknown]".to_string() } else { value.replace(';', ":") }
            })
            .collect();
        for id in sample.location_id.iter().rev() {
            frames.extend(locations.get(id).into_iter().flatten().cloned());
        }
        let total = stacks.entry(frames.join(";")).or_default();
        *total = total.checked_add(sample.value.get(value_index).copied().unwrap_or(0)).context("a stack's total overflows")?;
    }
    Ok(stacks.into_iter().filter(|(_, v)| *v > 0).map(|(stack, v)| format!("{stack} {v}")).collect())
}

pub fn flamegraph(folded: &[String], title: &str, count_name: &str) -> Result<Vec<u8>> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    options.count_name = count_name.to_string();
    let mut svg = Vec::new();
    if folded.is_empty() {
        // inferno refuses an empty profile; say so in the image rather than fail the run.
        return Ok(format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"600\" height=\"60\"><text x=\"10\" y=\"35\">{title}: no samples</text></svg>\n"
        )
        .into_bytes());
    }
    inferno::flamegraph::from_lines(&mut options, folded.iter().map(String::as_str), &mut svg)
        .context("rendering the flame graph")?;
    Ok(svg)
}
