//! ClickHouse as the collector's store, for fleets: any number of collectors share one
//! ClickHouse (or a cluster of them) and none keeps state another needs. Profiles are stored
//! as rows (`schema`), exactly once across collectors (`ingest`), inserted with the other
//! pushes of the moment (`inserts`), and queries run where the data is (`reads`, over
//! selections bound in `select`), from the roll-ups (`rollups`) that `plan` picks where they
//! are complete; retention drops days (`retention`).
//! `client` speaks ClickHouse's HTTP interface, in `row_binary` both ways, and `stacks` turns
//! a profile into rows and rows into a profile.
mod client;
mod ingest;
mod inserts;
mod plan;
mod reads;
mod retention;
mod rollups;
mod row_binary;
mod schema;
mod select;
mod stacks;

use std::{
    collections::HashMap,
    sync::{atomic::AtomicU64, Arc, Mutex, RwLock},
    time::Instant,
};

use anyhow::{Context as _, Result};
use ember_proto::{ember::AgentIdentity, pprof};

pub use client::Connection;
pub use schema::{statements, Cluster};

/// For the fuzz target of what goes to ClickHouse and comes back (`crate::fuzz`).
#[cfg(fuzzing)]
pub(crate) mod fuzzing {
    pub use super::{
        row_binary::{Reader, Writer},
        stacks::{rows, Builder, Stack},
    };
}

use crate::store::{Checked, Labels, Merged, Points, ProfileStore, Putting, Selection, Stored};

pub struct ClickHouse {
    client: Arc<client::Client>,
    /// Where pushes' rows wait to be inserted together.
    inserts: Arc<inserts::Inserts>,
    /// The cluster the tables are Distributed over, if any.
    cluster: Option<Cluster>,
    /// Checked by `statements`: names are spliced into statements.
    database: String,
    /// Profiles that start before this (unix ns) are past retention.
    horizon: AtomicU64,
    /// (day, stack hash) of the stacks this collector stored: most of a host's stacks repeat
    /// in its every profile, and are not sent again. Only an economy: a stack sent twice is
    /// one row once ClickHouse merges.
    stacks_stored: Arc<RwLock<FastSet<(u64, u64)>>>,
    /// Origin -> the watermark this collector last stored for it. A push that goes on from
    /// there (an agent sending its spool in order to one collector) is stored without asking
    /// ClickHouse what is stored already, two queries fewer. Only an economy too: a profile of
    /// such a push that another collector stored but never acknowledged is stored twice, and
    /// every read keeps one copy.
    continuing: Arc<Mutex<ember_pprof::FastMap<String, u64>>>,
    /// (level, bucket) -> profiles, of the buckets the last round of `roll_due` saw due and
    /// not built: one is built once it holds as many in the next round.
    seen: Mutex<HashMap<(u64, u64), u64>>,
}

type FastSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;

impl ClickHouse {
    /// Connects and creates the schema where it is missing (a no-op where it exists, so any
    /// number of collectors may start at once). On a cluster, every statement reads the
    /// shards' local tables where a profile's rows are (each profile's rows sit on one shard),
    /// and an insert returns once the shards hold it. Of a shard's replicas, every collector
    /// reads and writes the first that answers, in the cluster's order: a replica that lags
    /// (one just back) is read only while those before it are away, so what a collector
    /// counted and then built or checked come from one replica.
    pub fn open(connection: &Connection, database: &str, cluster: Option<&Cluster>) -> Result<ClickHouse> {
        let settings = match cluster {
            Some(_) => vec![("distributed_product_mode", "local"), ("insert_distributed_sync", "1"), ("load_balancing", "in_order")],
            None => vec![],
        };
        let client = Arc::new(client::Client::new(connection, &settings)?);
        for statement in statements(database, cluster)? {
            client.query(&statement, &[], None).with_context(|| format!("creating Ember's tables in ClickHouse at {}", connection.url))?;
        }
        Ok(ClickHouse {
            inserts: inserts::Inserts::start(client.clone(), database.to_string()),
            client,
            cluster: cluster.cloned(),
            database: database.to_string(),
            horizon: AtomicU64::new(0),
            stacks_stored: Arc::default(),
            continuing: Arc::default(),
            seen: Mutex::default(),
        })
    }
}

/// An id distinct across collectors and calls: of one collector's copy of a push, of a build
/// of roll-ups.
fn unique_id() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish()
}

impl ProfileStore for ClickHouse {
    fn put(&self, agent: &AgentIdentity, profiles: &[Checked]) -> Result<Stored> {
        tokio::runtime::Handle::current().block_on(self.start_put(agent, profiles)?.done())
    }

    fn start_put(&self, agent: &AgentIdentity, profiles: &[Checked]) -> Result<Putting> {
        ClickHouse::start_put(self, agent, profiles)
    }

    fn stored_through(&self, agent: &AgentIdentity) -> Result<u64> {
        self.watermark(&crate::store::origin(agent))
    }

    fn visit_merged(&self, selection: &Selection, deadline: Option<Instant>, visit: &mut dyn FnMut(pprof::Profile) -> Result<()>) -> Result<Merged> {
        let Some((profile, count)) = self.merged(selection, deadline)? else { return Ok(Merged::default()) };
        visit(profile)?;
        Ok(count)
    }

    fn points(&self, selection: &Selection, value: usize, group_by: Option<&str>, deadline: Option<Instant>) -> Result<Points> {
        ClickHouse::points(self, selection, value, group_by, deadline)
    }

    fn labels(&self, kind: &str, range: (u64, u64), deadline: Instant) -> Result<Labels> {
        ClickHouse::labels(self, kind, range, deadline)
    }

    /// By age only: ClickHouse's disk is its operator's to bound.
    fn enforce_retention(&self, oldest: u64, _max_bytes: u64) -> Result<usize> {
        ClickHouse::enforce_retention(self, oldest)
    }

    fn ready(&self) -> Result<()> {
        let deadline = Instant::now() + std::time::Duration::from_secs(2);
        self.client.query("SELECT 1", &[], Some(deadline)).map(drop).context("ClickHouse is not answering")
    }

    fn roll_due(&self, now: u64, delay: u64) -> Result<usize> {
        ClickHouse::roll_due(self, now, delay)
    }
}
