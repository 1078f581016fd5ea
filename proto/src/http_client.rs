//! The client for plain HTTP servers that both sides talk to (debuginfod from the agent,
//! ClickHouse from the collector): http:// or https:// URLs over HTTP/1.1, https servers
//! checked against the system's TLS roots.
use std::time::Duration;

use anyhow::{Context as _, Result};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{connect::HttpConnector, Client};

/// A client whose requests carry bodies of type `B`.
pub type HttpClient<B> = Client<HttpsConnector<HttpConnector>, B>;

/// An idle connection is not reused after this. Servers close idle connections themselves
/// (ClickHouse after its `keep_alive_timeout`, 3 s by default in 18.16): a request sent on one
/// the server is closing fails with "connection closed before message completed", and
/// an insert cannot be retried blindly. Under the servers' timeouts, the client closes first.
const IDLE_REUSED: Duration = Duration::from_secs(2);

/// Fails only if the system's TLS roots cannot be read.
pub fn http_client<B>() -> Result<HttpClient<B>>
where
    B: hyper::body::Body + Send,
    B::Data: Send,
{
    let connector = hyper_rustls::HttpsConnectorBuilder::new().with_native_roots().context("reading the system's TLS roots")?.https_or_http().enable_http1().build();
    Ok(Client::builder(hyper_util::rt::TokioExecutor::new()).pool_idle_timeout(IDLE_REUSED).build(connector))
}

#[cfg(test)]
mod tests {
    use std::{
        io::{BufRead as _, BufReader, Write as _},
        net::TcpListener,
        sync::{
            atomic::{AtomicUsize, Ordering},
            Arc,
        },
    };

    use super::*;

    /// A loopback server that keeps connections alive, answers each request with an empty
    /// 200, and counts the connections it accepted.
    fn counting_server() -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                counted.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut writer = stream;
                    let mut line = String::new();
                    while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                        if line == "\r\n" && writer.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_err() {
                            return;
                        }
                        line.clear();
                    }
                });
            }
        });
        (url, accepted)
    }

    #[test]
    fn a_connection_idle_past_the_limit_is_closed_not_reused() {
        let (url, accepted) = counting_server();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let client = http_client::<String>().unwrap();
            let get = || client.request(hyper::Request::get(url.as_str()).body(String::new()).unwrap());
            assert!(get().await.unwrap().status().is_success());
            assert!(get().await.unwrap().status().is_success());
            assert_eq!(accepted.load(Ordering::SeqCst), 1, "a connection just used is reused");
            tokio::time::sleep(IDLE_REUSED + Duration::from_millis(300)).await;
            assert!(get().await.unwrap().status().is_success());
            assert_eq!(accepted.load(Ordering::SeqCst), 2, "a connection idle past {IDLE_REUSED:?} is not reused");
        });
    }
}
