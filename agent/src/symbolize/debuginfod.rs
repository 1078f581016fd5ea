//! debuginfod client: fetches a binary's debug info by build id (`GET
//! <url>/buildid/<id>/debuginfo`) into an on-disk cache, on a thread of its own, so that a
//! server that is slow or down never holds up a drain. The symbolizer asks, gets "pending"
//! until the file is in the cache, and names the binary's frames from its own symbols
//! meanwhile. A build id no server has is not asked for again for an hour; one whose fetch
//! failed (timeout, refused, a 5xx), for a few minutes.
use std::{
    collections::HashMap,
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use ember_proto::http_client::{http_client, HttpClient};
use http_body_util::{BodyExt as _, Empty};
use tokio::sync::{mpsc, Semaphore};

use crate::ops::metrics;

/// Where and how to fetch debug info.
#[derive(Debug, Clone, PartialEq)]
pub struct DebuginfodSettings {
    /// Server base URLs, tried in order.
    pub urls: Vec<String>,
    /// The cache: `<cache>/<build id>/debuginfo`.
    pub cache: PathBuf,
    /// For a whole fetch, from connecting to the last byte.
    pub timeout: Duration,
}

/// Debug files larger than this are refused (a server, or a man in the middle, could
/// otherwise fill the disk).
const MAX_FILE: u64 = 4 << 30;
/// Fetches at once.
const CONCURRENT: usize = 4;
const RETRY_NOT_FOUND: Duration = Duration::from_secs(3600);
const RETRY_FAILED: Duration = Duration::from_secs(300);

pub enum Fetched {
    Ready(PathBuf),
    Pending,
    Unavailable,
}

enum State {
    Fetching,
    Unavailable { until: Instant },
}

/// The client: clones share the fetching thread and what it knows (the resolve stage starts
/// fetches when it opens a binary, the symbolizer reads what they brought).
#[derive(Clone)]
pub struct Debuginfod {
    cache: PathBuf,
    state: Arc<Mutex<HashMap<String, State>>>,
    requests: mpsc::UnboundedSender<String>,
}

impl Debuginfod {
    /// Starts the fetching thread.
    pub fn start(settings: DebuginfodSettings) -> Debuginfod {
        let state = Arc::new(Mutex::new(HashMap::new()));
        let (requests, queue) = mpsc::unbounded_channel();
        let cache = settings.cache.clone();
        let shared = state.clone();
        std::thread::Builder::new()
            .name("ember-debuginfod".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime for debuginfod");
                runtime.block_on(serve(settings, queue, shared));
            })
            .expect("spawning the debuginfod thread");
        Debuginfod { cache, state, requests }
    }

    /// The debug file of `build_id` if it is in the cache; else starts fetching it (once).
    pub fn get(&self, build_id: &str) -> Fetched {
        let path = cache_path(&self.cache, build_id);
        if path.exists() {
            return Fetched::Ready(path);
        }
        let mut state = self.state.lock().expect("debuginfod state");
        match state.get(build_id) {
            Some(State::Fetching) => Fetched::Pending,
            Some(State::Unavailable { until }) if Instant::now() < *until => Fetched::Unavailable,
            _ => {
                state.insert(build_id.to_string(), State::Fetching);
                let _ = self.requests.send(build_id.to_string());
                Fetched::Pending
            }
        }
    }
}

impl Debuginfod {
    /// Fetches started and not yet ended.
    pub fn in_flight(&self) -> usize {
        self.state.lock().expect("debuginfod state").values().filter(|s| matches!(s, State::Fetching)).count()
    }

    /// Waits until no fetch is in flight, or `limit` has passed.
    pub fn wait_for_fetches(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.in_flight() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn cache_path(cache: &Path, build_id: &str) -> PathBuf {
    cache.join(build_id).join("debuginfo")
}

async fn serve(settings: DebuginfodSettings, mut queue: mpsc::UnboundedReceiver<String>, state: Arc<Mutex<HashMap<String, State>>>) {
    let settings = Arc::new(settings);
    let client = match http_client() {
        Ok(client) => Arc::new(client),
        Err(e) => {
            tracing::error!("debuginfod is off: {e:#}");
            return;
        }
    };
    let slots = Arc::new(Semaphore::new(CONCURRENT));
    while let Some(build_id) = queue.recv().await {
        let (settings, client, state) = (settings.clone(), client.clone(), state.clone());
        let slot = slots.clone().acquire_owned().await.expect("semaphore open");
        tokio::spawn(async move {
            let started = Instant::now();
            let outcome = fetch(&settings, &client, &build_id).await;
            let (result, retry) = match &outcome {
                Ok(true) => ("found", None),
                Ok(false) => ("not_found", Some(RETRY_NOT_FOUND)),
                Err(e) => {
                    tracing::warn!(build_id, "debuginfod fetch failed, frames keep the binary's own names: {e:#}");
                    ("failed", Some(RETRY_FAILED))
                }
            };
            metrics::add("ember_debuginfod_fetches_total", &[("result", result)], 1.0);
            metrics::add("ember_debuginfod_fetch_seconds_total", &[], started.elapsed().as_secs_f64());
            let mut state = state.lock().expect("debuginfod state");
            match retry {
                Some(after) => state.insert(build_id, State::Unavailable { until: Instant::now() + after }),
                None => state.remove(&build_id),
            };
            drop(slot);
        });
    }
}

type Client = HttpClient<Empty<bytes::Bytes>>;

/// Tries each server in turn. Ok(false): none has it.
async fn fetch(settings: &DebuginfodSettings, client: &Client, build_id: &str) -> Result<bool> {
    let mut failure = None;
    for url in &settings.urls {
        let address = format!("{}/buildid/{build_id}/debuginfo", url.trim_end_matches('/'));
        match tokio::time::timeout(settings.timeout, download(client, &address, &settings.cache, build_id)).await {
            Ok(Ok(true)) => return Ok(true),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => failure = Some(e.context(address)),
            Err(_) => failure = Some(anyhow::anyhow!("{address}: no answer within {:?}", settings.timeout)),
        }
    }
    failure.map_or(Ok(false), Err)
}

/// Downloads one URL into the cache (a temporary file renamed when complete).
async fn download(client: &Client, address: &str, cache: &Path, build_id: &str) -> Result<bool> {
    let uri: hyper::Uri = address.parse().context("not a URL")?;
    let response = client.get(uri).await.context("request failed")?;
    match response.status().as_u16() {
        200 => {}
        404 => return Ok(false),
        status => bail!("status {status}"),
    }
    let path = cache_path(cache, build_id);
    let dir = path.parent().expect("a cache path has a parent");
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let partial = Partial(dir.join(format!("debuginfo.part-{}", std::process::id())));
    let mut file = fs::File::create(&partial.0).with_context(|| format!("creating {}", partial.0.display()))?;
    let (mut body, mut written) = (response.into_body(), 0u64);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.context("reading the body")?.into_data() {
            written += data.len() as u64;
            if written > MAX_FILE {
                bail!("larger than {} GiB: refused", MAX_FILE >> 30);
            }
            file.write_all(&data).context("writing the cache")?;
        }
    }
    fs::rename(&partial.0, &path).context("completing the cache file")?;
    tracing::info!(build_id, bytes = written, "debug info fetched from debuginfod");
    Ok(true)
}

/// A download not complete yet: removed if it never is (an error, or the timeout drops it).
struct Partial(PathBuf);

impl Drop for Partial {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}
