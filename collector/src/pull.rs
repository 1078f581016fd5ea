//! Pull mode: the collector fetches profiles from agents (ember.v1.Agent), resuming after the
//! last profile it has stored from each, so a restarted collector fills the gap and stores
//! nothing twice.
use std::{sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use ember_proto::{
    backoff::Backoff,
    ember::{agent_client::AgentClient, IdentityRequest, PullRequest},
    security::{Bearer, ClientSecurity},
};
use tonic::transport::Endpoint;

use crate::{
    service::{check, now_ns},
    store::{Checked, ProfileStore},
};

const MIN_BACKOFF: Duration = Duration::from_millis(500);
/// With jitter a wait is up to twice this.
const MAX_BACKOFF: Duration = Duration::from_secs(15);

/// An agent to pull from: where, and with which TLS settings and token.
pub struct Source {
    url: String,
    endpoint: Endpoint,
    /// Sent with every request when the agent requires a token.
    bearer: Bearer,
}

impl Source {
    pub fn new(url: String, security: &ClientSecurity, token: Option<&str>) -> Result<Source> {
        let endpoint = security.endpoint(&url, "agent to pull from")?;
        Ok(Source { url, endpoint, bearer: Bearer::new(token)? })
    }
}

/// Pulls from one agent until `stop`, reconnecting with backoff.
pub async fn pull_forever(source: Source, store: Arc<dyn ProfileStore>, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    let url = &source.url;
    let mut backoff = Backoff::new(MIN_BACKOFF, MAX_BACKOFF);
    loop {
        let mut stored = 0;
        let result = tokio::select! {
            _ = &mut stop => return,
            result = pull_once(&source, &store, &mut stored) => result,
        };
        // An agent that restarts after a day of pulls is not a long outage.
        if stored > 0 {
            backoff.reset();
        }
        let wait = backoff.next();
        if let Err(e) = result {
            tracing::warn!(agent = url, stored, "pull interrupted, retrying in {wait:?}: {e:#}");
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// One session: connects, asks for what follows the stored watermark, and stores what comes,
/// counting it in `stored`.
async fn pull_once(source: &Source, store: &Arc<dyn ProfileStore>, stored: &mut u64) -> Result<()> {
    let channel = source.endpoint.connect().await.with_context(|| format!("connecting to agent {}", source.url))?;
    let mut client = AgentClient::new(channel);
    let agent = client.identity(source.bearer.request(IdentityRequest {})).await?.into_inner();
    let after = {
        let (store, agent) = (store.clone(), agent.clone());
        tokio::task::spawn_blocking(move || store.stored_through(&agent)).await??
    };
    tracing::info!(agent = agent.agent_id, after, "pulling");
    let mut stream = client.pull(source.bearer.request(PullRequest { after_sequence: after })).await?.into_inner();
    while let Some(profile) = stream.message().await? {
        let (totals, decoded) = match check(&profile, now_ns()) {
            Ok(checked) => checked,
            Err(why) => {
                tracing::warn!(agent = agent.agent_id, sequence = profile.sequence, "refused a pulled profile: {why}");
                continue;
            }
        };
        let (store, agent) = (store.clone(), agent.clone());
        tokio::task::spawn_blocking(move || store.put(&agent, &[Checked { profile, totals, decoded: Some(decoded) }])).await??;
        *stored += 1;
    }
    Ok(())
}
