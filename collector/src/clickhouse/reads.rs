//! The queries, answered where the data is: a merged selection is one GROUP BY over the
//! sample rows (stack and labels) and one read of the stacks it names; a time series sums per
//! second and group; label values come from one GROUP BY, capped per name by LIMIT BY.
use std::{collections::BTreeMap, time::Instant};

use anyhow::{ensure, Result};
use ember_proto::pprof::{Profile, ValueType};

use super::{
    client::External,
    row_binary::{Reader, Writer},
    select::{bind, Bound, GROUP_VALUE},
    stacks::{Builder, SampleLabels, Stack},
    ClickHouse,
};
use crate::store::{Labels, Points, Selection, MAX_VALUES};

impl ClickHouse {
    /// The selection merged into one profile, and how many profiles it holds; None if none.
    pub(super) fn merged(&self, selection: &Selection, deadline: Option<Instant>) -> Result<Option<(Profile, usize)>> {
        let db = &self.database;
        let bound = bind(db, selection, "")?;
        let (with, filter) = (&bound.with, &bound.samples);
        let answer = self.client.query(
            &format!("WITH {with} SELECT uniqExact(origin, sequence), min(start_ns), max(end_ns) FROM {db}.samples WHERE {filter} FORMAT RowBinary"),
            &bound.external,
            deadline,
        )?;
        let mut r = Reader(&answer);
        let (count, start, end) = (r.u64()?, r.u64()?, r.u64()?);
        if count == 0 {
            return Ok(None);
        }
        let mut builder = Builder::default();
        self.describe(&mut builder, &bound, deadline)?;
        let rows = self.client.query(
            &format!(
                "WITH {with} SELECT stack, sample_keys, sample_values, sample_num_keys, sample_nums, sumForEach(values), \
sumForEach(arrayMap(x -> toFloat64(x), values)) FROM {db}.samples \
WHERE {filter} GROUP BY stack, sample_keys, sample_values, sample_num_keys, sample_nums FORMAT RowBinary"
            ),
            &bound.external,
            deadline,
        )?;
        let mut merged = Vec::new();
        let mut r = Reader(&rows);
        while !r.is_empty() {
            let stack = r.u64()?;
            let labels = SampleLabels { keys: r.strs()?, values: r.strs()?, num_keys: r.strs()?, nums: r.i64s()? };
            let values = r.i64s()?;
            // ClickHouse sums Int64 with wrap-around: the same sums in floating point tell.
            for _ in 0..r.length()? {
                ensure!(r.f64()?.abs() < i64::MAX as f64, "sample values overflow when merged");
            }
            merged.push((stack, labels, values));
        }
        self.stacks(&mut builder, merged.iter().map(|row| row.0), deadline)?;
        for (stack, labels, values) in merged {
            builder.sample(stack, &labels, values)?;
        }
        builder.profile.time_nanos = start as i64;
        builder.profile.duration_nanos = end.saturating_sub(start) as i64;
        Ok(Some((builder.profile, count as usize)))
    }

    /// Sets the sample types and period of the selection's profiles, which must agree.
    fn describe(&self, builder: &mut Builder, bound: &Bound, deadline: Option<Instant>) -> Result<()> {
        let answer = self.client.query(
            &format!(
                "SELECT sample_types, sample_units, any(period_type), any(period_unit), any(period) FROM {}.profiles WHERE {} \
GROUP BY sample_types, sample_units LIMIT 2 FORMAT RowBinary",
                self.database, bound.profiles
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
        let bound = bind(db, selection, group_by.unwrap_or(""))?;
        let (with, filter) = (&bound.with, &bound.samples);
        let group = if group_by.is_some() { GROUP_VALUE } else { "'total'" };
        let index = value + 1;
        let answer = self.client.query(
            &format!(
                "WITH {with} SELECT intDiv(start_ns, 1000000000) AS second, intDiv(end_ns - start_ns, 1000000000) AS length, {group} AS name, \
sum(values[{index}]) FROM {db}.samples WHERE {filter} GROUP BY second, length, name ORDER BY second, length FORMAT RowBinary"
            ),
            &bound.external,
            deadline,
        )?;
        let mut points: Vec<(u64, u64, BTreeMap<String, i64>)> = Vec::new();
        let mut r = Reader(&answer);
        while !r.is_empty() {
            let (second, length, name, total) = (r.u64()?, r.u64()?, r.str()?, r.i64()?);
            match points.last_mut() {
                Some(last) if (last.0, last.1) == (second, length) => {
                    last.2.insert(name, total);
                }
                _ => points.push((second, length, BTreeMap::from([(name, total)]))),
            }
        }
        let counted = self.client.query(
            &format!("WITH {with} SELECT uniqExact(origin, sequence) FROM {db}.samples WHERE {filter} FORMAT RowBinary"),
            &bound.external,
            deadline,
        )?;
        let unit = self.unit(&bound, value, deadline)?;
        Ok(Points { points, unit, profiles: Reader(&counted).u64()? as usize })
    }

    /// The unit of sample value `value` in the selection's profiles.
    fn unit(&self, bound: &Bound, value: usize, deadline: Option<Instant>) -> Result<String> {
        let answer = self.client.query(
            &format!("SELECT any(sample_units[{}]) FROM {}.profiles WHERE {} FORMAT RowBinary", value + 1, self.database, bound.profiles),
            &bound.external,
            deadline,
        )?;
        Reader(&answer).str()
    }

    /// Label names and values: the profiles' own over the range, the samples' over its last
    /// minute; at most MAX_VALUES (plus one, to tell truncation) per name.
    pub(super) fn labels(&self, kind: &str, range: (u64, u64), deadline: Instant) -> Result<Labels> {
        let db = &self.database;
        let selector = BTreeMap::new();
        let bound = bind(db, &Selection { kind, selector: &selector, range }, "")?;
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
                "SELECT agent, sequence, kind, start_ns, samples FROM {db}.profiles WHERE (origin, sequence, attempt) IN \
(SELECT origin, sequence, min(attempt) FROM {db}.profiles GROUP BY origin, sequence) ORDER BY start_ns, origin, sequence FORMAT RowBinary"
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
