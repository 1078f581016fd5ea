//! Talking to ClickHouse over its HTTP interface: statements, queries whose parameters travel
//! as external tables (RowBinary files beside the query, bound by ClickHouse, never spliced
//! into the SQL), and inserts. Every call is bounded in time and in the bytes it reads back.
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use ember_proto::http_client::{http_client, HttpClient};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::{body::Bytes, header, Method, Request, Uri};

use super::row_binary::Writer;

type Http = HttpClient<Full<Bytes>>;

/// The most an answer may hold: a merged selection is a few MiB of stacks.
const MAX_ANSWER: usize = 1 << 30;
/// A call without a query deadline (ingest, schema, retention) gives up after this.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Where ClickHouse is and who the collector is there.
#[derive(Clone)]
pub struct Connection {
    /// http://host:8123 or https://host:8443.
    pub url: String,
    pub user: String,
    pub password: String,
}

/// A table of parameters sent with a query: its name, its columns ("n UInt32, key String")
/// and its rows in RowBinary.
pub struct External<'a> {
    pub name: &'a str,
    pub structure: &'a str,
    pub rows: Writer,
}

pub struct Client {
    http: Http,
    /// Settings sent with every call.
    settings: Vec<(String, String)>,
    base: Uri,
    authorization: String,
}

impl Client {
    pub fn new(connection: &Connection, settings: &[(&str, &str)]) -> Result<Client> {
        let base: Uri = connection.url.trim_end_matches('/').parse().with_context(|| format!("ClickHouse URL {:?} is not a URL", connection.url))?;
        if !matches!(base.scheme_str(), Some("http" | "https")) || base.host().is_none() {
            bail!("ClickHouse URL {:?}: use http://host:port or https://host:port", connection.url);
        }
        let http = http_client()?;
        let credentials = format!("{}:{}", connection.user, connection.password);
        let settings = settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Ok(Client { http, settings, base, authorization: format!("Basic {}", base64(credentials.as_bytes())) })
    }

    /// Runs a statement or query (its text from the collector alone), with `external` tables
    /// as its parameters; returns the answer's bytes.
    pub fn query(&self, sql: &str, external: &[External], deadline: Option<Instant>) -> Result<Vec<u8>> {
        if external.is_empty() {
            return self.call(&[], sql.as_bytes().to_vec(), None, deadline);
        }
        let boundary = "ember-external-data-boundary";
        let mut body = Vec::new();
        let mut params = vec![("query".to_string(), sql.to_string())];
        for table in external {
            params.push((format!("{}_structure", table.name), table.structure.to_string()));
            params.push((format!("{}_format", table.name), "RowBinary".to_string()));
            body.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{0}\"; filename=\"{0}\"\r\n\r\n", table.name).as_bytes());
            body.extend_from_slice(&table.rows.0);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        self.call(&params, body, Some(&format!("multipart/form-data; boundary={boundary}")), deadline)
    }

    /// Inserts RowBinary `rows` with `head` ("INSERT INTO db.table (columns)").
    pub fn insert(&self, head: &str, rows: Writer) -> Result<()> {
        self.call(&[("query".to_string(), format!("{head} FORMAT RowBinary"))], rows.0, None, None).map(drop)
    }

    fn call(&self, params: &[(String, String)], body: Vec<u8>, content_type: Option<&str>, deadline: Option<Instant>) -> Result<Vec<u8>> {
        let mut query = String::new();
        for (name, value) in params.iter().chain(&self.settings) {
            query.push(if query.is_empty() { '?' } else { '&' });
            query.push_str(&format!("{}={}", percent_encode(name), percent_encode(value)));
        }
        let uri = format!("{}{}{query}", self.base, if self.base.path() == "/" { "" } else { "/" });
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header(header::AUTHORIZATION, &self.authorization)
            // ClickHouse refuses a request that says neither (hyper leaves it out when empty).
            .header(header::CONTENT_LENGTH, body.len());
        if let Some(content_type) = content_type {
            request = request.header(header::CONTENT_TYPE, content_type);
        }
        let request = request.body(Full::new(Bytes::from(body))).context("building a ClickHouse request")?;
        let timeout = deadline.map_or(DEFAULT_TIMEOUT, |d| d.saturating_duration_since(Instant::now()));
        let exchange = async {
            let response = self.http.request(request).await.context("ClickHouse did not answer")?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_ANSWER).collect().await.map_err(|e| anyhow::anyhow!("reading ClickHouse's answer: {e}"))?;
            Ok::<_, anyhow::Error>((status, body.to_bytes()))
        };
        let (status, bytes) = tokio::runtime::Handle::current()
            .block_on(async { tokio::time::timeout(timeout, exchange).await })
            .map_err(|_| anyhow::anyhow!("ClickHouse did not answer within {timeout:?}"))??;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes);
            bail!("ClickHouse refused ({status}): {}", text.lines().next().unwrap_or("").trim());
        }
        Ok(bytes.to_vec())
    }
}

fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(byte as char),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= chunk.len() { ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_are_the_standard_ones() {
        assert_eq!(base64(b"default:"), "ZGVmYXVsdDo=");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abc"), "YWJj");
        assert_eq!(percent_encode("a b&c=d'"), "a%20b%26c%3Dd%27");
    }
}
