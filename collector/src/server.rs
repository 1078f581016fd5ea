//! The running collector: wires the gRPC ingest service (with health and reflection), the
//! HTTP query API, the pull loops and retention onto one store, until SIGINT or SIGTERM.
//! `main` resolves its settings from the command line.
use std::{
    net::SocketAddr,
    time::{Duration, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};
use ember_proto::{ember::collector_server::CollectorServer, security};

use crate::{http, pull, request::QueryLimits, service, store_choice::StoreChoice};

/// `ember-collector serve`, resolved.
pub struct ServeSettings {
    pub token: Option<String>,
    pub pull: Vec<pull::Source>,
    pub tls: Option<tonic::transport::ServerTlsConfig>,
    /// Certificate and key (PEM) of the HTTPS query API.
    pub http_tls: Option<(Vec<u8>, Vec<u8>)>,
    pub listen: SocketAddr,
    pub http: SocketAddr,
    pub store: StoreChoice,
    pub retention: Duration,
    pub max_bytes: u64,
    pub rollup_delay: Duration,
    pub query_limits: QueryLimits,
}

pub async fn serve(args: ServeSettings) -> Result<()> {
    let place = args.store.describe();
    let choice = args.store;
    let store = tokio::task::spawn_blocking(move || choice.open()).await.context("opening the store")??;
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
    let (retained, max_age, max_bytes) = (store.clone(), args.retention, args.max_bytes);
    tokio::spawn(every(Duration::from_secs(60), ("retention: deleted old profiles", false), until_stopped(), move || {
        let oldest = std::time::SystemTime::now().checked_sub(max_age).unwrap_or(UNIX_EPOCH);
        retained.enforce_retention(oldest.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64, max_bytes)
    }));
    // Buckets come due `rollup_delay` after they end.
    let (rolled, delay) = (store.clone(), args.rollup_delay.as_nanos().min(u64::MAX.into()) as u64);
    tokio::spawn(every(Duration::from_secs(10), ("rolled up time buckets", true), until_stopped(), move || {
        rolled.roll_due(service::now_ns() as u64, delay)
    }));
    for source in args.pull {
        tokio::spawn(pull::pull_forever(source, store.clone(), until_stopped()));
    }
    let http = tokio::spawn(http::serve(http_listener, args.http_tls, store.clone(), args.query_limits, args.token.clone(), until_stopped()));
    // Standard gRPC health checking and reflection, for probes and tools such as grpcurl.
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<CollectorServer<service::CollectorService>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ember_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the gRPC reflection service")?;
    tracing::info!(grpc = %args.listen, http = %args.http, store = place, "collector listening");
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = args.tls.clone() {
        server = server.tls_config(tls).context("configuring TLS")?;
    }
    server
        .add_service(health_service)
        .add_service(reflection)
        .add_service(CollectorServer::with_interceptor(service::CollectorService::new(store), security::token_check(args.token)))
        .serve_with_shutdown(args.listen, until_stopped())
        .await
        .with_context(|| format!("serving gRPC on {}", args.listen))?;
    http.await??;
    Ok(())
}

/// Runs `work` on a blocking thread every `period` until `stop`, logging what it did (how
/// many things, when not none; at debug level for routine work) or why it failed.
async fn every(
    period: Duration,
    (what, routine): (&'static str, bool),
    stop: impl std::future::Future<Output = ()>,
    work: impl Fn() -> Result<usize> + Clone + Send + 'static,
) {
    tokio::pin!(stop);
    let mut ticks = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = ticks.tick() => {}
        }
        match tokio::task::spawn_blocking(work.clone()).await {
            Ok(Ok(0)) => {}
            Ok(Ok(count)) if routine => tracing::debug!(count, "{what}"),
            Ok(Ok(count)) => tracing::info!(count, "{what}"),
            Ok(Err(e)) => tracing::error!("{what} failed: {e:#}"),
            Err(e) => tracing::error!("{what}: the task failed: {e}"),
        }
    }
}
