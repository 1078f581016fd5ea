//! Storing profiles exactly once across any number of collectors: a profile whose (origin,
//! sequence) is stored already, or is below the origin's watermark, is a duplicate; two
//! collectors storing the same profile at once (an agent that timed out on one and resent to
//! another) write two copies under different attempts, and every read keeps one. A copy's
//! stacks and samples go in before its profile row, which makes it readable.
use std::{
    collections::HashSet,
    hash::{BuildHasher, Hasher},
    sync::atomic::{AtomicU64, Ordering},
};

use anyhow::Result;
use ember_proto::{ember::AgentIdentity, pprof};

use super::{
    client::External,
    row_binary::{Reader, Writer},
    stacks::rows,
    ClickHouse,
};
use crate::{
    service::MAX_DECOMPRESSED,
    store::{origin, Checked, Stored},
};

/// A gap's far side is looked at this far, no further, in one push.
const MAX_AHEAD: u64 = 100_000;

/// The rows of one push, per table.
#[derive(Default)]
struct Batch {
    stacks: Writer,
    samples: Writer,
    profiles: Writer,
    /// (day, stack) written in this batch.
    written: HashSet<(u64, u64)>,
}

impl Batch {
    fn add(&mut self, agent: &AgentIdentity, origin: &str, attempt: u64, profile: &ember_proto::ember::Profile, pprof: &pprof::Profile, totals: &[i64]) {
        let start = profile.start_unix_nanos.max(0) as u64;
        let mut labels: Vec<(&String, &String)> = profile.labels.iter().collect();
        labels.sort_unstable();
        let key = |w: &mut Writer| {
            w.date(start).u64(start).u64(profile.end_unix_nanos.max(0) as u64).str(&profile.kind).str(origin).u64(profile.sequence).u64(attempt);
            w.str(&agent.agent_id).str(&agent.hostname);
            w.strs(labels.iter().map(|l| l.0.as_str())).strs(labels.iter().map(|l| l.1.as_str()));
        };
        let rows = rows(pprof);
        let day = start / 86_400_000_000_000;
        for (hash, stack) in &rows.stacks {
            if self.written.insert((day, *hash)) {
                self.stacks.date(start).u64(*hash);
                stack.write(&mut self.stacks);
            }
        }
        for (stack, sample_labels, values) in &rows.samples {
            key(&mut self.samples);
            let w = &mut self.samples;
            w.strs(sample_labels.keys.iter().map(String::as_str)).strs(sample_labels.values.iter().map(String::as_str));
            w.strs(sample_labels.num_keys.iter().map(String::as_str)).i64s(&sample_labels.nums);
            w.u64(*stack).i64s(values);
        }
        key(&mut self.profiles);
        let s = |i: i64| ember_pprof::string(&pprof.string_table, i);
        let w = &mut self.profiles;
        w.strs(pprof.sample_type.iter().map(|t| s(t.r#type))).strs(pprof.sample_type.iter().map(|t| s(t.unit)));
        let period = pprof.period_type.unwrap_or_default();
        w.str(s(period.r#type)).str(s(period.unit)).i64(pprof.period).i64s(totals).u64(rows.samples.len() as u64);
    }
}

impl ClickHouse {
    pub(super) fn put(&self, agent: &AgentIdentity, profiles: &[Checked]) -> Result<Stored> {
        let origin = origin(agent);
        let horizon = self.horizon.load(Ordering::Relaxed);
        let through = self.watermark(&origin)?;
        let present = self.present(&origin, profiles.iter().map(|c| c.profile.sequence).filter(|&s| s > through))?;
        let attempt = attempt_id();
        let (mut batch, mut taken, mut result) = (Batch::default(), HashSet::new(), Stored::default());
        for Checked { profile, totals } in profiles {
            result.held.push(profile.sequence);
            let start = profile.start_unix_nanos.max(0) as u64;
            if start < horizon || profile.sequence <= through || present.contains(&profile.sequence) || !taken.insert(profile.sequence) {
                result.duplicates += 1;
                continue;
            }
            // Checked at ingest already: this decode succeeds.
            let pprof = ember_pprof::decode_gzip(&profile.pprof_gzip, MAX_DECOMPRESSED)?;
            batch.add(agent, &origin, attempt, profile, &pprof, totals);
        }
        if !taken.is_empty() {
            let db = &self.database;
            for (table, rows) in [("stacks", batch.stacks), ("samples", batch.samples)] {
                if !rows.0.is_empty() {
                    self.client.insert(&format!("INSERT INTO {db}.{table}"), rows)?;
                }
            }
            self.client.insert(&format!("INSERT INTO {db}.profiles"), batch.profiles)?;
        }
        result.stored_through = self.advance(&origin, through)?;
        Ok(result)
    }

    /// Highest N such that 1..=N of this origin are stored (as last recorded).
    pub(super) fn watermark(&self, origin: &str) -> Result<u64> {
        let answer = self.client.query(
            &format!("SELECT max(through) FROM {}.watermarks WHERE origin = (SELECT origin FROM args) FORMAT RowBinary", self.database),
            &[args(origin)],
            None,
        )?;
        Reader(&answer).u64()
    }

    /// Which of these sequences of the origin are stored.
    fn present(&self, origin: &str, sequences: impl Iterator<Item = u64>) -> Result<HashSet<u64>> {
        let mut wanted = Writer::default();
        for sequence in sequences {
            wanted.u64(sequence);
        }
        let answer = self.client.query(
            &format!(
                "SELECT DISTINCT sequence FROM {}.profiles WHERE origin = (SELECT origin FROM args) AND sequence IN (SELECT sequence FROM wanted) FORMAT RowBinary",
                self.database
            ),
            &[args(origin), External { name: "wanted", structure: "sequence UInt64", rows: wanted }],
            None,
        )?;
        let mut r = Reader(&answer);
        let mut found = HashSet::new();
        while !r.is_empty() {
            found.insert(r.u64()?);
        }
        Ok(found)
    }

    /// Moves the origin's watermark over the sequences stored after it without a gap.
    fn advance(&self, origin: &str, mut through: u64) -> Result<u64> {
        let answer = self.client.query(
            &format!(
                "SELECT DISTINCT sequence FROM {}.profiles WHERE origin = (SELECT origin FROM args) AND sequence > {through} \
AND sequence <= {} ORDER BY sequence FORMAT RowBinary",
                self.database,
                through.saturating_add(MAX_AHEAD)
            ),
            &[args(origin)],
            None,
        )?;
        let (start, mut r) = (through, Reader(&answer));
        while !r.is_empty() && r.u64()? == through + 1 {
            through += 1;
        }
        if through > start {
            let mut row = Writer::default();
            row.str(origin).u64(through);
            self.client.insert(&format!("INSERT INTO {}.watermarks", self.database), row)?;
        }
        Ok(through)
    }
}

/// The origin as the `args` table.
fn args(origin: &str) -> External<'static> {
    let mut rows = Writer::default();
    rows.str(origin);
    External { name: "args", structure: "origin String", rows }
}

/// An id for one collector's copy of a push: distinct across collectors and pushes.
fn attempt_id() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish()
}
