//! The embedded store: profiles persisted in a redb database under the data directory,
//! indexed by time, with per-agent sequence numbers so a retried push is stored once.
use std::path::Path;

use anyhow::{Context as _, Result};
use ember_proto::ember::{AgentIdentity, Profile};
use prost::Message;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

/// (start unix ns, agent id, sequence) -> StoredProfile.
const PROFILES: TableDefinition<(u64, &str, u64), &[u8]> = TableDefinition::new("profiles");
/// (agent id, sequence) -> start unix ns: which profiles an agent has delivered.
const DELIVERED: TableDefinition<(&str, u64), u64> = TableDefinition::new("delivered");
/// agent id -> highest sequence N such that 1..=N are all stored.
const CONTIGUOUS: TableDefinition<&str, u64> = TableDefinition::new("contiguous");

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
            let id = agent.agent_id.as_str();
            let mut through = contiguous.get(id)?.map(|v| v.value()).unwrap_or(0);
            for profile in profiles {
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
