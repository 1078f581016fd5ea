//! ember-collector: receives profiles pushed by agents over gRPC, keeps them in an embedded
//! store under a data directory, and answers queries.
mod http;
mod https;
mod pull;
mod query;
mod service;
mod store;

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::ExitCode,
    sync::Arc,
    time::{Duration, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use ember_proto::{
    ember::collector_server::CollectorServer,
    security::{self, ClientSecurity, ServerSecurity},
};

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
        /// HTTP address of the query API (/query, /diff, /healthz).
        #[arg(long, default_value = "127.0.0.1:7071")]
        http: SocketAddr,
        /// Where the embedded store keeps its data.
        #[arg(long, default_value = "ember-data")]
        data_dir: PathBuf,
        /// Delete profiles older than this many hours.
        #[arg(long, default_value_t = 168)]
        retention_hours: u64,
        /// Keep at most this many MiB of profiles (oldest deleted first).
        #[arg(long, default_value_t = 10_240)]
        max_size_mib: u64,
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
    /// List stored profiles: agent, sequence, kind, start (unix ns), size.
    List {
        #[arg(long, default_value = "ember-data")]
        data_dir: PathBuf,
    },
    /// Merge the stored profiles of one kind that match a selector and time range.
    Query {
        #[arg(long, default_value = "ember-data")]
        data_dir: PathBuf,
        /// Profile kind: cpu, offcpu, wall, net-tx, net-rx, net-retransmit, net-drop.
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

struct Serve {
    token: Option<String>,
    pull: Vec<pull::Source>,
    tls: Option<tonic::transport::ServerTlsConfig>,
    /// Certificate and key (PEM) of the HTTPS query API.
    http_tls: Option<(Vec<u8>, Vec<u8>)>,
    listen: SocketAddr,
    http: SocketAddr,
    data_dir: PathBuf,
    retention: Duration,
    max_bytes: u64,
}

async fn serve(args: Serve) -> Result<()> {
    let store = Arc::new(store::Store::open(&args.data_dir)?);
    let http_listener = tokio::net::TcpListener::bind(args.http).await.with_context(|| format!("binding {}", args.http))?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = stop.send(true);
    });
    tokio::spawn(retention(store.clone(), args.retention, args.max_bytes, until_stopped()));
    for source in args.pull {
        tokio::spawn(pull::pull_forever(source, store.clone(), until_stopped()));
    }
    let http = tokio::spawn(http::serve(http_listener, args.http_tls, store.clone(), args.token.clone(), until_stopped()));
    // Standard gRPC health checking and reflection, for probes and tools such as grpcurl.
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<CollectorServer<service::CollectorService>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ember_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the gRPC reflection service")?;
    tracing::info!(grpc = %args.listen, http = %args.http, data_dir = %args.data_dir.display(), "collector listening");
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = args.tls.clone() {
        server = server.tls_config(tls).context("configuring TLS")?;
    }
    server
        .add_service(health_service)
        .add_service(reflection)
        .add_service(CollectorServer::with_interceptor(service::CollectorService { store }, security::token_check(args.token)))
        .serve_with_shutdown(args.listen, until_stopped())
        .await
        .with_context(|| format!("serving gRPC on {}", args.listen))?;
    http.await??;
    Ok(())
}

/// Applies retention once a minute.
async fn retention(store: Arc<store::Store>, max_age: Duration, max_bytes: u64, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    let mut every = tokio::time::interval(Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = every.tick() => {}
        }
        let oldest = std::time::SystemTime::now().checked_sub(max_age).unwrap_or(UNIX_EPOCH);
        let min_start = oldest.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
        let store = store.clone();
        match tokio::task::spawn_blocking(move || store.enforce_retention(min_start, max_bytes)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(deleted)) => tracing::info!(deleted, "retention: deleted old profiles"),
            Ok(Err(e)) => tracing::error!("retention failed: {e:#}"),
            Err(e) => tracing::error!("retention task failed: {e}"),
        }
    }
}

fn run_query(data_dir: PathBuf, kind: String, selector: String, from: Option<u64>, to: Option<u64>, format: String, output: PathBuf) -> Result<()> {
    let store = store::Store::open(&data_dir)?;
    let selector = query::parse_selector(&selector)?;
    let now = std::time::SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() + 1;
    let nanos = |s: u64| s.saturating_mul(1_000_000_000);
    let (profile, count) = query::merged(&store, &kind, &selector, nanos(from.unwrap_or(0)), nanos(to.unwrap_or(now)))?;
    let bytes = query::render(&profile, &kind, &format)?;
    std::fs::write(&output, bytes).with_context(|| format!("writing {}", output.display()))?;
    eprintln!("merged {count} {kind} profiles into {}", output.display());
    Ok(())
}

fn list(data_dir: PathBuf) -> Result<()> {
    let store = store::Store::open(&data_dir)?;
    for stored in store.range(0, u64::MAX)? {
        if let (Some(agent), Some(p)) = (stored.agent, stored.profile) {
            println!("{} {} {} {} {}", agent.agent_id, p.sequence, p.kind, p.start_unix_nanos, p.pprof_gzip.len());
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().command {
        Command::Serve {
            listen, http, data_dir, retention_hours, max_size_mib, token_file, pull, pull_tls_ca, pull_tls_cert,
            pull_tls_key, pull_token_file, tls_cert, tls_key, tls_client_ca, plaintext,
        } => {
            let setup = || -> Result<Serve> {
                let server = ServerSecurity { cert: tls_cert, key: tls_key, client_ca: tls_client_ca, plaintext };
                let client = ClientSecurity { ca: pull_tls_ca, identity: pull_tls_cert.zip(pull_tls_key), domain: None, plaintext };
                let pull_token = pull_token_file.map(|path| security::read_token(&path)).transpose()?;
                let pull = pull
                    .into_iter()
                    .map(|url| pull::Source::new(url, &client, pull_token.as_deref()))
                    .collect::<Result<_>>()?;
                Ok(Serve {
                    token: token_file.map(|path| security::read_token(&path)).transpose()?,
                    pull,
                    tls: server.grpc(listen)?,
                    http_tls: server.tls(http, "HTTP")?,
                    listen,
                    http,
                    data_dir,
                    retention: Duration::from_secs(retention_hours * 3600),
                    max_bytes: max_size_mib << 20,
                })
            };
            match setup() {
                Ok(args) => tokio::runtime::Runtime::new().expect("tokio runtime").block_on(serve(args)),
                Err(error) => Err(error),
            }
        }
        Command::List { data_dir } => list(data_dir),
        Command::Query { data_dir, kind, selector, from, to, format, output } => {
            run_query(data_dir, kind, selector, from, to, format, output)
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
