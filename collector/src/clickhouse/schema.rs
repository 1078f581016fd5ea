//! The tables the collector keeps in ClickHouse, made for ClickHouse's way of answering:
//! samples are rows (a merged flame graph is one GROUP BY over them, run where the data is),
//! their stacks are stored once per day by hash, roll-ups sum them per minute, ten minutes
//! and hour, and every table but the watermarks is partitioned by day, so retention drops
//! whole partitions. The SQL is the subset that ClickHouse 18.16 (Debian's) and current
//! releases both accept.
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

/// Columns every sample row and roll-up row share: the sample's labels, stack and values.
const SAMPLE: &str = "sample_keys Array(String), sample_values Array(String), sample_num_keys Array(String), sample_nums Array(Int64), \
stack UInt64, values Array(Int64)";

/// A cluster the tables are sharded over: local tables on every server, and a Distributed
/// table over each. `replicated`: each shard is a set of replicas (`Replicated*MergeTree`,
/// kept in step through ZooKeeper; the servers' `macros` name their shard and replica).
#[derive(Clone, Debug)]
pub struct Cluster {
    pub name: String,
    pub replicated: bool,
}

/// Ember's tables: name, columns, engine (its family and arguments) and key, and what shards
/// its rows on a cluster.
const TABLES: [(&str, &str, (&str, &str), &str, &str); 6] = [
    // One row per stored copy of a profile: its sample types and totals, and which
    // (origin, sequence) it is. Written last, after its samples: a copy is readable once this
    // row exists, so a copy cut short by a crash is never read.
    (
        "profiles",
        "sample_types Array(String), sample_units Array(String), period_type String, period_unit String, period Int64, \
totals Array(Int64), samples UInt64",
        ("MergeTree", ""),
        "PARTITION BY day ORDER BY (origin, sequence)",
        "cityHash64(origin)",
    ),
    // One row per sample: its labels, its stack's hash and its values. Sharded as its
    // profile, so that picking a profile's copy is a question each shard answers alone.
    ("samples", SAMPLE, ("MergeTree", ""), "PARTITION BY day ORDER BY (kind, start_ns, stack)", "cityHash64(origin)"),
    // Each stack once per day it is used in (merges remove the copies), leaf first: one entry
    // per line of each frame, `locations` numbering the frames (a frame with inlined functions
    // has several lines), `lines` -1 for a frame without any.
    (
        "stacks",
        "functions Array(String), files Array(String), lines Array(Int64), binaries Array(String), build_ids Array(String), \
addresses Array(UInt64), locations Array(UInt64)",
        ("ReplacingMergeTree", ""),
        "PARTITION BY day ORDER BY stack",
        "stack",
    ),
    // How far each spool is stored without a gap: never dropped with the days, so that a
    // retry of a profile past retention is still known as a duplicate.
    ("watermarks", "", ("ReplacingMergeTree", "through"), "ORDER BY origin", "cityHash64(origin)"),
    // A bucket's samples summed per agent, kind, labels and stack, by one build (see
    // `rollups`): `profiles` is how many profiles the row's group (agent, kind, profile
    // labels) holds, `start_ns` and `end_ns` the first start and last end among them,
    // `value_sums` the sums in floating point (an Int64 sum wraps), `sample_rows` how
    // many sample rows it sums. Each build also sums its agents' rows together, rows
    // without an origin (see `rollups::FLEET`). Sorted by host within a bucket, so that one
    // host's range, or the fleet's, reads its own rows. Sharded as the samples they sum.
    ("rollups", SAMPLE, ("MergeTree", ""), "PARTITION BY day ORDER BY (level, kind, bucket, host, stack)", "cityHash64(origin)"),
    // Rows of a build of a bucket's roll-ups, one per kind, written after them in one insert:
    // how many profiles the bucket held when the build began (a build is read while its
    // bucket holds that many), and what the kind's roll-ups hold (see `rollups`).
    (
        "builds",
        "profiles UInt64, kind String, kind_profiles UInt64, first_ns UInt64, last_ns UInt64",
        ("MergeTree", ""),
        "PARTITION BY day ORDER BY (level, bucket)",
        "bucket",
    ),
];

/// Rows of a table partitioned by day whose profile starts in [from, to) (unix ns): the days
/// first, which spare ClickHouse the other days' partitions.
pub fn starts_in(from: u64, to: u64) -> String {
    const DAY: u64 = 86_400_000_000_000;
    let day = |ns: u64| (ns / DAY).min(u16::MAX.into());
    format!("day >= toDate(toUInt16({})) AND day <= toDate(toUInt16({})) AND start_ns >= {from} AND start_ns < {to}", day(from), day(to.saturating_sub(1)))
}

/// Keeps one copy of each profile among rows of `profiles` or `samples`: of the profiles the
/// condition `selected` picks, each (origin, sequence)'s smallest attempt (see PROFILE_KEY).
pub fn one_copy(database: &str, selected: &str) -> String {
    format!("(origin, sequence, attempt) IN (SELECT origin, sequence, min(attempt) FROM {database}.profiles WHERE {selected} GROUP BY origin, sequence)")
}

