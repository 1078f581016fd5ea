//! Query: merges the stored profiles of one kind that match a label selector and a time
//! range into one pprof, folded stacks, or an SVG flame graph.
use std::collections::BTreeMap;

use anyhow::{bail, Context as _, Result};
use ember_proto::pprof::Profile;

use crate::store::{Store, StoredProfile};

/// "service=api,pod=x": every pair must match the profile's labels (agent, host, node, static
/// labels) or, for keys the profile does not carry, its samples' labels (pod, namespace, ...).
pub fn parse_selector(text: &str) -> Result<BTreeMap<String, String>> {
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').with_context(|| format!("selector term {pair:?} is not key=value"))?;
            Ok((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

/// Whether a stored profile matches; the terms its own labels cannot decide go to
/// `sample_terms`, to select its samples.
fn matches<'s>(stored: &StoredProfile, kind: &str, selector: &'s BTreeMap<String, String>, sample_terms: &mut Vec<(&'s str, &'s str)>) -> bool {
    let (Some(agent), Some(profile)) = (&stored.agent, &stored.profile) else { return false };
    sample_terms.clear();
    profile.kind == kind
        && selector.iter().all(|(k, v)| match (k.as_str(), profile.labels.get(k)) {
            ("agent", _) => &agent.agent_id == v,
            ("host", _) => &agent.hostname == v,
            (_, Some(label)) => label == v,
            (key, None) => {
                sample_terms.push((key, v));
                true
            }
        })
}

pub fn merged(store: &Store, kind: &str, selector: &BTreeMap<String, String>, from: u64, to: u64) -> Result<(Profile, usize)> {
    let mut profiles = Vec::new();
    let mut sample_terms = Vec::new();
    for stored in store.range(from, to)? {
        if !matches(&stored, kind, selector, &mut sample_terms) {
            continue;
        }
        let bytes = &stored.profile.as_ref().expect("matched").pprof_gzip;
        let mut profile = ember_pprof::decode_gzip(bytes, 1 << 30)?;
        if sample_terms.is_empty() || ember_pprof::retain_samples(&mut profile, &sample_terms) > 0 {
            profiles.push(profile);
        }
    }
    if profiles.is_empty() {
        bail!("no {kind} profiles match in that time range");
    }
    let count = profiles.len();
    Ok((ember_pprof::merge(&profiles)?, count))
}

pub const FORMATS: [&str; 3] = ["pprof", "folded", "svg"];

/// A merged profile in one of `FORMATS`, viewed the way its kind is (see ember_pprof::view).
pub fn render(profile: &Profile, kind: &str, format: &str) -> Result<Vec<u8>> {
    let view = ember_pprof::view(kind);
    match format {
        "pprof" => Ok(ember_pprof::encode_gzip(profile)),
        "folded" => Ok((view.folded(profile).join("\n") + "\n").into_bytes()),
        "svg" => ember_pprof::flamegraph(&view.folded(profile), &format!("Ember {kind}"), view.unit(profile)),
        other => bail!("unknown format {other:?}: use pprof, folded or svg"),
    }
}

pub fn content_type(format: &str) -> &'static str {
    match format {
        "folded" => "text/plain",
        "svg" => "image/svg+xml",
        _ => "application/octet-stream",
    }
}
