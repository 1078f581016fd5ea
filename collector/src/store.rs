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
use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        RwLock,
    },
};

use anyhow::{Context as _, Result};
use ember_proto::ember::{AgentIdentity, Profile};
use prost::Message;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableHandle as _};

use crate::buckets::{self, bucket, Segment, LEVELS};

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

/// Where a profile's sequence number counts: its spool, or for agents that send no spool id,
/// the agent.
pub fn origin(agent: &AgentIdentity) -> String {
    match agent.spool_id {
        0 => agent.agent_id.clone(),
        id => format!("spool:{id:016x}"),
    }
}

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

/// A profile that passed the ingest checks, with the totals of its sample values.
pub struct Checked {
    pub profile: Profile,
    pub totals: Vec<i64>,
}

pub struct Store {
    /// Written (locked) only to compact the file; every other use reads.
    db: RwLock<Database>,
    path: PathBuf,
    /// Profiles that start before this (unix ns) are past retention.
    horizon: AtomicU64,
    /// The next generation of a pending bucket.
    generation: AtomicU64,
}

/// Size retention compacts the file, deletes the oldest profiles, and repeats at most this
/// many times (each round deletes what the file is over, and a sixteenth of the limit more).
const SIZE_ROUNDS: usize = 8;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Stored {
    pub stored_through: u64,
    pub duplicates: u32,
    /// The sequences of the request now held (stored now, or before).
    pub held: Vec<u64>,
}

