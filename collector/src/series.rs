//! Time series of a selection: its total per step over a range, optionally one line per value
//! of a "group by" label (a profile's label, such as host, or a sample's, such as pod), for the
//! web UI's chart. Lines beyond the heaviest few are summed into one.
use std::{
    collections::{BTreeMap, HashMap},
    time::Instant,
};

use anyhow::Result;
use ember_proto::pprof::Profile;
use serde::Serialize;

use crate::{
    embedded::{Detail, EmbeddedStore},
    query::{self, profile_label, NS},
    store::{origin, Point, Points, ProfileStore, Selection},
};

/// Lines a grouped series shows before the rest are summed as "other".
pub const MAX_GROUPS: usize = 10;
/// Points a line may have: the step grows with the range to stay within it.
pub const MAX_POINTS: u64 = 600;

#[derive(Serialize, Debug, PartialEq)]
pub struct Series {
    /// Unix seconds of the first step, and the step's length.
    pub from: u64,
    pub step: u64,
    /// Unit of the values ("nanoseconds", "count", "bytes", ...).
    pub unit: String,
    pub profiles: usize,
    pub lines: Vec<Line>,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct Line {
    /// The group's label value; "total" without a group.
    pub name: String,
    /// One value per step; a step without profiles is 0.
    pub values: Vec<i64>,
}

/// The step for a range of `seconds`: at least `wanted` (if given) and 1 s, and long enough
/// for at most MAX_POINTS points.
pub fn step(seconds: u64, wanted: Option<u64>) -> u64 {
    wanted.unwrap_or(1).max(1).max(seconds.div_ceil(MAX_POINTS))
}

/// The selection's totals of sample value `value` per step of [from, to) (unix seconds). The
/// step is at least `step`, and at least the profiles' usual length: a shorter one would
/// alternate between a profile's total and nothing.
#[allow(clippy::too_many_arguments)]
pub fn series(
    store: &dyn ProfileStore,
    kind: &str,
    selector: &BTreeMap<String, String>,
    (from, to): (u64, u64),
    step: u64,
    value: usize,
    group_by: Option<&str>,
    deadline: Option<Instant>,
) -> Result<Series> {
    let selection = Selection { kind, selector, range: (from.saturating_mul(NS), to.saturating_mul(NS)) };
    let Points { points: found, unit, profiles } = store.points(&selection, value, group_by, deadline)?;
    let mut lengths: Vec<u64> = found.iter().map(|f| f.length).collect();
    lengths.sort_unstable();
    let step = step.max(lengths.get(lengths.len() / 2).copied().unwrap_or(1));
    let points = (to - from).div_ceil(step) as usize;
    let lines = lines(&found, from, step, points);
    Ok(Series { from, step, unit, profiles, lines })
}

/// The embedded store's points: each matching profile's totals, from those stored at ingest
/// unless its samples must be told apart.
pub fn points(store: &EmbeddedStore, selection: &Selection, value: usize, group_by: Option<&str>, deadline: Option<Instant>) -> Result<Points> {
    let mut found: Vec<Point> = Vec::new();
    // Whether the value is held (known once a profile is decoded): if so, each point keeps
    // its source.
    let (mut unit, mut held) = (String::new(), false);
    let holds = ember_pprof::kind_holds(selection.kind);
    query::scan_matching(store, selection.kind, selection.selector, selection.range, Detail::Profiles, deadline, |stored, sample_terms| {
        // The group's key, and its value if the profile's own labels carry it.
        let group = group_by.map(|key| (key, profile_label(&stored, key)));
        // The totals stored at ingest answer unless samples must be told apart (profiles
        // stored before there were totals are decoded).
        let by_samples = !sample_terms.is_empty() || matches!(group, Some((_, None))) || stored.totals.len() <= value;
        let totals = if unit.is_empty() || by_samples {
            match query::decoded(&stored, sample_terms)? {
                Some(profile) => {
                    unit = ember_pprof::unit(&profile, value).to_string();
                    held = ember_pprof::held_values(&profile).get(value) == Some(&true);
                    by_samples.then(|| totals(&profile, value, group))
                }
                // None of its samples is selected; a held value's average still counts it.
                None if holds => Some(BTreeMap::new()),
                None => return Ok(()),
            }
        } else {
            None
        };
        let totals = totals.unwrap_or_else(|| BTreeMap::from([(group.and_then(|g| g.1).unwrap_or("total").to_string(), stored.totals[value])]));
        let profile = stored.profile.as_ref().expect("matched");
        let start = profile.start_unix_nanos.max(0) as u64;
        let length = (profile.end_unix_nanos.max(0) as u64).saturating_sub(start) / NS;
        let source = holds.then(|| origin(stored.agent.as_ref().expect("matched")));
        found.push(Point { start: start / NS, length, totals, source });
        Ok(())
    })?;
    if !held {
        found.iter_mut().for_each(|point| point.source = None);
    }
    Ok(Points { profiles: found.len(), points: found, unit })
}

/// A profile's totals by group (key, the profile's own value of it): all of it under
/// "total" without a group, or under the profile's value; else by each sample's value of the
/// key ("[none]" without).
fn totals(profile: &Profile, value: usize, group: Option<(&str, Option<&str>)>) -> BTreeMap<String, i64> {
    let text = |i: i64| ember_pprof::string(&profile.string_table, i);
    // The one group of the whole profile, there even if it has no samples.
    let whole = match group {
        None => Some("total"),
        Some((_, own)) => own,
    };
    let mut by_group: BTreeMap<String, i64> = whole.map(|name| (name.to_string(), 0)).into_iter().collect();
    for sample in &profile.sample {
        let name = whole.unwrap_or_else(|| {
            let key = group.map_or("", |g| g.0);
            sample.label.iter().find(|l| l.num == 0 && text(l.key) == key).map_or("[none]", |l| text(l.str))
        });
        let total: &mut i64 = by_group.entry(name.to_string()).or_default();
        *total = total.saturating_add(sample.value.get(value).copied().unwrap_or(0));
    }
    by_group
}

/// The lines of the profiles' totals by group: the MAX_GROUPS heaviest, heaviest first, and
/// the rest summed as "other", each with a value per step. The groups are weighed first and
/// only the lines shown get their points: a label with a million values costs a million
/// weights, not a million lines. A step holds the sum of each source's average for held
/// values, of all its profiles for the others.
fn lines(found: &[Point], from: u64, step: u64, points: usize) -> Vec<Line> {
    let mut weights: HashMap<&str, i64> = HashMap::new();
    for (group, total) in found.iter().flat_map(|point| &point.totals) {
        let weight = weights.entry(group).or_default();
        *weight = weight.saturating_add(*total);
    }
    let mut order: Vec<(&str, i64)> = weights.into_iter().collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let shown = if order.len() > MAX_GROUPS { MAX_GROUPS - 1 } else { order.len() };
    let line_of: HashMap<&str, usize> = order.iter().enumerate().map(|(i, &(group, _))| (group, i.min(shown))).collect();
    let mut lines: Vec<Line> = order[..shown].iter().map(|&(group, _)| Line { name: group.to_string(), values: vec![0; points] }).collect();
    if order.len() > shown {
        lines.push(Line { name: "other".into(), values: vec![0; points] });
    }
    // Held values: per (step, source), its profiles; per (step, line, source), their sum.
    let (mut profiles, mut held): (HashMap<(usize, &str), u64>, HashMap<(usize, usize, &str), i64>) = Default::default();
    for found in found {
        let point = ((found.start.saturating_sub(from) / step) as usize).min(points - 1);
        if let Some(source) = &found.source {
            *profiles.entry((point, source.as_str())).or_default() += 1;
        }
        for (group, total) in &found.totals {
            let value = match &found.source {
                Some(source) => held.entry((point, line_of[group.as_str()], source.as_str())).or_default(),
                None => &mut lines[line_of[group.as_str()]].values[point],
            };
            *value = value.saturating_add(*total);
        }
    }
    for ((point, line, source), sum) in held {
        let average = (sum as f64 / profiles[&(point, source)] as f64).round() as i64;
        let value = &mut lines[line].values[point];
        *value = value.saturating_add(average);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A point of one profile starting at `start`, 1 s long, with `total` in `group`.
    fn point(start: u64, group: &str, total: i64, source: Option<&str>) -> Point {
        Point { start, length: 1, totals: BTreeMap::from([(group.to_string(), total)]), source: source.map(String::from) }
    }

    /// Held values: two agents, the first with three profiles in a step of 3 s and the second
    /// with one, hold 100 and 40: the step shows 140, not the 340 their sum would.
    #[test]
    fn a_step_holds_each_sources_average_of_held_values() {
        let found = [point(0, "total", 90, Some("a")), point(1, "total", 100, Some("a")), point(2, "total", 110, Some("a")), point(2, "total", 40, Some("b"))];
        assert_eq!(lines(&found, 0, 3, 2)[0].values, [140, 0]);
        // Values that add up over time are summed.
        let found = found.map(|p| Point { source: None, ..p });
        assert_eq!(lines(&found, 0, 3, 2)[0].values, [340, 0]);
    }

    #[test]
    fn the_step_keeps_a_range_within_its_points() {
        assert_eq!(step(3600, None), 6);
        assert_eq!(step(600, Some(10)), 10);
        assert_eq!(step(60, None), 1);
    }

    #[test]
    fn lines_past_the_heaviest_are_summed_as_other() {
        // Group g{i} has i at the first point and 1 at the second.
        let found: Vec<_> = (0..12).flat_map(|i| [point(0, &format!("g{i:02}"), i, None), point(1, &format!("g{i:02}"), 1, None)]).collect();
        let lines = lines(&found, 0, 1, 2);
        assert_eq!(lines.len(), MAX_GROUPS);
        assert_eq!((lines[0].name.as_str(), lines[0].values.as_slice()), ("g11", &[11, 1][..]));
        // g00..g02 are the lightest three.
        assert_eq!((lines[9].name.as_str(), lines[9].values.as_slice()), ("other", &[3, 3][..]));
    }

    /// A label with 100,000 values over 600 points: lines for the ten shown, not for each
    /// value (that would be 480 MB).
    #[test]
    fn a_label_with_many_values_allocates_only_the_lines_shown() {
        let found: Vec<_> = (0..100_000).map(|i| point(i % 600, &format!("pod-{i}"), i as i64, None)).collect();
        let (lines, peak) = crate::allocations::peak_of(|| lines(&found, 0, 1, 600));
        assert_eq!(lines.len(), MAX_GROUPS);
        assert_eq!(lines[0].name, "pod-99999");
        assert!(peak < 32 << 20, "{} MiB allocated at the peak", peak >> 20);
    }
}
