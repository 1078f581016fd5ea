//! Retention: the store must not grow without bound, so profiles go by age and, oldest
//! first, by the database file's size; the de-duplication records of profiles past
//! retention go with them.
use std::sync::atomic::Ordering;

use anyhow::{Context as _, Result};
use redb::ReadableTable;

use super::{rollup_buckets::Buckets, EmbeddedStore, CONTIGUOUS, DELIVERED, PROFILES};

/// Size retention compacts the file, deletes the oldest profiles, and repeats at most this
/// many times (each round deletes what the file is over, and a sixteenth of the limit more).
const SIZE_ROUNDS: usize = 8;

impl EmbeddedStore {
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
}

#[cfg(test)]
mod tests {
    use ember_proto::ember::AgentIdentity;

    use super::*;
    use crate::{
        embedded::tests::{fresh_dir, profile},
        store::Checked,
    };

    fn entries(store: &EmbeddedStore) -> (usize, usize) {
        use redb::{ReadableDatabase as _, ReadableTableMetadata as _};
        let db = store.db();
        let txn = db.begin_read().unwrap();
        (txn.open_table(DELIVERED).unwrap().len().unwrap() as usize, txn.open_table(CONTIGUOUS).unwrap().len().unwrap() as usize)
    }

    #[test]
    fn de_duplication_records_go_with_retention() {
        let dir = fresh_dir("growth");
        let store = EmbeddedStore::open(&dir).unwrap();
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
        let store = EmbeddedStore::open(&dir).unwrap();
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
}
