//! Label names and values over a range, for the web UI's selector completion: every profile's
//! own labels (agent, host, static labels), and the sample labels (comm, pod, ...) of the
//! latest few profiles or roll-ups, since reading those means decoding them; the embedded
//! store's answer.
use std::{
    collections::{BTreeMap, VecDeque},
    time::Instant,
};

use anyhow::Result;

use crate::{
    embedded::{Detail, EmbeddedStore},
    query,
    store::Labels,
};

/// Profiles, the latest of the range, whose sample labels are read.
const SAMPLED_PROFILES: usize = 16;

/// The labels of the `kind` profiles of [from, to) (unix ns).
pub fn labels(store: &EmbeddedStore, kind: &str, range: (u64, u64), deadline: Instant) -> Result<Labels> {
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
