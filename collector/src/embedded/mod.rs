//! The embedded store: profiles persisted in a redb database under the data directory,
//! indexed by time, with per-spool sequence numbers so a retried push is stored once.
//! Profiles are de-duplicated by their spool (its random id), not by the agent's name: a
//! renamed agent resending its spool stores nothing twice, and a wiped spool's new numbers
//! never pass for old ones. Retention bounds everything: profiles by age and by the database
//! file's size, and the de-duplication records by age (a profile older than retention is
//! acknowledged but not stored again, so its record is no longer needed).
//!
//! Beside the profiles the store keeps their roll-ups (see `buckets`): storing a profile marks
//! its buckets pending (and undoes a roll-up already made of them); `rollup` builds the due
//! ones; a scan that may read roll-ups plans its range over the rolled-up buckets in the same
//! read transaction, so that it never sees a bucket twice or half.
//!
//! `embedded_store` puts it behind the collector's store interface (`store`). This file is
//! what the store's callers see and every part of it shares: the tables, the
//! records and answers, and opening the database. Storing with de-duplication is `ingest`,
//! retention `retention`, reads `scan`, and the roll-up bookkeeping `rollup_buckets`.
mod ingest;
mod retention;
mod rollup_buckets;
mod scan;

use std::{
    path::{Path, PathBuf},
    sync::{atomic::AtomicU64, RwLock},
};

use anyhow::{Context as _, Result};
use ember_proto::ember::{AgentIdentity, Profile};
use redb::{Database, ReadableTable, TableDefinition, TableHandle as _};

use crate::buckets::{bucket, LEVELS};

/// (start unix ns, origin, sequence) -> StoredProfile.
const PROFILES: TableDefinition<(u64, &str, u64), &[u8]> = TableDefinition::new("profiles");
/// (origin, sequence) -> start unix ns: which profiles an origin has delivered.
const DELIVERED: TableDefinition<(&str, u64), u64> = TableDefinition::new("delivered");
/// origin -> highest sequence N such that 1..=N are all stored.
const CONTIGUOUS: TableDefinition<&str, u64> = TableDefinition::new("contiguous");
/// (level, bucket start, n) -> StoredProfile: the bucket's roll-ups, one per agent and labels.
const ROLLUPS: TableDefinition<(u64, u64, u64), &[u8]> = TableDefinition::new("rollups");
/// (level, bucket start) -> raw profiles in it: buckets whose roll-ups are complete.
const ROLLED: TableDefinition<(u64, u64), u64> = TableDefinition::new("rolled");
/// (level, bucket start) -> generation: buckets to roll up (again). The generation changes at
/// every profile stored in the bucket, so a roll-up built meanwhile is not taken as complete.
const PENDING: TableDefinition<(u64, u64), u64> = TableDefinition::new("pending");

/// A stored profile: the agent's message plus who sent it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredProfile {
    #[prost(message, optional, tag = "1")]
    pub agent: Option<AgentIdentity>,
    #[prost(message, optional, tag = "2")]
    pub profile: Option<Profile>,
    /// The sum of each sample value, taken when the profile was checked: the time series
    /// reads it without decoding the profile. Empty in profiles stored before it existed.
    #[prost(int64, repeated, tag = "3")]
    pub totals: Vec<i64>,
    /// A roll-up: how many raw profiles it merges (0 for a raw profile).
    #[prost(uint64, tag = "4")]
    pub merged: u64,
}

impl StoredProfile {
    /// How many raw profiles this record stands for.
    pub fn profiles(&self) -> u64 {
        self.merged.max(1)
    }
}

/// What a scan reads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// Every raw profile: for views finer than a bucket (the time series).
    Profiles,
    /// Roll-ups where they cover whole buckets of the range, raw profiles elsewhere.
    RollUps,
}

