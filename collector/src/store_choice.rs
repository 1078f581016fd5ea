//! Which store a collector keeps its profiles in, as its command line says, and opening it:
//! the embedded store under a data directory (the default), or ClickHouse.
use std::{path::PathBuf, sync::Arc};

use anyhow::Result;

use crate::{
    clickhouse::{ClickHouse, Cluster, Connection},
    embedded::EmbeddedStore,
    embedded_store::Embedded,
    store::ProfileStore,
};

pub enum StoreChoice {
    Embedded(PathBuf),
    ClickHouse { connection: Connection, database: String, cluster: Option<Cluster> },
}

impl StoreChoice {
    /// Opens the store. ClickHouse's is reached through the tokio runtime the caller is in,
    /// from a thread that may block.
    pub fn open(&self) -> Result<Arc<dyn ProfileStore>> {
        Ok(match self {
            StoreChoice::Embedded(dir) => Arc::new(Embedded::new(EmbeddedStore::open(dir)?)),
            StoreChoice::ClickHouse { connection, database, cluster } => Arc::new(ClickHouse::open(connection, database, cluster.as_ref())?),
        })
    }

    /// Where the profiles are, for the log.
    pub fn describe(&self) -> String {
        match self {
            StoreChoice::Embedded(dir) => format!("embedded store in {}", dir.display()),
            StoreChoice::ClickHouse { connection, database, cluster } => {
                let on = match cluster {
                    Some(Cluster { name, replicated: true }) => format!(", Distributed over cluster {name}, replicated"),
                    Some(Cluster { name, replicated: false }) => format!(", Distributed over cluster {name}"),
                    None => String::new(),
                };
                format!("ClickHouse at {}, database {database}{on}", connection.url)
            }
        }
    }
}
