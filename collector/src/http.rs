//! HTTP query API of a running collector (the store is locked by the process that has it
//! open): merged profiles as pprof, folded stacks or SVG flame graphs, differential flame
//! graphs of two time ranges, and a health check. Every query is bounded (see `request`): a
//! default and a maximum range, a limit on queries running at once, and a time limit.
use std::{collections::BTreeMap, sync::Arc};

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
use ember_proto::security::authorized;

use crate::{
    api,
    query::{self, NS},
    request::{checked_range, error, limited, range_or_default, selector, Api, Params, QueryLimits},
    store::{ProfileStore, Selection},
    ui,
};

pub fn router(store: Arc<dyn ProfileStore>, limits: QueryLimits, token: Option<String>) -> Router {
    let api = Arc::new(Api::new(store, limits));
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
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready_handler))
        .merge(ui::routes())
        .merge(queries)
        .with_state(api)
}

/// Ready when the store is: a collector whose ClickHouse is away says why (503), so that a
/// load balancer sends agents to another.
async fn ready_handler(State(api): State<Arc<Api>>) -> Response {
    let store = api.store.clone();
    match tokio::task::spawn_blocking(move || store.ready()).await {
        Ok(Ok(())) => "ready\n".into_response(),
        Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e:#}")),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// Merges a range, within the query limits. `from` and `to` are unix seconds.
pub(crate) async fn merged(api: &Api, kind: &str, selector_text: &str, from: u64, to: u64) -> Result<Profile, Response> {
    let selector = selector(selector_text)?;
    let (from, to) = checked_range(api, from, to)?;
    let (store, owned_kind) = (api.store.clone(), kind.to_string());
    let (from, to) = (from.saturating_mul(NS), to.saturating_mul(NS));
    let work = move |deadline| query::merged(&*store, &Selection { kind: &owned_kind, selector: &selector, range: (from, to) }, Some(deadline));
    match limited(api, work).await? {
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
    store: Arc<dyn ProfileStore>,
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
