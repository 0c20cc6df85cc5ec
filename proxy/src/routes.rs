//! HTTP route registrations and the compiled, immutable snapshot that the
//! request path reads.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use pingora::upstreams::peer::HttpPeer;
use tuna_routing::{BuildIssue, HostTable, RouteSpec, RouteTable};

use crate::config::ProxyConfig;
use crate::error::{Error, Result};
use crate::metrics::{HostStats, HostStatsMap};

/// One path rule of a host: requests for `host` whose path matches go to
/// `backend`, an [`HttpBackend`]. The route type of the whole workspace
/// (`tuna_routing::RouteSpec`), with the backend resolved to addresses: the
/// plan emits the same type with a Service as its backend, and the proxy
/// compiles it with its peers built.
pub type HttpRoute = RouteSpec<HttpBackend>;

/// An upstream: the addresses the caller resolved and how to speak to them.
///
/// The proxy never resolves names: the caller (a reconciler that read the
/// Service, or the file provider) passes socket addresses, and registers
/// again when they change. That keeps DNS off the request path and makes
/// "which pod gets traffic" a decision of the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpBackend {
    /// Round-robin targets. Must not be empty.
    pub addrs: Vec<SocketAddr>,
    /// Protocol spoken to the upstream.
    pub protocol: UpstreamProtocol,
}

impl HttpBackend {
    /// Plain HTTP/1.1 to the given addresses (the common case).
    pub fn http1(addrs: impl IntoIterator<Item = SocketAddr>) -> Self {
        Self {
            addrs: addrs.into_iter().collect(),
            protocol: UpstreamProtocol::Http1,
        }
    }
}

/// Protocol spoken to an upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 over TCP, keep-alive pooled.
    #[default]
    Http1,
    /// HTTP/2 over cleartext TCP with prior knowledge (Service port
    /// `appProtocol: kubernetes.io/h2c`); needed for gRPC backends.
    H2c,
    /// HTTPS (rustls) — e.g. a Tunnel whose `upstream.url` is `https://…`.
    Tls(TlsUpstream),
}

/// TLS settings of an HTTPS upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsUpstream {
    /// Server name sent in SNI and checked against the certificate.
    pub sni: String,
    /// Verify the certificate chain and name against the system roots.
    /// In-cluster services often use self-signed certificates: `false`
    /// encrypts without authenticating.
    pub verify: bool,
    /// Offer HTTP/2 by ALPN (falls back to HTTP/1.1).
    pub h2: bool,
}

/// A backend prepared for the request path: peers pre-built, counters
/// attached.
#[derive(Debug)]
pub(crate) struct CompiledBackend {
    peers: Vec<HttpPeer>,
    /// The same addresses, for the HTTP/1.1 fast path.
    addrs: Vec<SocketAddr>,
    http1: bool,
    next: AtomicUsize,
    pub(crate) stats: Arc<HostStats>,
}

impl CompiledBackend {
    fn new(backend: &HttpBackend, stats: Arc<HostStats>, config: &ProxyConfig) -> Self {
        let peers = backend
            .addrs
            .iter()
            .map(|addr| {
                let (tls, sni) = match &backend.protocol {
                    UpstreamProtocol::Tls(t) => (true, t.sni.clone()),
                    _ => (false, String::new()),
                };
                let mut peer = HttpPeer::new(*addr, tls, sni);
                let o = &mut peer.options;
                o.connection_timeout = Some(config.upstream.connect);
                o.total_connection_timeout = Some(config.upstream.connect);
                o.read_timeout = Some(config.upstream.read);
                o.write_timeout = Some(config.upstream.write);
                o.idle_timeout = Some(config.upstream.idle);
                match &backend.protocol {
                    UpstreamProtocol::Http1 => {}
                    UpstreamProtocol::H2c => {
                        o.set_http_version(2, 2);
                        o.max_h2_streams = config.upstream_h2_streams;
                    }
                    UpstreamProtocol::Tls(t) => {
                        o.verify_cert = t.verify;
                        o.verify_hostname = t.verify;
                        if t.h2 {
                            o.set_http_version(2, 1);
                            o.max_h2_streams = config.upstream_h2_streams;
                        }
                    }
                }
                peer
            })
            .collect();
        Self {
            peers,
            addrs: backend.addrs.clone(),
            http1: backend.protocol == UpstreamProtocol::Http1,
            next: AtomicUsize::new(0),
            stats,
        }
    }

    /// The backend of an intercepted CONNECT: HTTPS (HTTP/1.1) to the
    /// target's addresses, verified against its CA (or the system roots)
    /// and its name; `idle` bounds the upstream's silence during a response
    /// (a watch), upgrades excepted.
    pub(crate) fn pinned(
        target: &crate::connect::UpstreamTarget,
        idle: std::time::Duration,
        stats: Arc<HostStats>,
        config: &ProxyConfig,
    ) -> Self {
        let backend = HttpBackend {
            addrs: target.addrs.clone(),
            protocol: UpstreamProtocol::Tls(TlsUpstream {
                sni: target.server_name.clone(),
                verify: true,
                h2: false,
            }),
        };
        let mut compiled = Self::new(&backend, stats, config);
        for peer in &mut compiled.peers {
            peer.group_key = target.group_key;
            peer.options.ca = target.ca.clone();
            peer.options.read_timeout = Some(idle);
        }
        compiled
    }

