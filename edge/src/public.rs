//! Public listeners: HTTP and HTTPS (HTTP/1.1 and h2 via ALPN), routed by
//! host to the session that serves it — the edge's trust boundary.
//!
//! This module holds what both paths share — the bounds, the trusted
//! proxies, the connection caps; the server (`server.rs`) sends plain
//! HTTP/1.1 connections to the byte relay ([`crate::relay`]), which parses
//! heads with the codec the proxy core shares (`tuna-http1`) and forwards
//! bodies as they are, and h2 clients (and what the relay hands over) to
//! the hyper path ([`crate::hyper_path`]).
//!
//! Each public connection gets its own data streams, one per host it talks
//! to, so a stream's [`tuna_protocol::wire::StreamMeta`] names one client and one
//! host; the agent's proxy core serves only that host on it and sets
//! `X-Forwarded-*` from the metadata.
//!
//! # What the edge guarantees the agent (both paths)
//!
//! - **Host**: the request's `Host` is the host it was routed by. The relay
//!   routes by `Host`; the hyper path routes by the target's authority (h2
//!   `:authority`, HTTP/1.1 absolute form) and replaces `Host` with it
//!   (RFC 9112 §3.2.2). A host that is not a plain DNS name or IP literal
//!   (userinfo `a@b`, other characters), a second `Host`, or none: 400.
//! - **Client-address fields**: `X-Forwarded-For`, `X-Forwarded-Host`,
//!   `X-Forwarded-Proto`, `Forwarded`, `X-Real-IP` and `X-Request-Id` from
//!   public clients are removed; the stream metadata's client address is
//!   the one truth. Peers in [`EdgeConfig::trusted_proxies`] (a load
//!   balancer in front of the edge) keep theirs; the proxy core appends
//!   the peer's address to their `X-Forwarded-For`.
//! - **Framing**: what the shared codec refuses is answered 400/431 here
//!   and never reaches a tunnel.
//! - **Bounds** ([`PublicLimits`]): connections per listener and per client
//!   address, the time for a request head, for each body read and write,
//!   for the agent's answer, and idle time on h2 and hyper connections.
//!
//! [`EdgeConfig::trusted_proxies`]: crate::server::EdgeConfig::trusted_proxies

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tuna_protocol::wire::Scheme;

/// Idle HTTP/1.1 streams one public connection keeps for reuse.
pub(crate) const MAX_IDLE_PER_CONNECTION: usize = 4;

/// Bounds of the public listeners. `Default` gives the production values
/// documented in `docs/tuna-api.md` ("Public HTTP: header policy and
/// limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublicLimits {
    /// Open connections per public listener (HTTP and HTTPS each); more
    /// are closed at accept.
    pub max_connections: usize,
    /// Open connections per client address (IPv4 address, IPv6 /64) per
    /// listener; trusted proxies are exempt.
    pub max_connections_per_ip: usize,
    /// Time for a complete request head, idle keep-alive time included.
    pub header_read: Duration,
    /// Longest wait for each read of a request body from the client.
    pub body_read: Duration,
    /// Longest wait for each write to the client or to a tunnel stream.
    pub write: Duration,
    /// Longest wait for the agent's response head and for each read of its
    /// body. Longer than the proxy core's upstream read timeout (60 s), so
    /// that its 504 page reaches the client first.
    pub response: Duration,
    /// A connection of the hyper path (h2, upgrades, HTTP/1.0) with no
    /// request in flight for this long is closed gracefully (h2 `GOAWAY`).
    pub idle: Duration,
    /// Concurrent streams a public h2 client may open.
    pub h2_max_streams: u32,
    /// How long a request for a host whose tunnel just went away waits for
    /// it to come back (an agent restarting, as on `helm upgrade`) before it
    /// is answered `503 Tunnel offline`. Counted from the moment the tunnel
    /// went away, so a host offline for longer answers at once. Zero: no
    /// wait.
    pub reconnect_grace: Duration,
}

impl Default for PublicLimits {
    fn default() -> Self {
        Self {
            max_connections: 16_384,
            max_connections_per_ip: 256,
            header_read: Duration::from_secs(30),
            body_read: Duration::from_secs(60),
            write: Duration::from_secs(60),
            response: Duration::from_secs(90),
            idle: Duration::from_secs(60),
            h2_max_streams: 128,
            reconnect_grace: Duration::from_secs(5),
        }
    }
}

/// An IP network (`10.0.0.0/8`, `2001:db8::/32`, or one address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpCidr {
    addr: IpAddr,
    prefix: u8,
}

impl IpCidr {
    /// Whether `ip` is inside this network (IPv4-mapped IPv6 addresses
    /// count as their IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for IpCidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{s:?} is not an IP network: use ADDRESS or ADDRESS/PREFIX");
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr = canonical(addr.trim().parse::<IpAddr>().map_err(|_| bad())?);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(bad)?,
            None => max,
        };
        Ok(Self { addr, prefix })
    }
}

