//! Shipping: sends spooled profiles to a sink (Ember's collector, or an OTLP receiver),
//! oldest first, in batches. While the sink is unreachable it retries with exponential
//! backoff and jitter; profiles wait in the spool meanwhile, so an outage loses nothing (up to
//! the spool's size).
use std::{future::Future, sync::Arc, time::Duration};

use anyhow::Result;
use ember_proto::{
    ember::{collector_client::CollectorClient, AgentIdentity, Profile, PushRequest},
    security::Bearer,
};
use tonic::{
    transport::{Channel, Endpoint},
    Code, Status,
};

use super::spool::Spool;
use crate::ops::metrics;

const BATCH: usize = 16;
const IDLE_POLL: Duration = Duration::from_millis(500);
const MIN_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Where a shipper sends profiles.
pub trait Sink: Send + 'static {
    /// What it is, for logs.
    const NAME: &'static str;
    /// Sends profiles (oldest first); returns the highest sequence now stored there.
    fn send(&mut self, profiles: Vec<Profile>) -> impl Future<Output = Result<u64, Status>> + Send;
}

/// Lazily connected, with a per-request timeout: the agent starts profiling even if the
/// sink is down, and a hung one does not hold profiles forever.
pub fn channel(endpoint: Endpoint) -> Channel {
    endpoint.timeout(Duration::from_secs(30)).connect_lazy()
}

/// Ember's collector (ember.v1.Collector/Push).
pub struct CollectorSink {
    client: CollectorClient<Channel>,
    agent: AgentIdentity,
    /// Sent with every push when the collector requires a token.
    bearer: Bearer,
}

impl CollectorSink {
    pub fn new(endpoint: Endpoint, agent: AgentIdentity, token: Option<&str>) -> Result<CollectorSink> {
        Ok(CollectorSink { client: CollectorClient::new(channel(endpoint)), agent, bearer: Bearer::new(token)? })
    }
}

impl Sink for CollectorSink {
    const NAME: &'static str = "collector";

    async fn send(&mut self, profiles: Vec<Profile>) -> Result<u64, Status> {
        let request = self.bearer.request(PushRequest { agent: Some(self.agent.clone()), profiles });
        Ok(self.client.push(request).await?.into_inner().stored_through)
    }
}

pub struct Shipper<S> {
    sink: S,
    spool: Arc<Spool>,
    backoff: Duration,
}

impl<S: Sink> Shipper<S> {
    pub fn new(sink: S, spool: Arc<Spool>) -> Shipper<S> {
        Shipper { sink, spool, backoff: MIN_BACKOFF }
    }

    /// Sends one batch. Ok(true): something was sent; Ok(false): the spool is empty.
    async fn send_batch(&mut self) -> Result<bool, Status> {
        let profiles = self.spool.oldest(BATCH).map_err(spool_error)?;
        let Some(last) = profiles.last().map(|p| p.sequence) else { return Ok(false) };
        let count = profiles.len();
        let started = std::time::Instant::now();
        let sent = self.sink.send(profiles).await;
        metrics::add("ember_ship_seconds_sum", &[("sink", S::NAME)], started.elapsed().as_secs_f64());
        metrics::add("ember_ship_seconds_count", &[("sink", S::NAME)], 1.0);
        if sent.as_ref().is_err_and(|status| status.code() != Code::InvalidArgument) {
            metrics::add("ember_ship_failures_total", &[("sink", S::NAME)], 1.0);
        }
        match sent {
            Ok(stored) => {
                self.spool.remove_through(stored).map_err(spool_error)?;
                Ok(true)
            }
            // The sink refused the content: retrying cannot help. Say so and move on,
            // rather than block every later profile behind it.
            Err(status) if status.code() == Code::InvalidArgument => {
                tracing::error!("{} refused profiles up to {last}: {}", S::NAME, status.message());
                metrics::add("ember_lost_total", &[("reason", "refused"), ("sink", S::NAME)], count as f64);
                self.spool.remove_through(last).map_err(spool_error)?;
                Ok(true)
            }
            Err(status) => Err(status),
        }
    }

    /// Runs on its own task until `stop`.
    pub fn spawn(self, stop: impl Future<Output = ()> + Send + 'static) -> tokio::task::JoinHandle<Result<()>> {
        tokio::spawn(async move {
            self.run(stop).await;
            Ok(())
        })
    }

    /// Sends until `stop` resolves, then makes a last bounded attempt to empty the spool.
    async fn run(mut self, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        let mut failing = false;
        loop {
            let wait = match self.send_batch().await {
                Ok(true) => {
                    if failing {
                        tracing::info!("{} reachable again: sending spooled profiles", S::NAME);
                        failing = false;
                    }
                    self.backoff = MIN_BACKOFF;
                    Duration::ZERO
                }
                Ok(false) => IDLE_POLL,
                Err(status) => {
                    if !failing {
                        // Unreachable, overloaded, or refusing this agent's token: retry, spooling.
                        tracing::warn!(code = ?status.code(), "sending to {} failed, spooling profiles until it works: {}", S::NAME, status.message());
                        failing = true;
                    }
                    let wait = jitter(self.backoff);
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                    wait
                }
            };
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while let Ok(true) = self.send_batch().await {}
        })
        .await;
    }
}

/// A spool failure (disk) is reported like a send failure: logged, retried with backoff.
fn spool_error(error: anyhow::Error) -> Status {
    Status::internal(format!("spool: {error:#}"))
}

/// 50-100% of the delay, so agents that lost the collector together do not return together.
fn jitter(delay: Duration) -> Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    delay.mul_f64(0.5 + (nanos % 1000) as f64 / 2000.0)
}
