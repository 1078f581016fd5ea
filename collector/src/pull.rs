//! Pull mode: the collector fetches profiles from agents (ember.v1.Agent), resuming after the
//! last profile it has stored from each, so a restarted collector fills the gap and stores
//! nothing twice.
use std::{sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use ember_proto::ember::{agent_client::AgentClient, IdentityRequest, PullRequest};

use crate::{
    service::{check, now_ns},
    store::Store,
};

const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Pulls from one agent until `stop`, reconnecting with backoff.
pub async fn pull_forever(url: String, store: Arc<Store>, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    let mut backoff = Duration::from_millis(500);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            result = pull_once(&url, &store) => {
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

async fn pull_once(url: &str, store: &Arc<Store>) -> Result<()> {
    let mut client = AgentClient::connect(url.to_string()).await.with_context(|| format!("connecting to agent {url}"))?;
    let agent = client.identity(IdentityRequest {}).await?.into_inner();
    let id = agent.agent_id.clone();
    let after = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || store.stored_through(&id)).await??
    };
    tracing::info!(agent = agent.agent_id, after, "pulling");
    let mut stream = client.pull(PullRequest { after_sequence: after }).await?.into_inner();
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
