//! The roller: builds the roll-ups of pending buckets once they are due (see `buckets`). A
//! bucket's profiles are grouped by everything a selector can match on (the agent, the kind,
//! the profile's labels) and each group is merged into one profile; sample labels are kept,
//! so sample-level selectors work on roll-ups as on profiles. A bucket is built from the
//! roll-ups of the level below where they exist, so ten minutes merge ten records per host,
//! not sixty.
use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use ember_proto::ember::Profile;
use prost::Message as _;

use crate::{
    buckets::LEVELS,
    query,
    embedded::{Detail, EmbeddedStore, StoredProfile},
};

/// What a group shares: the agent's identity (encoded), the kind, the labels (sorted).
type GroupKey = (Vec<u8>, String, Vec<(String, String)>);

/// Rolls up pending buckets once they are due and settled; called every few seconds.
#[derive(Default)]
pub struct Roller {
    /// The generation each due bucket had in the previous round.
    seen: HashMap<(u64, u64), u64>,
}

impl Roller {
    /// Rolls up every pending bucket that ended `delay` before `now` (unix ns) and did not
    /// change since the previous round, smallest level first; returns how many buckets it
    /// stored. The delay lets most of a bucket's profiles arrive first (an agent ships a
    /// profile when its interval ends); waiting for a quiet round lets a backlog (agents
    /// resending their spools after an outage) land before its buckets are built, not
    /// after every push of it. A profile that comes later undoes the roll-up, which is
    /// built again. A bucket that fails (logged) stays pending, and is read raw until then.
    pub fn roll_due(&mut self, store: &EmbeddedStore, now: u64, delay: u64) -> Result<usize> {
        let (mut stored, mut seen) = (0, HashMap::new());
        for level in LEVELS {
            let Some(last_due) = now.checked_sub(delay.saturating_add(level)) else { continue };
            for (bucket, generation) in store.pending(level, last_due + 1)? {
                seen.insert((level, bucket), generation);
                if self.seen.get(&(level, bucket)) != Some(&generation) {
                    continue;
                }
                let rollups = match build(store, level, bucket) {
                    Ok(rollups) => rollups,
                    Err(e) => {
                        tracing::warn!(level_seconds = level / query::NS, bucket, "rolling up a bucket failed: {e:#}");
                        continue;
                    }
                };
                let profiles = rollups.iter().map(StoredProfile::profiles).sum();
                stored += usize::from(store.save_rollups(level, bucket, generation, profiles, &rollups)?);
            }
        }
        self.seen = seen;
        Ok(stored)
    }
}

/// The roll-ups of one bucket, one per group.
fn build(store: &EmbeddedStore, level: u64, bucket: u64) -> Result<Vec<StoredProfile>> {
    // The bucket is pending, so not rolled up at its own level: this reads the levels below.
    let mut groups: BTreeMap<GroupKey, Vec<StoredProfile>> = BTreeMap::new();
    store.scan(bucket, bucket + level, Detail::RollUps, |stored| {
        let (Some(agent), Some(profile)) = (&stored.agent, &stored.profile) else { return Ok(()) };
        let mut labels: Vec<(String, String)> = profile.labels.clone().into_iter().collect();
        labels.sort_unstable();
        groups.entry((agent.encode_to_vec(), profile.kind.clone(), labels)).or_default().push(stored);
        Ok(())
    })?;
    groups.into_values().map(|members| merged(bucket, &members)).collect()
}

/// One group's members merged into a record that stands for all of them.
fn merged(bucket: u64, members: &[StoredProfile]) -> Result<StoredProfile> {
    let decoded = members.iter().filter_map(|m| query::decoded(m, &[]).transpose()).collect::<Result<Vec<_>>>()?;
    let pprof = ember_pprof::merge(&decoded)?;
    let first = members[0].profile.as_ref().expect("grouped");
    let end = members.iter().filter_map(|m| m.profile.as_ref()).map(|p| p.end_unix_nanos).max().unwrap_or(0);
    let profile = Profile {
        sequence: 0,
        kind: first.kind.clone(),
        start_unix_nanos: bucket as i64,
        end_unix_nanos: end,
        labels: first.labels.clone(),
        pprof_gzip: ember_pprof::encode_gzip(&pprof),
    };
    Ok(StoredProfile {
        agent: members[0].agent.clone(),
        profile: Some(profile),
        totals: ember_pprof::totals(&pprof),
        merged: members.iter().map(StoredProfile::profiles).sum(),
    })
}

#[cfg(test)]
mod tests {
    use ember_proto::{
        ember::AgentIdentity,
        pprof::{self, Function, Label, Line, Location, Sample, ValueType},
    };

    use super::*;
    use crate::{query::NS, store::Checked};

