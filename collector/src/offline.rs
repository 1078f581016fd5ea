//! The commands that read a stopped collector's data directory (the store is locked by the
//! process that has it open): `list` and `query`.
use std::path::PathBuf;

use anyhow::{Context as _, Result};

use crate::{embedded::EmbeddedStore, embedded_store::Embedded, query, store::Selection};

pub fn run_query(data_dir: PathBuf, kind: String, selector: String, from: Option<u64>, to: Option<u64>, format: String, output: PathBuf) -> Result<()> {
    let store = Embedded::new(EmbeddedStore::open(&data_dir)?);
    let selector = query::parse_selector(&selector)?;
    let nanos = |s: u64| s.saturating_mul(1_000_000_000);
    let range = (nanos(from.unwrap_or(0)), nanos(to.unwrap_or_else(query::now_seconds)));
    let (profile, count) = query::merged(&store, &Selection { kind: &kind, selector: &selector, range }, None)?
        .with_context(|| format!("no {kind} profiles match in that time range"))?;
    let bytes = query::render(&profile, &kind, &format)?;
    std::fs::write(&output, bytes).with_context(|| format!("writing {}", output.display()))?;
    eprintln!("merged {count} {kind} profiles into {}", output.display());
    Ok(())
}

/// Prints each stored profile, then (on stderr) what the roll-ups beside them take.
pub fn list(data_dir: PathBuf) -> Result<()> {
    let store = EmbeddedStore::open(&data_dir)?;
    let (mut count, mut bytes) = (0, 0);
    for stored in store.range(0, u64::MAX)? {
        if let (Some(agent), Some(p)) = (stored.agent, stored.profile) {
            println!("{} {} {} {} {}", agent.agent_id, p.sequence, p.kind, p.start_unix_nanos, p.pprof_gzip.len());
            (count, bytes) = (count + 1, bytes + p.pprof_gzip.len());
        }
    }
    let rollups = store.rollup_usage()?;
    eprintln!(
        "{count} profiles, {:.1} MB of pprof; {} roll-ups, {:.1} MB, of {} buckets; {} buckets pending",
        bytes as f64 / 1e6,
        rollups.records,
        rollups.bytes as f64 / 1e6,
        rollups.buckets,
        rollups.pending
    );
    Ok(())
}
