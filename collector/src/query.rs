//! Query: merges the stored profiles of one kind that match a label selector and a time
//! range into one pprof, folded stacks, or an SVG flame graph; and how the embedded store
//! finds and decodes what matches.
use std::{
    collections::BTreeMap,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context as _, Result};
use ember_proto::pprof::Profile;

use crate::{
    embedded::{Detail, EmbeddedStore, StoredProfile},
    store::{Merged, ProfileStore, Selection},
};

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

/// Nanoseconds in a second: queries take unix seconds, profiles carry unix nanoseconds.
pub const NS: u64 = 1_000_000_000;

/// A profile-level label: the agent's identity (agent, host), or the profile's own labels;
/// None for keys only its samples may carry.
pub fn profile_label<'a>(stored: &'a StoredProfile, key: &str) -> Option<&'a str> {
    let (agent, profile) = (stored.agent.as_ref()?, stored.profile.as_ref()?);
    match key {
        "agent" => Some(&agent.agent_id),
        "host" => Some(&agent.hostname),
        _ => profile.labels.get(key).map(String::as_str),
    }
}

/// Whether a stored profile matches; the terms its own labels cannot decide go to
/// `sample_terms`, to select its samples.
fn matches<'s>(stored: &StoredProfile, kind: &str, selector: &'s BTreeMap<String, String>, sample_terms: &mut Vec<(&'s str, &'s str)>) -> bool {
    let Some(profile) = &stored.profile else { return false };
    sample_terms.clear();
    profile.kind == kind
        && stored.agent.is_some()
        && selector.iter().all(|(k, v)| match profile_label(stored, k) {
            Some(label) => label == v,
            None => {
                sample_terms.push((k, v));
                true
            }
        })
}

/// Profiles decoded before they are merged into a partial result: memory holds one chunk of
/// decoded profiles and the partial merges, not every profile of the range at once.
pub const CHUNK: usize = 64;

/// Hands `visit` each stored profile of [from, to) whose own labels match, with the terms of
/// the selector its labels could not decide (to be matched by its samples). Past `deadline`,
/// gives up with an error (a query that would run on after its client was told it timed out
/// only wastes the host).
pub fn scan_matching<'s>(
    store: &EmbeddedStore,
    kind: &str,
    selector: &'s BTreeMap<String, String>,
    (from, to): (u64, u64),
    detail: Detail,
    deadline: Option<Instant>,
    mut visit: impl FnMut(StoredProfile, &[(&'s str, &'s str)]) -> Result<()>,
) -> Result<()> {
    let (mut read, mut sample_terms) = (0, Vec::new());
    store.scan(from, to, detail, |stored| {
        if deadline.is_some_and(|d| Instant::now() > d) {
            bail!("the query ran out of time after reading {read} profiles or roll-ups: narrow its range or selector");
        }
        read += 1;
        if matches(&stored, kind, selector, &mut sample_terms) {
            visit(stored, &sample_terms)?;
        }
        Ok(())
    })
}

/// A matching profile decoded, its samples narrowed to the sample terms; None if none remain.
pub fn decoded(stored: &StoredProfile, sample_terms: &[(&str, &str)]) -> Result<Option<Profile>> {
    let bytes = &stored.profile.as_ref().expect("matched").pprof_gzip;
    let mut profile = ember_pprof::decode_gzip(bytes, crate::service::MAX_DECOMPRESSED)?;
    Ok((sample_terms.is_empty() || ember_pprof::retain_samples(&mut profile, sample_terms) > 0).then_some(profile))
}

/// Hands `visit` each profile of [from, to) that matches, decoded (see `decoded`), or the
/// roll-up that holds it; returns how many raw profiles that was, and how many of them came
/// in roll-ups. Decoding (inflating, parsing) runs on a thread of its own, a few profiles
/// ahead of `visit`, so that a large query uses two cores.
pub fn visit_matching(
    store: &EmbeddedStore,
    kind: &str,
    selector: &BTreeMap<String, String>,
    range: (u64, u64),
    deadline: Option<Instant>,
    mut visit: impl FnMut(&StoredProfile, Profile) -> Result<()>,
) -> Result<Merged> {
    let (sender, receiver) = std::sync::mpsc::sync_channel::<Result<(StoredProfile, Profile)>>(16);
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let scanned = scan_matching(store, kind, selector, range, Detail::RollUps, deadline, |stored, sample_terms| {
                if let Some(profile) = decoded(&stored, sample_terms)? {
                    // A closed channel: the visitor failed, and has its error.
                    sender.send(Ok((stored, profile))).map_err(|_| anyhow::anyhow!("the query stopped"))?;
                }
                Ok(())
            });
            if let Err(error) = scanned {
                let _ = sender.send(Err(error));
            }
        });
        let mut count = Merged::default();
        for item in receiver {
            let (stored, profile) = item?;
            count.add(Merged { profiles: stored.profiles() as usize, rolled_up: stored.merged as usize });
            visit(&stored, profile)?;
        }
        Ok(count)
    })
}

/// Merges the selection, with how many profiles it holds; None if none match.
pub fn merged(store: &dyn ProfileStore, selection: &Selection, deadline: Option<Instant>) -> Result<Option<(Profile, usize)>> {
    let (mut chunk, mut partials) = (Vec::new(), Vec::new());
    let count = store.visit_merged(selection, deadline, &mut |profile| {
        chunk.push(profile);
        if chunk.len() == CHUNK {
            partials.push(ember_pprof::merge(&std::mem::take(&mut chunk))?);
        }
        Ok(())
    })?
    .profiles;
    if count == 0 {
        return Ok(None);
    }
    if partials.is_empty() && chunk.len() == 1 {
        return Ok(chunk.pop().map(|profile| (profile, count)));
    }
    partials.push(ember_pprof::merge(&chunk)?);
    Ok(Some((ember_pprof::merge(&partials)?, count)))
}

/// The end of a range that holds the current second: its default.
pub fn now_seconds() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() + 1
}

pub const FORMATS: [&str; 3] = ["pprof", "folded", "svg"];

/// A merged profile in one of `FORMATS`, viewed the way its kind is (see ember_pprof::view).
pub fn render(profile: &Profile, kind: &str, format: &str) -> Result<Vec<u8>> {
    let view = ember_pprof::view(kind);
    match format {
        "pprof" => Ok(ember_pprof::encode_gzip(profile)),
        "folded" => Ok((view.folded(profile)?.join("\n") + "\n").into_bytes()),
        "svg" => ember_pprof::flamegraph(&view.folded(profile)?, &format!("Ember {kind}"), view.unit(profile)),
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
