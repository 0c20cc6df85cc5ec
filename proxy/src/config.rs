//! Static settings of a proxy core, fixed when it is created.

use std::net::IpAddr;
use std::time::Duration;

/// Settings of a [`crate::ProxyCore`]. `Default` gives production values.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Upstream timeouts (connect, read, write, pooled-connection idle).
    pub upstream: UpstreamTimeouts,
    /// Downstream limits (header size/count/time, keep-alive idle).
    pub limits: DownstreamLimits,
    /// How long [`crate::ProxyCore::shutdown`] lets open connections finish
    /// before cutting them. 25 s fits inside Kubernetes' default 30 s grace
    /// period with room for the process to exit.
    pub shutdown_grace: Duration,
    /// Peers of the plain TCP listener whose `X-Forwarded-For` and request id
    /// are believed (e.g. a load balancer in front of standalone mode). Tunnel
    /// streams say whether they are trusted in their [`crate::ConnInfo`].
    pub trusted_peers: Vec<IpAddr>,
    /// Name of the request id header, added to the upstream request and the
    /// downstream response.
    pub request_id_header: http::HeaderName,
    /// How many times a request may be tried when connecting fails (the
    /// first attempt included). Only idempotent requests are retried, and
    /// only before any byte of them was sent.
    pub max_connect_attempts: usize,
    /// Idle upstream connections kept per pool.
    pub upstream_pool_size: usize,
    /// Most concurrent streams on one h2c/h2 upstream connection.
    pub upstream_h2_streams: usize,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            upstream: UpstreamTimeouts::default(),
            limits: DownstreamLimits::default(),
            shutdown_grace: Duration::from_secs(25),
            trusted_peers: Vec::new(),
            request_id_header: http::HeaderName::from_static(
                crate::gateway::DEFAULT_REQUEST_ID_HEADER,
            ),
            max_connect_attempts: 3,
            upstream_pool_size: 128,
            upstream_h2_streams: 100,
        }
    }
}

/// Upstream side timeouts.
#[derive(Debug, Clone)]
pub struct UpstreamTimeouts {
    /// TCP (and TLS) connect. Exceeding it answers 504.
    pub connect: Duration,
    /// Longest wait for any single read from the upstream (the response
    /// header, or the next body chunk). Exceeding it answers 504 if no
    /// response byte was sent yet. Upgraded (WebSocket) connections are
    /// exempt: they may idle as long as both ends want.
    pub read: Duration,
    /// Longest wait for a single write to the upstream.
    pub write: Duration,
    /// How long an idle keep-alive upstream connection stays pooled.
    pub idle: Duration,
}

impl Default for UpstreamTimeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            read: Duration::from_secs(60),
            write: Duration::from_secs(60),
            idle: Duration::from_secs(60),
        }
    }
}

/// Downstream (client side) limits.
#[derive(Debug, Clone)]
pub struct DownstreamLimits {
    /// Most bytes in a request header block; larger answers 431.
    pub max_header_bytes: usize,
    /// Most header fields in a request; more answers 431.
    pub max_header_count: usize,
    /// Time allowed for the first request header of a connection to
    /// arrive completely, however slowly it trickles in (slowloris).
    pub header_read_timeout: Duration,
    /// How long an idle keep-alive client connection is kept (whole seconds;
    /// also bounds each read of later request headers).
    pub keepalive_idle: Duration,
}

impl Default for DownstreamLimits {
    fn default() -> Self {
        Self {
            max_header_bytes: 32 * 1024,
            max_header_count: 100,
            header_read_timeout: Duration::from_secs(10),
            keepalive_idle: Duration::from_secs(60),
        }
    }
}
