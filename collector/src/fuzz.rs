//! Entry points for the fuzz targets (`cargo xtask fuzz`, built with `--cfg fuzzing`): the
//! collector's push handler and its HTTP query API, each over a real store in a temporary
//! directory (one per fuzzing process).
use std::{
    sync::{Arc, LazyLock},
    time::Duration,
};

use axum::Router;
use ember_proto::{
    ember::{collector_server::Collector, AgentIdentity, Profile, PushRequest},
    pprof,
};
use prost::Message;

use crate::{
    http::router,
    request::QueryLimits,
    service::{check, CollectorService},
    embedded::EmbeddedStore,
    embedded_store::Embedded,
    store::{Checked, ProfileStore},
};

/// A store in a fresh directory under the system's temporary directory.
fn scratch_store(name: &str) -> Arc<Embedded> {
    let dir = std::env::temp_dir().join(format!("ember-fuzz-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating the fuzz store's directory");
    Arc::new(Embedded::new(EmbeddedStore::open(&dir).expect("opening the fuzz store")))
}

static RUNTIME: LazyLock<tokio::runtime::Runtime> =
    LazyLock::new(|| tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime"));

/// A PushRequest as the gRPC layer hands it over (protobuf bytes), through the real handler
/// into a real store. Whatever the answer, every profile is accounted for once.
pub fn push(data: &[u8]) {
    static SERVICE: LazyLock<CollectorService> = LazyLock::new(|| CollectorService::new(scratch_store("push")));
    let Ok(request) = PushRequest::decode(data) else { return };
    let sequences: Vec<u64> = request.profiles.iter().map(|p| p.sequence).collect();
    let Ok(response) = RUNTIME.block_on(SERVICE.push(tonic::Request::new(request))) else { return };
    let response = response.into_inner();
    for refusal in &response.refused {
        assert!(sequences.contains(&refusal.sequence), "refused {} which was not pushed", refusal.sequence);
    }
}

/// The query API's router over a store that holds two small cpu profiles, from two hosts, at
/// 1000 s and 2000 s, for a fuzz target to send requests to.
pub fn query_router() -> Router {
    let store = scratch_store("query");
    for (sequence, host) in [(1u64, "a"), (2, "b")] {
        let agent = AgentIdentity { agent_id: host.into(), spool_id: 1, ..Default::default() };
        let start = sequence as i64 * 1000 * 1_000_000_000;
        let profile = Profile {
            sequence: 1,
            kind: "cpu".into(),
            start_unix_nanos: start,
            end_unix_nanos: start + 10_000_000_000,
            labels: [("host".to_string(), host.to_string())].into(),
            pprof_gzip: ember_pprof::encode_gzip(&small_pprof()),
        };
        let (totals, decoded) = check(&profile, i64::MAX / 2).expect("a valid seed");
        store.put(&agent, &[Checked { profile, totals, decoded: Some(decoded) }]).expect("seeding the fuzz store");
    }
    let limits = QueryLimits { max_range: Duration::from_secs(7 * 86_400), concurrent: 4, timeout: Duration::from_secs(5) };
    router(store, limits, None)
}

/// main -> work, 3 samples, with a sample label.
fn small_pprof() -> pprof::Profile {
    use pprof::{Function, Label, Line, Location, Sample, ValueType};
    let strings = ["", "samples", "count", "main", "work", "thread"];
    pprof::Profile {
        string_table: strings.iter().map(|s| s.to_string()).collect(),
        sample_type: vec![ValueType { r#type: 1, unit: 2 }],
        function: vec![Function { id: 1, name: 3, ..Default::default() }, Function { id: 2, name: 4, ..Default::default() }],
        location: (1..=2).map(|id| Location { id, line: vec![Line { function_id: id, ..Default::default() }], ..Default::default() }).collect(),
        sample: vec![Sample { location_id: vec![2, 1], value: vec![3], label: vec![Label { key: 5, str: 3, ..Default::default() }] }],
        ..Default::default()
    }
}

/// What the ClickHouse store writes and reads back. `data` as a profile.proto that passes the
/// collector's checks: into rows and back, the same folded stacks for every value. `data` as
/// ClickHouse's answer of stored stacks (RowBinary): read without a panic, and each stack
/// read writes back as it was read.
pub fn clickhouse_rows(data: &[u8]) {
    use crate::clickhouse::fuzzing::{rows, Builder, Reader, Stack, Writer};
    let mut answer = Reader(data);
    while let Ok(stack) = Stack::read(&mut answer) {
        let mut written = Writer(Vec::new());
        stack.write(&mut written);
        assert_eq!(Stack::read(&mut Reader(&written.0)).expect("a stack written reads back"), stack);
    }
    let Ok(profile) = ember_pprof::decode(data) else { return };
    let rows = rows(&profile, &|_| true);
    let mut builder = Builder::default();
    for (hash, stack) in &rows.stacks {
        builder.stack(*hash, stack);
    }
    for (hash, labels, values) in rows.samples {
        builder.sample(hash, &labels, values).expect("every sample's stack was built");
    }
    for value in 0..profile.sample_type.len().min(4) {
        if let Ok(folded) = ember_pprof::folded(&profile, value, &[]) {
            assert_eq!(ember_pprof::folded(&builder.profile, value, &[]).expect("the same totals"), folded, "value {value}");
        }
    }
}
