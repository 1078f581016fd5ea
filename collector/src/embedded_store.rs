//! The embedded store behind the collector's store interface: its queries read profiles and
//! roll-ups one record at a time and decode them here (`query`, `series`, `labels`), and its
//! roll-ups are built by `rollup`.
use std::{collections::HashMap, sync::Mutex, time::Instant};

use anyhow::Result;
use ember_proto::{ember::AgentIdentity, pprof};

use crate::{
    embedded::{Detail, EmbeddedStore},
    labels, query,
    rollup::Roller,
    series,
    store::{origin, Checked, Labels, Merged, Points, ProfileStore, Selection, Stored},
};

/// The redb store, and the roller's memory of the buckets it saw pending.
pub struct Embedded {
    pub store: EmbeddedStore,
    roller: Mutex<Roller>,
}

impl Embedded {
    pub fn new(store: EmbeddedStore) -> Embedded {
        Embedded { store, roller: Mutex::default() }
    }
}

impl ProfileStore for Embedded {
    fn put(&self, agent: &AgentIdentity, profiles: &[Checked]) -> Result<Stored> {
        self.store.put(agent, profiles)
    }

    fn stored_through(&self, agent: &AgentIdentity) -> Result<u64> {
        self.store.stored_through(agent)
    }

    fn visit_merged(&self, selection: &Selection, deadline: Option<Instant>, visit: &mut dyn FnMut(pprof::Profile) -> Result<()>) -> Result<Merged> {
        let (kind, selector, range) = (selection.kind, selection.selector, selection.range);
        if !ember_pprof::kind_holds(kind) {
            return query::visit_matching(&self.store, kind, selector, range, deadline, |_, profile| visit(profile));
        }
        // Held values are averaged over each agent's profiles: how many each has is counted
        // from the records alone (a sample selector leaves some out of the merge, not of the
        // average), and each agent's records are merged apart, then divided once.
        let mut counts: HashMap<String, u64> = HashMap::new();
        query::scan_matching(&self.store, kind, selector, range, Detail::RollUps, deadline, |stored, _| {
            *counts.entry(origin(stored.agent.as_ref().expect("matched"))).or_default() += stored.profiles();
            Ok(())
        })?;
        let mut agents: HashMap<String, Vec<pprof::Profile>> = HashMap::new();
        let count = query::visit_matching(&self.store, kind, selector, range, deadline, |stored, profile| {
            let parts = agents.entry(origin(stored.agent.as_ref().expect("matched"))).or_default();
            parts.push(profile);
            if parts.len() == query::CHUNK {
                *parts = vec![ember_pprof::merge(parts)?];
            }
            Ok(())
        })?;
        for (agent, parts) in agents {
            let mut merged = ember_pprof::merge(&parts)?;
            // A record a roll-up replaced between the two reads stands for the same profiles.
            ember_pprof::average_held(&mut merged, counts.get(&agent).copied().unwrap_or(1));
            visit(merged)?;
        }
        Ok(count)
    }

    fn points(&self, selection: &Selection, value: usize, group_by: Option<&str>, deadline: Option<Instant>) -> Result<Points> {
        series::points(&self.store, selection, value, group_by, deadline)
    }

    fn labels(&self, kind: &str, range: (u64, u64), deadline: Instant) -> Result<Labels> {
        labels::labels(&self.store, kind, range, deadline)
    }

    fn enforce_retention(&self, oldest: u64, max_bytes: u64) -> Result<usize> {
        self.store.enforce_retention(oldest, max_bytes)
    }

    /// The database is open for as long as the collector runs.
    fn ready(&self) -> Result<()> {
        Ok(())
    }