/// The columns a table starts with.
fn leading(table: &str) -> String {
    match table {
        "profiles" | "samples" => format!("{PROFILE_KEY}, "),
        "stacks" => "day Date, stack UInt64, ".to_string(),
        "rollups" => "day Date, level UInt64, bucket UInt64, build UInt64, start_ns UInt64, end_ns UInt64, kind String, origin String, \
agent String, host String, label_keys Array(String), label_values Array(String), profiles UInt64, value_sums Array(Float64), sample_rows UInt64, "
            .to_string(),
        "builds" => "day Date, level UInt64, bucket UInt64, build UInt64, ".to_string(),
        _ => "origin String, through UInt64".to_string(),
    }
}

/// The table engine: on replicas, its replicated twin, under a ZooKeeper path of its shard's
/// (from the server's `{shard}` macro), as the replica the server's `{replica}` macro names.
fn engine(database: &str, table: &str, (family, args): (&str, &str), replicated: bool) -> String {
    if !replicated {
        return if args.is_empty() { family.to_string() } else { format!("{family}({args})") };
    }
    let place = format!("'/clickhouse/tables/{{shard}}/{database}/{table}', '{{replica}}'");
    let args = if args.is_empty() { place } else { format!("{place}, {args}") };
    format!("Replicated{family}({args})")
}

/// The name of `table` on each server: itself on one server; on a cluster, `<table>_local`
/// under the Distributed table of that name.
pub fn local_name(table: &str, cluster: Option<&Cluster>) -> String {
    match cluster {
        Some(_) => format!("{table}_local"),
        None => table.to_string(),
    }
}

/// The statements that create the schema in `database`, in order: on one server its tables;
/// on `cluster`, each table as `<table>_local` on the server (replicated where the cluster's
/// shards are) and a Distributed table over the cluster's (every server of it needs both:
/// run them on each, or point a collector at each).
pub fn statements(database: &str, cluster: Option<&Cluster>) -> Result<Vec<String>> {
    let database = identifier("ClickHouse database", database)?;
    let name = cluster.map(|c| identifier("ClickHouse cluster", &c.name)).transpose()?;
    let replicated = cluster.is_some_and(|c| c.replicated);
    let mut out = vec![format!("CREATE DATABASE IF NOT EXISTS {database}")];
    for (table, columns, family, key, shard_by) in TABLES {
        let local = local_name(table, cluster);
        let engine = engine(database, &local, family, replicated);
        out.push(format!("CREATE TABLE IF NOT EXISTS {database}.{local} ({}{columns}) ENGINE = {engine} {key}", leading(table)));
        if let Some(name) = name {
            out.push(format!("CREATE TABLE IF NOT EXISTS {database}.{table} AS {database}.{local} ENGINE = Distributed({name}, {database}, {local}, {shard_by})"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_gets_local_tables_and_distributed_ones_over_them() {
        let single = statements("ember", None).unwrap();
        assert_eq!(single.len(), 7);
        assert!(single[1].starts_with("CREATE TABLE IF NOT EXISTS ember.profiles (day Date,"), "{}", single[1]);
        let fleet = |replicated| Cluster { name: "fleet".into(), replicated };
        let cluster = statements("ember", Some(&fleet(false))).unwrap();
        assert_eq!(cluster.len(), 13);
        assert!(cluster[3].starts_with("CREATE TABLE IF NOT EXISTS ember.samples_local (day Date,"), "{}", cluster[3]);
        assert_eq!(cluster[4], "CREATE TABLE IF NOT EXISTS ember.samples AS ember.samples_local ENGINE = Distributed(fleet, ember, samples_local, cityHash64(origin))");
        assert!(cluster[7].ends_with("(origin String, through UInt64) ENGINE = ReplacingMergeTree(through) ORDER BY origin"), "{}", cluster[7]);
        assert!(cluster[12].ends_with("ENGINE = Distributed(fleet, ember, builds_local, bucket)"), "{}", cluster[12]);
        assert!(statements("ember", Some(&Cluster { name: "a,b".into(), replicated: false })).is_err());
        let replicated = statements("ember", Some(&fleet(true))).unwrap();
        assert!(
            replicated[1].ends_with("ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/ember/profiles_local', '{replica}') PARTITION BY day ORDER BY (origin, sequence)"),
            "{}",
            replicated[1]
        );
        assert!(
            replicated[7].ends_with("ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/ember/watermarks_local', '{replica}', through) ORDER BY origin"),
            "{}",
            replicated[7]
        );
        assert_eq!(replicated[8], cluster[8]);
    }

    #[test]
    fn only_plain_names_are_identifiers() {
        assert!(identifier("database", "ember_1").is_ok());
        for bad in ["", "1x", "a.b", "a`b", "a b", "x; DROP TABLE y"] {
            assert!(identifier("database", bad).is_err(), "{bad}");
        }
    }
}
