//! Profiles pushed to a collector as an agent pushes them: in batches, each one checked stored
//! or held whole, so that a bench never times a collector that turned work away.
use anyhow::{ensure, Result};
use ember_proto::ember::{collector_client::CollectorClient, AgentIdentity, Profile, PushRequest};
use tonic::transport::Channel;

/// Pushes `profiles` as `agent` in batches of `batch`; returns how many were pushed.
pub async fn push_batches(client: &mut CollectorClient<Channel>, agent: &AgentIdentity, profiles: impl IntoIterator<Item = Profile>, batch: usize) -> Result<u64> {
    let (mut pending, mut pushed) = (Vec::with_capacity(batch), 0);
    let mut profiles = profiles.into_iter().peekable();
    while let Some(profile) = profiles.next() {
        pending.push(profile);
        if pending.len() == batch || profiles.peek().is_none() {
            let sent = pending.len();
            let answer = client.push(PushRequest { agent: Some(agent.clone()), profiles: std::mem::take(&mut pending) }).await?.into_inner();
            ensure!(answer.refused.is_empty() && answer.held.len() == sent, "a push was not held whole: {answer:?}");
            pushed += sent as u64;
        }
    }
    Ok(pushed)
}
