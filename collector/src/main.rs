//! ember-collector: receives profiles pushed by agents over gRPC, keeps them in an embedded
//! store under a data directory, and answers queries.
mod query;
mod service;
mod store;

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc, time::UNIX_EPOCH};

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use ember_proto::ember::collector_server::CollectorServer;

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
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: SocketAddr,
        /// Where the embedded store keeps its data.
        #[arg(long, default_value = "ember-data")]
        data_dir: PathBuf,
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
        /// Labels to match, e.g. "host=web-1,service=api" (agent and host are built in).
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

async fn serve(listen: SocketAddr, data_dir: PathBuf) -> Result<()> {
    let store = Arc::new(store::Store::open(&data_dir)?);
    let service = service::CollectorService { store };
    tracing::info!(%listen, data_dir = %data_dir.display(), "collector listening");
    tonic::transport::Server::builder()
        .add_service(CollectorServer::new(service))
        .serve_with_shutdown(listen, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .with_context(|| format!("serving on {listen}"))
}

fn query(data_dir: PathBuf, kind: String, selector: String, from: Option<u64>, to: Option<u64>, format: String, output: PathBuf) -> Result<()> {
    let store = store::Store::open(&data_dir)?;
    let selector = query::parse_selector(&selector)?;
    let now = std::time::SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() + 1;
    let nanos = |s: u64| s.saturating_mul(1_000_000_000);
    let (profile, count) = query::merged(&store, &kind, &selector, nanos(from.unwrap_or(0)), nanos(to.unwrap_or(now)))?;
    let bytes = match format.as_str() {
        "pprof" => ember_pprof::encode_gzip(&profile),
        "folded" => (ember_pprof::folded(&profile, 0, &["comm"]).join("\n") + "\n").into_bytes(),
        _ => ember_pprof::flamegraph(&ember_pprof::folded(&profile, 0, &["comm"]), &format!("Ember {kind}"), "samples")?,
    };
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
        Command::Serve { listen, data_dir } => {
            tokio::runtime::Runtime::new().expect("tokio runtime").block_on(serve(listen, data_dir))
        }
        Command::List { data_dir } => list(data_dir),
        Command::Query { data_dir, kind, selector, from, to, format, output } => {
            query(data_dir, kind, selector, from, to, format, output)
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
