//! The agent's status server (HTTP): liveness, readiness and Prometheus metrics, for systemd
//! watchers, Kubernetes probes and scrapers. It carries no profiles and no secrets, so it is
//! served plaintext on whatever address is given (probes reach pods on their own IP).
use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};
use axum::{http::StatusCode, routing::get, Router};
use tokio::net::TcpListener;

use super::metrics;

/// What the probes ask about: the programs are attached (ready), and the drain loop still
/// turns (live).
pub struct Health {
    ready: AtomicBool,
    last_tick: AtomicU64,
    /// The loop is dead past this long without a tick.
    max_silence: Duration,
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

impl Health {
    pub fn new(interval: Duration) -> Arc<Health> {
        Arc::new(Health { ready: AtomicBool::new(false), last_tick: AtomicU64::new(now()), max_silence: interval * 3 + Duration::from_secs(30) })
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
        self.tick();
    }

    pub fn tick(&self) {
        self.last_tick.store(now(), Ordering::Relaxed);
    }

    fn live(&self) -> bool {
        now().saturating_sub(self.last_tick.load(Ordering::Relaxed)) <= self.max_silence.as_secs()
    }
}

fn answer(ok: bool, what: &str) -> (StatusCode, String) {
    if ok {
        (StatusCode::OK, "ok\n".into())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("{what}\n"))
    }
}

/// Binds first, so a taken port is a startup error rather than a background one.
pub async fn bind(address: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(address).await.with_context(|| format!("binding the status server to {address}"))
}

pub async fn serve(listener: TcpListener, health: Arc<Health>, stop: impl std::future::Future<Output = ()> + Send + 'static) -> Result<()> {
    let (live, ready) = (health.clone(), health);
    let router = Router::new()
        .route("/healthz", get(move || async move { answer(live.live(), "the drain loop has stalled") }))
        .route("/readyz", get(move || async move { answer(ready.ready.load(Ordering::Relaxed), "BPF programs not attached yet") }))
        .route("/metrics", get(|| async { ([("content-type", metrics::CONTENT_TYPE)], metrics::render()) }));
    axum::serve(listener, router).with_graceful_shutdown(stop).await.context("status server")
}
