//! The gRPC Collector service: validates pushed profiles and stores them. Bad input is
//! refused with a clear status and never affects what is already stored.
use std::sync::Arc;

use ember_proto::ember::{collector_server::Collector, Profile, PushRequest, PushResponse, Refusal};
use tonic::{Request, Response, Status};

use crate::store::{Checked, ProfileStore};

pub const KINDS: [&str; 10] = ["cpu", "offcpu", "wall", "net-tx", "net-rx", "net-retransmit", "net-drop", "faults", "memory-requests", "heap"];
/// A profile may decompress to at most this much: an agent's 10 s profile is a few MiB at
/// most, and a small push must not make the collector inflate hundreds of MiB.
pub const MAX_DECOMPRESSED: u64 = 64 << 20;
/// Start times more than this far in the future are a broken agent clock.
const MAX_CLOCK_SKEW_NS: i64 = 10 * 60 * 1_000_000_000;
const MAX_LABELS: usize = 256;

pub struct CollectorService {
    pub store: Arc<dyn ProfileStore>,
    /// Pushes being checked and stored at once, at most (`MAX_PUSHES_STORING`): the others
    /// wait their turn, so that a burst of pushes waits here, not in memory or threads.
    storing: tokio::sync::Semaphore,
}

/// Pushes stored at once, at most: with a collector's first pushes each carrying all its stacks
/// (some 0.5 MB of rows), 256 stay under the rows ClickHouse's store buffers.
const MAX_PUSHES_STORING: usize = 256;

impl CollectorService {
    pub fn new(store: Arc<dyn ProfileStore>) -> CollectorService {
        CollectorService { store, storing: tokio::sync::Semaphore::new(MAX_PUSHES_STORING) }
    }
}

/// Checks a pushed (or pulled) profile; returns the totals of its sample values, and its pprof
/// decoded.
pub fn check(profile: &Profile, now_ns: i64) -> Result<(Vec<i64>, ember_proto::pprof::Profile), String> {
    if !KINDS.contains(&profile.kind.as_str()) {
        return Err(format!("unknown profile kind {:?} (known: {})", profile.kind, KINDS.join(", ")));
    }
    if profile.sequence == 0 {
        return Err("sequence numbers start at 1".into());
    }
    if profile.end_unix_nanos < profile.start_unix_nanos || profile.start_unix_nanos <= 0 {
        return Err(format!("time range {}..{} is not a range", profile.start_unix_nanos, profile.end_unix_nanos));
    }
    if profile.start_unix_nanos > now_ns + MAX_CLOCK_SKEW_NS {
        return Err("profile starts more than 10 minutes in the future: check the agent's clock".into());
    }
    if profile.labels.len() > MAX_LABELS {
        return Err(format!("{} labels on one profile (at most {MAX_LABELS})", profile.labels.len()));
    }
    let decoded = ember_pprof::decode_gzip(&profile.pprof_gzip, MAX_DECOMPRESSED).map_err(|e| format!("{e:#}"))?;
    Ok((ember_pprof::totals(&decoded), decoded))
}

#[tonic::async_trait]
impl Collector for CollectorService {
    async fn push(&self, request: Request<PushRequest>) -> Result<Response<PushResponse>, Status> {
        let request = request.into_inner();
        let agent = request.agent.ok_or_else(|| Status::invalid_argument("push without agent identity"))?;
        if agent.agent_id.is_empty() {
            return Err(Status::invalid_argument("push with an empty agent_id"));
        }
        // A bad profile is refused alone: the others of the request are stored, and the agent
        // learns exactly which were refused and why. Decompressing and decoding are the
        // push's heaviest work: on the blocking pool with the storing, not the async threads;
        // a store's wait for its inserts is awaited here (see `Putting`).
        let _turn = self.storing.acquire().await.map_err(|_| Status::unavailable("the collector is stopping"))?;
        let store = self.store.clone();
        let now_ns = now_ns();
        let (putting, refused) = tokio::task::spawn_blocking(move || {
            let (mut good, mut refused) = (Vec::new(), Vec::new());
            for profile in request.profiles {
                match check(&profile, now_ns) {
                    Ok((totals, decoded)) => good.push(Checked { profile, totals, decoded: Some(decoded) }),
                    Err(reason) => {
                        tracing::warn!(agent = agent.agent_id, sequence = profile.sequence, "refused a profile: {reason}");
                        refused.push(Refusal { sequence: profile.sequence, reason });
                    }
                }
            }
            store.start_put(&agent, &good).map(|putting| (putting, refused))
        })
        .await
        .map_err(|e| Status::internal(format!("store task failed: {e}")))?
        .map_err(|e| Status::unavailable(format!("storing failed: {e:#}")))?;
        let stored = putting.done().await.map_err(|e| Status::unavailable(format!("storing failed: {e:#}")))?;
        Ok(Response::new(PushResponse { stored_through: stored.stored_through, duplicates: stored.duplicates, held: stored.held, refused }))
    }
}

pub fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos() as i64
}
