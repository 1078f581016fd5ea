//! Label names and values over a range, for the web UI's selector completion: every profile's
//! own labels (agent, host, static labels), and the sample labels (comm, pod, ...) of the
//! latest few profiles or roll-ups, since reading those means decoding them. Values are
//! capped per name so that a label such as a thread id cannot make the answer unbounded.
use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    time::Instant,
};

use anyhow::Result;
use serde::Serialize;

use crate::{
    query,
    store::{Detail, Store},
};

/// Profiles, the latest of the range, whose sample labels are read.
const SAMPLED_PROFILES: usize = 16;
/// Values kept per label name; beyond them the name is marked as truncated.
pub const MAX_VALUES: usize = 200;

#[derive(Serialize, Default, Debug)]
pub struct Labels {
    /// Name -> its values, sorted.
    pub labels: BTreeMap<String, BTreeSet<String>>,
    /// Names with more values than MAX_VALUES.
    pub truncated: BTreeSet<String>,
}

impl Labels {
    fn add(&mut self, name: &str, value: &str) {
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

/// The labels of the `kind` profiles of [from, to) (unix ns).
pub fn labels(store: &Store, kind: &str, range: (u64, u64), deadline: Instant) -> Result<Labels> {
    let mut found = Labels::default();
    let mut latest = VecDeque::with_capacity(SAMPLED_PROFILES);
    query::scan_matching(store, kind, &BTreeMap::new(), range, Detail::RollUps, Some(deadline), |stored, _| {
        for key in ["agent", "host"] {
            found.add(key, query::profile_label(&stored, key).unwrap_or(""));
        }
        for (name, value) in &stored.profile.as_ref().expect("matched").labels {
            found.add(name, value);
        }
        if latest.len() == SAMPLED_PROFILES {
            latest.pop_front();
        }
        latest.push_back(stored);
        Ok(())
    })?;
    for stored in latest {
        let Some(profile) = query::decoded(&stored, &[])? else { continue };
        let text = |i: i64| ember_pprof::string(&profile.string_table, i);
        for label in profile.sample.iter().flat_map(|s| &s.label).filter(|l| l.num == 0) {
            found.add(text(label.key), text(label.str));
        }
    }
    Ok(found)
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
