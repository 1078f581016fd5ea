//! The web UI: a page and its scripts, embedded in the binary and served as they are (no
//! build chain). uPlot, the time-series chart, comes from the npm registry through `cargo
//! xtask setup`; the build embeds what setup fetched (see build.rs). The page holds no data, so
//! it is served without the bearer token; the API calls it makes carry it.
use axum::{
    http::header,
    response::IntoResponse,
    routing::get,
    Router,
};

/// (path, content type, bytes).
const ASSETS: [(&str, &str, &[u8]); 6] = [
    ("/", "text/html; charset=utf-8", include_bytes!("../ui/index.html")),
    ("/ui/app.css", "text/css; charset=utf-8", include_bytes!("../ui/app.css")),
    ("/ui/app.js", "text/javascript; charset=utf-8", include_bytes!("../ui/app.js")),
    ("/ui/flame.js", "text/javascript; charset=utf-8", include_bytes!("../ui/flame.js")),
    ("/ui/uPlot.min.js", "text/javascript; charset=utf-8", include_bytes!(concat!(env!("EMBER_UPLOT_DIST"), "/uPlot.iife.min.js"))),
    ("/ui/uPlot.min.css", "text/css; charset=utf-8", include_bytes!(concat!(env!("EMBER_UPLOT_DIST"), "/uPlot.min.css"))),
];

pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    ASSETS.iter().fold(Router::new(), |router, &(path, content_type, bytes)| {
        // A new collector version must not run with an old page from the browser's cache.
        router.route(path, get(move || async move { ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], bytes).into_response() }))
    })
}
