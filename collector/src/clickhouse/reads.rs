//! The queries, answered where the data is: a merged selection is one GROUP BY over its
//! complete roll-ups and the sample rows of the rest of its range (by stack and labels), and
//! one read of the stacks it names; a time series sums the sample rows per second and group;
//! label values come from one GROUP BY, capped per name by LIMIT BY.
use std::{
    collections::{BTreeMap, HashMap},
    time::Instant,
};

use anyhow::{ensure, Result};
use ember_proto::pprof::{Profile, ValueType};

use super::{
    client::External,
    plan::Read,
    rollups::GROUP,
    row_binary::{Reader, Writer},
    schema::one_copy,
    select::{bind, Bound, GROUP_VALUE},
    stacks::{Builder, SampleLabels, Stack},
    ClickHouse,
};
use crate::store::{Labels, Merged, Point, Points, Selection, MAX_VALUES};

/// The source of every row where rows are not told apart by agent. Not a constant column:
/// reading a replicated table through a Distributed one, ClickHouse 18.16 refuses a result
/// whose column is constant in one shard's stream and not in another's.
const NO_SOURCE: &str = "materialize('')";

impl ClickHouse {
    /// The selection merged into one profile, and how many profiles it holds; None if none.
    pub(super) fn merged(&self, selection: &Selection, deadline: Option<Instant>) -> Result<Option<(Profile, Merged)>> {
        let db = &self.database;
        let read = self.plan(selection.range, deadline)?;
        let bound = bind(db, selection, "", &read)?;
        let (with, raw, rolled) = (&bound.with, &bound.samples, &bound.rollups);
        // The profiles merged (those with a sample selected), and how many came from roll-ups:
        // a roll-up row says how many profiles its group (see `rollups`) holds. Without terms,
        // every group of the kind is selected, and its build said what they hold.
        let raw_counted = |source: &str, raw_profiles: &str, table: &str| {
            format!(
                "WITH {with} SELECT {source} AS source, materialize(toUInt64(0)) AS rolled, uniqExact(origin, sequence) AS n, min(start_ns) AS first_ns, \
max(end_ns) AS last_ns FROM {db}.{table} WHERE {raw_profiles} GROUP BY source"
            )
        };
        let counted = |source: &str, [raw_profiles, rolled_groups]: [&str; 2], table: &str| {
            format!(
                "SELECT * FROM ({} \
UNION ALL SELECT source, materialize(toUInt64(1)) AS rolled, sum(group_profiles) AS n, min(group_first) AS first_ns, max(group_last) AS last_ns FROM \
(WITH {with} SELECT {source} AS source, any(profiles) AS group_profiles, min(start_ns) AS group_first, max(end_ns) AS group_last \
FROM {db}.rollups WHERE {rolled_groups} GROUP BY source, level, bucket, {GROUP}) GROUP BY source) \
FORMAT RowBinary",
                raw_counted(source, raw_profiles, table)
            )
        };
        let (mut count, mut start, mut end) = (Merged::default(), u64::MAX, 0);
        let answer = if !selection.selector.is_empty() {
            self.client.query(&counted(NO_SOURCE, [raw, rolled], "samples"), &bound.external, deadline)?
        } else {
            if let Some(held) = read.held.get(selection.kind) {
                let profiles = held.profiles as usize;
                count.add(Merged { profiles, rolled_up: profiles });
                (start, end) = (held.first_ns, held.last_ns);
            }
            match read.raw.is_empty() {
                true => Vec::new(),
                false => self.client.query(&format!("{} FORMAT RowBinary", raw_counted(NO_SOURCE, raw, "samples")), &bound.external, deadline)?,
            }
        };
        let mut r = Reader(&answer);
        while !r.is_empty() {
            let (_, rolled, profiles, first, last) = (r.str()?, r.u64()?, r.u64()? as usize, r.u64()?, r.u64()?);
            count.add(Merged { profiles, rolled_up: if rolled == 1 { profiles } else { 0 } });
            (start, end) = (start.min(first), end.max(last));
        }
        if count.profiles == 0 {
            return Ok(None);
        }
        // Held values are averaged over each source's profiles (see ember_pprof::kind_holds),
        // whether a sample of them is selected or not: they are counted, and the samples
        // summed, per source.
        let holds = ember_pprof::kind_holds(selection.kind);
        let source = if holds { "origin" } else { NO_SOURCE };
        let mut profiles_of = HashMap::new();
        if holds {
            let [whole_raw, whole_rolled] = &bound.whole_profiles;
            let answer = self.client.query(&counted(source, [whole_raw, whole_rolled], "profiles"), &bound.external, deadline)?;
            let mut r = Reader(&answer);
            while !r.is_empty() {
                let (source, _, profiles, _, _) = (r.str()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
                *profiles_of.entry(source).or_insert(0) += profiles;
            }
        }
        let mut builder = Builder::default();
        self.describe(&mut builder, &bound, deadline)?;
        let per_table = |table: &str, floats: &str, filter: &str| {
            format!(
                "WITH {with} SELECT {source} AS source, stack, sample_keys, sample_values, sample_num_keys, sample_nums, sumForEach(values) AS summed, \
sumForEach({floats}) AS floats FROM {db}.{table} WHERE {filter} GROUP BY source, stack, sample_keys, sample_values, sample_num_keys, sample_nums"
            )
        };
        let rows = self.client.query(
            &format!(
                "SELECT source, stack, sample_keys, sample_values, sample_num_keys, sample_nums, sumForEach(summed), sumForEach(floats) FROM \
({} UNION ALL {}) GROUP BY source, stack, sample_keys, sample_values, sample_num_keys, sample_nums FORMAT RowBinary",
                per_table("samples", "arrayMap(x -> toFloat64(x), values)", raw),
                per_table("rollups", "value_sums", rolled)
            ),
            &bound.external,
            deadline,
        )?;
        let held = ember_pprof::held_values(&builder.profile);
        let averages = held.contains(&true);
        let (mut merged, mut averaged) = (Vec::new(), HashMap::<(u64, SampleLabels), Vec<f64>>::new());
        let mut r = Reader(&rows);
        while !r.is_empty() {
            let source = r.str()?;
            let stack = r.u64()?;
            let labels = SampleLabels { keys: r.strs()?, values: r.strs()?, num_keys: r.strs()?, nums: r.i64s()? };
            let values = r.i64s()?;
            // ClickHouse sums Int64 with wrap-around: the same sums in floating point tell (kept
            // beside a roll-up's sums, which may have wrapped when it was built).
            for _ in 0..r.length()? {
                ensure!(r.f64()?.abs() < i64::MAX as f64, "sample values overflow when merged");
            }
            if averages {
                let profiles = profiles_of.get(&source).copied().unwrap_or(1).max(1) as f64;
                let sums = averaged.entry((stack, labels)).or_insert_with(|| vec![0.0; values.len()]);
                for ((sum, value), held) in sums.iter_mut().zip(&values).zip(held.iter().chain(std::iter::repeat(&false))) {
                    *sum += if *held { *value as f64 / profiles } else { *value as f64 };
                }
            } else {
                merged.push((stack, labels, values));
            }
        }
        merged.extend(averaged.into_iter().map(|((stack, labels), sums)| (stack, labels, sums.into_iter().map(|sum| sum.round() as i64).collect())));
        self.stacks(&mut builder, merged.iter().map(|row| row.0), deadline)?;
        for (stack, labels, values) in merged {
            builder.sample(stack, &labels, values)?;
        }
        builder.profile.time_nanos = start as i64;
        builder.profile.duration_nanos = end.saturating_sub(start) as i64;
        Ok(Some((builder.profile, count)))
    }

    /// Sets the sample types and period of the selection's profiles, which must agree.
    fn describe(&self, builder: &mut Builder, bound: &Bound, deadline: Option<Instant>) -> Result<()> {
        let answer = self.client.query(
            &format!(
                "WITH {} SELECT sample_types, sample_units, any(period_type), any(period_unit), any(period) FROM {}.profiles WHERE {} \
GROUP BY sample_types, sample_units LIMIT 2 FORMAT RowBinary",
                bound.with, self.database, bound.selected
            ),
            &bound.external,
            deadline,
        )?;
        let mut r = Reader(&answer);
        let (types, units) = (r.strs()?, r.strs()?);
        let (period_type, period_unit, period) = (r.str()?, r.str()?, r.i64()?);
        ensure!(r.is_empty(), "cannot merge profiles with different sample types");
        builder.profile.sample_type = types.iter().zip(&units).map(|(t, u)| ValueType { r#type: builder.string(t), unit: builder.string(u) }).collect();
        if !period_type.is_empty() || !period_unit.is_empty() {
            builder.profile.period_type = Some(ValueType { r#type: builder.string(&period_type), unit: builder.string(&period_unit) });
        }
        builder.profile.period = period;
        Ok(())
    }

    /// Makes the stacks of these hashes known to `builder` (a sample whose stack is missing
    /// is an error when it is added).
    fn stacks(&self, builder: &mut Builder, hashes: impl Iterator<Item = u64>, deadline: Option<Instant>) -> Result<()> {
        let mut rows = Writer::default();
        for hash in hashes {
            rows.u64(hash);
        }
        let external = [External { name: "wanted", structure: "stack UInt64", rows }];
        let answer = self.client.query(
            &format!(
                "SELECT stack, any(functions), any(files), any(lines), any(binaries), any(build_ids), any(addresses), any(locations) \
FROM {}.stacks WHERE stack IN (SELECT stack FROM wanted) GROUP BY stack FORMAT RowBinary",
                self.database
            ),
            &external,
            deadline,
        )?;
        let mut r = Reader(&answer);
        while !r.is_empty() {
            let hash = r.u64()?;
            builder.stack(hash, &Stack::read(&mut r)?);
        }
        Ok(())
    }

    /// Totals of sample value `value` per second of profile starts, profile length and group.
    pub(super) fn points(&self, selection: &Selection, value: usize, group_by: Option<&str>, deadline: Option<Instant>) -> Result<Points> {
        let db = &self.database;
        let bound = bind(db, selection, group_by.unwrap_or(""), &Read::raw(selection.range))?;
        let (with, filter) = (&bound.with, &bound.samples);
        let group = if group_by.is_some() { GROUP_VALUE } else { "'total'" };
        // Held values are averaged per source over a step: each source's points apart (one
        // profile of a source per start second).
        let (unit, holds) = self.value_type(&bound, value, deadline)?;
        let source = if holds { "origin" } else { NO_SOURCE };
        let index = value + 1;
        let answer = self.client.query(
            &format!(
                "WITH {with} SELECT intDiv(start_ns, 1000000000) AS second, intDiv(end_ns - start_ns, 1000000000) AS length, {source} AS source, \
{group} AS name, sum(values[{index}]) FROM {db}.samples WHERE {filter} GROUP BY second, length, source, name ORDER BY second, length, source \
FORMAT RowBinary"
            ),
            &bound.external,
            deadline,
        )?;
        let mut points: Vec<Point> = Vec::new();
        let mut r = Reader(&answer);
        while !r.is_empty() {
            let (start, length, source, name, total) = (r.u64()?, r.u64()?, r.str()?, r.str()?, r.i64()?);
            let source = holds.then_some(source);
            match points.last_mut() {
                Some(last) if (last.start, last.length, &last.source) == (start, length, &source) => {
                    last.totals.insert(name, total);
                }
                _ => points.push(Point { start, length, totals: BTreeMap::from([(name, total)]), source }),
            }
        }
        let counted = self.client.query(
            &format!("WITH {with} SELECT uniqExact(origin, sequence) FROM {db}.samples WHERE {filter} FORMAT RowBinary"),
            &bound.external,
            deadline,
        )?;
        Ok(Points { points, unit, profiles: Reader(&counted).u64()? as usize })
    }

    /// The unit of sample value `value` in the selection's profiles, and whether it is held.
    fn value_type(&self, bound: &Bound, value: usize, deadline: Option<Instant>) -> Result<(String, bool)> {
        let answer = self.client.query(
            &format!(
                "WITH {3} SELECT any(sample_units[{0}]), any(sample_types[{0}]) FROM {1}.profiles WHERE {2} FORMAT RowBinary",
                value + 1,
                self.database,
                bound.selected,
                bound.with
            ),
            &bound.external,
            deadline,
        )?;
        let mut r = Reader(&answer);
        Ok((r.str()?, ember_pprof::is_held(&r.str()?)))
    }

    /// Label names and values: the profiles' own over the range, the samples' over its last
    /// minute; at most MAX_VALUES (plus one, to tell truncation) per name.
    pub(super) fn labels(&self, kind: &str, range: (u64, u64), deadline: Instant) -> Result<Labels> {
        let db = &self.database;
        let selector = BTreeMap::new();
        let bound = bind(db, &Selection { kind, selector: &selector, range }, "", &Read::raw(range))?;
        let profiles = &bound.profiles;
        let cap = MAX_VALUES + 1;
        let answer = self.client.query(
            &format!(
                "SELECT k, v FROM (SELECT arrayConcat(['agent', 'host'], label_keys) AS ks, arrayConcat([agent, host], label_values) AS vs \
FROM {db}.profiles WHERE {profiles}) ARRAY JOIN ks AS k, vs AS v GROUP BY k, v ORDER BY k, v LIMIT {cap} BY k \
UNION ALL \
SELECT k, v FROM (SELECT sample_keys, sample_values FROM {db}.samples WHERE {profiles} \
AND start_ns >= (SELECT max(start_ns) FROM {db}.profiles WHERE {profiles}) - 60000000000) \
ARRAY JOIN sample_keys AS k, sample_values AS v GROUP BY k, v ORDER BY k, v LIMIT {cap} BY k FORMAT RowBinary"
            ),
            &bound.external,
            Some(deadline),
        )?;
        let mut found = Labels::default();
        let mut r = Reader(&answer);
        while !r.is_empty() {
            found.add(&r.str()?, &r.str()?);
        }
        Ok(found)
    }

    /// Hands `visit` each stored profile (one copy of each): agent, sequence, kind, start
    /// (unix ns) and sample rows, in time order; returns how many.
    pub fn list(&self, visit: &mut dyn FnMut(&str, u64, &str, u64, u64)) -> Result<usize> {
        let db = &self.database;
        let answer = self.client.query(
            &format!(
                "SELECT agent, sequence, kind, start_ns, samples FROM {db}.profiles WHERE {} ORDER BY start_ns, origin, sequence FORMAT RowBinary",
                one_copy(db, "1")
            ),
            &[],
            None,
        )?;
        let (mut r, mut count) = (Reader(&answer), 0);
        while !r.is_empty() {
            let (agent, sequence, kind, start, samples) = (r.str()?, r.u64()?, r.str()?, r.u64()?, r.u64()?);
            visit(&agent, sequence, &kind, start, samples);
            count += 1;
        }
        Ok(count)
    }
}
