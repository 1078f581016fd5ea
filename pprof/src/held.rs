//! Held values: sample types that tell what was held when a profile was taken (the heap's
//! `inuse_objects` and `inuse_space`, as Go's heap profiles name them), not what happened
//! during its interval. Over a range of time such a value is averaged over each source's
//! profiles and summed over the sources: the sum of six snapshots of the same memory would
//! show six times what is held.
use ember_proto::pprof::Profile;

use crate::string;

/// Whether sample type `name` is a held value.
pub fn is_held(name: &str) -> bool {
    matches!(name, "inuse_objects" | "inuse_space")
}

/// Whether profiles of `kind` carry held values: merging them over time needs the count of
/// each source's profiles.
pub fn kind_holds(kind: &str) -> bool {
    kind == "heap"
}

/// Per sample value of `profile`, whether it is held.
pub fn held_values(profile: &Profile) -> Vec<bool> {
    profile.sample_type.iter().map(|t| is_held(string(&profile.string_table, t.r#type))).collect()
}

/// Divides the held values of `profile`, the merge of a source's `profiles` over a range, by
/// that count (to the nearest): its average.
pub fn average_held(profile: &mut Profile, profiles: u64) {
    let held = held_values(profile);
    if profiles <= 1 || !held.contains(&true) {
        return;
    }
    for sample in &mut profile.sample {
        for (value, _) in sample.value.iter_mut().zip(&held).filter(|(_, held)| **held) {
            *value = (*value as f64 / profiles as f64).round() as i64;
        }
    }
}

#[cfg(test)]
mod tests {
    use ember_proto::pprof::{Sample, ValueType};

    use super::*;

    #[test]
    fn only_held_values_are_divided() {
        let strings = ["", "alloc_objects", "count", "alloc_space", "bytes", "inuse_objects", "inuse_space"].map(String::from).to_vec();
        let types = [(1, 2), (3, 4), (5, 2), (6, 4)].map(|(r#type, unit)| ValueType { r#type, unit }).to_vec();
        let mut profile = Profile {
            string_table: strings,
            sample_type: types,
            sample: vec![Sample { value: vec![10, 1000, 5, 500], ..Default::default() }],
            ..Default::default()
        };
        assert_eq!(held_values(&profile), [false, false, true, true]);
        average_held(&mut profile, 3);
        assert_eq!(profile.sample[0].value, [10, 1000, 2, 167]);
        assert!(kind_holds("heap") && !kind_holds("cpu") && !kind_holds("faults"));
    }
}
