//! Inserts gathered across pushes: ClickHouse makes a part (a directory of files per column)
//! of every insert, and merges them later, so many small inserts cost it far more than a few
//! large ones. Pushes that arrive within `GATHER` of each other are inserted together, one
//! insert per table, in table order (a profile's samples before its profile row); each push
//! is answered once its rows are stored, or with the error that stopped them. What waits is
//! bounded: a push that would take the buffer past `MAX_BUFFERED` is refused (retryable).
use std::{
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use tokio::sync::oneshot;

use super::{client::Client, row_binary::Writer};

/// How long the first push of a gathering waits for others.
const GATHER: Duration = Duration::from_millis(100);
/// A gathering this large is inserted at once.
const FLUSH_BYTES: usize = 32 << 20;
/// Rows waiting, at most: past it pushes are refused until the buffer drains.
const MAX_BUFFERED: usize = 256 << 20;
/// A push waits this long for its rows to be stored, then fails (retryable).
const WAIT: Duration = Duration::from_secs(60);

/// The tables, in the order their rows are inserted.
const TABLES: [&str; 4] = ["stacks", "samples", "profiles", "watermarks"];

#[derive(Default)]
struct Gathering {
    rows: [Writer; 4],
    bytes: usize,
    since: Option<Instant>,
    waiting: Vec<oneshot::Sender<Result<(), String>>>,
}

pub struct Inserts {
    gathering: Mutex<Gathering>,
    arrived: Condvar,
}

impl Inserts {
    /// Starts the thread that inserts into `database` (on the tokio runtime of the caller).
    pub fn start(client: Arc<Client>, database: String) -> Arc<Inserts> {
        let inserts = Arc::new(Inserts { gathering: Mutex::default(), arrived: Condvar::new() });
        let (runtime, worker) = (tokio::runtime::Handle::current(), inserts.clone());
        std::thread::Builder::new()
            .name("clickhouse-inserts".into())
            .spawn(move || {
                let _entered = runtime.enter();
                loop {
                    let gathering = worker.next();
                    let stored = insert(&client, &database, gathering.rows).map_err(|e| format!("{e:#}"));
                    for waiting in gathering.waiting {
                        let _ = waiting.send(stored.clone());
                    }
                }
            })
            .expect("starting the ClickHouse insert thread");
        inserts
    }

    /// Stores these rows (per table, in TABLES' order) with the other pushes of the moment;
    /// what it returns completes once they are stored.
    pub fn gather(&self, rows: [Writer; 4]) -> Result<impl std::future::Future<Output = Result<()>> + Send + 'static> {
        let bytes: usize = rows.iter().map(|r| r.0.len()).sum();
        let (sender, receiver) = oneshot::channel();
        if bytes == 0 {
            let _ = sender.send(Ok(()));
        } else {
            let mut gathering = self.gathering.lock().unwrap_or_else(|e| e.into_inner());
            if gathering.bytes + bytes > MAX_BUFFERED {
                bail!("{} MiB of rows are waiting for ClickHouse already: retry shortly", gathering.bytes >> 20);
            }
            for (all, mine) in gathering.rows.iter_mut().zip(rows) {
                all.0.extend_from_slice(&mine.0);
            }
            gathering.bytes += bytes;
            gathering.since.get_or_insert_with(Instant::now);
            gathering.waiting.push(sender);
            drop(gathering);
            self.arrived.notify_one();
        }
        Ok(async move {
            match tokio::time::timeout(WAIT, receiver).await {
                Ok(Ok(Ok(()))) => Ok(()),
                Ok(Ok(Err(error))) => bail!("{error}"),
                Ok(Err(_)) => bail!("the ClickHouse insert thread is gone"),
                Err(_) => bail!("ClickHouse did not store the rows within {WAIT:?}"),
            }
        })
    }

    /// Waits for a gathering that is due (GATHER after its first push, or large), and takes it.
    fn next(&self) -> Gathering {
        let mut gathering = self.gathering.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let wait = match gathering.since {
                None => Duration::from_secs(3600),
                Some(_) if gathering.bytes >= FLUSH_BYTES => return std::mem::take(&mut *gathering),
                Some(since) => match GATHER.checked_sub(since.elapsed()) {
                    None => return std::mem::take(&mut *gathering),
                    Some(left) => left,
                },
            };
            gathering = self.arrived.wait_timeout(gathering, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// One insert per table that has rows, in order.
fn insert(client: &Client, database: &str, rows: [Writer; 4]) -> Result<()> {
    for (table, rows) in TABLES.iter().zip(rows) {
        if !rows.0.is_empty() {
            client.insert(&format!("INSERT INTO {database}.{table}"), rows)?;
        }
    }
    Ok(())
}
