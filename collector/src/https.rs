//! HTTPS for the query API: a listener that completes TLS handshakes off the accept path, so a
//! slow or broken client cannot stall the others, and hands axum finished streams.
use std::{io, net::SocketAddr, sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use tokio::{net::TcpListener, sync::mpsc};
use tokio_rustls::{
    rustls::{
        self,
        pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    },
    server::TlsStream,
    TlsAcceptor,
};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub struct TlsListener {
    streams: mpsc::Receiver<(TlsStream<tokio::net::TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

fn server_config(cert: &[u8], key: &[u8]) -> Result<rustls::ServerConfig> {
    let certs = CertificateDer::pem_slice_iter(cert).collect::<Result<Vec<_>, _>>().context("reading the TLS certificate")?;
    let key = PrivateKeyDer::from_pem_slice(key).context("reading the TLS key")?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the TLS certificate and key do not fit together")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

impl TlsListener {
    pub fn new(listener: TcpListener, cert: &[u8], key: &[u8]) -> Result<TlsListener> {
        let acceptor = TlsAcceptor::from(Arc::new(server_config(cert, key)?));
        let local = listener.local_addr()?;
        let (done, streams) = mpsc::channel(64);
        tokio::spawn(async move {
            while !done.is_closed() {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: wait rather than spin.
                        tracing::warn!("accepting an HTTPS connection: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, done) = (acceptor.clone(), done.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = done.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { streams, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.streams.recv().await {
            Some(accepted) => accepted,
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}
