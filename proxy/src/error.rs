//! The crate's error type.

use std::net::SocketAddr;

/// Everything the registration and entry-point API can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The host name of a route registration is not a valid host.
    #[error("invalid host {host:?}: use a DNS name or *.wildcard, without scheme or path")]
    InvalidHost {
        /// As given.
        host: String,
    },
    /// A backend has no address to send traffic to.
    #[error("backend for {what} has no addresses: resolve the Service first")]
    NoAddresses {
        /// Which route or listener.
        what: String,
    },
    /// The route table could not be compiled at all.
    #[error("route table rejected: {0}")]
    Routing(#[from] tuna_routing::Error),
    /// Binding a listener failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Requested address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A TCP listener is already bound at that address.
    #[error("a TCP listener already exists on {0}: remove it first")]
    ListenerExists(SocketAddr),
    /// No TCP listener exists at that address.
    #[error("no TCP listener on {0}")]
    NoSuchListener(SocketAddr),
    /// No TCP service is registered under that key.
    #[error("no TCP service registered as {0:?}")]
    NoSuchTcpService(String),
    /// Connecting to a TCP upstream failed on every address.
    #[error("TCP upstream unreachable: {0}")]
    UpstreamUnreachable(#[source] std::io::Error),
    /// The per-listener (or per-service) connection limit is reached.
    #[error("connection limit of {0} reached")]
    ConnectionLimit(usize),
    /// A certificate or key cannot be used (a CONNECT listener's CA, an
    /// upstream's CA).
    #[error("certificate: {0}")]
    InvalidCertificate(String),
    /// The core is shutting down and accepts no new work.
    #[error("the proxy core is shutting down")]
    ShuttingDown,
    /// Other I/O failure.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
