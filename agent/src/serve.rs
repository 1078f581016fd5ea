//! Pull mode: the agent serves its kept profiles over gRPC (ember.v1.Agent) to collectors that
//! pull, from any sequence number on, then streams new ones as they are made. A restarted
//! collector asks from its last stored sequence and misses nothing the agent still keeps.
use std::{net::SocketAddr, pin::Pin, sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use ember_proto::ember::{
    agent_server::{Agent, AgentServer},
    AgentIdentity, IdentityRequest, Profile, PullRequest,
};
use tokio_stream::{wrappers::ReceiverStream, Stream};
use tonic::{Request, Response, Status};

use crate::spool::Spool;

const POLL: Duration = Duration::from_millis(500);

struct AgentService {
    spool: Arc<Spool>,
    identity: AgentIdentity,
}

#[tonic::async_trait]
impl Agent for AgentService {
    type PullStream = Pin<Box<dyn Stream<Item = Result<Profile, Status>> + Send>>;

    async fn pull(&self, request: Request<PullRequest>) -> Result<Response<Self::PullStream>, Status> {
        let mut after = request.into_inner().after_sequence;
        let spool = self.spool.clone();
        let (profiles, stream) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            loop {
                let batch = match spool.after(after, 16) {
                    Ok(batch) => batch,
                    Err(e) => {
                        let _ = profiles.send(Err(Status::internal(format!("{e:#}")))).await;
                        return;
                    }
                };
                if batch.is_empty() {
                    tokio::select! {
                        _ = profiles.closed() => return,
                        _ = tokio::time::sleep(POLL) => continue,
                    }
                }
                for profile in batch {
                    after = profile.sequence;
                    if profiles.send(Ok(profile)).await.is_err() {
                        return; // the collector went away
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(stream))))
    }

    async fn identity(&self, _: Request<IdentityRequest>) -> Result<Response<AgentIdentity>, Status> {
        Ok(Response::new(self.identity.clone()))
    }
}

pub async fn serve(address: SocketAddr, spool: Arc<Spool>, identity: AgentIdentity, stop: impl std::future::Future<Output = ()>) -> Result<()> {
    tonic::transport::Server::builder()
        .add_service(AgentServer::new(AgentService { spool, identity }))
        .serve_with_shutdown(address, stop)
        .await
        .with_context(|| format!("serving pulls on {address}"))
}
