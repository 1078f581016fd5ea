//! Storing profiles exactly once across any number of collectors: a profile whose (origin,
//! sequence) is stored already, or is below the origin's watermark, is a duplicate; two
//! collectors storing the same profile at once (an agent that timed out on one and resent to
//! another) write two copies under different attempts, and every read keeps one. A copy's
//! stacks and samples go in before its profile row, which makes it readable.
use std::{collections::HashSet, sync::atomic::Ordering};

use anyhow::Result;
use ember_pprof::FastMap;
use ember_proto::{ember::AgentIdentity, pprof};

use super::{
    client::External,
    row_binary::{Reader, Writer},
    stacks::{rows, Stack},
    unique_id, ClickHouse,
};
use super::FastSet;
use crate::{
    service::MAX_DECOMPRESSED,
    store::{origin, Checked, Putting, Stored},
};

/// A gap's far side is looked at this far, no further, in one push.
const MAX_AHEAD: u64 = 100_000;
/// (day, stack) pairs a collector remembers having stored (about 40 MB); past it, it forgets
/// them all and sends each stack once more.
const MAX_KNOWN_STACKS: usize = 1 << 20;
/// Origins whose watermark a collector remembers (some 100 bytes each); past it, it forgets
/// them all and asks ClickHouse again.
const MAX_CONTINUING: usize = 1 << 18;

/// The rows of one push, per table.
#[derive(Default)]
struct Batch {
    /// The push's stacks this collector has not stored before, by (day, hash).
    stacks: FastMap<(u64, u64), Stack>,
    samples: Writer,
    profiles: Writer,
}

