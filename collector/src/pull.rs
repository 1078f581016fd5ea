//! Pull mode: the collector fetches profiles from agents (ember.v1.Agent), resuming after the
//! last profile it has stored from each, so a restarted collector fills the gap and stores
//! nothing twice.
use std::{sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use ember_proto::{
    ember::{agent_client::AgentClient, IdentityRequest, PullRequest},
    security::{Bearer, ClientSecurity},
};
use tonic::transport::Endpoint;

use crate::{
    service::{check, now_ns},
    store::Store,
};

const MAX_BACKOFF: Duration = Duration::from_secs(30);

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
pub async fn pull_forever(source: Source, store: Arc<Store>, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    let url = &source.url;
    let mut backoff = Duration::from_millis(500);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            result = pull_once(&source, &store) => {
                if let Err(e) = result {
                    tracing::warn!(agent = url, "pull interrupted, retrying in {backoff:?}: {e:#}");
                }
            }
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(backoff) => backoff = (backoff * 2).min(MAX_BACKOFF),
        }
    }
}

async fn pull_once(source: &Source, store: &Arc<Store>) -> Result<()> {
    let channel = source.endpoint.connect().await.with_context(|| format!("connecting to agent {}", source.url))?;
    let mut client = AgentClient::new(channel);
    let agent = client.identity(source.bearer.request(IdentityRequest {})).await?.into_inner();
    let id = agent.agent_id.clone();
    let after = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || store.stored_through(&id)).await??
    };
    tracing::info!(agent = agent.agent_id, after, "pulling");
    let mut stream = client.pull(source.bearer.request(PullRequest { after_sequence: after })).await?.into_inner();
    while let Some(profile) = stream.message().await? {
        if let Err(why) = check(&profile, now_ns()) {
            tracing::warn!(agent = agent.agent_id, sequence = profile.sequence, "refused a pulled profile: {why}");
            continue;
        }
        let (store, agent) = (store.clone(), agent.clone());
        tokio::task::spawn_blocking(move || store.put(&agent, &[profile])).await??;
    }
    Ok(())
}
