//! The collector's HTTP query API, through its real router over a seeded store: the input is a
//! request target ("/query?...", "/diff?..." or "/api/...?..."). Every answer is a status with a one-line
//! error or a body, never a panic or a 5xx other than the limits' 503 and 504.
#![no_main]
use std::sync::LazyLock;

use axum::{body::Body, http::Request, Router};
use tower::ServiceExt as _;

static ROUTER: LazyLock<Router> = LazyLock::new(ember_collector::fuzz::query_router);
static RUNTIME: LazyLock<tokio::runtime::Runtime> =
    LazyLock::new(|| tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap());

libfuzzer_sys::fuzz_target!(init: ember_fuzz::catch_stack_overflows(), |data: &[u8]| {
    let Ok(target) = std::str::from_utf8(data) else { return };
    let Ok(request) = Request::get(target).body(Body::empty()) else { return };
    let response = RUNTIME.block_on(ROUTER.clone().oneshot(request)).unwrap();
    let status = response.status().as_u16();
    assert!(status < 500 || status == 503 || status == 504, "{target:?} answered {status}");
});