impl Batch {
    fn add(&mut self, known: &FastSet<(u64, u64)>, agent: &AgentIdentity, origin: &str, attempt: u64, profile: &ember_proto::ember::Profile, pprof: &pprof::Profile, totals: &[i64]) {
        let start = profile.start_unix_nanos.max(0) as u64;
        let mut labels: Vec<(&String, &String)> = profile.labels.iter().collect();
        labels.sort_unstable();
        // The columns every row of the profile starts with, written once.
        let mut key = Writer::default();
        key.date(start).u64(start).u64(profile.end_unix_nanos.max(0) as u64).str(&profile.kind).str(origin).u64(profile.sequence).u64(attempt);
        key.str(&agent.agent_id).str(&agent.hostname);
        key.strs(labels.iter().map(|l| l.0.as_str())).strs(labels.iter().map(|l| l.1.as_str()));
        let day = start / 86_400_000_000_000;
        let rows = rows(pprof, &|hash| !known.contains(&(day, hash)) && !self.stacks.contains_key(&(day, hash)));
        let samples = rows.samples.len() as u64;
        for (hash, stack) in rows.stacks {
            self.stacks.entry((day, hash)).or_insert(stack);
        }
        for (stack, sample_labels, values) in &rows.samples {
            let w = &mut self.samples;
            w.0.extend_from_slice(&key.0);
            w.strs(sample_labels.keys.iter().map(String::as_str)).strs(sample_labels.values.iter().map(String::as_str));
            w.strs(sample_labels.num_keys.iter().map(String::as_str)).i64s(&sample_labels.nums);
            w.u64(*stack).i64s(values);
        }
        let s = |i: i64| ember_pprof::string(&pprof.string_table, i);
        let w = &mut self.profiles;
        w.0.extend_from_slice(&key.0);
        w.strs(pprof.sample_type.iter().map(|t| s(t.r#type))).strs(pprof.sample_type.iter().map(|t| s(t.unit)));
        let period = pprof.period_type.unwrap_or_default();
        w.str(s(period.r#type)).str(s(period.unit)).i64(pprof.period).i64s(totals).u64(samples);
    }

    /// The stacks table's rows, and their keys.
    fn new_stacks(&self) -> (Writer, Vec<(u64, u64)>) {
        let (mut rows, mut keys) = (Writer::default(), Vec::new());
        for (&(day, hash), stack) in &self.stacks {
            rows.date(day * 86_400_000_000_000).u64(hash);
            stack.write(&mut rows);
            keys.push((day, hash));
        }
        (rows, keys)
    }
}

impl ClickHouse {
    pub(super) fn start_put(&self, agent: &AgentIdentity, profiles: &[Checked]) -> Result<Putting> {
        let origin = origin(agent);
        let horizon = self.horizon.load(Ordering::Relaxed);
        let first = profiles.iter().map(|c| c.profile.sequence).min();
        // Taken out while this push is stored: another push of the origin at the same time
        // asks ClickHouse.
        let continued = self.continuing.lock().unwrap_or_else(|e| e.into_inner()).remove(&origin);
        let (through, stored) = match continued {
            Some(through) if first == through.checked_add(1) => (through, HashSet::new()),
            _ => {
                let through = self.watermark(&origin)?;
                (through, self.stored_after(&origin, through)?)
            }
        };
        let attempt = unique_id();
        let (mut batch, mut taken, mut result) = (Batch::default(), Vec::new(), Stored::default());
        let known = self.stacks_stored.read().unwrap_or_else(|e| e.into_inner());
        for Checked { profile, totals, decoded } in profiles {
            result.held.push(profile.sequence);
            let start = profile.start_unix_nanos.max(0) as u64;
            if start < horizon || profile.sequence <= through || stored.contains(&profile.sequence) || taken.contains(&profile.sequence) {
                result.duplicates += 1;
                continue;
            }
            let pprof = match decoded {
                Some(pprof) => std::borrow::Cow::Borrowed(pprof),
                None => std::borrow::Cow::Owned(ember_pprof::decode_gzip(&profile.pprof_gzip, MAX_DECOMPRESSED)?),
            };
            batch.add(&known, agent, &origin, attempt, profile, &pprof, totals);
            taken.push(profile.sequence);
        }
        drop(known);
        // The watermark moves over what is stored now, this push included, in the same
        // gathering as the push's rows and after them.
        let mut after = through;
        while stored.contains(&(after + 1)) || taken.contains(&(after + 1)) {
            after += 1;
        }
        let mut watermark = Writer::default();
        if after > through {
            watermark.str(&origin).u64(after);
        }
        let (stacks, new) = batch.new_stacks();
        let stored = self.inserts.gather([stacks, batch.samples, batch.profiles, watermark])?;
        let (known, continuing) = (self.stacks_stored.clone(), self.continuing.clone());
        let finish = move || {
            let mut known = known.write().unwrap_or_else(|e| e.into_inner());
            if known.len() > MAX_KNOWN_STACKS {
                known.clear();
            }
            known.extend(new);
            drop(known);
            let mut continuing = continuing.lock().unwrap_or_else(|e| e.into_inner());
            if continuing.len() >= MAX_CONTINUING {
                continuing.clear();
            }
            continuing.insert(origin, after);
            result.stored_through = after;
            result
        };
        Ok(Putting::Waiting { stored: Box::pin(stored), finish: Box::new(finish) })
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

    /// The origin's sequences stored after `through` (up to MAX_AHEAD after it), by this
    /// collector or another.
    fn stored_after(&self, origin: &str, through: u64) -> Result<HashSet<u64>> {
        let answer = self.client.query(
            &format!(
                "SELECT DISTINCT sequence FROM {}.profiles WHERE origin = (SELECT origin FROM args) AND sequence > {through} \
AND sequence <= {} FORMAT RowBinary",
                self.database,
                through.saturating_add(MAX_AHEAD)
            ),
            &[args(origin)],
            None,
        )?;
        let mut r = Reader(&answer);
        let mut found = HashSet::new();
        while !r.is_empty() {
            found.insert(r.u64()?);
        }
        Ok(found)
    }
}

/// The origin as the `args` table.
fn args(origin: &str) -> External<'static> {
    let mut rows = Writer::default();
    rows.str(origin);
    External { name: "args", structure: "origin String", rows }
}
