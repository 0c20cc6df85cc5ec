//! HTTP route registrations and the compiled, immutable snapshot that the
//! request path reads.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use pingora::upstreams::peer::HttpPeer;
use pingora::utils::tls::WrappedX509;
use tuna_routing::action::{Filter, Timeouts};
use tuna_routing::{BuildIssue, HostTable, ListenerSpecs, PortTable, RouteSpec, RouteTable};

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
    /// Round-robin targets. Must not be empty, unless `gateway` is set.
    pub addrs: Vec<SocketAddr>,
    /// Protocol spoken to the upstream.
    pub protocol: UpstreamProtocol,
    /// A Gateway API rule: when set, its weighted backends, filters and
    /// timeouts decide what a request does, and `addrs`/`protocol` are not
    /// used (see the crate docs, "Gateway API rules").
    pub gateway: Option<Arc<GatewayRule>>,
}

impl HttpBackend {
    /// Plain HTTP/1.1 to the given addresses (the common case).
    pub fn http1(addrs: impl IntoIterator<Item = SocketAddr>) -> Self {
        Self {
            addrs: addrs.into_iter().collect(),
            protocol: UpstreamProtocol::Http1,
            gateway: None,
        }
    }

    /// A Gateway API rule (`HTTPRoute`): every request chooses one of
    /// `rule.backends` by weight.
    pub fn gateway(rule: GatewayRule) -> Self {
        Self {
            addrs: Vec::new(),
            protocol: UpstreamProtocol::Http1,
            gateway: Some(Arc::new(rule)),
        }
    }
}

/// What a matched Gateway API rule does: where requests go, by weight, and
/// the rule's filters and timeouts, as `tuna_routing::action` describes them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GatewayRule {
    /// The rule's backends. A request picks one by smooth weighted
    /// round-robin; with none of positive weight, requests are answered 500.
    pub backends: Vec<WeightedTarget>,
    /// Applied in order.
    pub filters: Vec<Filter>,
    /// `request` bounds the exchange until the response head (504 after
    /// it), `backend_request` each attempt at a backend.
    pub timeouts: Timeouts,
}

/// One backend of a [`GatewayRule`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightedTarget {
    /// Round-robin addresses. Empty: the requests its weight draws are
    /// answered 500, as the Gateway API asks for a backend that does not
    /// resolve.
    pub addrs: Vec<SocketAddr>,
    /// Protocol spoken to it.
    pub protocol: UpstreamProtocol,
    /// Its share of the rule's requests; 0 never gets any.
    pub weight: u32,
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

/// Where the requests of a granted CONNECT go: resolved addresses, the name
/// the upstream's certificate is checked against, and the CAs to check it
/// with. Built by [`UpstreamTarget::new`] in [`crate::connect`], once per target (it parses the certificates) and share it.
pub struct UpstreamTarget {
    pub(crate) addrs: Vec<SocketAddr>,
    pub(crate) server_name: String,
    pub(crate) ca: Option<Arc<[WrappedX509]>>,
    /// Keeps pooled upstream connections of targets with other trust apart.
    pub(crate) group_key: u64,
}

impl std::fmt::Debug for UpstreamTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTarget")
            .field("addrs", &self.addrs)
            .field("server_name", &self.server_name)
            .field("ca_certs", &self.ca.as_ref().map(|c| c.len()))
            .finish()
    }
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
    /// A Gateway API rule's targets (its own `peers` are then empty).
    pub(crate) gateway: Option<CompiledGateway>,
}

/// A [`GatewayRule`] prepared for the request path.
#[derive(Debug)]
pub(crate) struct CompiledGateway {
    pub(crate) rule: Arc<GatewayRule>,
    /// One per backend of the rule; `None` for one without addresses.
    targets: Vec<Option<Arc<CompiledBackend>>>,
    /// The smooth weighted round-robin order of target indexes, one cycle:
    /// computed once, so a pick is one atomic increment, no lock.
    schedule: Box<[u32]>,
    next: AtomicUsize,
}

/// The longest [`CompiledGateway::schedule`]: weights whose sum (divided
/// by their greatest common divisor) exceeds it are scaled down to it,
/// which keeps every share within 1/1024 of the request count.
const MAX_SCHEDULE: u64 = 1024;

