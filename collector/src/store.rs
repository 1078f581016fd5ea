//! The collector's store, as ingest, pull and the query API see it: whichever keeps the
//! profiles, the embedded redb store (`embedded_store`, the default) or ClickHouse
//! (`clickhouse`, for fleets), stores each profile once and answers the same questions.
use std::{
    collections::{BTreeMap, BTreeSet},
    time::Instant,
};

use anyhow::Result;
use ember_proto::{
    ember::{AgentIdentity, Profile},
    pprof,
};
use serde::Serialize;

/// Where a profile's sequence number counts: its spool, or for agents that send no spool id,
/// the agent.
pub fn origin(agent: &AgentIdentity) -> String {
    match agent.spool_id {
        0 => agent.agent_id.clone(),
        id => format!("spool:{id:016x}"),
    }
}

/// A profile that passed the ingest checks, with the totals of its sample values.
pub struct Checked {
    pub profile: Profile,
    pub totals: Vec<i64>,
    /// Its pprof as the check decoded it, for a store that reads the samples (None: decode
    /// it there).
    pub decoded: Option<pprof::Profile>,
}

/// What a push achieved, as the agent is told.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Stored {
    pub stored_through: u64,
    pub duplicates: u32,
    /// The sequences of the request now held (stored now, or before).
    pub held: Vec<u64>,
}

/// What a query selects: one kind, the profiles and samples its selector matches (see
/// `query::parse_selector`), whose start lies in [from, to) (unix ns).
pub struct Selection<'a> {
    pub kind: &'a str,
    pub selector: &'a BTreeMap<String, String>,
    pub range: (u64, u64),
}

/// A share of a time series: the start and length (unix seconds) of the profiles it sums,
/// and their totals by group ("total" without a group).
pub struct Point {
    pub start: u64,
    pub length: u64,
    pub totals: BTreeMap<String, i64>,
    /// For held values (`ember_pprof::kind_holds`), the one source (`origin`) whose profile
    /// this is, so that a step averages each source's profiles; None where values add up.
    pub source: Option<String>,
}

/// The points of a selection, the unit of their values, and how many profiles they sum.
pub struct Points {
    pub points: Vec<Point>,
    pub unit: String,
    pub profiles: usize,
}

/// How many stored profiles a merged selection holds, and how many of them were read from
/// roll-ups (the rest, from the profiles themselves).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Merged {
    pub profiles: usize,
    pub rolled_up: usize,
}

impl Merged {
    pub fn add(&mut self, other: Merged) {
        self.profiles += other.profiles;
        self.rolled_up += other.rolled_up;
    }
}

/// Values kept per label name; beyond them the name is marked as truncated.
pub const MAX_VALUES: usize = 200;

/// Label names and values, for the web UI's selector completion. Values are capped per name so
/// that a label such as a thread id cannot make the answer unbounded.
#[derive(Serialize, Default, Debug)]
pub struct Labels {
    /// Name -> its values, sorted.
    pub labels: BTreeMap<String, BTreeSet<String>>,
    /// Names with more values than MAX_VALUES.
    pub truncated: BTreeSet<String>,
}

impl Labels {
    pub fn add(&mut self, name: &str, value: &str) {
        if value.is_empty() {
            return;
        }
        let values = self.labels.entry(name.to_string()).or_default();
        if values.len() < MAX_VALUES {
            values.insert(value.to_string());
        } else if !values.contains(value) {
            self.truncated.insert(name.to_string());
        }
    }
}

/// A put under way: stored, or waiting for the store's own inserting thread (ClickHouse's
/// gathered inserts), and finished once that answers. A push waits for it on the async
/// threads, not on a blocking thread of its own: a thousand pushes waiting took the blocking
/// pool's 512 threads, started and stopped them over and over, and queued the others' checks.
pub enum Putting {
    Stored(Stored),
    Waiting { stored: std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>>, finish: Box<dyn FnOnce() -> Stored + Send> },
}

impl Putting {
    pub async fn done(self) -> Result<Stored> {
        match self {
            Putting::Stored(stored) => Ok(stored),
            Putting::Waiting { stored, finish } => stored.await.map(|()| finish()),
        }
    }
}

/// Every store answers these; each is called on a blocking thread, and a query's work stops
/// with an error past its deadline.
pub trait ProfileStore: Send + Sync {
    /// Stores an agent's profiles exactly once: a profile of its spool stored before (by
    /// this collector or another over the same store) is counted as a duplicate.
    fn put(&self, agent: &AgentIdentity, profiles: &[Checked]) -> Result<Stored>;

    /// `put`, handing back what it would wait for (see `Putting`).
    fn start_put(&self, agent: &AgentIdentity, profiles: &[Checked]) -> Result<Putting> {
        self.put(agent, profiles).map(Putting::Stored)
    }

    /// Highest sequence N such that the profiles 1..=N of this agent's spool are all stored.
    fn stored_through(&self, agent: &AgentIdentity) -> Result<u64>;

    /// Hands `visit` the selection merged, in parts (the embedded store's records, or one
    /// profile merged where the data is); returns how many stored profiles they stand for.
    fn visit_merged(&self, selection: &Selection, deadline: Option<Instant>, visit: &mut dyn FnMut(pprof::Profile) -> Result<()>) -> Result<Merged>;

    /// The selection's totals of sample value `value` by the values of label `group_by`, at
    /// least per second of profile starts.
    fn points(&self, selection: &Selection, value: usize, group_by: Option<&str>, deadline: Option<Instant>) -> Result<Points>;

    /// The label names and values of the `kind` profiles of [from, to) (unix ns).
    fn labels(&self, kind: &str, range: (u64, u64), deadline: Instant) -> Result<Labels>;

    /// Deletes profiles that start before `oldest` (unix ns), and the oldest beyond
    /// `max_bytes` where the store bounds its own size; returns how many.
    fn enforce_retention(&self, oldest: u64, max_bytes: u64) -> Result<usize>;

    /// Whether the store can take profiles and answer queries now; the reason if not.
    fn ready(&self) -> Result<()>;

    /// Builds the roll-ups of time buckets that ended `delay` before `now` (unix ns); returns
    /// how many it built.
    fn roll_due(&self, now: u64, delay: u64) -> Result<usize>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_past_the_cap_mark_their_name() {
        let mut labels = Labels::default();
        for i in 0..MAX_VALUES + 1 {
            labels.add("tid", &i.to_string());
        }
        labels.add("host", "a");
        labels.add("host", "a");
        labels.add("pod", "");
        assert_eq!(labels.labels["tid"].len(), MAX_VALUES);
        assert_eq!(labels.truncated, BTreeSet::from(["tid".to_string()]));
        assert_eq!(labels.labels["host"].len(), 1);
        assert!(!labels.labels.contains_key("pod"));
    }
}
