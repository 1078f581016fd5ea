//! Transport security shared by the agent and the collector, for every gRPC connection either
//! side opens or accepts: bearer tokens, TLS identities read from PEM files, and the rule that
//! plaintext leaves this host only when explicitly asked for.
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result};
use subtle::ConstantTimeEq as _;
use tonic::{
    metadata::{Ascii, MetadataValue},
    transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig},
    Request, Status,
};

/// A token file holds the token (surrounding whitespace ignored); an empty one is an error, so
/// a truncated secret never turns into "no token".
pub fn read_token(path: &Path) -> Result<String> {
    let token = std::fs::read_to_string(path).with_context(|| format!("reading token file {}", path.display()))?;
    let token = token.trim().to_string();
    anyhow::ensure!(!token.is_empty(), "token file {} is empty", path.display());
    Ok(token)
}

/// What a client sends as `authorization: Bearer <token>`, when it has a token.
#[derive(Debug, Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    pub fn new(token: Option<&str>) -> Result<Bearer> {
        let header = token.map(|t| format!("Bearer {t}").parse().context("the token has characters not allowed in a header"));
        Ok(Bearer(header.transpose()?))
    }

    /// A request carrying the token.
    pub fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(header) = &self.0 {
            request.metadata_mut().insert("authorization", header.clone());
        }
        request
    }
}

/// Whether a request carries `authorization: Bearer <token>` (when a token is configured).
/// The comparison takes the same time wherever the first difference is (subtle's, which the
/// optimizer cannot turn into an early exit).
pub fn authorized(header: Option<&[u8]>, token: Option<&str>) -> bool {
    let Some(token) = token else { return true };
    let expected = format!("Bearer {token}");
    let Some(given) = header else { return false };
    bool::from(given.ct_eq(expected.as_bytes()))
}

/// A tonic interceptor that refuses requests without the token.
pub fn token_check(token: Option<String>) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |request: Request<()>| {
        let header = request.metadata().get("authorization").map(|v| v.as_bytes());
        if authorized(header, token.as_deref()) {
            Ok(request)
        } else {
            Err(Status::unauthenticated("missing or wrong bearer token"))
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// "h" of "scheme://h:port/path" ("::1" of "http://[::1]:7070").
pub fn url_host(url: &str) -> &str {
    let authority = url.split_once("://").map_or(url, |(_, rest)| rest).split('/').next().unwrap_or_default();
    match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    }
}

fn is_local_host(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// How a server accepts connections: its certificate and key (PEM), and with a client CA,
/// only clients whose certificate that CA signed (mutual TLS).
#[derive(Debug, Clone, Default)]
pub struct ServerSecurity {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub client_ca: Option<PathBuf>,
    /// Accept plaintext on an address other hosts can reach.
    pub plaintext: bool,
}

impl ServerSecurity {
    /// The TLS identity of the server, or None for plaintext, which is refused off loopback
    /// unless asked for. `what` names the server in the error ("gRPC", "HTTP").
    pub fn tls(&self, listen: SocketAddr, what: &str) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Ok(Some((read(cert)?, read(key)?))),
            (None, None) => {
                anyhow::ensure!(
                    self.plaintext || listen.ip().is_loopback(),
                    "refusing plaintext {what} on {listen}: give a TLS certificate and key, or --plaintext to accept it"
                );
                Ok(None)
            }
            _ => anyhow::bail!("TLS needs both a certificate and a key"),
        }
    }

    /// tonic's TLS configuration, from `tls`.
    pub fn grpc(&self, listen: SocketAddr) -> Result<Option<ServerTlsConfig>> {
        let Some((cert, key)) = self.tls(listen, "gRPC")? else { return Ok(None) };
        let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
        if let Some(ca) = &self.client_ca {
            tls = tls.client_ca_root(Certificate::from_pem(read(ca)?));
        }
        Ok(Some(tls))
    }
}

/// How a client connects: https:// URLs verify the server against `ca` (and present
/// `identity` for mutual TLS); http:// URLs are refused unless the server is on this host or
/// plaintext was asked for.
#[derive(Debug, Clone, Default)]
pub struct ClientSecurity {
    pub ca: Option<PathBuf>,
    /// Certificate and key (PEM) for mutual TLS.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The name to expect in the server's certificate [default: the URL's host].
    pub domain: Option<String>,
    pub plaintext: bool,
}

impl ClientSecurity {
    /// A lazily connecting endpoint for `url`; `what` says what it is for, in errors.
    pub fn endpoint(&self, url: &str, what: &str) -> Result<Endpoint> {
        let mut endpoint = Endpoint::from_shared(url.to_string())
            .with_context(|| format!("invalid {what} address {url:?} (expected e.g. https://host:7070)"))?
            .connect_timeout(Duration::from_secs(5));
        if url.starts_with("https://") {
            let ca = self.ca.as_ref().with_context(|| format!("{what} over https:// needs the CA that signed its certificate"))?;
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
            if let Some((cert, key)) = &self.identity {
                tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            if let Some(domain) = &self.domain {
                tls = tls.domain_name(domain.clone());
            }
            endpoint = endpoint.tls_config(tls).context("configuring TLS")?;
        } else {
            anyhow::ensure!(
                self.plaintext || is_local_host(url_host(url)),
                "refusing plaintext gRPC to {url} ({what}): use https:// with a CA, or --plaintext to accept it"
            );
        }
        Ok(endpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_must_match_exactly() {
        assert!(authorized(None, None));
        assert!(authorized(Some(b"Bearer s3cret"), Some("s3cret")));
        assert!(!authorized(Some(b"Bearer s3cre"), Some("s3cret")));
        assert!(!authorized(Some(b"Bearer s3creT"), Some("s3cret")));
        assert!(!authorized(None, Some("s3cret")));
    }

    #[test]
    fn plaintext_is_refused_off_this_host_unless_asked_for() {
        let client = ClientSecurity::default();
        assert!(client.endpoint("http://127.0.0.1:7070", "push").is_ok());
        assert!(client.endpoint("http://localhost:7070", "push").is_ok());
        assert!(client.endpoint("http://[::1]:7070", "push").is_ok());
        let error = client.endpoint("http://collector.example:7070", "push").unwrap_err().to_string();
        assert!(error.contains("refusing plaintext"), "{error}");
        assert!(ClientSecurity { plaintext: true, ..Default::default() }.endpoint("http://collector.example:7070", "push").is_ok());
        let error = client.endpoint("https://collector.example:7070", "push").unwrap_err().to_string();
        assert!(error.contains("needs the CA"), "{error}");
        let server = ServerSecurity::default();
        assert!(server.grpc("127.0.0.1:7070".parse().unwrap()).unwrap().is_none());
        assert!(server.grpc("0.0.0.0:7070".parse().unwrap()).is_err());
    }

    #[test]
    fn empty_token_files_are_refused() {
        let path = std::env::temp_dir().join(format!("ember-token-test-{}", std::process::id()));
        std::fs::write(&path, " \n").unwrap();
        assert!(read_token(&path).unwrap_err().to_string().contains("is empty"));
        std::fs::write(&path, "s3cret\n").unwrap();
        assert_eq!(read_token(&path).unwrap(), "s3cret");
        std::fs::remove_file(&path).unwrap();
    }
}
