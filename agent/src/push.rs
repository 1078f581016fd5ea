//! Push: sends spooled profiles to the collector over gRPC, oldest first, in batches. While
//! the collector is unreachable it retries with exponential backoff and jitter; profiles
//! wait in the spool meanwhile, so an outage loses nothing (up to the spool's size).
use std::{sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use ember_proto::ember::{collector_client::CollectorClient, AgentIdentity, PushRequest};
use tonic::{
    metadata::{Ascii, MetadataValue},
    transport::{ClientTlsConfig, Endpoint},
    Code,
};

use crate::spool::Spool;

const BATCH: usize = 16;
const IDLE_POLL: Duration = Duration::from_millis(500);
const MIN_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

pub struct Pusher {
    client: CollectorClient<tonic::transport::Channel>,
    spool: Arc<Spool>,
    agent: AgentIdentity,
    /// `Bearer <token>`, sent with every push when the collector requires one.
    authorization: Option<MetadataValue<Ascii>>,
    backoff: Duration,
}

impl Pusher {
    pub fn new(url: &str, spool: Arc<Spool>, agent: AgentIdentity, token: Option<&str>, tls: Option<ClientTlsConfig>) -> Result<Pusher> {
        let authorization = token
            .map(|t| format!("Bearer {t}").parse().context("the token has characters not allowed in a header"))
            .transpose()?;
        let mut endpoint = Endpoint::from_shared(url.to_string())
            .with_context(|| format!("invalid collector address {url:?} (expected e.g. https://collector:7070)"))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30));
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls).context("configuring TLS")?;
        }
        // Lazy: the agent starts profiling even if the collector is down.
        let client = CollectorClient::new(endpoint.connect_lazy());
        Ok(Pusher { client, spool, agent, authorization, backoff: MIN_BACKOFF })
    }

    /// Pushes one batch. Ok(true): something was sent; Ok(false): the spool is empty.
    async fn push_batch(&mut self) -> Result<bool, tonic::Status> {
        let profiles = self.spool.oldest(BATCH).map_err(spool_error)?;
        let Some(last) = profiles.last().map(|p| p.sequence) else { return Ok(false) };
        let mut request = tonic::Request::new(PushRequest { agent: Some(self.agent.clone()), profiles });
        if let Some(authorization) = &self.authorization {
            request.metadata_mut().insert("authorization", authorization.clone());
        }
        match self.client.push(request).await {
            Ok(response) => {
                let stored = response.into_inner().stored_through;
                self.spool.remove_through(stored).map_err(spool_error)?;
                Ok(true)
            }
            // The collector refused the content: retrying cannot help. Say so and move on,
            // rather than block every later profile behind it.
            Err(status) if status.code() == Code::InvalidArgument => {
                tracing::error!("collector refused profiles up to {last}: {}", status.message());
                self.spool.remove_through(last).map_err(spool_error)?;
                Ok(true)
            }
            Err(status) => Err(status),
        }
    }

    /// Pushes until `stop` resolves, then makes a last bounded attempt to empty the spool.
    pub async fn run(mut self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let mut failing = false;
        loop {
            let wait = match self.push_batch().await {
                Ok(true) => {
                    if failing {
                        tracing::info!("push works again: sending spooled profiles");
                        failing = false;
                    }
                    self.backoff = MIN_BACKOFF;
                    Duration::ZERO
                }
                Ok(false) => IDLE_POLL,
                Err(status) => {
                    if !failing {
                        // Unreachable, overloaded, or refusing this agent's token: retry, spooling.
                        tracing::warn!(code = ?status.code(), "push failed, spooling profiles until it works: {}", status.message());
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
            while let Ok(true) = self.push_batch().await {}
        })
        .await;
    }
}

/// A spool failure (disk) is reported like a push failure: logged, retried with backoff.
fn spool_error(error: anyhow::Error) -> tonic::Status {
    tonic::Status::internal(format!("spool: {error:#}"))
}

/// 50-100% of the delay, so agents that lost the collector together do not return together.
fn jitter(delay: Duration) -> Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    delay.mul_f64(0.5 + (nanos % 1000) as f64 / 2000.0)
}
