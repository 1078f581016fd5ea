//! Building roll-ups: once a minute, ten minutes or hour has ended and the delay for its last
//! profiles has passed, its samples are summed per agent, kind, profile labels, sample labels
//! and stack into the rollups table, by one INSERT ... SELECT that runs where the data is.
//! Not by materialized views: a view sums every row inserted, and two collectors storing one
//! profile at once insert two copies of it (see `ingest`), of which reads keep one. A build
//! sums one copy of each profile, and then records how many profiles the bucket held when it
//! began, which tells queries whether it holds them all (`plan`).
//!
//! Any collector builds what is due, so none is needed for it; two that build one bucket at
//! once make two equal builds, and reads take one. Each level is built from the samples, so a
//! build depends on no other being complete.
use std::{collections::HashMap, time::Instant};

use anyhow::Result;

use super::{
    row_binary::{Reader, Writer},
    schema::{one_copy, starts_in},
    unique_id, ClickHouse,
};
use crate::buckets::{bucket, LEVELS};

/// Buckets that ended longer ago than this are not built: a profile that arrives later than
/// that after its bucket ended is read raw with its bucket's other profiles.
const LOOKBACK: u64 = 24 * 3600 * 1_000_000_000;
/// A round builds for this long at most; the next round goes on.
const ROUND: std::time::Duration = std::time::Duration::from_secs(5);

/// What a group of roll-up rows shares: one agent's profiles of one kind and labels.
pub const GROUP: &str = "kind, origin, agent, host, label_keys, label_values";
/// What a roll-up row sums over: the samples of one stack and sample labels.
const SUMMED_BY: &str = "sample_keys, sample_values, sample_num_keys, sample_nums, stack";
/// Roll-up rows that sum a bucket's agents together (one group per kind, with no origin,
/// agent, host or labels, and no profiles of its own): what a question about the whole fleet
/// reads, a fraction of the per-agent rows where hosts share their stacks.
pub const FLEET: &str = "origin = ''";
/// The per-agent roll-up rows.
pub const PER_AGENT: &str = "origin != ''";

impl ClickHouse {
    /// Builds the roll-ups of the buckets that ended `delay` before `now` (unix ns), within
    /// LOOKBACK, and that no complete build covers; returns how many it built. A bucket is
    /// built once it held as many profiles in two rounds in a row, so that a backlog (agents
    /// resending their spools after an outage) lands before it is built, not after each push.
    pub(super) fn roll_due(&self, now: u64, delay: u64) -> Result<usize> {
        let Some(due) = now.checked_sub(delay) else { return Ok(0) };
        let last_hour = LEVELS[LEVELS.len() - 1];
        let from = bucket(last_hour, due.saturating_sub(LOOKBACK));
        let coverage = self.coverage((from, due), None)?;
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let (mut now_seen, started, mut built) = (HashMap::new(), Instant::now(), 0);
        // The largest first: after an outage, they answer the most with the fewest builds.
        for &level in LEVELS.iter().rev() {
            // `from` starts a bucket of every level: each divides the next.
            for start in (from..due.saturating_sub(level).saturating_add(1)).step_by(level as usize) {
                let stored = coverage.profiles(level, start);
                if stored == 0 || coverage.complete(level, start).is_some() {
                    continue;
                }
                now_seen.insert((level, start), stored);
                if seen.get(&(level, start)) != Some(&stored) || started.elapsed() >= ROUND {
                    continue;
                }
                // A bucket that fails is tried again next round; the others go on.
                match self.build(level, start, stored) {
                    Ok(true) => built += 1,
                    Ok(false) => {}
                    Err(e) => tracing::warn!(level_seconds = level / 1_000_000_000, bucket = start, "rolling up a bucket failed: {e:#}"),
                }
            }
        }
        *seen = now_seen;
        Ok(built)
    }