pub struct EmbeddedStore {
    /// Written (locked) only to compact the file; every other use reads.
    db: RwLock<Database>,
    path: PathBuf,
    /// Profiles that start before this (unix ns) are past retention.
    horizon: AtomicU64,
    /// The next generation of a pending bucket.
    generation: AtomicU64,
}

#[derive(Default)]
pub struct RollupUsage {
    pub records: u64,
    pub bytes: u64,
    pub buckets: u64,
    pub pending: u64,
}

impl EmbeddedStore {
    pub fn open(dir: &Path) -> Result<EmbeddedStore> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating data directory {}", dir.display()))?;
        let path = dir.join("profiles.redb");
        let db = Database::create(&path).with_context(|| format!("opening {}", path.display()))?;
        let txn = db.begin_write()?;
        let before_rollups = !txn.list_tables()?.any(|table| table.name() == PENDING.name());
        // Every table exists from here on: a read transaction opens them without creating.
        txn.open_table(DELIVERED)?;
        txn.open_table(CONTIGUOUS)?;
        txn.open_table(ROLLUPS)?;
        txn.open_table(ROLLED)?;
        let mut generation = 0;
        {
            let profiles = txn.open_table(PROFILES)?;
            let mut pending = txn.open_table(PENDING)?;
            if before_rollups {
                // A store written before roll-ups: its buckets are all to be rolled up.
                for entry in profiles.iter()? {
                    let (start, _, _) = entry?.0.value();
                    for level in LEVELS {
                        pending.insert((level, bucket(level, start)), 0)?;
                    }
                }
            }
            for entry in pending.iter()? {
                generation = generation.max(entry?.1.value());
            }
        }
        txn.commit()?;
        Ok(EmbeddedStore { db: RwLock::new(db), path, horizon: AtomicU64::new(0), generation: AtomicU64::new(generation + 1) })
    }

    fn db(&self) -> std::sync::RwLockReadGuard<'_, Database> {
        self.db.read().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;
    use crate::store::Checked;

    /// An empty directory for one test's store.
    pub(super) fn fresh_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ember-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    pub(super) fn profile(sequence: u64, start: i64, bytes: usize) -> Checked {
        let profile = Profile { sequence, kind: "cpu".into(), start_unix_nanos: start, end_unix_nanos: start + 1, pprof_gzip: vec![0; bytes], ..Default::default() };
        Checked { profile, totals: vec![], decoded: None }
    }

    #[test]
    fn a_store_from_before_roll_ups_gets_all_its_buckets_pending() {
        let dir = fresh_dir("upgrade");
        std::fs::create_dir_all(&dir).unwrap();
        {
            // The tables of a collector without roll-ups: two profiles, a minute apart.
            let db = Database::create(dir.join("profiles.redb")).unwrap();
            let txn = db.begin_write().unwrap();
            let mut profiles = txn.open_table(PROFILES).unwrap();
            for (start, sequence) in [(LEVELS[2] + 5, 1), (LEVELS[2] + LEVELS[0] + 5, 2)] {
                profiles.insert((start, "a", sequence), StoredProfile::default().encode_to_vec().as_slice()).unwrap();
            }
            drop(profiles);
            txn.commit().unwrap();
        }
        let store = EmbeddedStore::open(&dir).unwrap();
        let pending = |level| store.pending(level, u64::MAX).unwrap().into_iter().map(|(bucket, _)| bucket).collect::<Vec<_>>();
        assert_eq!(pending(LEVELS[0]), [LEVELS[2], LEVELS[2] + LEVELS[0]]);
        assert_eq!(pending(LEVELS[1]), [LEVELS[2]]);
        assert_eq!(pending(LEVELS[2]), [LEVELS[2]]);
        // Only once: a store that has the roll-up tables is not scanned again.
        drop(store);
        let store = EmbeddedStore::open(&dir).unwrap();
        store.save_rollups(LEVELS[2], LEVELS[2], 0, 2, &[]).unwrap();
        drop(store);
        assert!(EmbeddedStore::open(&dir).unwrap().pending(LEVELS[2], u64::MAX).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
