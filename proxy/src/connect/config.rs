//! A CONNECT listener's configuration: who decides, which CA signs, and
//! its bounds.

use std::sync::Arc;
use std::time::Duration;

use super::ca::InterceptCa;
use super::grant::ConnectAuthorizer;

/// Bounds of a CONNECT listener.
#[derive(Debug, Clone)]
pub struct ConnectLimits {
    /// Most open granted connections; a CONNECT granted while they are all
    /// taken is answered `503`.
    pub max_connections: usize,
    /// Most connections that have not been granted yet (the CONNECT head
    /// is on its way, or the authorizer is deciding); more are closed as
    /// they are accepted.
    pub max_unauthenticated: usize,
    /// Most connections not granted yet from one client address.
    pub max_unauthenticated_per_ip: usize,
    /// Time for the CONNECT head to arrive and, after the `200`, for the TLS
    /// handshake to complete.
    pub handshake_timeout: Duration,
    /// Time the authorizer gets (`503` after it).
    pub authorize_timeout: Duration,
    /// Longest silence of the upstream while a response is under way (a
    /// watch with no events); upgraded connections are not limited.
    pub upstream_idle: Duration,
}

impl Default for ConnectLimits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            max_unauthenticated: 512,
            max_unauthenticated_per_ip: 32,
            handshake_timeout: Duration::from_secs(10),
            authorize_timeout: Duration::from_secs(10),
            // An API server ends a watch after --min-request-timeout (30 to
            // 60 minutes) and a client re-watches; bookmarks usually come
            // every minute.
            upstream_idle: Duration::from_secs(30 * 60),
        }
    }
}

/// Everything a CONNECT listener needs.
#[derive(Clone)]
pub struct ConnectConfig {
    /// Decides who may go where.
    pub authorizer: Arc<dyn ConnectAuthorizer>,
    /// Signs the certificates the clients see.
    pub ca: Arc<InterceptCa>,
    /// Bounds.
    pub limits: ConnectLimits,
}

impl std::fmt::Debug for ConnectConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectConfig")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}
