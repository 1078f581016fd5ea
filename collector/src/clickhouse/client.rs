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
/// Calls in flight at once, at most; the others wait their turn. ClickHouse closes the
/// connections it cannot take (a thousand agents' first pushes at once, each asking what is
/// stored, opened some 500), and runs at most 100 queries at once by default, for all the
/// collectors it serves.
const MAX_IN_FLIGHT: usize = 16;

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
    in_flight: tokio::sync::Semaphore,
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
        Ok(Client { http, in_flight: tokio::sync::Semaphore::new(MAX_IN_FLIGHT), settings, base, authorization: format!("Basic {}", base64(credentials.as_bytes())) })
    }

    /// Runs a statement or query (its text from the collector alone), with `external` tables
    /// as its parameters; returns the answer's bytes. With tables, the text travels as the
    /// form's first field rather than in the URL: ClickHouse's HTTP server refuses a request
    /// line over 16 KiB (with an empty 400), and a statement grows with its selector's terms.
    pub fn query(&self, sql: &str, external: &[External], deadline: Option<Instant>) -> Result<Vec<u8>> {
        if external.is_empty() {
            return self.call(&[], sql.as_bytes().to_vec(), None, deadline);
        }
        let mut fields = vec![("query", "", sql.as_bytes())];
        let mut params = Vec::new();
        for table in external {
            params.push((format!("{}_structure", table.name), table.structure.to_string()));
            params.push((format!("{}_format", table.name), "RowBinary".to_string()));
            fields.push((table.name, table.name, &table.rows.0));
        }
        let (boundary, body) = form(&fields);
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
            let _turn = self.in_flight.acquire().await.context("ClickHouse client closed")?;
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
            let first = text.lines().next().unwrap_or("").trim();
            bail!("ClickHouse refused ({status}): {}", if first.is_empty() { "no reason given" } else { first });
        }
        Ok(bytes.to_vec())
    }
}

/// A multipart form of (name, file name or "" for a plain field, content), and its boundary:
/// one that no content holds, since table rows carry strings a request chose.
fn form(fields: &[(&str, &str, &[u8])]) -> (String, Vec<u8>) {
    let holds = |content: &[u8], boundary: &[u8]| content.windows(boundary.len()).any(|w| w == boundary);
    let boundary = (0u64..)
        .map(|n| format!("ember-form-boundary-{n}"))
        .find(|b| fields.iter().all(|(_, _, content)| !holds(content, b.as_bytes())))
        .expect("a boundary no field holds");
    let mut body = Vec::new();
    for (name, file, content) in fields {
        let file = if file.is_empty() { String::new() } else { format!("; filename=\"{file}\"") };
        body.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"{file}\r\n\r\n").as_bytes());
        body.extend_from_slice(content);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (boundary, body)
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

    #[test]
    fn a_form_boundary_is_in_no_field() {
        let hostile = b"x\r\n--ember-form-boundary-0\r\n--ember-form-boundary-1--";
        let (boundary, body) = form(&[("query", "", b"SELECT 1"), ("terms", "terms", hostile)]);
        assert_eq!(boundary, "ember-form-boundary-2");
        let text = String::from_utf8_lossy(&body);
        assert!(text.starts_with("--ember-form-boundary-2\r\nContent-Disposition: form-data; name=\"query\"\r\n\r\nSELECT 1\r\n"), "{text}");
        assert!(text.contains("name=\"terms\"; filename=\"terms\"\r\n\r\n") && text.ends_with("--ember-form-boundary-2--\r\n"), "{text}");
    }
}