    /// First address index for a new request (round-robin).
    pub(crate) fn start_index(&self) -> usize {
        self.next.fetch_add(1, Relaxed)
    }

    /// The peer for attempt `attempt` of a request that started at `start`:
    /// retries move on to the next address.
    pub(crate) fn peer(&self, start: usize, attempt: usize) -> &HttpPeer {
        &self.peers[(start + attempt) % self.peers.len()]
    }

    /// The address for attempt `i` (start index plus attempt), as [`Self::peer`].
    pub(crate) fn addr(&self, i: usize) -> SocketAddr {
        self.addrs[i % self.addrs.len()]
    }

    /// Whether the fast path may serve this backend (plain HTTP/1.1).
    pub(crate) fn is_http1(&self) -> bool {
        self.http1
    }

    pub(crate) fn addr_count(&self) -> usize {
        self.peers.len()
    }
}

pub(crate) type Table = RouteTable<Arc<CompiledBackend>>;

/// What the request path reads: replaced whole, never mutated.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    pub(crate) table: Table,
    /// Per-host counters of the configured hosts, for `/metrics`.
    pub(crate) hosts: HostStatsMap,
}

/// The control-plane side: the live table's next version, changed one host
/// at a time. Each host compiles once when it is set (its backends' peers
/// and round-robin position built then), and both maps are persistent: a
/// [`Snapshot`] is an O(1) clone of them, so a change of one host among
/// 10 000 costs O(log n), not a visit of every host.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    table: Table,
    hosts: HostStatsMap,
}

impl Registry {
    /// Sets a host's routes, compiling them once, and returns the issues of
    /// that host's rules: the same build is what the request path reads.
    pub(crate) fn set_host(
        &mut self,
        host: &str,
        routes: Vec<HttpRoute>,
        config: &ProxyConfig,
    ) -> Result<Vec<BuildIssue>> {
        let key = canonical_host(host)?;
        for r in &routes {
            if r.backend.addrs.is_empty() {
                return Err(Error::NoAddresses {
                    what: format!("{key}{} ({})", r.path, r.origin),
                });
            }
        }
        let stats = self.hosts.get(key.as_str()).cloned().unwrap_or_default();
        let specs = specs_of(&routes, &stats, config);
        let (table, issues) = match HostTable::build(&key, specs) {
            Ok(built) => built,
            // A name a request may carry but a route may not (`a_b.example`):
            // every rule is reported and the host routes nothing.
            Err(tuna_routing::Error::InvalidHost { reason, .. }) => {
                self.remove(&key);
                return Ok(routes
                    .into_iter()
                    .map(|r| BuildIssue::InvalidHost {
                        origin: r.origin,
                        host: key.clone(),
                        reason,
                    })
                    .collect());
            }
            Err(e) => return Err(e.into()),
        };
        self.table.set_host(Arc::new(table));
        self.hosts.insert(key.into(), stats);
        Ok(issues)
    }

    pub(crate) fn remove_host(&mut self, host: &str) -> Result<bool> {
        Ok(self.remove(&canonical_host(host)?))
    }

    fn remove(&mut self, key: &str) -> bool {
        let removed = self.hosts.remove(key).is_some();
        if removed {
            self.table.remove_host(key);
        }
        removed
    }

    /// The table as of now: O(1), every host shared.
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot {
            table: self.table.clone(),
            hosts: self.hosts.clone(),
        }
    }
}

fn canonical_host(host: &str) -> Result<String> {
    // Wildcards are valid route hosts but not valid request hosts; check
    // the name after the `*.` label.
    let (wild, rest) = match host.strip_prefix("*.") {
        Some(rest) => ("*.", rest),
        None => ("", host),
    };
    match tuna_routing::normalize_host(rest) {
        Some(h) if !h.is_empty() && !host.contains('/') => Ok(format!("{wild}{h}")),
        _ => Err(Error::InvalidHost { host: host.into() }),
    }
}

fn specs_of(
    routes: &[HttpRoute],
    stats: &Arc<HostStats>,
    config: &ProxyConfig,
) -> Vec<RouteSpec<Arc<CompiledBackend>>> {
    routes
        .iter()
        .map(|r| RouteSpec {
            host: r.host.clone(),
            path: r.path.clone(),
            path_type: r.path_type,
            backend: Arc::new(CompiledBackend::new(&r.backend, stats.clone(), config)),
            origin: r.origin.clone(),
            tie_break: r.tie_break.clone(),
            matcher: r.matcher.clone(),
        })
        .collect()
}
