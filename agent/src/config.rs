//! How the agent reaches the edge: its addresses, the TLS name and trust
//! anchors to check, the reconnect backoff.

use std::path::PathBuf;
use std::time::Duration;

/// Which certificates the agent accepts from the edge.
#[derive(Debug, Clone)]
pub enum Trust {
    /// CA certificate(s) in PEM, e.g. the edge's self-signed certificate.
    CaPem(Vec<u8>),
    /// A PEM file with CA certificate(s).
    CaFile(PathBuf),
    /// The operating system's trust store.
    SystemRoots,
}

/// How to reach the edge. Tunnels (and their tokens) are attached on the
/// handle ([`AgentHandle::attach`](crate::AgentHandle::attach)).
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// `host:port` of the edge's agent listener; several, separated by
    /// commas, for the replicas of an edge fleet (one session each, every
    /// tunnel on each; a host name resolving to several addresses counts as
    /// one per address).
    pub edge_addr: String,
    /// Name checked against the edge's certificate; defaults to the host of `edge_addr`.
    pub server_name: Option<String>,
    /// Trust anchors for the edge's certificate.
    pub trust: Trust,
    /// First reconnect delay.
    pub backoff_initial: Duration,
    /// Reconnect delays never exceed this.
    pub backoff_max: Duration,
    /// Identity sent in `Hello`, for the edge's logs.
    pub agent_name: String,
}

impl AgentConfig {
    /// A config with default backoff (0.5 s doubling to 30 s).
    pub fn new(edge_addr: impl Into<String>, trust: Trust) -> Self {
        Self {
            edge_addr: edge_addr.into(),
            server_name: None,
            trust,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            agent_name: concat!("tuna-tunnel/", env!("CARGO_PKG_VERSION")).to_owned(),
        }
    }
}
