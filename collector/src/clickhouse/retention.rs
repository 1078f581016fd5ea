//! Retention in ClickHouse: whole days, dropped as partitions (ClickHouse 18.16 has no TTL),
//! once every moment of the day is older than the retention; a day's profiles stay until its
//! end passes the horizon. Profiles past the horizon that arrive late are acknowledged as
//! duplicates, not stored again.
use std::sync::atomic::Ordering;

use anyhow::{ensure, Result};

use super::{
    client::External,
    schema::local_name,
    row_binary::{Reader, Writer},
    ClickHouse,
};

const DAY_NS: u64 = 86_400_000_000_000;

impl ClickHouse {
    /// Drops the days that ended before `oldest` (unix ns); returns how many profiles went.
    pub(super) fn enforce_retention(&self, oldest: u64) -> Result<usize> {
        self.horizon.store(oldest, Ordering::Relaxed);
        // Days since 1970-01-01, as a Date is stored.
        let first_kept = oldest / DAY_NS;
        // On a cluster, this server's part: each server's is dropped by the collectors on it
        // (a replica's drop is its shard's other replicas' too).
        let tables = ["profiles", "samples", "stacks", "rollups", "builds"].map(|table| local_name(table, self.cluster.as_ref()));
        let mut args = Writer::default();
        args.str(&self.database);
        let answer = self.client.query(
            &format!(
                "SELECT DISTINCT partition_id FROM system.parts WHERE database = (SELECT db FROM args) \
AND table IN ('{}') AND active AND toUInt16(max_date) < {first_kept} FORMAT RowBinary",
                tables.join("', '")
            ),
            &[External { name: "args", structure: "db String", rows: args }],
            None,
        )?;
        let mut days = Vec::new();
        let mut r = Reader(&answer);
        while !r.is_empty() {
            let id = r.str()?;
            ensure!(!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()), "ClickHouse named a partition {id:?}, not a day");
            days.push(id);
        }
        if days.is_empty() {
            return Ok(0);
        }
        let db = &self.database;
        let counted = self.client.query(&format!("SELECT count() FROM {db}.{} WHERE toUInt16(day) < {first_kept} FORMAT RowBinary", tables[0]), &[], None)?;
        let gone = Reader(&counted).u64()?;
        for day in days {
            for table in &tables {
                self.client.query(&format!("ALTER TABLE {db}.{table} DROP PARTITION ID '{day}'"), &[], None)?;
            }
        }
        Ok(gone as usize)
    }
}
