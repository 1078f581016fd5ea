//! Sample selection: keeps the samples whose string labels match every term (e.g. pod=x,
//! namespace=prod), so a query can slice a host's profile down to one target; and the totals
//! of what is selected.
use ember_proto::pprof::Profile;

use crate::string;

/// Keeps the samples that carry every (key, value) as a string label; returns how many remain.
pub fn retain_samples(profile: &mut Profile, terms: &[(&str, &str)]) -> usize {
    let strings = &profile.string_table;
    let text = |index: i64| string(strings, index);
    profile.sample.retain(|sample| {
        terms.iter().all(|(key, value)| sample.label.iter().any(|l| text(l.key) == *key && l.num == 0 && text(l.str) == *value))
    });
    profile.sample.len()
}

/// The sum of each sample value (saturating: a total is a figure to show, not to merge).
pub fn totals(profile: &Profile) -> Vec<i64> {
    let mut totals = vec![0i64; profile.sample_type.len()];
    for sample in &profile.sample {
        for (total, value) in totals.iter_mut().zip(&sample.value) {
            *total = total.saturating_add(*value);
        }
    }
    totals
}

#[cfg(test)]
mod tests {
    use ember_proto::pprof::{Label, Sample};

    use super::*;

    #[test]
    fn only_samples_with_every_term_remain() {
        let strings = ["", "pod", "a", "b", "namespace", "prod"].map(String::from).to_vec();
        let sample = |labels: &[(i64, i64)]| Sample {
            value: vec![1],
            label: labels.iter().map(|&(key, str)| Label { key, str, ..Default::default() }).collect(),
            ..Default::default()
        };
        let mut profile = Profile {
            string_table: strings,
            sample: vec![sample(&[(1, 2), (4, 5)]), sample(&[(1, 3), (4, 5)]), sample(&[(4, 5)])],
            ..Default::default()
        };
        assert_eq!(retain_samples(&mut profile.clone(), &[("namespace", "prod")]), 3);
        assert_eq!(retain_samples(&mut profile, &[("namespace", "prod"), ("pod", "a")]), 1);
        assert_eq!(profile.sample[0].label[0].str, 2);
    }
}
