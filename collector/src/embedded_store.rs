//! The embedded store behind the collector's store interface: its queries read profiles and
//! roll-ups one record at a time and decode them here (`query`, `series`, `labels`), and its
//! roll-ups are built by `rollup`.
use std::{sync::Mutex, time::Instant};

use anyhow::Result;
use ember_proto::{ember::AgentIdentity, pprof};

use crate::{
    embedded::EmbeddedStore,
    labels, query,
    rollup::Roller,
    series,
    store::{Checked, Labels, Points, ProfileStore, Selection, Stored},
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

    fn visit_merged(&self, selection: &Selection, deadline: Option<Instant>, visit: &mut dyn FnMut(pprof::Profile) -> Result<()>) -> Result<usize> {
        query::visit_matching(&self.store, selection.kind, selection.selector, selection.range, deadline, |_, profile| visit(profile))
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
}