impl CompiledGateway {
    fn new(rule: &Arc<GatewayRule>, stats: &Arc<HostStats>, config: &ProxyConfig) -> Self {
        let targets = rule
            .backends
            .iter()
            .map(|t| {
                (!t.addrs.is_empty()).then(|| {
                    let backend = HttpBackend {
                        addrs: t.addrs.clone(),
                        protocol: t.protocol.clone(),
                        gateway: None,
                    };
                    Arc::new(CompiledBackend::new(&backend, stats.clone(), config))
                })
            })
            .collect();
        let weights: Vec<u32> = rule.backends.iter().map(|t| t.weight).collect();
        Self {
            rule: rule.clone(),
            targets,
            schedule: smooth_schedule(&weights),
            next: AtomicUsize::new(0),
        }
    }

    /// The target of the next request: `None` when the rule has no backend
    /// of positive weight, or the one drawn has no addresses (→ 500).
    pub(crate) fn pick(&self) -> Option<&Arc<CompiledBackend>> {
        if self.schedule.is_empty() {
            return None;
        }
        let i = self.next.fetch_add(1, Relaxed) % self.schedule.len();
        self.targets[self.schedule[i] as usize].as_ref()
    }
}

/// One cycle of smooth weighted round-robin (nginx's): each step adds every
/// weight to its running total and picks the largest, which then gives up
/// the sum. Weights 1:3 give `B B A B` — each target spread over the cycle
/// rather than in a block. Weight 0 never appears.
pub(crate) fn smooth_schedule(weights: &[u32]) -> Box<[u32]> {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    let divisor = weights.iter().fold(0u64, |g, &w| gcd(g, u64::from(w)));
    if divisor == 0 {
        return Box::new([]);
    }
    let mut reduced: Vec<u64> = weights.iter().map(|&w| u64::from(w) / divisor).collect();
    let sum: u64 = reduced.iter().sum();
    if sum > MAX_SCHEDULE {
        for w in reduced.iter_mut().filter(|w| **w > 0) {
            *w = (*w * MAX_SCHEDULE / sum).max(1);
        }
    }
    let total: u64 = reduced.iter().sum();
    let mut current = vec![0i64; reduced.len()];
    let mut schedule = Vec::with_capacity(total as usize);
    for _ in 0..total {
        let mut best = 0;
        for (i, w) in reduced.iter().enumerate() {
            current[i] += *w as i64;
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total as i64;
        schedule.push(best as u32);
    }
    schedule.into_boxed_slice()
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
        let gateway = backend
            .gateway
            .as_ref()
            .map(|rule| CompiledGateway::new(rule, &stats, config));
        Self {
            peers,
            addrs: backend.addrs.clone(),
            // The fast path applies no filters, weights or timeouts: a
            // Gateway rule is Pingora's.
            http1: backend.protocol == UpstreamProtocol::Http1 && gateway.is_none(),
            next: AtomicUsize::new(0),
            stats,
            gateway,
        }
    }

    /// The backend of an intercepted CONNECT: HTTPS (HTTP/1.1) to the
    /// target's addresses, verified against its CA (or the system roots)
    /// and its name; `idle` bounds the upstream's silence during a response
    /// (a watch), upgrades excepted.
    pub(crate) fn pinned(
        target: &UpstreamTarget,
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
            gateway: None,
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

/// The listeners of one HTTP port of a Gateway's own address, and the
/// requests it answered.
#[derive(Debug)]
pub(crate) struct Port {
    pub(crate) table: PortTable<Arc<CompiledBackend>>,
    pub(crate) stats: Arc<HostStats>,
    /// HTTPS listeners: the port's streams are TLS, terminated with the
    /// certificate SNI selects.
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
}

/// The ports of Gateway addresses with HTTP listeners, by `ip:port`: a
/// persistent map, so that a snapshot shares it (O(1)).
pub(crate) type PortMap = imbl::OrdMap<SocketAddr, Arc<Port>>;

/// One HTTP listener of a port of a Gateway's own address, as
/// [`crate::ProxyCore::set_port_routes`] takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerRoutes {
    /// The listener's hostname: exact, a `*.` wildcard spanning any number
    /// of labels, or `None` for every host.
    pub hostname: Option<String>,
    /// The routes of the HTTPRoutes attached to it, each matched through
    /// its `GatewayMatch::hostname` (its `host` is not read): see
    /// [`tuna_routing::PortTable`].
    pub routes: Vec<HttpRoute>,
    /// An HTTPS listener's certificate: the port then terminates TLS, and
    /// a listener without one gets no handshake. `None` on an HTTP port.
    pub certificate: Option<crate::ServerCertificate>,
}

/// What the request path reads: replaced whole, never mutated.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    pub(crate) table: Table,
    /// Per-host counters of the configured hosts, for `/metrics`.
    pub(crate) hosts: HostStatsMap,
    /// The HTTP ports of Gateway addresses.
    pub(crate) ports: PortMap,
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
    ports: PortMap,
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
            if r.backend.addrs.is_empty() && r.backend.gateway.is_none() {
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

    /// Sets the HTTP listeners of one port of a Gateway's address,
    /// compiling them once; an empty list removes the port. Returns the
    /// issues of its rules.
    pub(crate) fn set_port(
        &mut self,
        at: SocketAddr,
        listeners: Vec<ListenerRoutes>,
        config: &ProxyConfig,
    ) -> Result<Vec<BuildIssue>> {
        if listeners.is_empty() {
            self.ports.remove(&at);
            return Ok(Vec::new());
        }
        for l in &listeners {
            for r in &l.routes {
                if r.backend.addrs.is_empty() && r.backend.gateway.is_none() {
                    return Err(Error::NoAddresses {
                        what: format!("{at} {}{} ({})", r.host, r.path, r.origin),
                    });
                }
            }
        }
        let stats = self
            .ports
            .get(&at)
            .map(|p| p.stats.clone())
            .unwrap_or_default();
        let tls = crate::listener_tls::acceptor(
            listeners
                .iter()
                .filter_map(|l| Some((l.hostname.as_deref(), l.certificate.as_ref()?))),
        )?;
        let listeners = listeners
            .into_iter()
            .map(|l| ListenerSpecs {
                hostname: l.hostname,
                specs: specs_of(&l.routes, &stats, config),
            })
            .collect();
        let (table, issues) = PortTable::build(listeners);
        self.ports.insert(at, Arc::new(Port { table, stats, tls }));
        Ok(issues)
    }

    /// Removes a port of a Gateway's address; returns whether it had listeners.
    pub(crate) fn remove_port(&mut self, at: SocketAddr) -> bool {
        self.ports.remove(&at).is_some()
    }

    /// The table as of now: O(1), every host shared.
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot {
            table: self.table.clone(),
            hosts: self.hosts.clone(),
            ports: self.ports.clone(),
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

#[cfg(test)]
mod tests {
    use super::smooth_schedule;

    #[test]
    fn smooth_schedule_spreads_each_share_over_one_cycle() {
        let cases: &[(&[u32], &[u32])] = &[
            (&[1, 3], &[1, 0, 1, 1]),
            (&[2, 6], &[1, 0, 1, 1]),
            (&[1, 1, 1], &[0, 1, 2]),
            (&[5, 1, 1], &[0, 0, 1, 0, 2, 0, 0]),
            (&[0, 2], &[1]),
            (&[3, 0, 0], &[0]),
            (&[0, 0], &[]),
            (&[], &[]),
        ];
        for (weights, want) in cases {
            assert_eq!(&*smooth_schedule(weights), *want, "{weights:?}");
        }
    }

    #[test]
    fn large_weights_are_scaled_to_a_bounded_cycle() {
        let s = smooth_schedule(&[1_000_000, 999_999, 1]);
        assert!(s.len() as u64 <= super::MAX_SCHEDULE + 3, "{}", s.len());
        let count = |i| s.iter().filter(|&&t| t == i).count();
        assert!(count(2) >= 1, "a positive weight keeps a share");
        assert!(count(0).abs_diff(count(1)) <= 1);
    }
}
