//! A selection as SQL: the text depends only on the number of selector terms, and the kind,
//! the terms and any other string a request brings travel in external tables (`args`, one
//! row; `terms`, one row per term), so no request can change what a statement does. Range
//! bounds are integers the collector formats itself, and the roll-ups a selection reads
//! travel in a third table (`parts`).
use anyhow::{bail, Result};

use super::{
    client::External,
    plan::Read,
    rollups::{FLEET, PER_AGENT},
    row_binary::Writer,
    schema::{one_copy, starts_in},
};
use crate::{buckets::LEVELS, store::Selection};

/// Selector terms one query may carry.
pub const MAX_TERMS: usize = 32;

/// A bound selection: its WITH list and conditions, and the tables that carry its values.
pub struct Bound<'a> {
    /// Scalars for the statement's WITH: `the_kind`, `the_group`, and `k{i}`, `v{i}` per term.
    pub with: String,
    /// Conditions on the samples table: kind, range, the copy each profile is read from, terms,
    /// and outside the roll-ups read.
    pub samples: String,
    /// Conditions on the rollups table: kind, one of the roll-ups read, the fleet's rows or
    /// the agents', terms.
    pub rollups: String,
    /// Conditions on the profiles table: kind and range.
    pub profiles: String,
    /// The same, and the terms that profile labels answer alone (a term on sample labels
    /// holds for every profile): the profiles the selection may read from.
    pub selected: String,
    /// Conditions on the profiles of the range outside the roll-ups read, and on the roll-ups
    /// read, with the terms that profile labels answer alone: the profiles a held value is
    /// averaged over.
    pub whole_profiles: [String; 2],
    pub external: Vec<External<'a>>,
}

/// Raw ranges spelled out one by one at most; past that, one range spans them (the rows of
/// the roll-ups read inside it are then left out by the buckets alone).
const MAX_RAW_RANGES: usize = 32;

/// The rows whose profile starts in one of `raw`'s ranges: each range's days and times, which
/// spare ClickHouse the partitions and index granules of the rest (the roll-ups read).
fn starts_in_any(raw: &[(u64, u64)]) -> String {
    match raw {
        [] => "0".to_string(),
        [.., (_, last)] if raw.len() > MAX_RAW_RANGES => starts_in(raw[0].0, *last),
        _ => format!("({})", raw.iter().map(|&(from, to)| format!("({})", starts_in(from, to))).collect::<Vec<_>>().join(" OR ")),
    }
}

/// Binds `selection`, read as `read` says (complete roll-ups, and the samples of the rest of
/// its range), and `group` (a label name, or "" for none) as `the_group`.
pub fn bind<'a>(database: &str, selection: &Selection, group: &str, read: &Read) -> Result<Bound<'a>> {
    if selection.selector.len() > MAX_TERMS {
        bail!("a selector may have at most {MAX_TERMS} terms");
    }
    let (from, to) = selection.range;
    let mut args = Writer::default();
    args.str(selection.kind).str(group);
    let mut terms = Writer::default();
    let mut with = vec!["(SELECT kind FROM args) AS the_kind".to_string(), "(SELECT group_by FROM args) AS the_group".to_string()];
    let range = starts_in(from, to);
    let raw = starts_in_any(&read.raw);
    let profiles = format!("kind = (SELECT kind FROM args) AND {range}");
    let raw_profiles = format!("kind = (SELECT kind FROM args) AND {raw}");
    let mut samples = vec![format!("kind = the_kind AND {raw}"), one_copy(database, &raw_profiles)];
    let mut whole = vec![format!("kind = the_kind AND {raw}")];
    // A question about every agent at once reads the fleet's roll-up rows; one with terms, or
    // of a kind whose held values are averaged per agent, the per-agent ones.
    let fleet = selection.selector.is_empty() && !ember_pprof::kind_holds(selection.kind);
    let mut rollups = vec![format!("kind = the_kind AND {range} AND bucket >= {from} AND bucket < {to} AND {}", if fleet { FLEET } else { PER_AGENT })];
    let (parts, mut read_parts) = (&read.parts, Writer::default());
    if parts.is_empty() {
        rollups.push("0".into());
    } else {
        for part in parts {
            read_parts.u64(part.level).u64(part.bucket).u64(part.build);
        }
        rollups.push("(level, bucket, build) IN (SELECT level, bucket, build FROM parts)".into());
        // A bucket read from its roll-ups is not read raw.
        let covered: Vec<String> =
            LEVELS.iter().map(|level| format!("(toUInt64({level}), intDiv(start_ns, {level}) * {level}) IN (SELECT level, bucket FROM parts)")).collect();
        samples.push(format!("NOT ({})", covered.join(" OR ")));
        whole.push(format!("NOT ({})", covered.join(" OR ")));
    }
    let (mut whole_rollups, mut selected) = (rollups.clone(), vec![profiles.clone()]);
    for (i, (key, value)) in selection.selector.iter().enumerate() {
        terms.u32(i as u32).str(key).str(value);
        with.push(format!("(SELECT key FROM terms WHERE n = {i}) AS k{i}"));
        with.push(format!("(SELECT value FROM terms WHERE n = {i}) AS v{i}"));
        // The agent's identity is a column, compared as one so that the roll-ups' sort key
        // serves a host (the statement's text is chosen here from two names, never taken from
        // the request). Other keys: the profile's own label where it has the key, else its
        // samples'.
        let term = |samples: &str| match key.as_str() {
            "agent" | "host" => format!("{key} = v{i}"),
            _ => format!("if(has(label_keys, k{i}), label_values[indexOf(label_keys, k{i})] = v{i}, {samples})"),
        };
        let sample_term = term(&format!("has(sample_keys, k{i}) AND sample_values[indexOf(sample_keys, k{i})] = v{i}"));
        samples.push(sample_term.clone());
        rollups.push(sample_term);
        for conditions in [&mut whole, &mut whole_rollups, &mut selected] {
            conditions.push(term("1"));
        }
    }
    Ok(Bound {
        with: with.join(", "),
        samples: samples.join(" AND "),
        rollups: rollups.join(" AND "),
        profiles,
        selected: selected.join(" AND "),
        whole_profiles: [whole.join(" AND "), whole_rollups.join(" AND ")],
        external: vec![
            External { name: "args", structure: "kind String, group_by String", rows: args },
            External { name: "terms", structure: "n UInt32, key String, value String", rows: terms },
            External { name: "parts", structure: "level UInt64, bucket UInt64, build UInt64", rows: read_parts },
        ],
    })
}

/// A label's value for a row of the samples table: the profile's where it has the label
/// (agent, host, its own labels), else the sample's, else "[none]".
pub const GROUP_VALUE: &str = "multiIf(the_group = 'agent', agent, the_group = 'host', host, \
has(label_keys, the_group), label_values[indexOf(label_keys, the_group)], \
has(sample_keys, the_group), sample_values[indexOf(sample_keys, the_group)], '[none]')";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_ranges_are_spelled_out_up_to_a_bound_and_then_spanned() {
        assert_eq!(starts_in_any(&[]), "0");
        let two = starts_in_any(&[(0, 60), (120, 180)]);
        assert_eq!(two, format!("(({}) OR ({}))", starts_in(0, 60), starts_in(120, 180)));
        let many: Vec<(u64, u64)> = (0..MAX_RAW_RANGES as u64 + 1).map(|i| (i * 120, i * 120 + 60)).collect();
        assert_eq!(starts_in_any(&many), starts_in(0, MAX_RAW_RANGES as u64 * 120 + 60));
    }
}
