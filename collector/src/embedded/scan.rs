//! Reads of a time range, in time order and one record at a time, so that a query holds only
//! what it merges; where roll-ups cover whole buckets a scan may read them instead of the
//! profiles they merge.
use anyhow::{Context as _, Result};
use prost::Message;
use redb::ReadableDatabase;

use super::{Detail, EmbeddedStore, StoredProfile, PROFILES, ROLLED, ROLLUPS};
use crate::buckets::{self, Segment};

impl EmbeddedStore {
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
}
