//! The JSON API behind the web UI, usable on its own: label names and values, time series,
//! and the merged call tree (of one range, or of two as a diff). Each is bounded like the
//! other queries: range, concurrency, time, and (the tree) node count.
use std::sync::Arc;

use axum::{
    extract::{Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use serde::Serialize;

use crate::{
    query::NS,
    request::{checked_range, error, limited, range_or_default, selector, Api, Params},
    series,
    store::Selection,
    tree::{Tree, TreeBuilder},
};

pub(crate) async fn labels_handler(State(api): State<Arc<Api>>, Query(q): Query<Params>) -> Response {
    let (from, to) = match range_or_default(&api, q.from, q.to) {
        Ok(range) => range,
        Err(response) => return response,
    };
    let store = api.store.clone();
    match limited(&api, move |deadline| store.labels(&q.kind, (from.saturating_mul(NS), to.saturating_mul(NS)), deadline)).await {
        Ok(found) => Json(found).into_response(),
        Err(response) => response,
    }
}

pub(crate) async fn series_handler(State(api): State<Arc<Api>>, Query(q): Query<Params>) -> Response {
    let parsed = selector(&q.selector).and_then(|s| Ok((s, range_or_default(&api, q.from, q.to)?)));
    let (selector, (from, to)) = match parsed {
        Ok(found) => found,
        Err(response) => return response,
    };
    let (store, step) = (api.store.clone(), series::step(to - from, q.step));
    let value = q.value.unwrap_or(ember_pprof::view(&q.kind).value);
    let group_by = Some(q.group_by.trim().to_string()).filter(|g| !g.is_empty());
    let work = move |deadline| series::series(&*store, &q.kind, &selector, (from, to), step, value, group_by.as_deref(), Some(deadline));
    match limited(&api, work).await {
        Ok(found) => Json(found).into_response(),
        Err(response) => response,
    }
}

/// The largest tree a query may ask for (`max_nodes`), and the default.
const MAX_NODES: usize = 200_000;
const DEFAULT_NODES: usize = 50_000;

#[derive(Serialize)]
struct TreeAnswer {
    kind: String,
    /// The sample value the tree weighs, an index into `sample_types`.
    value: usize,
    /// (type, unit) of each sample value, e.g. ("samples", "count"), ("cpu", "nanoseconds").
    sample_types: Vec<(String, String)>,
    /// Profiles merged into the tree, and into its base.
    profiles: usize,
    base_profiles: usize,
    /// Parts merged for both: the embedded store's records (roll-ups, each many profiles, and
    /// raw profiles), or one merged profile per range where the data is.
    records: usize,
    /// Of `profiles` and `base_profiles`, how many were read from roll-ups.
    rolled_up: usize,
    #[serde(flatten)]
    tree: Tree,
}

pub(crate) async fn tree_handler(State(api): State<Arc<Api>>, Query(q): Query<Params>) -> Response {
    let max_nodes = q.max_nodes.unwrap_or(DEFAULT_NODES);
    if !(1..=MAX_NODES).contains(&max_nodes) {
        return error(StatusCode::BAD_REQUEST, format!("max_nodes must be 1 to {MAX_NODES}"));
    }
    let checked = || -> Result<_, Response> {
        let range = range_or_default(&api, q.from, q.to)?;
        let base = match (q.base_from, q.base_to) {
            (Some(from), Some(to)) => Some((checked_range(&api, from, to)?, selector(q.base_selector.as_deref().unwrap_or(&q.selector))?)),
            (None, None) => None,
            _ => return Err(error(StatusCode::BAD_REQUEST, "a diff needs both base_from and base_to")),
        };
        Ok((selector(&q.selector)?, range, base))
    };
    let (selector, (from, to), base) = match checked() {
        Ok(found) => found,
        Err(response) => return response,
    };
    let store = api.store.clone();
    let kind = q.kind.clone();
    let value = q.value.unwrap_or(ember_pprof::view(&kind).value);
    let work = move |deadline| {
        let roots = ember_pprof::view(&kind).roots;
        let mut builder = TreeBuilder::default();
        let (mut sample_types, mut records) = (Vec::new(), 0);
        let mut add = |slot: usize, selector, (from, to): (u64, u64)| {
            let selection = Selection { kind: &kind, selector, range: (from.saturating_mul(NS), to.saturating_mul(NS)) };
            store.visit_merged(&selection, Some(deadline), &mut |profile| {
                records += 1;
                if sample_types.is_empty() {
                    let text = |i: i64| ember_pprof::string(&profile.string_table, i).to_string();
                    sample_types = profile.sample_type.iter().map(|t| (text(t.r#type), text(t.unit))).collect();
                }
                builder.add(&profile, value, roots, slot);
                Ok(())
            })
        };
        let merged = add(0, &selector, (from, to))?;
        let base = match &base {
            Some((range, base_selector)) => Some(add(1, base_selector, *range)?),
            None => None,
        };
        let tree = builder.finish(max_nodes, base.is_some());
        let (profiles, base_profiles) = (merged.profiles, base.map_or(0, |b| b.profiles));
        let rolled_up = merged.rolled_up + base.map_or(0, |b| b.rolled_up);
        Ok(TreeAnswer { kind, value, sample_types, profiles, base_profiles, records, rolled_up, tree })
    };
    match limited(&api, work).await {
        Ok(found) => Json(found).into_response(),
        Err(response) => response,
    }
}
