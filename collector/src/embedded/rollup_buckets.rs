//! The store's side of roll-ups: which buckets wait to be rolled up and which are complete,
//! and their roll-ups. A bucket's roll-ups must always hold all of its profiles, so a profile
//! stored in it, or retention reaching it, undoes them, and a roll-up built meanwhile is not
//! saved.
use anyhow::Result;
use prost::Message;
use redb::{ReadableDatabase, ReadableTable};

use super::{RollupUsage, EmbeddedStore, StoredProfile, PENDING, ROLLED, ROLLUPS};
use crate::buckets::LEVELS;

impl EmbeddedStore {
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

/// The roll-up tables, open in a write transaction.
pub(super) struct Buckets<'t> {
    rollups: redb::Table<'t, (u64, u64, u64), &'static [u8]>,
    rolled: redb::Table<'t, (u64, u64), u64>,
    pub(super) pending: redb::Table<'t, (u64, u64), u64>,
}

impl<'t> Buckets<'t> {
    pub(super) fn open(txn: &'t redb::WriteTransaction) -> Result<Self> {
        Ok(Buckets { rollups: txn.open_table(ROLLUPS)?, rolled: txn.open_table(ROLLED)?, pending: txn.open_table(PENDING)? })
    }

    /// Drops a bucket's roll-ups: they no longer hold all of its profiles.
    pub(super) fn undo(&mut self, level: u64, bucket: u64) -> Result<()> {
        if self.rolled.remove((level, bucket))?.is_some() {
            self.rollups.retain_in((level, bucket, 0)..=(level, bucket, u64::MAX), |_, _| false)?;
        }
        Ok(())
    }

    /// Drops the roll-ups and pending marks of every bucket that starts at or before `start`,
    /// the last profile retention deleted: those buckets are read raw from now on.
    pub(super) fn forget_through(&mut self, start: u64) -> Result<()> {
        for level in LEVELS {
            self.rolled.retain_in((level, 0)..=(level, start), |_, _| false)?;
            self.pending.retain_in((level, 0)..=(level, start), |_, _| false)?;
            self.rollups.retain_in((level, 0, 0)..=(level, start, u64::MAX), |_, _| false)?;
        }
        Ok(())
    }
}
