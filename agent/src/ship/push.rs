//! Shipping: sends spooled profiles to a sink (Ember's collector, or an OTLP receiver),
//! oldest first, in batches. While the sink is unreachable it retries with exponential
//! backoff and jitter; profiles wait in the spool meanwhile, so an outage loses nothing (up to
//! the spool's size).
use std::{future::Future, sync::Arc, time::Duration};

use anyhow::Result;
use ember_proto::{
    backoff::Backoff,
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
/// With jitter a wait is up to twice this.
const MAX_BACKOFF: Duration = Duration::from_secs(15);

/// Where a shipper sends profiles.
pub trait Sink: Send + 'static {
    /// What it is, for logs.
    const NAME: &'static str;
    /// Sends profiles (oldest first); says which of them the sink now holds and which it
    /// refused for good. An error means nothing is known to have arrived: all are retried.
    fn send(&mut self, profiles: Vec<Profile>) -> impl Future<Output = Result<Acknowledged, Status>> + Send;
}

/// A sink's answer to one send.
#[derive(Debug, Default)]
pub struct Acknowledged {
    /// Sequences the sink holds (stored now, or before): forgotten by the spool.
    pub held: Vec<u64>,
    /// Sequences refused for their content, with why: dropped from the spool and counted.
    pub refused: Vec<(u64, String)>,
}

/// Lazily connected, with a per-request timeout: the agent starts profiling even if the
/// sink is down, and a hung one does not hold profiles forever.
pub fn channel(endpoint: Endpoint) -> Channel {
    endpoint.timeout(Duration::from_secs(30)).connect_lazy()
}

/// Ember's collector (ember.v1.Collector/Push): one, or several that share a store, tried in
/// turn. The spool's sequence numbers make a batch sent to two of them stored once.
pub struct CollectorSink {
    /// (name, client) of each collector; pushes go to `current` until it fails.
    collectors: Vec<(String, CollectorClient<Channel>)>,
    current: usize,
    agent: AgentIdentity,
    /// Sent with every push when the collector requires a token.
    bearer: Bearer,
}

impl CollectorSink {
    pub fn new(collectors: &[(String, Endpoint)], agent: AgentIdentity, token: Option<&str>) -> Result<CollectorSink> {
        let collectors = collectors.iter().map(|(name, endpoint)| (name.clone(), CollectorClient::new(channel(endpoint.clone())))).collect();
        Ok(CollectorSink { collectors, current: 0, agent, bearer: Bearer::new(token)? })
    }
}

impl Sink for CollectorSink {
    const NAME: &'static str = "collector";

    /// Tries each collector once, from the one that took the last push: a failure or a
    /// timeout moves on at once, and the batch stays spooled only if every one failed.
    async fn send(&mut self, profiles: Vec<Profile>) -> Result<Acknowledged, Status> {
        let mut failed = None;
        for _ in 0..self.collectors.len() {
            let request = self.bearer.request(PushRequest { agent: Some(self.agent.clone()), profiles: profiles.clone() });
            let pushed = self.collectors[self.current].1.push(request).await;
            match pushed {
                Ok(response) => {
                    let response = response.into_inner();
                    return Ok(Acknowledged { held: response.held, refused: response.refused.into_iter().map(|r| (r.sequence, r.reason)).collect() });
                }
                // Refused for its content: another collector would refuse it too.
                Err(status) if status.code() == Code::InvalidArgument => return Err(status),
                Err(status) => {
                    if self.collectors.len() > 1 {
                        let name = &self.collectors[self.current].0;
                        let next = &self.collectors[(self.current + 1) % self.collectors.len()].0;
                        tracing::warn!(code = ?status.code(), "pushing to {name} failed, trying {next}: {}", status.message());
                        metrics::add("ember_ship_failovers_total", &[], 1.0);
                    }
                    self.current = (self.current + 1) % self.collectors.len();
                    failed = Some(status);
                }
            }
        }
        Err(failed.unwrap_or_else(|| Status::unavailable("no collector to push to")))
    }
}

pub struct Shipper<S> {
    sink: S,
    spool: Arc<Spool>,
    backoff: Backoff,
}

impl<S: Sink> Shipper<S> {
    pub fn new(sink: S, spool: Arc<Spool>) -> Shipper<S> {
        Shipper { sink, spool, backoff: Backoff::new(MIN_BACKOFF, MAX_BACKOFF) }
    }

    /// Sends one batch and forgets what the sink acknowledged. Ok(true): the spool shrank;
    /// Ok(false): it is empty. A send that moves nothing on is an error, so the caller backs
    /// off instead of sending the same batch again at once.
    async fn send_batch(&mut self) -> Result<bool, Status> {
        let profiles = self.spool.take_batch(BATCH).map_err(spool_error)?;
        if profiles.is_empty() {
            return Ok(false);
        }
        let sequences: Vec<u64> = profiles.iter().map(|p| p.sequence).collect();
        let started = std::time::Instant::now();
        let sent = self.sink.send(profiles).await;
        metrics::observe("ember_ship_seconds", &[("sink", S::NAME)], started.elapsed().as_secs_f64());
        let acknowledged = match sent {
            Ok(acknowledged) => acknowledged,
            // The sink refused the whole batch for its content: retrying cannot help.
            Err(status) if status.code() == Code::InvalidArgument => Acknowledged {
                refused: sequences.iter().map(|seq| (*seq, status.message().to_string())).collect(),
                ..Default::default()
            },
            Err(status) => {
                self.spool.send_failed();
                metrics::add("ember_ship_failures_total", &[("sink", S::NAME)], 1.0);
                return Err(status);
            }
        };
        for (sequence, reason) in &acknowledged.refused {
            tracing::error!(sequence, "{} refused a profile, which is dropped: {reason}", S::NAME);
        }
        if !acknowledged.refused.is_empty() {
            metrics::add("ember_lost_total", &[("reason", "refused"), ("sink", S::NAME)], acknowledged.refused.len() as f64);
        }
        let done: Vec<u64> = acknowledged.held.iter().copied().chain(acknowledged.refused.iter().map(|(seq, _)| *seq)).collect();
        let removed = self.spool.remove(&done).map_err(spool_error)?;
        if removed == 0 {
            metrics::add("ember_ship_failures_total", &[("sink", S::NAME)], 1.0);
            return Err(Status::data_loss(format!("{} acknowledged none of profiles {sequences:?}", S::NAME)));
        }
        Ok(true)
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
                    self.backoff.reset();
                    Duration::ZERO
                }
                Ok(false) => IDLE_POLL,
                Err(status) => {
                    if !failing {
                        // Unreachable, overloaded, or refusing this agent's token: retry, spooling.
                        tracing::warn!(code = ?status.code(), "sending to {} failed, spooling profiles until it works: {}", S::NAME, status.message());
                        failing = true;
                    }
                    self.backoff.next()
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
