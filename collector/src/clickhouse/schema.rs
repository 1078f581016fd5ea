//! The tables the collector keeps in ClickHouse, made for ClickHouse's way of answering:
//! samples are rows (a merged flame graph is one GROUP BY over them, run where the data is),
//! their stacks are stored once per day by hash, and every table but the watermarks is
//! partitioned by day, so retention drops whole partitions. The SQL is the subset that
//! ClickHouse 18.16 (Debian's) and current releases both accept.
use anyhow::{bail, Result};

/// A database or cluster name, checked: names are the one thing spliced into statements.
pub fn identifier<'a>(what: &str, name: &'a str) -> Result<&'a str> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') || name.len() > 64 {
        bail!("{what} {name:?}: use letters, digits and '_' (at most 64, not starting with a digit)");
    }
    Ok(name)
}

/// Columns every sample row and profile row share: when, what, and which copy.
/// `attempt` tells apart two stores of one (origin, sequence) by two collectors; reads keep
/// the smallest, so a profile counts once whichever copies exist.
const PROFILE_KEY: &str = "day Date, start_ns UInt64, end_ns UInt64, kind String, origin String, sequence UInt64, attempt UInt64, \
agent String, host String, label_keys Array(String), label_values Array(String)";

/// The statements that create the schema in `database`, in order.
pub fn statements(database: &str) -> Result<Vec<String>> {
    let database = identifier("ClickHouse database", database)?;
    Ok(vec![
        format!("CREATE DATABASE IF NOT EXISTS {database}"),
        // One row per stored copy of a profile: its sample types and totals, and which
        // (origin, sequence) it is. Written last, after its samples: a copy is readable once
        // this row exists, so a copy cut short by a crash is never read.
        format!(
            "CREATE TABLE IF NOT EXISTS {database}.profiles ({PROFILE_KEY}, sample_types Array(String), sample_units Array(String), \
period_type String, period_unit String, period Int64, totals Array(Int64), samples UInt64) \
ENGINE = MergeTree PARTITION BY day ORDER BY (origin, sequence)"
        ),
        // One row per sample: its labels, its stack's hash and its values.
        format!(
            "CREATE TABLE IF NOT EXISTS {database}.samples ({PROFILE_KEY}, sample_keys Array(String), sample_values Array(String), \
sample_num_keys Array(String), sample_nums Array(Int64), stack UInt64, values Array(Int64)) \
ENGINE = MergeTree PARTITION BY day ORDER BY (kind, start_ns, stack)"
        ),
        // Each stack once per day it is used in (merges remove the copies), leaf first: one
        // entry per line of each frame, `locations` numbering the frames (a frame with inlined
        // functions has several lines), `lines` -1 for a frame without any.
        format!(
            "CREATE TABLE IF NOT EXISTS {database}.stacks (day Date, stack UInt64, functions Array(String), files Array(String), \
lines Array(Int64), binaries Array(String), build_ids Array(String), addresses Array(UInt64), locations Array(UInt64)) \
ENGINE = ReplacingMergeTree PARTITION BY day ORDER BY stack"
        ),
        // How far each spool is stored without a gap: never dropped with the days, so that a
        // retry of a profile past retention is still known as a duplicate.
        format!("CREATE TABLE IF NOT EXISTS {database}.watermarks (origin String, through UInt64) ENGINE = ReplacingMergeTree(through) ORDER BY origin"),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_are_identifiers() {
        assert!(identifier("database", "ember_1").is_ok());
        for bad in ["", "1x", "a.b", "a`b", "a b", "x; DROP TABLE y"] {
            assert!(identifier("database", bad).is_err(), "{bad}");
        }
    }
}