impl std::fmt::Display for IpCidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// What the public side knows and enforces, shared by every connection of
/// one edge.
#[derive(Debug)]
pub(crate) struct PublicPolicy {
    pub(crate) limits: PublicLimits,
    pub(crate) trusted_proxies: Vec<IpCidr>,
}

impl PublicPolicy {
    /// Whether a peer's forwarding fields (`X-Forwarded-For`, ...) are kept.
    pub(crate) fn is_trusted(&self, peer: IpAddr) -> bool {
        self.trusted_proxies.iter().any(|n| n.contains(peer))
    }
}

/// Counts open connections of one listener, in total and per client.
pub(crate) struct ConnectionLimiter {
    policy: Arc<PublicPolicy>,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// An admitted connection; dropping it frees its place.
pub(crate) struct Admitted {
    limiter: Arc<ConnectionLimiter>,
    key: Option<IpAddr>,
}

impl ConnectionLimiter {
    pub(crate) fn new(policy: Arc<PublicPolicy>) -> Arc<Self> {
        Arc::new(Self {
            policy,
            open: Mutex::new((0, HashMap::new())),
        })
    }

    /// Admits a connection from `peer`, or `None` when a limit is reached.
    pub(crate) fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Admitted> {
        let limits = &self.policy.limits;
        // One client is one IPv4 address or one IPv6 /64 (what a single
        // host is usually given); a trusted proxy speaks for many.
        let key = (!self.policy.is_trusted(peer)).then(|| crate::budget::source_key(peer));
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.0 >= limits.max_connections {
            return None;
        }
        if let Some(key) = key {
            let n = open.1.entry(key).or_insert(0);
            if *n >= limits.max_connections_per_ip {
                return None;
            }
            *n += 1;
        }
        open.0 += 1;
        Some(Admitted {
            limiter: Arc::clone(self),
            key,
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.limiter.open.lock().unwrap_or_else(|p| p.into_inner());
        open.0 -= 1;
        if let Some(key) = self.key
            && let Some(n) = open.1.get_mut(&key)
        {
            *n -= 1;
            if *n == 0 {
                open.1.remove(&key);
            }
        }
    }
}

/// What a connection's code needs to know about its client.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    pub(crate) client_addr: SocketAddr,
    pub(crate) scheme: Scheme,
    /// A trusted proxy: its forwarding fields are kept.
    pub(crate) trusted: bool,
    pub(crate) limits: PublicLimits,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_contain_what_they_say() {
        let cases: &[(&str, &str, bool)] = &[
            ("10.0.0.0/8", "10.200.3.4", true),
            ("10.0.0.0/8", "11.0.0.1", false),
            ("192.0.2.7", "192.0.2.7", true),
            ("192.0.2.7", "192.0.2.8", false),
            ("0.0.0.0/0", "203.0.113.9", true),
            ("2001:db8::/32", "2001:db8:1::1", true),
            ("2001:db8::/32", "2001:db9::1", false),
            ("192.0.2.0/24", "::ffff:192.0.2.1", true),
            ("::/0", "10.0.0.1", false),
        ];
        for (net, ip, want) in cases {
            let net: IpCidr = net.parse().unwrap();
            assert_eq!(net.contains(ip.parse().unwrap()), *want, "{net} {ip}");
        }
        for bad in ["10.0.0.0/33", "example.com", "10.0.0.0/x", "::/129"] {
            assert!(bad.parse::<IpCidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_count_per_listener_and_per_client() {
        let policy = Arc::new(PublicPolicy {
            limits: PublicLimits {
                max_connections: 4,
                max_connections_per_ip: 2,
                ..PublicLimits::default()
            },
            trusted_proxies: vec!["192.0.2.1".parse().unwrap()],
        });
        let limiter = ConnectionLimiter::new(policy);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let a1 = limiter.admit(ip("198.51.100.1")).unwrap();
        let a2 = limiter.admit(ip("198.51.100.1")).unwrap();
        assert!(limiter.admit(ip("198.51.100.1")).is_none(), "per client");
        let v6a = limiter.admit(ip("2001:db8::1")).unwrap();
        let v6b = limiter.admit(ip("2001:db8::2")).unwrap();
        drop(a1);
        assert!(
            limiter.admit(ip("2001:db8::3")).is_none(),
            "one /64 is one client"
        );
        let other = limiter.admit(ip("198.51.100.2")).unwrap();
        assert!(limiter.admit(ip("198.51.100.3")).is_none(), "per listener");
        drop((v6a, v6b, other));
        let trusted: Vec<Admitted> = (0..3)
            .map(|_| {
                limiter
                    .admit(ip("192.0.2.1"))
                    .expect("a trusted proxy has no per-client limit")
            })
            .collect();
        assert!(
            limiter.admit(ip("192.0.2.1")).is_none(),
            "but the listener's"
        );
        drop((a2, trusted));
        assert!(
            limiter.admit(ip("198.51.100.1")).is_some(),
            "places are freed"
        );
    }
}
