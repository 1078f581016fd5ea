//! HTTP query API of a running collector (the store is locked by the process that has it
//! open): merged profiles as pprof, folded stacks or SVG flame graphs, differential flame
//! graphs of two time ranges, and a health check.
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
use serde::Deserialize;

use ember_proto::security::authorized;

use crate::{query, store::Store};

#[derive(Deserialize)]
struct Range {
    #[serde(default = "default_kind")]
    kind: String,
    #[serde(default)]
    selector: String,
    /// Unix seconds; default: everything.
    from: Option<u64>,
    to: Option<u64>,
    #[serde(default = "default_format")]
    format: String,
}

#[derive(Deserialize)]
struct DiffRanges {
    #[serde(default = "default_kind")]
    kind: String,
    #[serde(default)]
    selector: String,
    base_from: u64,
    base_to: u64,
    from: u64,
    to: u64,
}

fn default_kind() -> String {
    "cpu".into()
}

fn default_format() -> String {
    "svg".into()
}

pub fn router(store: Arc<Store>, token: Option<String>) -> Router {
    let queries = Router::new()
        .route("/query", get(query_handler))
        .route("/diff", get(diff_handler))
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
    Router::new().route("/healthz", get(|| async { "ok\n" })).merge(queries).with_state(store)
}

/// Errors are one line of text with a status a client can act on.
fn error(status: StatusCode, e: impl std::fmt::Display) -> Response {
    (status, format!("{e}\n")).into_response()
}

async fn merged(store: Arc<Store>, kind: String, selector: String, from: u64, to: u64) -> Result<(Profile, usize), Response> {
    let selector = query::parse_selector(&selector).map_err(|e| error(StatusCode::BAD_REQUEST, format!("{e:#}")))?;
    tokio::task::spawn_blocking(move || query::merged(&store, &kind, &selector, from, to))
        .await
        .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e))?
        .map_err(|e| error(StatusCode::NOT_FOUND, format!("{e:#}")))
}

const NS: u64 = 1_000_000_000;

async fn query_handler(State(store): State<Arc<Store>>, Query(q): Query<Range>) -> Response {
    if !query::FORMATS.contains(&q.format.as_str()) {
        return error(StatusCode::BAD_REQUEST, format!("unknown format {:?}: use pprof, folded or svg", q.format));
    }
    let (from, to) = (q.from.unwrap_or(0).saturating_mul(NS), q.to.map_or(u64::MAX, |t| t.saturating_mul(NS)));
    let (profile, _) = match merged(store, q.kind.clone(), q.selector, from, to).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    match query::render(&profile, &q.kind, &q.format) {
        Ok(bytes) => ([(header::CONTENT_TYPE, query::content_type(&q.format))], bytes).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
    }
}

/// A differential flame graph: the base range's stacks against the later range's, colored by
/// growth and shrinkage.
async fn diff_handler(State(store): State<Arc<Store>>, Query(q): Query<DiffRanges>) -> Response {
    let base = merged(store.clone(), q.kind.clone(), q.selector.clone(), q.base_from * NS, q.base_to * NS).await;
    let new = merged(store, q.kind.clone(), q.selector, q.from * NS, q.to * NS).await;
    let (base, new) = match (base, new) {
        (Ok((base, _)), Ok((new, _))) => (base, new),
        (Err(response), _) | (_, Err(response)) => return response,
    };
    let view = ember_pprof::view(&q.kind);
    let lines = diff_lines(&view.folded(&base), &view.folded(&new));
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
    token: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let router = router(store, token);
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
