//! ember-collector: receives profiles pushed by agents over gRPC, keeps them in a store (an
//! embedded one under a data directory, or ClickHouse), and answers queries. This file is the
//! command line: it resolves `serve`'s settings and dispatches. `server` wires the running
//! collector (`service` ingest, the `store` chosen in `store_choice`, `http`/`https` queries
//! over `query`, `pull` loops); `offline` answers `list` and `query` from a stopped
//! collector's data directory or from ClickHouse.
#[cfg(test)]
mod allocations;
mod api;
mod buckets;
mod clickhouse;
mod embedded;
mod embedded_store;
mod http;
mod https;
mod labels;
mod offline;
mod pull;
mod query;
mod request;
mod rollup;
mod series;
mod server;
mod service;
mod store;
mod store_choice;
mod tree;
mod ui;

#[cfg(fuzzing)]
pub mod fuzz;

use std::{io::{IsTerminal as _, Write as _}, net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Result;
use clap::{Parser, Subcommand};
use ember_proto::security::{self, ClientSecurity, ServerSecurity};

use crate::{clickhouse::{Cluster, Connection}, request::QueryLimits, server::ServeSettings, store_choice::StoreChoice};

#[derive(Parser)]
#[command(name = "ember-collector", version, about = "Ember's collector: receive, store and query profiles")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Receive pushed profiles (gRPC) and store them.
    Serve {
        /// gRPC address agents push to.
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: SocketAddr,
        /// HTTP address of the query API (/query, /diff, /healthz, /readyz).
        #[arg(long, default_value = "127.0.0.1:7071")]
        http: SocketAddr,
        #[command(flatten)]
        store: StoreArgs,
        /// Delete profiles older than this many hours (in ClickHouse: whole days, once the
        /// day's end is that old).
        #[arg(long, default_value_t = 168)]
        retention_hours: u64,
        /// Keep the embedded store (its database file) within this many MiB (oldest profiles
        /// deleted first).
        #[arg(long, default_value_t = 10_240)]
        max_size_mib: u64,
        /// Roll a time bucket's profiles up (one merged profile per agent, read by queries
        /// instead of each) this many seconds after the bucket ends. A profile that arrives
        /// later undoes its bucket's roll-up until it is built again.
        #[arg(long, default_value_t = 60)]
        rollup_delay_seconds: u64,
        /// The longest time range one query may merge, in hours.
        #[arg(long, default_value_t = 168, value_parser = clap::value_parser!(u64).range(1..=87_600))]
        query_max_range_hours: u64,
        /// Queries that may run at once (more get 503 and retry).
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=1024))]
        query_concurrency: u64,
        /// A query still running after this many milliseconds is stopped (504).
        #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
        query_timeout_ms: u64,
        /// Require `authorization: Bearer <token>` (token read from this file) on pushes and
        /// queries. Health checks stay open for probes.
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// Pull from this agent (gRPC URL, e.g. https://node-1:7072); repeat for several.
        #[arg(long)]
        pull: Vec<String>,
        /// Pull over TLS: the CA (PEM) that signed the agents' certificates.
        #[arg(long)]
        pull_tls_ca: Option<PathBuf>,
        /// Pull over mutual TLS: the collector's client certificate (PEM) ...
        #[arg(long, requires = "pull_tls_key")]
        pull_tls_cert: Option<PathBuf>,
        /// ... and its private key (PEM).
        #[arg(long, requires = "pull_tls_cert")]
        pull_tls_key: Option<PathBuf>,
        /// The bearer token agents require of pullers (read from this file).
        #[arg(long)]
        pull_token_file: Option<PathBuf>,
        /// Serve gRPC and the HTTP query API over TLS with this certificate (PEM) ...
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// ... and its private key (PEM).
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Mutual TLS on gRPC: accept only agents whose certificate this CA (PEM) signed.
        #[arg(long, requires = "tls_cert")]
        tls_client_ca: Option<PathBuf>,
        /// Accept plaintext gRPC and HTTP on non-loopback addresses, and pull plaintext from
        /// agents on other hosts (without it, both are refused).
        #[arg(long)]
        plaintext: bool,
    },
    /// List stored profiles: agent, sequence, kind, start (unix ns), size (pprof bytes in the
    /// embedded store, sample rows in ClickHouse).
    List {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// ClickHouse as the store: the statements that make Ember's schema.
    Clickhouse {
        #[command(subcommand)]
        command: ClickhouseCommand,
    },
    /// Merge the stored profiles of one kind that match a selector and time range.
    Query {
        #[command(flatten)]
        store: StoreArgs,
        /// Profile kind: cpu, offcpu, wall, net-tx, net-rx, net-retransmit, net-drop, faults,
        /// memory-requests, heap.
        #[arg(long, default_value = "cpu")]
        kind: String,
        /// Labels to match, e.g. "host=web-1,service=api" (agent and host are built in); keys a
        /// profile does not carry select its samples, e.g. "node=n3,pod=checkout-7f9".
        #[arg(long, default_value = "")]
        selector: String,
        /// Start of the range, unix seconds [default: everything].
        #[arg(long)]
        from: Option<u64>,
        /// End of the range, unix seconds [default: now].
        #[arg(long)]
        to: Option<u64>,
        /// pprof (gzipped), folded or svg.
        #[arg(long, default_value = "pprof", value_parser = ["pprof", "folded", "svg"])]
        format: String,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
    },
}

