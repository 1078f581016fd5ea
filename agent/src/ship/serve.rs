//! Pull mode: the agent serves its kept profiles over gRPC (ember.v1.Agent) to collectors that
//! pull, from any sequence number on, then streams new ones as they are made. A restarted
//! collector asks from its last stored sequence and misses nothing the agent still keeps.
use std::{net::SocketAddr, pin::Pin, sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use ember_proto::{
    ember::{
        agent_server::{Agent, AgentServer},
        AgentIdentity, IdentityRequest, Profile, PullRequest,
    },
    security::token_check,
};
use tokio_stream::{wrappers::ReceiverStream, Stream};
use tonic::{transport::ServerTlsConfig, Request, Response, Status};

use super::spool::Spool;

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

/// Serves pulls, with gRPC health checking and reflection beside them for probes and tools
/// such as grpcurl; over TLS when given, and only to pullers with the token when given.
pub async fn serve(
    address: SocketAddr,
    tls: Option<ServerTlsConfig>,
    token: Option<String>,
    spool: Arc<Spool>,
    identity: AgentIdentity,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<AgentServer<AgentService>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ember_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the gRPC reflection service")?;
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        server = server.tls_config(tls).context("configuring TLS")?;
    }
    server
        .add_service(health_service)
        .add_service(reflection)
        .add_service(AgentServer::with_interceptor(AgentService { spool, identity }, token_check(token)))
        .serve_with_shutdown(address, stop)
        .await
        .with_context(|| format!("serving pulls on {address}"))
}