    /// Builds one bucket's roll-ups, `stored` being the profiles it holds now: its per-agent
    /// rows first, the fleet's summed from them, then the build's row, which makes them
    /// readable; returns whether it made that row. A profile stored meanwhile may be in the
    /// rows or not: either way the bucket holds more than `stored`, so this build would not be
    /// read, and a later one is made.
    ///
    /// Before the row is written, the build is checked against the bucket as it is then: the
    /// same profiles, and every sample row of them summed. On replicas, which copy each table
    /// on its own, a replica may hold a profile's row before its samples, or a count and a
    /// build may come from two replicas (the first away, or back and behind); a build row
    /// claiming samples its rows lack would be read as complete.
    fn build(&self, level: u64, start: u64, stored: u64) -> Result<bool> {
        let db = &self.database;
        let build = unique_id();
        let range = starts_in(start, start + level);
        let chosen = one_copy(db, &range);
        let this_build = format!("{range} AND level = {level} AND bucket = {start} AND build = {build}");
        self.client.query(
            &format!(
                "INSERT INTO {db}.rollups (day, level, bucket, build, start_ns, end_ns, {GROUP}, profiles, {SUMMED_BY}, values, value_sums, sample_rows) \
SELECT bucket_day, {level}, {start}, {build}, first_ns, last_ns, {GROUP}, profiles, {SUMMED_BY}, summed, floats, summed_rows FROM \
(SELECT any(day) AS bucket_day, {GROUP}, {SUMMED_BY}, sumForEach(values) AS summed, sumForEach(arrayMap(x -> toFloat64(x), values)) AS floats, \
count() AS summed_rows FROM {db}.samples WHERE {range} AND {chosen} GROUP BY {GROUP}, {SUMMED_BY}) AS per_sample \
ANY LEFT JOIN (SELECT {GROUP}, uniqExact(sequence) AS profiles, min(start_ns) AS first_ns, max(end_ns) AS last_ns FROM {db}.profiles \
WHERE {range} GROUP BY {GROUP}) AS per_group USING ({GROUP})"
            ),
            &[],
            None,
        )?;
        self.client.query(
            &format!(
                "INSERT INTO {db}.rollups (day, level, bucket, build, start_ns, end_ns, {GROUP}, profiles, {SUMMED_BY}, values, value_sums, sample_rows) \
SELECT any(day), {level}, {start}, {build}, min(start_ns), max(end_ns), kind, '', '', '', emptyArrayString(), emptyArrayString(), toUInt64(0), \
{SUMMED_BY}, sumForEach(values), sumForEach(value_sums), sum(sample_rows) FROM {db}.rollups \
WHERE {this_build} AND {PER_AGENT} GROUP BY kind, {SUMMED_BY}"
            ),
            &[],
            None,
        )?;
        // Checked, and what the build holds per kind (the profiles of its groups, their first
        // start and last end: what a query without terms counts), in one statement, so that
        // on replicas both come from one replica's view. The agents' rows and the fleet's
        // must each sum every sample row: through a Distributed table the agents' rows may
        // reach their shards after the fleet's were summed from them.
        let checked = self.client.query(
            &format!(
                // Current releases make a scalar subquery Nullable: ifNull keeps each a UInt64.
                "SELECT ifNull((SELECT uniqExact(origin, sequence) FROM {db}.profiles WHERE {range}), toUInt64(0)), \
ifNull((SELECT sum(samples) FROM {db}.profiles WHERE {range} AND {chosen}), toUInt64(0)), \
sum(kind_rows), sum(fleet_rows), groupArray(kind), groupArray(kind_profiles), groupArray(first), groupArray(last) FROM \
(SELECT kind, sumIf(group_profiles, agents) AS kind_profiles, minIf(group_first, agents) AS first, maxIf(group_last, agents) AS last, \
sumIf(group_rows, agents) AS kind_rows, sumIf(group_rows, NOT agents) AS fleet_rows FROM \
(SELECT kind, ({PER_AGENT}) AS agents, any(profiles) AS group_profiles, min(start_ns) AS group_first, max(end_ns) AS group_last, \
sum(sample_rows) AS group_rows FROM {db}.rollups \
WHERE {this_build} GROUP BY {GROUP}) GROUP BY kind) \
FORMAT RowBinary"
            ),
            &[],
            None,
        )?;
        let mut r = Reader(&checked);
        let (now_stored, sample_rows, summed_rows, fleet_rows) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        if now_stored != stored || sample_rows != summed_rows || fleet_rows != summed_rows {
            tracing::debug!(
                level_seconds = level / 1_000_000_000, bucket = start, stored, now_stored, sample_rows, summed_rows, fleet_rows,
                "a bucket changed while it was built"
            );
            return Ok(false);
        }
        let (kinds, profiles, firsts, lasts) = (r.strs()?, r.u64s()?, r.u64s()?, r.u64s()?);
        // One row per kind; a build of nothing but empty profiles still says it was made.
        let mut rows = Writer::default();
        let held = kinds.iter().zip(profiles).zip(firsts).zip(lasts).map(|(((kind, profiles), first), last)| (kind.as_str(), profiles, first, last));
        for (kind, profiles, first, last) in held.chain(kinds.is_empty().then_some(("", 0, 0, 0))) {
            rows.date(start).u64(level).u64(start).u64(build).u64(stored).str(kind).u64(profiles).u64(first).u64(last);
        }
        self.client.insert(&format!("INSERT INTO {db}.builds"), rows)?;
        Ok(true)
    }
}