    /// An hour boundary: every level's buckets start here.
    const T0: u64 = 472_222 * 3600 * NS;
    const MINUTE: u64 = 60 * NS;
    /// The collector's default delay.
    const DELAY: u64 = MINUTE;

    /// A 10 s profile of `host`: main -> f{n} for a few n that change with `i`, each sample
    /// labelled with one of two pods.
    fn pprof(host: u64, i: u64) -> pprof::Profile {
        let mut strings: Vec<String> = ["", "samples", "count", "main", "pod"].map(String::from).to_vec();
        let mut functions = vec![Function { id: 1, name: 3, ..Default::default() }];
        let mut locations = vec![Location { id: 1, line: vec![Line { function_id: 1, ..Default::default() }], ..Default::default() }];
        let mut samples = Vec::new();
        for k in 0..3 {
            let n = (host * 7 + i * 3 + k) % 11;
            strings.push(format!("f{n}"));
            let id = k + 2;
            functions.push(Function { id, name: strings.len() as i64 - 1, ..Default::default() });
            locations.push(Location { id, line: vec![Line { function_id: id, ..Default::default() }], ..Default::default() });
            strings.push(format!("pod-{}", (n + i) % 2));
            let label = Label { key: 4, str: strings.len() as i64 - 1, ..Default::default() };
            samples.push(Sample { location_id: vec![id, 1], value: vec![1 + (i + k) as i64 % 5], label: vec![label] });
        }
        pprof::Profile { sample_type: vec![ValueType { r#type: 1, unit: 2 }], sample: samples, location: locations, function: functions, string_table: strings, ..Default::default() }
    }

    fn agent(host: u64) -> AgentIdentity {
        AgentIdentity { agent_id: format!("host-{host}"), hostname: format!("host-{host}"), ..Default::default() }
    }

    /// Host `host`'s profiles number `first..last` (10 s each from T0).
    fn push(store: &EmbeddedStore, host: u64, numbers: std::ops::Range<u64>) {
        let profiles: Vec<Checked> = numbers
            .map(|i| {
                let start = (T0 + i * 10 * NS) as i64;
                let pprof = pprof(host, i);
                let labels = HashMap::from([("service".to_string(), "api".to_string())]);
                let profile = Profile { sequence: i + 1, kind: "cpu".into(), start_unix_nanos: start, end_unix_nanos: start + 10 * NS as i64, labels, pprof_gzip: ember_pprof::encode_gzip(&pprof) };
                Checked { totals: ember_pprof::totals(&pprof), profile, decoded: None }
            })
            .collect();
        store.put(&agent(host), &profiles).unwrap();
    }

    /// The folded stacks (sorted) and profile count of a query over [from, to), through
    /// roll-ups where there are some (as queries read), and from the raw profiles alone.
    fn both_ways(store: &EmbeddedStore, selector: &str, from: u64, to: u64) -> [(Vec<String>, usize); 2] {
        let selector = query::parse_selector(selector).unwrap();
        let folded = |profile: &pprof::Profile| {
            let mut lines = ember_pprof::folded(profile, 0, &["pod"]).unwrap();
            lines.sort();
            lines
        };
        let mut rolled = Vec::new();
        let count = query::visit_matching(store, "cpu", &selector, (from, to), None, |_, profile| Ok(rolled.push(profile))).unwrap().profiles;
        let rolled = ember_pprof::merge(&rolled).unwrap();
        let mut raw = Vec::new();
        query::scan_matching(store, "cpu", &selector, (from, to), Detail::Profiles, None, |stored, terms| {
            raw.extend(query::decoded(&stored, terms)?);
            Ok(())
        })
        .unwrap();
        [(folded(&rolled), count), (folded(&ember_pprof::merge(&raw).unwrap()), raw.len())]
    }

    /// Records (roll-ups and profiles) a query over [from, to) reads.
    fn records(store: &EmbeddedStore, from: u64, to: u64) -> usize {
        let mut read = 0;
        store.scan(from, to, Detail::RollUps, |_| Ok(read += 1)).unwrap();
        read
    }

    /// Two rounds of a roller: the first sees the due buckets, the second builds those that
    /// did not change; returns what the second stored.
    fn roll_due(store: &EmbeddedStore, now: u64, delay: u64) -> Result<usize> {
        let mut roller = Roller::default();
        roller.roll_due(store, now, delay)?;
        roller.roll_due(store, now, delay)
    }

    fn fresh_store(name: &str) -> (EmbeddedStore, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("ember-rollup-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        (EmbeddedStore::open(&dir).unwrap(), dir)
    }

    #[test]
    fn queries_over_roll_ups_answer_what_the_raw_profiles_do() {
        let (store, dir) = fresh_store("equal");
        // 75 minutes of two hosts.
        for host in 0..2 {
            push(&store, host, 0..450);
        }
        let end = T0 + 75 * MINUTE;
        // Not yet due: the last minutes and the second hour, until DELAY after they end.
        assert_eq!(roll_due(&store, T0 + 59 * MINUTE, DELAY).unwrap(), 58 + 5);
        assert_eq!(roll_due(&store, end + DELAY, DELAY).unwrap(), (75 - 58) + (7 - 5) + 1);
        assert_eq!(roll_due(&store, end + DELAY, DELAY).unwrap(), 0, "nothing left pending");
        // The first hour is two records (one per host); the next 15 minutes, six per host
        // (ten minutes, then five one-minute roll-ups).
        assert_eq!(records(&store, T0, T0 + 60 * MINUTE), 2);
        assert_eq!(records(&store, T0, end), 2 + 2 * (1 + 5));
        // Ragged ranges, a profile selector and a sample selector.
        for (selector, from, to) in [
            ("", T0, end),
            ("", T0 + 35 * NS, T0 + 63 * MINUTE + 5 * NS),
            ("host=host-1", T0 + 9 * MINUTE, T0 + 71 * MINUTE),
            ("pod=pod-1", T0 + 125 * NS, end),
            ("service=api,pod=pod-0,host=host-0", T0, T0 + 21 * MINUTE),
        ] {
            let [rolled, raw] = both_ways(&store, selector, from, to);
            assert!(!raw.0.is_empty());
            assert_eq!(rolled, raw, "{selector:?} over [{from}, {to})");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_late_profile_undoes_its_buckets_roll_ups_until_they_are_built_again() {
        let (store, dir) = fresh_store("late");
        push(&store, 0, 0..120);
        push(&store, 1, 0..100);
        let now = T0 + 3 * 3600 * NS;
        roll_due(&store, now, DELAY).unwrap();
        assert_eq!(records(&store, T0, T0 + 20 * MINUTE), 2 + 2);
        // Host 1's profiles of 16:40 to 20:00 arrive late (a spool resent after an outage):
        // the query sees them at once, read raw beside the roll-ups still whole.
        push(&store, 1, 100..120);
        let [rolled, raw] = both_ways(&store, "", T0, T0 + 20 * MINUTE);
        assert_eq!((rolled.1, raw.1), (240, 240));
        assert_eq!(rolled, raw);
        assert!(records(&store, T0, T0 + 20 * MINUTE) > 4);
        // Rolled up again: the first ten minutes were not touched, the rest is rebuilt.
        assert_eq!(roll_due(&store, now, DELAY).unwrap(), 4 + 1 + 1);
        assert_eq!(records(&store, T0, T0 + 20 * MINUTE), 4);
        assert_eq!(both_ways(&store, "", T0, T0 + 20 * MINUTE)[0], raw);
        // A roll-up built while a profile arrived is not kept: the bucket stays pending.
        push(&store, 0, 120..121);
        let (bucket, generation) = store.pending(MINUTE, u64::MAX).unwrap()[0];
        push(&store, 1, 120..121);
        assert!(!store.save_rollups(MINUTE, bucket, generation, 1, &[]).unwrap());
        // A roller builds a bucket only after a round in which it did not change.
        let mut roller = Roller::default();
        assert_eq!(roller.roll_due(&store, now, DELAY).unwrap(), 0, "first seen");
        push(&store, 0, 121..122);
        assert_eq!(roller.roll_due(&store, now, DELAY).unwrap(), 0, "changed since");
        assert_eq!(roller.roll_due(&store, now, DELAY).unwrap(), 3, "minute 20, the ten minutes from 20, the hour");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn retention_takes_the_roll_ups_of_the_buckets_it_reaches() {
        let (store, dir) = fresh_store("retention");
        push(&store, 0, 0..180);
        roll_due(&store, T0 + 3 * 3600 * NS, DELAY).unwrap();
        assert_eq!(records(&store, T0, T0 + 30 * MINUTE), 3);
        // Retention deletes the profiles before 12:30: the buckets it reached (minutes 0 to
        // 12, and the first two ten-minute buckets) are read raw; the rest stay rolled up:
        // three profiles, minutes 13 to 19, and the ten minutes from 20.
        store.enforce_retention(T0 + 12 * MINUTE + 30 * NS, u64::MAX).unwrap();
        assert_eq!(records(&store, T0, T0 + 30 * MINUTE), 3 + 7 + 1);
        let [rolled, raw] = both_ways(&store, "", T0, T0 + 30 * MINUTE);
        assert_eq!((rolled.1, raw.1), (180 - 75, 180 - 75));
        assert_eq!(rolled, raw);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
