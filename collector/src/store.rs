//! The embedded store: profiles persisted in a redb database under the data directory,
//! indexed by time, with per-spool sequence numbers so a retried push is stored once.
//! Profiles are de-duplicated by their spool (its random id), not by the agent's name: a
//! renamed agent resending its spool stores nothing twice, and a wiped spool's new numbers
//! never pass for old ones.
use std::path::Path;

use anyhow::{Context as _, Result};
use ember_proto::ember::{AgentIdentity, Profile};
use prost::Message;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

/// (start unix ns, origin, sequence) -> StoredProfile.
const PROFILES: TableDefinition<(u64, &str, u64), &[u8]> = TableDefinition::new("profiles");
/// (origin, sequence) -> start unix ns: which profiles an origin has delivered.
const DELIVERED: TableDefinition<(&str, u64), u64> = TableDefinition::new("delivered");
/// origin -> highest sequence N such that 1..=N are all stored.
const CONTIGUOUS: TableDefinition<&str, u64> = TableDefinition::new("contiguous");

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
}

pub struct Store {
    db: Database,
}

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
        txn.open_table(PROFILES)?;
        txn.open_table(DELIVERED)?;
        txn.open_table(CONTIGUOUS)?;
        txn.commit()?;
        Ok(Store { db })
    }

    /// Stores an agent's profiles in one transaction; profiles it delivered before are
    /// counted as duplicates and dropped.
    pub fn put(&self, agent: &AgentIdentity, profiles: &[Profile]) -> Result<Stored> {
        let txn = self.db.begin_write()?;
        let mut result = Stored::default();
        {
            let mut stored = txn.open_table(PROFILES)?;
            let mut delivered = txn.open_table(DELIVERED)?;
            let mut contiguous = txn.open_table(CONTIGUOUS)?;
            let origin = origin(agent);
            let id = origin.as_str();
            let mut through = contiguous.get(id)?.map(|v| v.value()).unwrap_or(0);
            for profile in profiles {
                result.held.push(profile.sequence);
                if profile.sequence <= through || delivered.get((id, profile.sequence))?.is_some() {
                    result.duplicates += 1;
                    continue;
                }
                let start = profile.start_unix_nanos.max(0) as u64;
                let record = StoredProfile { agent: Some(agent.clone()), profile: Some(profile.clone()) };
                stored.insert((start, id, profile.sequence), record.encode_to_vec().as_slice())?;
                delivered.insert((id, profile.sequence), start)?;
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

    /// Deletes profiles that started before `min_start`, then the oldest until the stored
    /// profiles take at most `max_bytes`. Returns how many were deleted. (What each agent
    /// delivered is remembered, so a late retry of a deleted profile is still a duplicate.)
    pub fn enforce_retention(&self, min_start: u64, max_bytes: u64) -> Result<usize> {
        let txn = self.db.begin_write()?;
        let deleted;
        {
            let mut table = txn.open_table(PROFILES)?;
            let mut sizes = Vec::new();
            for entry in table.iter()? {
                let (key, value) = entry?;
                let (start, agent, sequence) = key.value();
                sizes.push(((start, agent.to_string(), sequence), value.value().len() as u64));
            }
            let mut total: u64 = sizes.iter().map(|(_, n)| n).sum();
            let mut doomed = Vec::new();
            for (key, size) in sizes {
                if key.0 < min_start || total > max_bytes {
                    total -= size;
                    doomed.push(key);
                }
            }
            for (start, agent, sequence) in &doomed {
                table.remove((*start, agent.as_str(), *sequence))?;
            }
            deleted = doomed.len();
        }
        txn.commit()?;
        Ok(deleted)
    }

    /// Highest sequence N such that the profiles 1..=N of this agent's spool are all stored.
    pub fn stored_through(&self, agent: &AgentIdentity) -> Result<u64> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(CONTIGUOUS)?;
        Ok(table.get(origin(agent).as_str())?.map(|v| v.value()).unwrap_or(0))
    }

    /// Profiles whose start lies in [from, to), in time order.
    pub fn range(&self, from: u64, to: u64) -> Result<Vec<StoredProfile>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(PROFILES)?;
        let mut out = Vec::new();
        for entry in table.range((from, "", 0)..(to, "", 0))? {
            let (_, value) = entry?;
            out.push(StoredProfile::decode(value.value()).context("corrupt stored profile")?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(sequence: u64, start: i64, bytes: usize) -> Profile {
        Profile { sequence, kind: "cpu".into(), start_unix_nanos: start, end_unix_nanos: start + 1, pprof_gzip: vec![0; bytes], ..Default::default() }
    }

    #[test]
    fn stores_once_survives_reopen_and_enforces_retention() {
        let dir = std::env::temp_dir().join(format!("ember-store-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
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
        // Age: profile 1 (start 100) goes; size: then the oldest until at most ~1 profile.
        assert_eq!(store.enforce_retention(150, u64::MAX).unwrap(), 1);
        assert_eq!(store.enforce_retention(0, 1500).unwrap(), 1);
        let left: Vec<u64> = store.range(0, u64::MAX).unwrap().iter().map(|p| p.profile.as_ref().unwrap().sequence).collect();
        assert_eq!(left, [3]);
        // A late retry of a deleted profile is still recognised.
        assert_eq!(store.put(&agent, &[profile(1, 100, 1000)]).unwrap().duplicates, 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sequences_count_per_spool_not_per_agent_name() {
        let dir = std::env::temp_dir().join(format!("ember-store-spools-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
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