impl Store {
    pub fn open(dir: &Path) -> Result<Store> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating data directory {}", dir.display()))?;
        let path = dir.join("profiles.redb");
        let db = Database::create(&path).with_context(|| format!("opening {}", path.display()))?;
        let txn = db.begin_write()?;
        let before_rollups = !txn.list_tables()?.any(|table| table.name() == PENDING.name());
        txn.open_table(DELIVERED)?;
        txn.open_table(CONTIGUOUS)?;
        let mut generation = 0;
        {
            let profiles = txn.open_table(PROFILES)?;
            let mut buckets = Buckets::open(&txn)?;
            if before_rollups {
                // A store written before roll-ups: its buckets are all to be rolled up.
                for entry in profiles.iter()? {
                    let (start, _, _) = entry?.0.value();
                    for level in LEVELS {
                        buckets.pending.insert((level, bucket(level, start)), 0)?;
                    }
                }
            }
            for entry in buckets.pending.iter()? {
                generation = generation.max(entry?.1.value());
            }
        }
        txn.commit()?;
        Ok(Store { db: RwLock::new(db), path, horizon: AtomicU64::new(0), generation: AtomicU64::new(generation + 1) })
    }

    fn db(&self) -> std::sync::RwLockReadGuard<'_, Database> {
        self.db.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores an agent's profiles in one transaction; profiles it delivered before, and
    /// profiles already past retention, are counted as duplicates and dropped.
    pub fn put(&self, agent: &AgentIdentity, profiles: &[Checked]) -> Result<Stored> {
        let horizon = self.horizon.load(Ordering::Relaxed);
        let db = self.db();
        let txn = db.begin_write()?;
        let mut result = Stored::default();
        {
            let mut stored = txn.open_table(PROFILES)?;
            let mut delivered = txn.open_table(DELIVERED)?;
            let mut contiguous = txn.open_table(CONTIGUOUS)?;
            let mut buckets = Buckets::open(&txn)?;
            let origin = origin(agent);
            let id = origin.as_str();
            let mut through = contiguous.get(id)?.map(|v| v.value()).unwrap_or(0);
            for Checked { profile, totals } in profiles {
                result.held.push(profile.sequence);
                let start = profile.start_unix_nanos.max(0) as u64;
                if start < horizon || profile.sequence <= through || delivered.get((id, profile.sequence))?.is_some() {
                    result.duplicates += 1;
                    continue;
                }
                let record = StoredProfile { agent: Some(agent.clone()), profile: Some(profile.clone()), totals: totals.clone(), merged: 0 };
                stored.insert((start, id, profile.sequence), record.encode_to_vec().as_slice())?;
                delivered.insert((id, profile.sequence), start)?;
                for level in LEVELS {
                    let bucket = bucket(level, start);
                    buckets.pending.insert((level, bucket), self.generation.fetch_add(1, Ordering::Relaxed))?;
                    buckets.undo(level, bucket)?;
                }
            }
            while delivered.get((id, through + 1))?.is_some() {
                through += 1;
            }
            contiguous.insert(id, through)?;
            result.stored_through = through;
        }
        txn.commit()?;
        Ok(result)
    }

    /// Deletes profiles that started before `min_start`, and the de-duplication records of
    /// profiles that did (and of spools left with none); then the oldest profiles until the
    /// database file takes at most `max_bytes`, compacting it. Returns how many profiles it
    /// deleted.
    pub fn enforce_retention(&self, min_start: u64, max_bytes: u64) -> Result<usize> {
        self.horizon.fetch_max(min_start, Ordering::Relaxed);
        let mut deleted = self.delete_oldest(|start, _| start < min_start)?;
        self.forget_delivered_before(min_start)?;
        for _ in 0..SIZE_ROUNDS {
            if self.file_bytes()? <= max_bytes {
                return Ok(deleted);
            }
            // Free pages first (a file is often larger than what it holds), then profiles.
            let compacted = self.db.write().unwrap_or_else(|e| e.into_inner()).compact().context("compacting the store")?;
            let file = self.file_bytes()?;
            if file <= max_bytes {
                return Ok(deleted);
            }
            let mut excess = file - max_bytes + max_bytes / 16;
            let removed = self.delete_oldest(|_, size| {
                let doomed = excess > 0;
                excess = excess.saturating_sub(size);
                doomed
            })?;
            deleted += removed;
            if removed == 0 && !compacted {
                break;
            }
        }
        let file = self.file_bytes()?;
        if file > max_bytes {
            tracing::warn!(file, max_bytes, "the store is over its size limit with nothing left to delete");
        }
        Ok(deleted)
    }

    fn file_bytes(&self) -> Result<u64> {
        Ok(std::fs::metadata(&self.path).with_context(|| format!("reading {}", self.path.display()))?.len())
    }

    /// Deletes profiles, oldest first, while `doomed(start, stored bytes)` says so, and the
    /// roll-ups of the buckets they were in.
    fn delete_oldest(&self, mut doomed: impl FnMut(u64, u64) -> bool) -> Result<usize> {
        let db = self.db();
        let txn = db.begin_write()?;
        let mut keys = Vec::new();
        {
            let mut table = txn.open_table(PROFILES)?;
            for entry in table.iter()? {
                let (key, value) = entry?;
                let (start, origin, sequence) = key.value();
                if !doomed(start, value.value().len() as u64) {
                    break;
                }
                keys.push((start, origin.to_string(), sequence));
            }
            for (start, origin, sequence) in &keys {
                table.remove((*start, origin.as_str(), *sequence))?;
            }
            if let Some((last, _, _)) = keys.last() {
                Buckets::open(&txn)?.forget_through(*last)?;
            }
        }
        txn.commit()?;
        Ok(keys.len())
    }

    /// Drops the de-duplication records of profiles that started before `min_start`, and the
    /// watermark of every spool left without records (all it delivered is past retention).
    fn forget_delivered_before(&self, min_start: u64) -> Result<()> {
        let db = self.db();
        let txn = db.begin_write()?;
        {
            let mut delivered = txn.open_table(DELIVERED)?;
            let mut contiguous = txn.open_table(CONTIGUOUS)?;
            let mut old = Vec::new();
            let mut live = std::collections::HashSet::new();
            for entry in delivered.iter()? {
                let (key, start) = entry?;
                let (origin, sequence) = key.value();
                if start.value() < min_start {
                    old.push((origin.to_string(), sequence));
                } else {
                    live.insert(origin.to_string());
                }
            }
            for (origin, sequence) in &old {
                delivered.remove((origin.as_str(), *sequence))?;
            }
            let mut idle = Vec::new();
            for entry in contiguous.iter()? {
                let origin = entry?.0.value().to_string();
                if !live.contains(&origin) {
                    idle.push(origin);
                }
            }
            for origin in &idle {
                contiguous.remove(origin.as_str())?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// Highest sequence N such that the profiles 1..=N of this agent's spool are all stored.
    pub fn stored_through(&self, agent: &AgentIdentity) -> Result<u64> {
        let txn = self.db().begin_read()?;
        let table = txn.open_table(CONTIGUOUS)?;
        Ok(table.get(origin(agent).as_str())?.map(|v| v.value()).unwrap_or(0))
    }

    /// Profiles whose start lies in [from, to), in time order.
    pub fn range(&self, from: u64, to: u64) -> Result<Vec<StoredProfile>> {
        let mut out = Vec::new();
        self.scan(from, to, Detail::Profiles, |profile| {
            out.push(profile);
            Ok(())
        })?;
        Ok(out)
    }

    /// Hands `visit` the profiles whose start lies in [from, to), or with `Detail::RollUps`
    /// the roll-ups of the whole buckets in it and the profiles elsewhere, in time order, one
    /// at a time (a query holds only what it merges, not the whole range), until it returns
    /// an error.
    pub fn scan(&self, from: u64, to: u64, detail: Detail, mut visit: impl FnMut(StoredProfile) -> Result<()>) -> Result<()> {
        let txn = self.db().begin_read()?;
        let profiles = txn.open_table(PROFILES)?;
        let rollups = txn.open_table(ROLLUPS)?;
        let segments = match detail {
            Detail::Profiles => vec![Segment::Profiles(from, to)],
            Detail::RollUps => {
                let rolled = txn.open_table(ROLLED)?;
                buckets::plan(from, to, &mut |level, from, to| {
                    rolled.range((level, from)..(level, to))?.map(|e| Ok(e?.0.value().1)).collect()
                })?
            }
        };
        let mut visit_bytes = |bytes: &[u8]| visit(StoredProfile::decode(bytes).context("corrupt stored profile")?);
        for segment in segments {
            match segment {
                Segment::Profiles(from, to) => {
                    for entry in profiles.range((from, "", 0)..(to, "", 0))? {
                        visit_bytes(entry?.1.value())?;
                    }
                }
                Segment::RollUps(level, bucket) => {
                    for entry in rollups.range((level, bucket, 0)..=(level, bucket, u64::MAX))? {
                        visit_bytes(entry?.1.value())?;
                    }
                }
            }
        }
        Ok(())
    }

    /// How many roll-ups there are, of how many buckets, what they take, and how many
    /// buckets wait to be rolled up.
    pub fn rollup_usage(&self) -> Result<RollupUsage> {
        use redb::ReadableTableMetadata as _;
        let txn = self.db().begin_read()?;
        let mut usage = RollupUsage { buckets: txn.open_table(ROLLED)?.len()?, pending: txn.open_table(PENDING)?.len()?, ..Default::default() };
        for entry in txn.open_table(ROLLUPS)?.iter()? {
            usage.records += 1;
            usage.bytes += entry?.1.value().len() as u64;
        }
        Ok(usage)
    }

    /// The pending buckets of `level` that start before `before`, with their generations.
    pub fn pending(&self, level: u64, before: u64) -> Result<Vec<(u64, u64)>> {
        let txn = self.db().begin_read()?;
        let pending = txn.open_table(PENDING)?;
        pending.range((level, 0)..(level, before))?.map(|e| e.map(|(k, g)| (k.value().1, g.value())).map_err(Into::into)).collect()
    }

    /// Stores a bucket's roll-ups, built from `profiles` raw profiles, unless the bucket
    /// changed since `generation` (a profile arrived, or retention reached it): then it stays
    /// pending, and false is returned.
    pub fn save_rollups(&self, level: u64, bucket: u64, generation: u64, profiles: u64, rollups: &[StoredProfile]) -> Result<bool> {
        let db = self.db();
        let txn = db.begin_write()?;
        {
            let mut buckets = Buckets::open(&txn)?;
            if buckets.pending.get((level, bucket))?.map(|g| g.value()) != Some(generation) {
                return Ok(false);
            }
            buckets.undo(level, bucket)?;
            for (n, rollup) in rollups.iter().enumerate() {
                buckets.rollups.insert((level, bucket, n as u64), rollup.encode_to_vec().as_slice())?;
            }
            buckets.rolled.insert((level, bucket), profiles)?;
            buckets.pending.remove((level, bucket))?;
        }
        txn.commit()?;
        Ok(true)
    }
}

#[derive(Default)]
pub struct RollupUsage {
    pub records: u64,
    pub bytes: u64,
    pub buckets: u64,
    pub pending: u64,
}

/// The roll-up tables, open in a write transaction.
struct Buckets<'t> {
    rollups: redb::Table<'t, (u64, u64, u64), &'static [u8]>,
    rolled: redb::Table<'t, (u64, u64), u64>,
    pending: redb::Table<'t, (u64, u64), u64>,
}

impl<'t> Buckets<'t> {
    fn open(txn: &'t redb::WriteTransaction) -> Result<Self> {
        Ok(Buckets { rollups: txn.open_table(ROLLUPS)?, rolled: txn.open_table(ROLLED)?, pending: txn.open_table(PENDING)? })
    }

    /// Drops a bucket's roll-ups: they no longer hold all of its profiles.
    fn undo(&mut self, level: u64, bucket: u64) -> Result<()> {
        if self.rolled.remove((level, bucket))?.is_some() {
            self.rollups.retain_in((level, bucket, 0)..=(level, bucket, u64::MAX), |_, _| false)?;
        }
        Ok(())
    }

    /// Drops the roll-ups and pending marks of every bucket that starts at or before `start`,
    /// the last profile retention deleted: those buckets are read raw from now on.
    fn forget_through(&mut self, start: u64) -> Result<()> {
        for level in LEVELS {
            self.rolled.retain_in((level, 0)..=(level, start), |_, _| false)?;
            self.pending.retain_in((level, 0)..=(level, start), |_, _| false)?;
            self.rollups.retain_in((level, 0, 0)..=(level, start, u64::MAX), |_, _| false)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty directory for one test's store.
    fn fresh_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ember-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn profile(sequence: u64, start: i64, bytes: usize) -> Checked {
        let profile = Profile { sequence, kind: "cpu".into(), start_unix_nanos: start, end_unix_nanos: start + 1, pprof_gzip: vec![0; bytes], ..Default::default() };
        Checked { profile, totals: vec![] }
    }

    #[test]
    fn stores_once_survives_reopen_and_enforces_retention() {
        let dir = fresh_dir("test");
        let agent = AgentIdentity { agent_id: "a".into(), ..Default::default() };
        {
            let store = Store::open(&dir).unwrap();
            // Out of order: 2 arrives before 1; the watermark waits for the gap to close.
            assert_eq!(store.put(&agent, &[profile(2, 200, 1000)]).unwrap(), Stored { stored_through: 0, duplicates: 0, held: vec![2] });
            assert_eq!(
                store.put(&agent, &[profile(1, 100, 1000), profile(2, 200, 1000)]).unwrap(),
                Stored { stored_through: 2, duplicates: 1, held: vec![1, 2] }
            );
        }
        let store = Store::open(&dir).unwrap();
        assert_eq!(store.put(&agent, &[profile(3, 300, 1000)]).unwrap().stored_through, 3);
        assert_eq!(store.range(0, u64::MAX).unwrap().len(), 3);
        // Age: profile 1 (start 100) goes.
        assert_eq!(store.enforce_retention(150, u64::MAX).unwrap(), 1);
        let left: Vec<u64> = store.range(0, u64::MAX).unwrap().iter().map(|p| p.profile.as_ref().unwrap().sequence).collect();
        assert_eq!(left, [2, 3]);
        // A late retry of a deleted profile is acknowledged, not stored again.
        assert_eq!(store.put(&agent, &[profile(1, 100, 1000)]).unwrap().duplicates, 1);
        assert_eq!(store.range(0, u64::MAX).unwrap().len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn entries(store: &Store) -> (usize, usize) {
        use redb::ReadableTableMetadata as _;
        let db = store.db();
        let txn = db.begin_read().unwrap();
        (txn.open_table(DELIVERED).unwrap().len().unwrap() as usize, txn.open_table(CONTIGUOUS).unwrap().len().unwrap() as usize)
    }

    #[test]
    fn de_duplication_records_go_with_retention() {
        let dir = fresh_dir("growth");
        let store = Store::open(&dir).unwrap();
        // A hundred spools (pods restarted with fresh spools), ten profiles each.
        for spool in 1..=100u64 {
            let agent = AgentIdentity { agent_id: "pod".into(), spool_id: spool, ..Default::default() };
            let profiles: Vec<Checked> = (1..=10).map(|n| profile(n, (spool * 100 + n) as i64, 10)).collect();
            store.put(&agent, &profiles).unwrap();
        }
        assert_eq!(entries(&store), (1000, 100));
        // Retention passes the first half of them: their records go too.
        store.enforce_retention(50 * 100 + 50, u64::MAX).unwrap();
        assert_eq!(entries(&store), (500, 50));
        store.enforce_retention(u64::MAX, u64::MAX).unwrap();
        assert_eq!(entries(&store), (0, 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_database_file_is_kept_within_the_size_limit() {
        let dir = fresh_dir("size");
        let store = Store::open(&dir).unwrap();
        let agent = AgentIdentity { agent_id: "a".into(), spool_id: 1, ..Default::default() };
        for n in 1..=64u64 {
            store.put(&agent, &[profile(n, n as i64, 64 << 10)]).unwrap();
        }
        let full = store.file_bytes().unwrap();
        assert!(full > 4 << 20, "{full} bytes for 4 MiB of profiles");
        let limit = full / 2;
        let deleted = store.enforce_retention(0, limit).unwrap();
        assert!(store.file_bytes().unwrap() <= limit, "{} bytes over the {limit} limit", store.file_bytes().unwrap());
        // The oldest went; the newest stayed.
        let left: Vec<u64> = store.range(0, u64::MAX).unwrap().iter().map(|p| p.profile.as_ref().unwrap().sequence).collect();
        assert_eq!(left, (deleted as u64 + 1..=64).collect::<Vec<_>>());
        assert!(left.len() >= 16, "only {} of 64 left under a limit of half the file", left.len());
        std::fs::remove_dir_all(&dir).unwrap();
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
        let store = Store::open(&dir).unwrap();
        let pending = |level| store.pending(level, u64::MAX).unwrap().into_iter().map(|(bucket, _)| bucket).collect::<Vec<_>>();
        assert_eq!(pending(LEVELS[0]), [LEVELS[2], LEVELS[2] + LEVELS[0]]);
        assert_eq!(pending(LEVELS[1]), [LEVELS[2]]);
        assert_eq!(pending(LEVELS[2]), [LEVELS[2]]);
        // Only once: a store that has the roll-up tables is not scanned again.
        drop(store);
        let store = Store::open(&dir).unwrap();
        store.save_rollups(LEVELS[2], LEVELS[2], 0, 2, &[]).unwrap();
        drop(store);
        assert!(Store::open(&dir).unwrap().pending(LEVELS[2], u64::MAX).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sequences_count_per_spool_not_per_agent_name() {
        let dir = fresh_dir("spools");
        let store = Store::open(&dir).unwrap();
        let old = AgentIdentity { agent_id: "pod-a".into(), spool_id: 7, ..Default::default() };
        assert_eq!(store.put(&old, &[profile(1, 100, 10), profile(2, 200, 10)]).unwrap().duplicates, 0);
        // Renamed (a new pod on the same node and spool): its resend is a duplicate.
        let renamed = AgentIdentity { agent_id: "pod-b".into(), spool_id: 7, ..Default::default() };
        assert_eq!(store.put(&renamed, &[profile(2, 200, 10), profile(3, 300, 10)]).unwrap(), Stored { stored_through: 3, duplicates: 1, held: vec![2, 3] });
        // A wiped spool numbers from 1 again, under a new id: nothing passes for old.
        let wiped = AgentIdentity { agent_id: "pod-b".into(), spool_id: 8, ..Default::default() };
        assert_eq!(store.put(&wiped, &[profile(1, 400, 10)]).unwrap(), Stored { stored_through: 1, duplicates: 0, held: vec![1] });
        assert_eq!(store.range(0, u64::MAX).unwrap().len(), 4);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
