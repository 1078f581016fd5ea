//! The commands that read stored profiles without a running collector (the embedded store is
//! locked by the process that has it open; ClickHouse is shared): `list` and `query`.
use std::path::PathBuf;

use anyhow::{Context as _, Result};

use crate::{clickhouse::ClickHouse, embedded::EmbeddedStore, query, store::Selection, store_choice::StoreChoice};

pub fn run_query(store: StoreChoice, kind: String, selector: String, from: Option<u64>, to: Option<u64>, format: String, output: PathBuf) -> Result<()> {
    let runtime = runtime()?;
    let _entered = runtime.enter();
    let store = store.open()?;
    let selector = query::parse_selector(&selector)?;
    let nanos = |s: u64| s.saturating_mul(1_000_000_000);
    let range = (nanos(from.unwrap_or(0)), nanos(to.unwrap_or_else(query::now_seconds)));
    let (profile, count) = query::merged(&*store, &Selection { kind: &kind, selector: &selector, range }, None)?
        .with_context(|| format!("no {kind} profiles match in that time range"))?;
    let bytes = query::render(&profile, &kind, &format)?;
    std::fs::write(&output, bytes).with_context(|| format!("writing {}", output.display()))?;
    eprintln!("merged {count} {kind} profiles into {}", output.display());
    Ok(())
}

/// Prints each stored profile, then (on stderr) what it all takes.
pub fn list(store: StoreChoice) -> Result<()> {
    match store {
        StoreChoice::Embedded(dir) => list_embedded(dir),
        StoreChoice::ClickHouse { connection, database, cluster } => {
            let runtime = runtime()?;
            let _entered = runtime.enter();
            let count = ClickHouse::open(&connection, &database, cluster.as_ref())?.list(&mut |agent, sequence, kind, start, samples| {
                println!("{agent} {sequence} {kind} {start} {samples}");
            })?;
            eprintln!("{count} profiles");
            Ok(())
        }
    }
}

fn list_embedded(dir: PathBuf) -> Result<()> {
    let store = EmbeddedStore::open(&dir)?;
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

/// A runtime for ClickHouse's client, whose calls block a thread that has entered it.
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().context("starting a tokio runtime")
}
