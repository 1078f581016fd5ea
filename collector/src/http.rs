//! HTTP query API of a running collector (the store is locked by the process that has it
//! open): merged profiles as pprof, folded stacks or SVG flame graphs, differential flame
//! graphs of two time ranges, and a health check. Every query is bounded: a default and a
//! maximum range, a limit on queries running at once, and a time limit.
use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Result;
use axum::{
    extract::{Query, Request, State},
    middleware::Next,
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use ember_proto::pprof::Profile;
use serde::Deserialize;

use ember_proto::security::authorized;

use crate::{
    api,
    query::{self, NS},
    store::Store,
    ui,
};

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
    pub(crate) store: Arc<Store>,
    limits: QueryLimits,
    running: tokio::sync::Semaphore,
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
    format: String,
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

pub fn router(store: Arc<Store>, limits: QueryLimits, token: Option<String>) -> Router {
    let api = Arc::new(Api { store, limits, running: tokio::sync::Semaphore::new(limits.concurrent) });
    let queries = Router::new()
        .route("/query", get(query_handler))
        .route("/diff", get(diff_handler))
        .route("/api/labels", get(api::labels_handler))
        .route("/api/series", get(api::series_handler))
        .route("/api/tree", get(api::tree_handler))
        .layer(axum::middleware::from_fn(move |request: Request, next: Next| {
            let allowed = authorized(request.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes()), token.as_deref());
            async move {
                if allowed {
                    next.run(request).await
                } else {
                    error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token")
                }
            }
        }));
    Router::new().route("/healthz", get(|| async { "ok\n" })).merge(ui::routes()).merge(queries).with_state(api)
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

/// Merges a range, within the query limits. `from` and `to` are unix seconds.
pub(crate) async fn merged(api: &Api, kind: &str, selector_text: &str, from: u64, to: u64) -> Result<Profile, Response> {
    let selector = selector(selector_text)?;
    let (from, to) = checked_range(api, from, to)?;
    let (store, owned_kind) = (api.store.clone(), kind.to_string());
    let (from, to) = (from.saturating_mul(NS), to.saturating_mul(NS));
    match limited(api, move |deadline| query::merged(&store, &owned_kind, &selector, from, to, Some(deadline))).await? {
        Some((profile, _)) => Ok(profile),
        None => Err(error(StatusCode::NOT_FOUND, format!("no {kind} profiles match in that time range"))),
    }
}

async fn query_handler(State(api): State<Arc<Api>>, Query(q): Query<Params>) -> Response {
    if !query::FORMATS.contains(&q.format.as_str()) {
        return error(StatusCode::BAD_REQUEST, format!("unknown format {:?}: use pprof, folded or svg", q.format));
    }
    let (from, to) = match range_or_default(&api, q.from, q.to) {
        Ok(range) => range,
        Err(response) => return response,
    };
    let profile = match merged(&api, &q.kind, &q.selector, from, to).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    match query::render(&profile, &q.kind, &q.format) {
        Ok(bytes) => ([(header::CONTENT_TYPE, query::content_type(&q.format))], bytes).into_response(),
        Err(e) => error(StatusCode::UNPROCESSABLE_ENTITY, format!("{e:#}")),
    }
}

/// A differential flame graph: the base range's stacks against the later range's, colored by
/// growth and shrinkage.
async fn diff_handler(State(api): State<Arc<Api>>, Query(q): Query<Params>) -> Response {
    let (Some(base_from), Some(base_to), Some(from), Some(to)) = (q.base_from, q.base_to, q.from, q.to) else {
        return error(StatusCode::BAD_REQUEST, "a diff needs base_from, base_to, from and to");
    };
    let base = merged(&api, &q.kind, &q.selector, base_from, base_to).await;
    let new = merged(&api, &q.kind, &q.selector, from, to).await;
    let (base, new) = match (base, new) {
        (Ok(base), Ok(new)) => (base, new),
        (Err(response), _) | (_, Err(response)) => return response,
    };
    let view = ember_pprof::view(&q.kind);
    let lines = match (view.folded(&base), view.folded(&new)) {
        (Ok(base), Ok(new)) => diff_lines(&base, &new),
        (Err(e), _) | (_, Err(e)) => return error(StatusCode::UNPROCESSABLE_ENTITY, format!("{e:#}")),
    };
    match ember_pprof::flamegraph(&lines, &format!("Ember {} diff", q.kind), view.unit(&new)) {
        Ok(svg) => ([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// "stack before after" lines, the differential folded format.
fn diff_lines(base: &[String], new: &[String]) -> Vec<String> {
    let parse = |lines: &[String]| -> BTreeMap<String, i64> {
        lines
            .iter()
            .filter_map(|l| l.rsplit_once(' '))
            .map(|(stack, n)| (stack.to_string(), n.parse().unwrap_or(0)))
            .collect()
    };
    let (base, new) = (parse(base), parse(new));
    let stacks: std::collections::BTreeSet<&String> = base.keys().chain(new.keys()).collect();
    stacks
        .into_iter()
        .map(|s| format!("{s} {} {}", base.get(s).unwrap_or(&0), new.get(s).unwrap_or(&0)))
        .collect()
}

/// Serves the query API, over TLS when given a certificate and key (PEM).
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<(Vec<u8>, Vec<u8>)>,
    store: Arc<Store>,
    limits: QueryLimits,
    token: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let router = router(store, limits, token);
    match tls {
        Some((cert, key)) => {
            let listener = crate::https::TlsListener::new(listener, &cert, &key)?;
            axum::serve(listener, router).with_graceful_shutdown(shutdown).await?
        }
        None => axum::serve(listener, router).with_graceful_shutdown(shutdown).await?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_lines_pair_counts_of_both_ranges() {
        let base = vec!["a;b 3".to_string(), "a;c 1".to_string()];
        let new = vec!["a;b 5".to_string(), "a;d 2".to_string()];
        assert_eq!(diff_lines(&base, &new), ["a;b 3 5", "a;c 1 0", "a;d 0 2"]);
    }
}
