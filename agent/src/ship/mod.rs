//! Stage 5, ship: where profiles go once encoded. Local files (`files`), and the spools that
//! shippers send from: push to Ember's collector (`push`), serve to pulling collectors
//! (`serve`), and OTLP export (`otlp`). Each sink has its own spool, so one sink's outage never
//! holds another. The commands start it; the pipeline writes to it.
pub mod files;
mod otlp;
mod push;
mod serve;
mod spool;

use std::{collections::HashMap, future::Future, net::SocketAddr, path::PathBuf, sync::Arc};

use anyhow::Result;
use ember_proto::ember::AgentIdentity;
use tonic::{
    metadata::MetadataMap,
    transport::{Endpoint, ServerTlsConfig},
};

pub use spool::Spool;

use otlp::OtlpSink;
use push::{CollectorSink, Shipper};

/// How Ember's collector gets the profiles.
pub enum Delivery {
    /// The agent pushes to the first of these collectors (named, for logs) that takes it.
    Push(Vec<(String, Endpoint)>),
    /// It pulls from the agent, which keeps the newest `keep` profiles.
    Serve { address: SocketAddr, tls: Option<ServerTlsConfig>, keep: usize },
}

/// Shipping as `settings` resolved it.
pub struct ShipSettings {
    pub delivery: Option<Delivery>,
    /// OTLP receiver, and the headers of every export.
    pub otlp: Option<(Endpoint, MetadataMap)>,
    pub spool_dir: PathBuf,
    pub spool_max_bytes: u64,
    pub agent: AgentIdentity,
    /// Bearer token: sent with pushes, required of pullers.
    pub token: Option<String>,
    /// Labels of every shipped profile (host, node, kernel, static labels).
    pub labels: HashMap<String, String>,
}

/// What the pipeline writes to: every sink's spool, and the labels of every profile.
pub struct Shipping {
    pub spools: Vec<Arc<Spool>>,
    pub labels: HashMap<String, String>,
}

pub type Task = tokio::task::JoinHandle<Result<()>>;

/// Opens the spools and starts a task per sink, each running until `until_stopped()` resolves.
pub fn start<F>(settings: &ShipSettings, until_stopped: &impl Fn() -> F) -> Result<(Shipping, Vec<Task>)>
where
    F: Future<Output = ()> + Send + 'static,
{
    let (dir, max_bytes) = (&settings.spool_dir, settings.spool_max_bytes);
    let (mut spools, mut tasks): (Vec<Arc<Spool>>, Vec<Task>) = (vec![], vec![]);
    match &settings.delivery {
        Some(Delivery::Push(collectors)) => {
            let spool = Arc::new(Spool::open(dir, "collector", max_bytes, usize::MAX)?);
            let agent = AgentIdentity { spool_id: spool.id(), ..settings.agent.clone() };
            let sink = CollectorSink::new(collectors, agent, settings.token.as_deref())?;
            tasks.push(Shipper::new(sink, spool.clone()).spawn(until_stopped()));
            spools.push(spool);
        }
        Some(Delivery::Serve { address, tls, keep }) => {
            let spool = Arc::new(Spool::open(dir, "pull", max_bytes, *keep)?);
            let (token, agent) = (settings.token.clone(), AgentIdentity { spool_id: spool.id(), ..settings.agent.clone() });
            tasks.push(tokio::spawn(serve::serve(*address, tls.clone(), token, spool.clone(), agent, until_stopped())));
            spools.push(spool);
        }
        None => {}
    }
    if let Some((endpoint, headers)) = &settings.otlp {
        let spool = Arc::new(Spool::open(&dir.join("otlp"), "otlp", max_bytes, usize::MAX)?);
        let sink = OtlpSink::new(endpoint.clone(), headers.clone());
        tasks.push(Shipper::new(sink, spool.clone()).spawn(until_stopped()));
        spools.push(spool);
    }
    Ok((Shipping { spools, labels: settings.labels.clone() }, tasks))
}
