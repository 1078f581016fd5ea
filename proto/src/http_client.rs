//! The client for plain HTTP servers that both sides talk to (debuginfod from the agent,
//! ClickHouse from the collector): http:// or https:// URLs over HTTP/1.1, https servers
//! checked against the system's TLS roots.
use anyhow::{Context as _, Result};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{connect::HttpConnector, Client};

/// A client whose requests carry bodies of type `B`.
pub type HttpClient<B> = Client<HttpsConnector<HttpConnector>, B>;

/// Fails only if the system's TLS roots cannot be read.
pub fn http_client<B>() -> Result<HttpClient<B>>
where
    B: hyper::body::Body + Send,
    B::Data: Send,
{
    let connector = hyper_rustls::HttpsConnectorBuilder::new().with_native_roots().context("reading the system's TLS roots")?.https_or_http().enable_http1().build();
    Ok(Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector))
}