    fn roll_due(&self, now: u64, delay: u64) -> Result<usize> {
        self.roller.lock().unwrap_or_else(|e| e.into_inner()).roll_due(&self.store, now, delay)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ember_proto::{
        ember::Profile as Pushed,
        pprof::{Profile, Sample, ValueType},
    };

    use super::*;
    use crate::query::NS;

    #[test]
    fn the_step_is_at_least_the_profiles_length_and_totals_come_from_ingest() {
        let dir = std::env::temp_dir().join(format!("ember-series-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Embedded::new(EmbeddedStore::open(&dir).unwrap());
        let pprof = Profile {
            string_table: ["", "samples", "count"].map(String::from).to_vec(),
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            sample: vec![Sample { value: vec![1], ..Default::default() }],
            ..Default::default()
        };
        // Three 10 s profiles; the stored totals (5, 7, 9) are what the series reads.
        let profiles: Vec<Checked> = (0..3u64)
            .map(|i| {
                let start = (1000 + 10 * i as i64) * NS as i64;
                let profile = Pushed { sequence: i + 1, kind: "cpu".into(), start_unix_nanos: start, end_unix_nanos: start + 10 * NS as i64, pprof_gzip: ember_pprof::encode_gzip(&pprof), ..Default::default() };
                Checked { profile, totals: vec![5 + 2 * i as i64], decoded: None }
            })
            .collect();
        store.put(&AgentIdentity { agent_id: "a".into(), ..Default::default() }, &profiles).unwrap();
        let found = series::series(&store, "cpu", &BTreeMap::new(), (1000, 1030), 1, 0, None, None).unwrap();
        assert_eq!((found.step, found.profiles, found.unit.as_str()), (10, 3, "count"));
        assert_eq!(found.lines, [series::Line { name: "total".into(), values: vec![5, 7, 9] }]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Heap in-use through roll-ups: each agent's average, as from its raw profiles; what was
    /// allocated adds up.
    #[test]
    fn held_values_are_each_agents_average_through_roll_ups() {
        let dir = std::env::temp_dir().join(format!("ember-held-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Embedded::new(EmbeddedStore::open(&dir).unwrap());
        // An hour boundary: every level's buckets start here.
        const T0: u64 = 472_222 * 3600 * NS;
        let heap = |in_use: i64| Profile {
            string_table: ["", "alloc_space", "bytes", "inuse_space"].map(String::from).to_vec(),
            sample_type: vec![ValueType { r#type: 1, unit: 2 }, ValueType { r#type: 3, unit: 2 }],
            sample: vec![Sample { value: vec![7, in_use], ..Default::default() }],
            ..Default::default()
        };
        // Agent a: 12 profiles of 10 s holding 10, 20, ... 120 (65 on average); b: 6 holding 1000.
        for (agent, count, held) in [("a", 12, 10), ("b", 6, 0)] {
            let profiles: Vec<Checked> = (0..count)
                .map(|i| {
                    let (start, pprof) = ((T0 + i * 10 * NS) as i64, heap(if held > 0 { held * (i as i64 + 1) } else { 1000 }));
                    let profile = Pushed { sequence: i + 1, kind: "heap".into(), start_unix_nanos: start, end_unix_nanos: start + 10 * NS as i64, pprof_gzip: ember_pprof::encode_gzip(&pprof), ..Default::default() };
                    Checked { totals: ember_pprof::totals(&pprof), profile, decoded: None }
                })
                .collect();
            store.put(&AgentIdentity { agent_id: agent.into(), ..Default::default() }, &profiles).unwrap();
        }
        let selector = BTreeMap::new();
        let totals = |to: u64| {
            let (profile, count) = query::merged(&store, &Selection { kind: "heap", selector: &selector, range: (T0, to) }, None).unwrap().unwrap();
            (ember_pprof::totals(&profile), count)
        };
        let raw = totals(T0 + 3 * 60 * NS);
        assert_eq!(raw, (vec![18 * 7, 65 + 1000], 18));
        // Rolled up (two rounds: a bucket is built once it did not change since the last).
        let now = T0 + 3 * 3600 * NS;
        store.roll_due(now, 60 * NS).unwrap();
        assert!(store.roll_due(now, 60 * NS).unwrap() > 0, "nothing rolled up");
        // By minute roll-ups, and by the hour's.
        assert_eq!(totals(T0 + 3 * 60 * NS), raw);
        assert_eq!(totals(T0 + 3600 * NS), raw);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
