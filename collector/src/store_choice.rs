//! Which store a collector keeps its profiles in, as its command line says, and opening it:
//! the embedded store under a data directory (the default), or ClickHouse.
use std::{path::PathBuf, sync::Arc};

use anyhow::Result;

use crate::{
    clickhouse::{ClickHouse, Connection},
    embedded::EmbeddedStore,
    embedded_store::Embedded,
    store::ProfileStore,
};

pub enum StoreChoice {
    Embedded(PathBuf),
    ClickHouse { connection: Connection, database: String, cluster: Option<String> },
}

impl StoreChoice {
    /// Opens the store. ClickHouse's is reached through the tokio runtime the caller is in,
    /// from a thread that may block.
    pub fn open(&self) -> Result<Arc<dyn ProfileStore>> {
        Ok(match self {
            StoreChoice::Embedded(dir) => Arc::new(Embedded::new(EmbeddedStore::open(dir)?)),
            StoreChoice::ClickHouse { connection, database, cluster } => Arc::new(ClickHouse::open(connection, database, cluster.as_deref())?),
        })
    }

    /// Where the profiles are, for the log.
    pub fn describe(&self) -> String {
        match self {
            StoreChoice::Embedded(dir) => format!("embedded store in {}", dir.display()),
            StoreChoice::ClickHouse { connection, database, cluster } => {
                let on = cluster.as_ref().map(|c| format!(", Distributed over cluster {c}")).unwrap_or_default();
                format!("ClickHouse at {}, database {database}{on}", connection.url)
            }
        }
    }
}
