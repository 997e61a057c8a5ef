//! Tables served from Redis (Redis Cluster, or one server; Valkey speaks
//! the same protocol): `pleio publish` uploads a table's stored row bytes
//! (`store`), and `Table::open("redis://...")` reads them back, checked
//! row by row, decoded by pleio exactly as from the file.
//!
//! `url` parses addresses, `resp` is the wire protocol, `tls` wraps
//! `rediss://` connections, `client` the cluster-aware pipelined client,
//! `store` the key layout, publishing and batch reads.

pub mod client;
pub mod resp;
pub mod store;
pub mod tls;
pub mod url;

pub use store::{publish, PublishOptions, Published, RemoteTable};
pub use url::is_remote;

use crate::error::{Error, ErrorKind};

/// Errors of a remote table.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// A malformed `redis://` address.
    #[error("{url}: {what}")]
    Url {
        /// The address (password hidden).
        url: String,
        /// What is wrong.
        what: String,
    },
    /// Connecting to, writing to or reading from a node failed (timeouts
    /// included).
    #[error("redis node {node}: {source}")]
    Io {
        /// `host:port`.
        node: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A TLS certificate or key file given in the address cannot be used.
    #[error("{}: {what}", path.display())]
    TlsFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The TLS handshake with a node failed (a certificate that does not
    /// verify, a server that does not speak TLS, a refused client).
    #[error("redis node {node}: TLS {what} (rediss:// options: tls_ca, tls_cert, tls_key, tls_name)")]
    Tls {
        /// `host:port`.
        node: String,
        /// What failed.
        what: String,
    },
    /// The node refused the credentials.
    #[error("redis node {node}: authentication failed: {message} (check the user and password: redis://USER:PASSWORD@HOST:PORT/NAME or PLEIO_REDIS_PASSWORD)")]
    Auth {
        /// `host:port`.
        node: String,
        /// The server's error.
        message: String,
    },
    /// The node answered with an error.
    #[error("redis node {node}: {message}")]
    Server {
        /// `host:port`.
        node: String,
        /// The server's error.
        message: String,
    },
    /// The node's reply broke the protocol or pleio's expectations.
    #[error("redis node {node}: {what}")]
    Protocol {
        /// `host:port`.
        node: String,
        /// What was wrong.
        what: String,
    },
    /// No node answered.
    #[error("no redis node answered")]
    NoNode,
    /// No node serves the slot of a key.
    #[error("no redis node serves slot {slot} (key {key})")]
    Uncovered {
        /// The slot.
        slot: u16,
        /// The key.
        key: String,
    },
    /// A key kept moving.
    #[error("key {key}: redirected ({message})")]
    Redirected {
        /// The key.
        key: String,
        /// The server's `MOVED` error.
        message: String,
    },
    /// A key is missing or shorter than the table needs.
    #[error("redis node {node}: key {key} gave {got} bytes at offset {start}, {want} expected (a missing or truncated bucket: publish the table again)")]
    Short {
        /// `host:port`.
        node: String,
        /// The key.
        key: String,
        /// Offset asked.
        start: u64,
        /// Bytes asked.
        want: usize,
        /// Bytes given.
        got: usize,
    },
    /// A row's check does not match: the bucket is corrupt or of another table.
    #[error("row {row}: its check in key {key} does not match table {table} (a corrupt bucket, or another table's)")]
    Corrupt {
        /// The bucket's key.
        key: String,
        /// The row.
        row: u64,
        /// The table's id.
        table: String,
    },
    /// Rounds of retries ran out.
    #[error("{ranges} reads (the first of key {key}) failed after {rounds} rounds: {last}")]
    GaveUp {
        /// Reads still not done.
        ranges: usize,
        /// The key of the first.
        key: String,
        /// Rounds tried.
        rounds: u32,
        /// The last failure.
        last: Box<RemoteError>,
    },
    /// No table is published under the name.
    #[error("no table published as {name:?} (key {key} is missing): run pleio publish TABLE redis://HOST:PORT/{name}")]
    NoTable {
        /// The name.
        name: String,
        /// The alias key.
        key: String,
    },
    /// The manifest is missing, unreadable or inconsistent.
    #[error("manifest {key}: {what}")]
    Manifest {
        /// Its key.
        key: String,
        /// What is wrong.
        what: String,
    },
    /// A write was refused.
    #[error("key {key}: the server answered {reply}")]
    Refused {
        /// The key.
        key: String,
        /// The reply.
        reply: String,
    },
}

impl RemoteError {
    pub(crate) fn io(node: &str, source: std::io::Error) -> RemoteError {
        RemoteError::Io {
            node: node.to_string(),
            source,
        }
    }
}

impl From<RemoteError> for Error {
    fn from(e: RemoteError) -> Error {
        let kind = match &e {
            RemoteError::Url { .. } | RemoteError::TlsFile { .. } => ErrorKind::Setup,
            RemoteError::NoTable { .. } => ErrorKind::NotFound,
            RemoteError::Manifest { .. } => ErrorKind::InvalidFile,
            _ => ErrorKind::Remote,
        };
        let row = match &e {
            RemoteError::Corrupt { row, .. } => Some(*row),
            _ => None,
        };
        Error::new(kind, e).at(row, None, None)
    }
}
