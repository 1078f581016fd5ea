//! What every query request shares, whichever handler serves it: the parameters, the checks
//! of its range and selector, errors as a status and one line, and the limits a query runs
//! within (range, queries at once, time), so that no request can cost without bound.
use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Result;
use axum::{
    http::{header, StatusCode},
    response::{IntoResponse, Response},
};
use serde::Deserialize;

use crate::{query, store::ProfileStore};

/// What a query may cost.
#[derive(Clone, Copy, Debug)]
pub struct QueryLimits {
    /// The longest range one query (or each side of a diff) may cover.
    pub max_range: Duration,
    /// Queries that may run at once; more are refused (503), not queued without bound.
    pub concurrent: usize,
    /// A query still merging after this is stopped (504).
    pub timeout: Duration,
}

/// The range of a query that gives no `from`: the last hour.
const DEFAULT_RANGE: u64 = 3600;

pub(crate) struct Api {
    pub(crate) store: Arc<dyn ProfileStore>,
    limits: QueryLimits,
    running: tokio::sync::Semaphore,
}

impl Api {
    pub(crate) fn new(store: Arc<dyn ProfileStore>, limits: QueryLimits) -> Api {
        Api { store, limits, running: tokio::sync::Semaphore::new(limits.concurrent) }
    }
}

/// The parameters of every query: each endpoint reads the ones it needs.
#[derive(Deserialize)]
pub(crate) struct Params {
    #[serde(default = "default_kind")]
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) selector: String,
    /// Unix seconds; default: the hour before `to`, which defaults to now (/diff needs both).
    pub(crate) from: Option<u64>,
    pub(crate) to: Option<u64>,
    /// /query: pprof, folded or svg.
    #[serde(default = "default_format")]
    pub(crate) format: String,
    /// The base range of a diff (/diff needs it; /api/tree takes both ends or neither), and
    /// its own selector (/api/tree; default: the same).
    pub(crate) base_from: Option<u64>,
    pub(crate) base_to: Option<u64>,
    pub(crate) base_selector: Option<String>,
    /// /api/series: seconds per point, at least what keeps the range within
    /// series::MAX_POINTS.
    pub(crate) step: Option<u64>,
    /// /api/series and /api/tree: the index of the sample value (default: the kind's, as
    /// in the flame graph).
    pub(crate) value: Option<usize>,
    /// /api/series: one line per value of this label.
    #[serde(default)]
    pub(crate) group_by: String,
    /// /api/tree: the most nodes it may hold.
    pub(crate) max_nodes: Option<usize>,
}

fn default_kind() -> String {
    "cpu".into()
}

fn default_format() -> String {
    "svg".into()
}

/// Errors are one line of text with a status a client can act on.
pub(crate) fn error(status: StatusCode, e: impl std::fmt::Display) -> Response {
    (status, format!("{e}\n")).into_response()
}

/// A range of unix seconds a query may cover: not empty, and within the limit.
pub(crate) fn checked_range(api: &Api, from: u64, to: u64) -> Result<(u64, u64), Response> {
    if to <= from {
        return Err(error(StatusCode::BAD_REQUEST, format!("empty range: from {from} is not before to {to}")));
    }
    if to - from > api.limits.max_range.as_secs() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("range of {} s is longer than the {} s a query may cover (--query-max-range-hours)", to - from, api.limits.max_range.as_secs()),
        ));
    }
    Ok((from, to))
}

/// The range of a query's optional `from` and `to` (unix seconds): by default the hour up to
/// now.
pub(crate) fn range_or_default(api: &Api, from: Option<u64>, to: Option<u64>) -> Result<(u64, u64), Response> {
    let to = to.unwrap_or_else(query::now_seconds);
    checked_range(api, from.unwrap_or(to.saturating_sub(DEFAULT_RANGE)), to)
}

pub(crate) fn selector(text: &str) -> Result<BTreeMap<String, String>, Response> {
    query::parse_selector(text).map_err(|e| error(StatusCode::BAD_REQUEST, format!("{e:#}")))
}

/// Runs `work` off the async threads, within the query limits: refused (503) when too many
/// run, and its error a timeout (504) once past its deadline, else unprocessable (422: stored
/// profiles that cannot be merged, values that overflow).
pub(crate) async fn limited<T: Send + 'static>(
    api: &Api,
    work: impl FnOnce(Instant) -> Result<T> + Send + 'static,
) -> Result<T, Response> {
    let Ok(_permit) = api.running.try_acquire() else {
        let busy = format!("{} queries are running already: retry shortly", api.limits.concurrent);
        return Err((StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "1")], format!("{busy}\n")).into_response());
    };
    let deadline = Instant::now() + api.limits.timeout;
    match tokio::task::spawn_blocking(move || work(deadline)).await.map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e))? {
        Ok(found) => Ok(found),
        Err(e) if Instant::now() > deadline => Err(error(StatusCode::GATEWAY_TIMEOUT, format!("{e:#}"))),
        Err(e) => Err(error(StatusCode::UNPROCESSABLE_ENTITY, format!("{e:#}"))),
    }
}