#[derive(Subcommand)]
enum ClickhouseCommand {
    /// Print the statements `serve --clickhouse` runs at start (each is a no-op where its
    /// object exists), for a DBA to review or run first.
    Schema {
        /// The database they create and fill.
        #[arg(long, default_value = "ember")]
        database: String,
        /// Local tables on every server of this cluster, and Distributed tables over them.
        #[arg(long)]
        cluster: Option<String>,
        /// The cluster's shards are sets of replicas: replicated local tables.
        #[arg(long, requires = "cluster")]
        replicated: bool,
    },
}

/// Where profiles are stored: the embedded store, or ClickHouse.
#[derive(clap::Args)]
struct StoreArgs {
    /// Where the embedded store keeps its data.
    #[arg(long, default_value = "ember-data")]
    data_dir: PathBuf,
    /// Store in ClickHouse at this HTTP(S) URL (e.g. http://clickhouse-1:8123) instead of the
    /// embedded store; any number of collectors may share it.
    #[arg(long)]
    clickhouse: Option<String>,
    /// The ClickHouse database (created with Ember's tables where missing).
    #[arg(long, default_value = "ember")]
    clickhouse_database: String,
    /// A ClickHouse cluster (from the servers' remote_servers): its shards hold the profiles,
    /// read and written through Distributed tables.
    #[arg(long)]
    clickhouse_cluster: Option<String>,
    /// The cluster's shards are sets of replicas: the local tables are Replicated*MergeTree,
    /// kept in step through the servers' ZooKeeper (their `macros` name shard and replica).
    #[arg(long, requires = "clickhouse_cluster")]
    clickhouse_replicated: bool,
    /// The ClickHouse user.
    #[arg(long, default_value = "default")]
    clickhouse_user: String,
    /// A file that holds the ClickHouse user's password (else EMBER_CLICKHOUSE_PASSWORD, else
    /// none).
    #[arg(long)]
    clickhouse_password_file: Option<PathBuf>,
}

impl StoreArgs {
    fn choice(self) -> Result<StoreChoice> {
        let Some(url) = self.clickhouse else { return Ok(StoreChoice::Embedded(self.data_dir)) };
        let password = match self.clickhouse_password_file {
            Some(path) => security::read_token(&path)?,
            None => std::env::var("EMBER_CLICKHOUSE_PASSWORD").unwrap_or_default(),
        };
        let connection = Connection { url, user: self.clickhouse_user, password };
        let cluster = self.clickhouse_cluster.map(|name| Cluster { name, replicated: self.clickhouse_replicated });
        Ok(StoreChoice::ClickHouse { connection, database: self.clickhouse_database, cluster })
    }
}

/// The command line: parses it, runs the command, and prints a failure as one line.
pub fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let result = match Cli::parse().command {
        Command::Serve {
            listen, http, store, retention_hours, max_size_mib, rollup_delay_seconds, query_max_range_hours, query_concurrency,
            query_timeout_ms, token_file, pull, pull_tls_ca, pull_tls_cert, pull_tls_key, pull_token_file, tls_cert,
            tls_key, tls_client_ca, plaintext,
        } => {
            let setup = || -> Result<ServeSettings> {
                let server = ServerSecurity { cert: tls_cert, key: tls_key, client_ca: tls_client_ca, plaintext };
                let client = ClientSecurity { ca: pull_tls_ca, identity: pull_tls_cert.zip(pull_tls_key), domain: None, plaintext };
                let pull_token = pull_token_file.map(|path| security::read_token(&path)).transpose()?;
                let pull = pull
                    .into_iter()
                    .map(|url| pull::Source::new(url, &client, pull_token.as_deref()))
                    .collect::<Result<_>>()?;
                Ok(ServeSettings {
                    token: token_file.map(|path| security::read_token(&path)).transpose()?,
                    pull,
                    tls: server.grpc(listen)?,
                    http_tls: server.tls(http, "HTTP")?,
                    listen,
                    http,
                    store: store.choice()?,
                    retention: Duration::from_secs(retention_hours * 3600),
                    max_bytes: max_size_mib << 20,
                    rollup_delay: Duration::from_secs(rollup_delay_seconds),
                    query_limits: QueryLimits {
                        max_range: Duration::from_secs(query_max_range_hours * 3600),
                        concurrent: query_concurrency as usize,
                        timeout: Duration::from_millis(query_timeout_ms),
                    },
                })
            };
            match setup() {
                Ok(args) => tokio::runtime::Runtime::new().expect("tokio runtime").block_on(server::serve(args)),
                Err(error) => Err(error),
            }
        }
        Command::Clickhouse { command: ClickhouseCommand::Schema { database, cluster, replicated } } => {
            let cluster = cluster.map(|name| Cluster { name, replicated });
            clickhouse::statements(&database, cluster.as_ref()).and_then(|statements| {
                let mut out = std::io::stdout().lock();
                statements.iter().try_for_each(|statement| writeln!(out, "{statement};\n")).map_err(Into::into)
            })
        }
        Command::List { store } => store.choice().and_then(offline::list),
        Command::Query { store, kind, selector, from, to, format, output } => {
            store.choice().and_then(|store| offline::run_query(store, kind, selector, from, to, format, output))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
