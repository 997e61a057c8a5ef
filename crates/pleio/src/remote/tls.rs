//! TLS for `rediss://` addresses: the client configuration (trusted
//! certificates, an optional client certificate) read once from PEM files,
//! and each connection's handshake, finished before the first command so a
//! certificate that does not verify is reported as such, naming the node.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use super::url::TlsOptions;
use super::RemoteError;

/// Where the system's trusted certificates are looked for when no
/// `tls_ca` is given (`SSL_CERT_FILE` first).
const SYSTEM_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// A client configuration and the name the nodes must carry, if fixed.
#[derive(Clone)]
pub struct Tls {
    config: Arc<ClientConfig>,
    name: Option<String>,
}

fn file_err(path: &Path, what: impl std::fmt::Display) -> RemoteError {
    RemoteError::TlsFile {
        path: path.to_path_buf(),
        what: what.to_string(),
    }
}

/// The certificates in the PEM file `path` (at least one).
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, RemoteError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(path, e))?;
    if certs.is_empty() {
        return Err(file_err(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

/// The system's bundle: `SSL_CERT_FILE`, else the first of [`SYSTEM_BUNDLES`] that exists.
fn system_bundle() -> Result<PathBuf, RemoteError> {
    if let Some(p) = std::env::var_os("SSL_CERT_FILE") {
        return Ok(PathBuf::from(p));
    }
    SYSTEM_BUNDLES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| RemoteError::TlsFile {
            path: PathBuf::from(SYSTEM_BUNDLES[0]),
            what: format!(
                "no system certificate bundle (looked at {}): give tls_ca=PATH",
                SYSTEM_BUNDLES.join(", ")
            ),
        })
}

impl Tls {
    /// Reads the files `o` names and builds the configuration.
    pub fn new(o: &TlsOptions) -> Result<Tls, RemoteError> {
        let ca = match &o.ca {
            Some(p) => p.clone(),
            None => system_bundle()?,
        };
        let mut roots = RootCertStore::empty();
        let (added, _ignored) = roots.add_parsable_certificates(certificates(&ca)?);
        if added == 0 {
            return Err(file_err(&ca, "holds no usable CA certificate"));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| file_err(&ca, e))?
            .with_root_certificates(roots);
        let config = match (&o.cert, &o.key) {
            (Some(cert), Some(key)) => {
                let chain = certificates(cert)?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| file_err(key, e))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| file_err(cert, e))?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Tls {
            config: Arc::new(config),
            name: o.name.clone(),
        })
    }

    /// Wraps `tcp` (connected to `node`, `host:port`) and completes the
    /// handshake within the socket's timeouts.
    pub fn connect(&self, node: &str, mut tcp: TcpStream) -> Result<Stream, RemoteError> {
        let host = match &self.name {
            Some(n) => n.as_str(),
            None => {
                let h = node.rsplit_once(':').map_or(node, |(h, _)| h);
                h.trim_start_matches('[').trim_end_matches(']')
            }
        };
        let tls_err = |what: String| RemoteError::Tls {
            node: node.to_string(),
            what,
        };
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| tls_err(format!("{host:?} is not a host name or IP address: {e}")))?;
        let mut conn = ClientConnection::new(self.config.clone(), name)
            .map_err(|e| tls_err(e.to_string()))?;
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp).map_err(|e| {
                tls_err(match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                        "handshake: no answer within timeout_ms (does the node speak TLS on this port?)"
                            .to_string()
                    }
                    _ => format!("handshake: {e}"),
                })
            })?;
        }
        Ok(Stream::Tls(Box::new(StreamOwned::new(conn, tcp))))
    }
}

/// A connection's byte stream: plain TCP or TLS over it.
pub enum Stream {
    /// `redis://`.
    Plain(TcpStream),
    /// `rediss://`.
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}
