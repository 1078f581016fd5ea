//! Storing pushed and pulled profiles exactly once: a retried push, a renamed agent's resend
//! and a late retry of a profile already past retention are acknowledged without a second copy,
//! and an agent learns how far its spool is stored.
use std::sync::atomic::Ordering;

use anyhow::Result;
use ember_proto::ember::AgentIdentity;
use prost::Message;
use redb::{ReadableDatabase, ReadableTable};

use super::{rollup_buckets::Buckets, EmbeddedStore, StoredProfile, CONTIGUOUS, DELIVERED, PROFILES};
use crate::{
    buckets::{bucket, LEVELS},
    store::{origin, Checked, Stored},
};

impl EmbeddedStore {
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
            for Checked { profile, totals, .. } in profiles {
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

    /// Highest sequence N such that the profiles 1..=N of this agent's spool are all stored.
    pub fn stored_through(&self, agent: &AgentIdentity) -> Result<u64> {
        let txn = self.db().begin_read()?;
        let table = txn.open_table(CONTIGUOUS)?;
        Ok(table.get(origin(agent).as_str())?.map(|v| v.value()).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::tests::{fresh_dir, profile};

    #[test]
    fn stores_once_survives_reopen_and_enforces_retention() {
        let dir = fresh_dir("test");
        let agent = AgentIdentity { agent_id: "a".into(), ..Default::default() };
        {
            let store = EmbeddedStore::open(&dir).unwrap();
            // Out of order: 2 arrives before 1; the watermark waits for the gap to close.
            assert_eq!(store.put(&agent, &[profile(2, 200, 1000)]).unwrap(), Stored { stored_through: 0, duplicates: 0, held: vec![2] });
            assert_eq!(
                store.put(&agent, &[profile(1, 100, 1000), profile(2, 200, 1000)]).unwrap(),
                Stored { stored_through: 2, duplicates: 1, held: vec![1, 2] }
            );
        }
        let store = EmbeddedStore::open(&dir).unwrap();
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

    #[test]
    fn sequences_count_per_spool_not_per_agent_name() {
        let dir = fresh_dir("spools");
        let store = EmbeddedStore::open(&dir).unwrap();
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
