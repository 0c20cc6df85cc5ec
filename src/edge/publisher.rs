//! The publisher — the agent's job: it owns the proxy core and the tunnels.
//!
//! Callers (standalone's runtime, the Tunnel and Ingress reconcilers) say what
//! one tunnel should serve with [`Publisher::publish`] and stop it with
//! [`Publisher::unpublish`]; both are synchronous and never wait for the
//! network. Each tunnel is a task of its own that mints the tunnel's token
//! with the tunnel's [`EdgeApi`] (the operator's key, or the key of a Tunnel's
//! `apiKeySecretRef`), attaches it to the agent's one connection to the edge
//! (tunnel protocol v2: many tunnels per connection, each with its own
//! token), installs the routes in the proxy core **only once the edge
//! accepted the binding**, swaps them live when they change (never a
//! reconnect), renews the token at a third of its lifetime (minting a new one
//! when renewal is refused, e.g. at the edge's lifetime cap), and on stop
//! removes the routes, detaches and revokes the token. Its progress is a
//! [`TunnelState`] on a watch channel, which reconcilers turn into conditions
//! and events. No lock is held across an `.await`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tuna_agent::{Agent, AgentConfig, AgentHandle};
use tuna_protocol::wire::{Binding, BoundTarget, TunnelToken};
use tuna_proxy::{
    GatewayRule, HttpBackend, HttpRoute, ProxyCore, TcpLimits, TcpTarget, TcpUpstream, TlsUpstream,
    UpstreamProtocol, WeightedTarget,
};
use tuna_routing::RouteSpec;

use crate::edge::api::{EdgeApi, ErrorClass, MintedToken, gone_is_ok};
use crate::plan::gateway::GatewayAction;
use crate::plan::service::{ResolvedUpstream, UpstreamScheme};

/// Default lifetime asked for each tunnel token; renewed at a third of it.
pub const TOKEN_TTL: Duration = Duration::from_secs(3600);

/// The shortest token lifetime a publisher asks for: renewal runs at a third
/// of it, and the edge counts lifetimes in whole seconds.
pub const MIN_TOKEN_TTL: Duration = Duration::from_secs(3);

/// How long a stopping tunnel waits for a token request already sent, so
/// that what the edge minted is revoked rather than left live.
const MINT_ON_STOP: Duration = Duration::from_secs(5);

/// What one tunnel serves: an HTTP host, the TCP endpoint of a tcp Tunnel,
/// or the address of a Gateway.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TunnelKey {
    /// An HTTP host (lower case).
    Host(String),
    /// A tcp Tunnel, `namespace/name`.
    Tcp(String),
    /// A Gateway with an address of its own, `namespace/name`.
    Address(String),
}

impl TunnelKey {
    /// The id the tunnel has on the agent's connection.
    pub fn id(&self) -> String {
        match self {
            Self::Host(h) => format!("host/{h}"),
            Self::Tcp(t) => format!("tcp/{t}"),
            Self::Address(g) => format!("address/{g}"),
        }
    }
}

impl fmt::Display for TunnelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Host(h) => write!(f, "host {h}"),
            Self::Tcp(t) => write!(f, "tcp Tunnel {t}"),
            Self::Address(g) => write!(f, "address of Gateway {g}"),
        }
    }
}

/// What a tunnel forwards to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Serving {
    /// HTTP: the host's routes (resolved upstreams; names are looked up here).
    Http {
        /// The host.
        host: String,
        /// Its routes.
        routes: Vec<RouteSpec<RouteBackend>>,
    },
    /// TCP: the endpoint as declared (alias or port text) and where bytes go.
    Tcp {
        /// Alias or port number, as the binding names it.
        endpoint: String,
        /// The upstream.
        upstream: ResolvedUpstream,
    },
    /// A held address (a Gateway's): each port's connections, raw, to its
    /// upstream.
    Address {
        /// The address the edge gave (`POST /v1/gateway-addresses`).
        address: IpAddr,
        /// TCP port → the TCPRoute rule its connections follow (its
        /// backends by weight).
        ports: BTreeMap<u16, Arc<GatewayAction>>,
        /// HTTP port → its listeners: the port's requests, any `Host`, are
        /// routed by these alone.
        http: BTreeMap<u16, Vec<AddressListener>>,
    },
}

/// One HTTP listener on a port of a Gateway's address, for the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressListener {
    /// Its hostname (`None`: every host).
    pub hostname: Option<String>,
    /// Its routes, matched through their `GatewayMatch::hostname`.
    pub routes: Vec<RouteSpec<RouteBackend>>,
    /// An HTTPS listener's certificate (`None`: HTTP).
    pub certificate: Option<tuna_proxy::ServerCertificate>,
}

impl Serving {
    /// A Gateway's address serving the ports of `plan`; its HTTPS
    /// listeners with `certificates` (by Secret namespace and name: a
    /// listener whose Secret is not there is left out).
    pub fn address(
        address: IpAddr,
        plan: &crate::plan::gateway_model::AddressPlan,
        certificates: &std::collections::BTreeMap<(String, String), tuna_proxy::ServerCertificate>,
    ) -> Self {
        let http = plan
            .http
            .iter()
            .map(|(port, listeners)| {
                let listeners = listeners
                    .iter()
                    .filter_map(|l| {
                        let certificate = match &l.certificate {
                            Some(secret) => Some(certificates.get(secret)?.clone()),
                            None => None,
                        };
                        Some((l, certificate))
                    })
                    .map(|(l, certificate)| AddressListener {
                        certificate,
                        hostname: l.hostname.clone(),
                        routes: l
                            .specs
                            .iter()
                            .filter_map(|s| {
                                let backend = RouteBackend::of(&s.backend)?;
                                Some(s.clone().map_backend(|_| backend))
                            })
                            .collect(),
                    })
                    .collect();
                (*port, listeners)
            })
            .collect();
        Self::Address {
            address,
            ports: plan.tcp.clone(),
            http,
        }
    }

    /// Whether it serves nothing (an address without a listener to serve).
    pub fn is_empty(&self) -> bool {
        match self {
            Self::Address { ports, http, .. } => ports.is_empty() && http.is_empty(),
            _ => false,
        }
    }
}

/// Where a published HTTP route sends requests: one resolved upstream (an
/// Ingress path, a Tunnel), or a Gateway API rule (weighted backends,
/// filters, timeouts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteBackend {
    /// One upstream.
    Upstream(ResolvedUpstream),
    /// An `HTTPRoute` rule.
    Gateway(Arc<GatewayAction>),
}

impl RouteBackend {
    /// What a planned route publishes: its Gateway rule, else its upstream;
    /// `None` for a backend the plan left unresolved.
    pub fn of(backend: &crate::plan::Backend) -> Option<Self> {
        match (&backend.gateway, &backend.upstream) {
            (Some(action), _) => Some(Self::Gateway(Arc::clone(action))),
            (None, Some(upstream)) => Some(Self::Upstream(upstream.clone())),
            (None, None) => None,
        }
    }
}

impl From<ResolvedUpstream> for RouteBackend {
    fn from(upstream: ResolvedUpstream) -> Self {
        Self::Upstream(upstream)
    }
}

impl fmt::Display for RouteBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Upstream(u) => write!(f, "{u}"),
            Self::Gateway(action) if action.backends.is_empty() => {
                f.write_str("no valid backend (500)")
            }
            Self::Gateway(action) => {
                for (i, b) in action.backends.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "Service {}/{}", b.namespace, b.service)?;
                    if let Some(port) = b.port {
                        write!(f, ":{port}")?;
                    }
                    write!(f, " (weight {})", b.weight)?;
                }
                Ok(())
            }
        }
    }
}

impl Serving {
    /// What the tunnel binds at the edge (its token names the same).
    fn bindings(&self) -> Vec<Binding> {
        match self {
            Self::Http { host, .. } => vec![Binding::http(host.clone())],
            Self::Tcp { endpoint, .. } => vec![Binding::tcp(endpoint.clone())],
            Self::Address {
                address,
                ports,
                http,
            } => ports
                .keys()
                .chain(http.keys())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .map(|port| Binding::address(*address, *port))
                .collect(),
        }
    }
}

/// Everything a tunnel needs.
#[derive(Clone)]
pub struct TunnelSpec {
    /// What it forwards to.
    pub serving: Serving,
    /// Owner labels of its token (finds orphans at the edge).
    pub labels: BTreeMap<String, String>,
    /// Who mints its token: the operator's key or the Tunnel's own.
    pub edge: Arc<dyn EdgeApi>,
    /// Identifies `edge` for change detection (e.g. `operator` or `secret ns/name#key@rv`).
    pub edge_identity: String,
    /// The token records something the next agent process needs (the
    /// subdomain reserved for it): [`Publisher::shutdown_keeping_tokens`]
    /// leaves such tokens at the edge and revokes the others.
    pub keep_on_shutdown: bool,
}

impl fmt::Debug for TunnelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TunnelSpec")
            .field("serving", &self.serving)
            .field("labels", &self.labels)
            .field("edge_identity", &self.edge_identity)
            .field("keep_on_shutdown", &self.keep_on_shutdown)
            .finish()
    }
}

/// Where a tunnel stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelState {
    /// Minting the token or waiting for the edge's answer.
    Pending {
        /// What is happening.
        step: &'static str,
    },
    /// The edge accepted the binding; traffic flows; routes are installed.
    Serving {
        /// The revision of the spec now installed (see [`Publisher::publish`]).
        revision: u64,
        /// The edge's session id (changes only on a reconnect).
        session_id: String,
        /// The public TCP port, for TCP tunnels.
        port: Option<u16>,
        /// Routes that could not be installed (unresolvable upstream names).
        warnings: Vec<String>,
    },
    /// The edge refused the binding or closed the tunnel (bad key, binding not
    /// allowed, revoked); `code` is the edge's error code.
    Refused {
        /// Machine-readable code, e.g. `binding_not_allowed`.
        code: String,
        /// The edge's message.
        message: String,
    },
    /// The edge API failed (token minting); retried by itself when `retrying`.
    Failed {
        /// What failed.
        message: String,
        /// Whether the task retries by itself (else it waits for a change).
        retrying: bool,
    },
    /// The connection to the edge is down; the agent reconnects by itself.
    Disconnected {
        /// Why.
        reason: String,
    },
    /// Unpublished: routes removed, token revoked.
    Stopped,
}

impl TunnelState {
    /// Every state's [`TunnelState::label`], for gauges that report zeros too.
    pub const LABELS: [&'static str; 6] = [
        "pending",
        "serving",
        "refused",
        "failed",
        "disconnected",
        "stopped",
    ];

    /// The state's name in metrics (`tuna_operator_tunnels{state}`).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Pending { .. } => "pending",
            Self::Serving { .. } => "serving",
            Self::Refused { .. } => "refused",
            Self::Failed { .. } => "failed",
            Self::Disconnected { .. } => "disconnected",
            Self::Stopped => "stopped",
        }
    }

    /// Settled at `revision` or later: serving that spec, or refused/failed.
    pub fn reached(&self, revision: u64) -> bool {
        match self {
            Self::Serving { revision: r, .. } => *r >= revision,
            other => other.is_settled(),
        }
    }

    /// A state a caller may stop waiting at: serving, refused, or failed without retry.
    pub fn is_settled(&self) -> bool {
        matches!(
            self,
            Self::Serving { .. }
                | Self::Refused { .. }
                | Self::Failed {
                    retrying: false,
                    ..
                }
                | Self::Stopped
        )
    }
}

/// The state of one tunnel on the agent's connection (the agent's own type).
pub use tuna_agent::TunnelStatus as TransportState;

struct Entry {
    desired: watch::Sender<(u64, TunnelSpec)>,
    state: watch::Receiver<TunnelState>,
    token: Arc<Mutex<Option<TunnelToken>>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Owns the proxy core and the tunnels (see the module docs).
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

struct Inner {
    proxy: ProxyCore,
    agent: AgentHandle,
    /// Every state change, by key: reconcilers turn them into status and events.
    changes: tokio::sync::broadcast::Sender<TunnelKey>,
    /// Set by [`Publisher::shutdown_keeping_tokens`]: stopping tunnels leave
    /// their tokens for the next agent process to find.
    keep_tokens: std::sync::atomic::AtomicBool,
    /// Set when [`Publisher::shutdown`] begins: nothing is published after it
    /// (a late reconcile would start a tunnel and mint a token no one revokes).
    closed: std::sync::atomic::AtomicBool,
    entries: Mutex<HashMap<TunnelKey, Entry>>,
    retry: RetryPolicy,
    /// Lifetime asked for each token (renewed at a third of it).
    token_ttl: Duration,
}

/// How a publisher talks to the edge API.
#[derive(Debug, Clone, Copy)]
pub struct PublisherOptions {
    /// Backoff of the tunnel tasks' edge API calls.
    pub retry: RetryPolicy,
    /// Lifetime asked for each tunnel token, renewed at a third of it (at
    /// least [`MIN_TOKEN_TTL`]).
    pub token_ttl: Duration,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            token_ttl: TOKEN_TTL,
        }
    }
}

/// Backoff of a tunnel task's edge API calls.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// First delay.
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// Full jitter over a capped exponential: uniform in [d/2, d].
    pub fn delay(&self, attempt: u32) -> Duration {
        use rand::Rng;
        let exp = self.initial.saturating_mul(1u32 << attempt.min(16));
        let capped = exp.min(self.max);
        let half = capped / 2;
        half + Duration::from_millis(rand::rng().random_range(0..=half.as_millis() as u64))
    }
}

impl Publisher {
    /// Starts the agent's connection to the edge (`config`: address, trust,
    /// name) with its streams going into `proxy`, and a publisher over both.
    pub fn start(proxy: ProxyCore, config: AgentConfig) -> Result<Self, tuna_agent::Error> {
        Self::start_with(proxy, config, PublisherOptions::default())
    }

    /// Same, with explicit options for the edge API calls.
    pub fn start_with(
        proxy: ProxyCore,
        config: AgentConfig,
        options: PublisherOptions,
    ) -> Result<Self, tuna_agent::Error> {
        let streams = proxy.clone();
        let agent = Agent::start(config, move |stream, meta| {
            crate::edge::transport::serve_stream(&streams, stream, meta)
        })?;
        Ok(Self {
            inner: Arc::new(Inner {
                proxy,
                agent,
                changes: tokio::sync::broadcast::channel(4096).0,
                keep_tokens: std::sync::atomic::AtomicBool::new(false),
                closed: std::sync::atomic::AtomicBool::new(false),
                entries: Mutex::new(HashMap::new()),
                retry: options.retry,
                token_ttl: options.token_ttl.max(MIN_TOKEN_TTL),
            }),
        })
    }

    /// The agent's connection to the edge.
    pub fn agent(&self) -> &AgentHandle {
        &self.inner.agent
    }

    /// The keys of tunnels whose state changed, as they change. A lagged
    /// receiver should treat every tunnel as changed.
    pub fn changes(&self) -> tokio::sync::broadcast::Receiver<TunnelKey> {
        self.inner.changes.subscribe()
    }

    /// The proxy core.
    pub fn proxy(&self) -> &ProxyCore {
        &self.inner.proxy
    }

    /// Publishes (or updates) one tunnel and returns a watch of its state and
    /// the revision of this spec: the state says `Serving { revision }` once
    /// it is installed ([`TunnelState::reached`]). Route or upstream changes are
    /// swapped live; a changed binding or key re-mints the token on the same
    /// connection.
    pub fn publish(&self, key: TunnelKey, spec: TunnelSpec) -> (watch::Receiver<TunnelState>, u64) {
        let mut entries = self.inner.entries.lock().expect("publisher lock");
        // Checked under the entries' lock, which shutdown takes to list the
        // tunnels it stops: a publish either comes before (and is stopped) or
        // after (and starts nothing).
        if self.inner.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return (watch::channel(TunnelState::Stopped).1, 0);
        }
        if let Some(entry) = entries.get(&key)
            && !entry.task.is_finished()
        {
            entry.desired.send_if_modified(|(revision, current)| {
                let changed = current.serving != spec.serving
                    || current.labels != spec.labels
                    || current.edge_identity != spec.edge_identity;
                if changed {
                    *revision += 1;
                    *current = spec.clone();
                }
                changed
            });
            let revision = entry.desired.borrow().0;
            return (entry.state.clone(), revision);
        }
        let (desired_tx, desired_rx) = watch::channel((1, spec));
        let (state_tx, state_rx) = watch::channel(TunnelState::Pending {
            step: "minting a token",
        });
        let stop = CancellationToken::new();
        let token = Arc::new(Mutex::new(None));
        let task = tokio::spawn(run_tunnel(
            Arc::clone(&self.inner),
            key.clone(),
            desired_rx,
            state_tx,
            stop.clone(),
            Arc::clone(&token),
        ));
        entries.insert(
            key,
            Entry {
                desired: desired_tx,
                state: state_rx.clone(),
                token,
                stop,
                task,
            },
        );
        (state_rx, 1)
    }

    /// Stops one tunnel: routes removed, detached, token revoked. Returns a
    /// future that resolves once that is done (callers may drop it).
    pub fn unpublish(&self, key: &TunnelKey) -> impl Future<Output = ()> + Send + 'static {
        let entry = self
            .inner
            .entries
            .lock()
            .expect("publisher lock")
            .remove(key);
        async move {
            if let Some(entry) = entry {
                entry.stop.cancel();
                let _ = entry.task.await;
            }
        }
    }

    /// The state of a tunnel, if published.
    pub fn state(&self, key: &TunnelKey) -> Option<watch::Receiver<TunnelState>> {
        self.inner
            .entries
            .lock()
            .expect("publisher lock")
            .get(key)
            .map(|e| e.state.clone())
    }

    /// How many published tunnels are in each state (every state named, zeros
    /// included), for `tuna_operator_tunnels`.
    pub fn count_by_state(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut counts: std::collections::BTreeMap<&'static str, usize> =
            TunnelState::LABELS.iter().map(|l| (*l, 0)).collect();
        for key in self.keys() {
            if let Some(state) = self.state(&key) {
                *counts.entry(state.borrow().label()).or_default() += 1;
            }
        }
        counts
    }

    /// Every published tunnel.
    pub fn keys(&self) -> Vec<TunnelKey> {
        let mut keys: Vec<TunnelKey> = self
            .inner
            .entries
            .lock()
            .expect("publisher lock")
            .keys()
            .cloned()
            .collect();
        keys.sort();
        keys
    }

    /// The current token of a tunnel (diagnostics and tests; never logged).
    pub fn token(&self, key: &TunnelKey) -> Option<TunnelToken> {
        let slot = Arc::clone(
            &self
                .inner
                .entries
                .lock()
                .expect("publisher lock")
                .get(key)?
                .token,
        );
        slot.lock().expect("token lock").clone()
    }

    /// Waits until every published tunnel is settled (see
    /// [`TunnelState::is_settled`]) or `limit` passed.
    pub async fn settled(&self, limit: Duration) {
        let states: Vec<watch::Receiver<TunnelState>> = self
            .inner
            .entries
            .lock()
            .expect("publisher lock")
            .values()
            .map(|e| e.state.clone())
            .collect();
        let all = async {
            for mut s in states {
                let _ = s.wait_for(TunnelState::is_settled).await;
            }
        };
        let _ = tokio::time::timeout(limit, all).await;
    }

    /// Stops every tunnel (revoking tokens), then drains the proxy.
    pub async fn shutdown(&self) {
        {
            let _entries = self.inner.entries.lock().unwrap_or_else(|p| p.into_inner());
            self.inner
                .closed
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let keys = self.keys();
        let stops: Vec<_> = keys.iter().map(|k| self.unpublish(k)).collect();
        futures::future::join_all(stops).await;
        self.inner.proxy.shutdown().await;
    }

    /// Ends every tunnel task at once, revoking nothing — what a crash does to
    /// them. For a handle dropped without its shutdown: its tasks must not
    /// outlive it (they would renew or re-mint tokens a later process revokes).
    pub fn abandon(&self) {
        let entries = self.inner.entries.lock().unwrap_or_else(|p| p.into_inner());
        for entry in entries.values() {
            entry.task.abort();
        }
    }

    /// Stops every tunnel, leaving at the edge the tokens whose spec says
    /// `keep_on_shutdown` (and revoking the others), then drains the proxy: the
    /// agent's way to stop for an upgrade. The next agent process learns from
    /// the kept tokens' labels what its predecessor reserved, then revokes
    /// them (start-up sweep); unrenewed, they expire within their TTL anyway.
    pub async fn shutdown_keeping_tokens(&self) {
        self.inner
            .keep_tokens
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.shutdown().await;
    }
}

/// Resolves an upstream to socket addresses: headless endpoints, an IP
/// literal (a cluster IP), or a name (standalone).
async fn addresses(upstream: &ResolvedUpstream) -> Result<Vec<SocketAddr>, String> {
    if !upstream.endpoints.is_empty() {
        return Ok(upstream
            .endpoints
            .iter()
            .map(|ip| SocketAddr::new(*ip, upstream.port))
            .collect());
    }
    if let Ok(ip) = upstream.host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, upstream.port)]);
    }
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((upstream.host.as_str(), upstream.port))
        .await
        .map_err(|e| format!("cannot resolve {}: {e}", upstream.authority()))?
        .collect();
    if addrs.is_empty() {
        return Err(format!("{} resolves to no address", upstream.authority()));
    }
    Ok(addrs)
}

fn protocol_of(upstream: &ResolvedUpstream) -> UpstreamProtocol {
    match upstream.scheme {
        UpstreamScheme::Https => UpstreamProtocol::Tls(TlsUpstream {
            sni: upstream.host.clone(),
            // A Service stands for workloads that often use self-signed
            // certificates; a literal external host is verified.
            verify: upstream.service.is_none() && upstream.host.parse::<IpAddr>().is_err(),
            h2: false,
        }),
        _ if upstream.is_h2c() => UpstreamProtocol::H2c,
        _ => UpstreamProtocol::Http1,
    }
}

/// A Gateway rule for the proxy: each weighted backend resolved to its
/// addresses. One that does not resolve keeps its weight with no address,
/// so that its share of requests is answered 500 (as the Gateway API asks
/// for a backend that cannot be reached) rather than moved to the others;
/// why is returned as a warning.
async fn gateway_rule(action: &GatewayAction) -> (GatewayRule, Vec<String>) {
    let mut warnings = Vec::new();
    let mut backends = Vec::with_capacity(action.backends.len());
    for b in &action.backends {
        let (addrs, protocol) = match &b.upstream {
            Some(upstream) => match addresses(upstream).await {
                Ok(addrs) => (addrs, protocol_of(upstream)),
                Err(message) => {
                    warnings.push(format!(
                        "backend Service {}/{}: {message}",
                        b.namespace, b.service
                    ));
                    (Vec::new(), protocol_of(upstream))
                }
            },
            None => (Vec::new(), UpstreamProtocol::Http1),
        };
        backends.push(WeightedTarget {
            addrs,
            protocol,
            weight: b.weight,
        });
    }
    // The share of a backendRef that does not resolve answers 500 (the
    // specification): a target without addresses.
    for b in action.invalid.iter().filter(|b| b.weight > 0) {
        backends.push(WeightedTarget {
            addrs: Vec::new(),
            protocol: UpstreamProtocol::Http1,
            weight: b.weight,
        });
    }
    let rule = GatewayRule {
        backends,
        filters: action.filters.clone(),
        timeouts: action.timeouts,
    };
    (rule, warnings)
}

/// A route for the proxy, with warnings about what of it could not be
/// resolved; `Err` when nothing of it could.
async fn http_route(spec: &RouteSpec<RouteBackend>) -> Result<(HttpRoute, Vec<String>), String> {
    let (backend, warnings) = match &spec.backend {
        RouteBackend::Upstream(upstream) => {
            let backend = HttpBackend {
                addrs: addresses(upstream).await?,
                protocol: protocol_of(upstream),
                gateway: None,
            };
            (backend, Vec::new())
        }
        RouteBackend::Gateway(action) => {
            let (rule, warnings) = gateway_rule(action).await;
            (HttpBackend::gateway(rule), warnings)
        }
    };
    let route = HttpRoute {
        host: spec.host.clone(),
        path: spec.path.clone(),
        path_type: spec.path_type,
        backend,
        origin: spec.origin.clone(),
        tie_break: spec.tie_break.clone(),
        matcher: spec.matcher.clone(),
    };
    Ok((route, warnings))
}

/// Installs what `serving` forwards to; returns warnings (routes left out).
async fn install(proxy: &ProxyCore, serving: &Serving) -> Result<Vec<String>, String> {
    match serving {
        Serving::Http { host, routes } => {
            let mut warnings = Vec::new();
            let mut proxy_routes = Vec::with_capacity(routes.len());
            for spec in routes {
                let (route, messages) = match http_route(spec).await {
                    Ok((r, messages)) => (Some(r), messages),
                    Err(message) => (None, vec![message]),
                };
                proxy_routes.extend(route);
                warnings.extend(messages.into_iter().map(|message| {
                    format!(
                        "route {host}{} of {}/{}: {message}",
                        spec.path, spec.origin.namespace, spec.origin.name
                    )
                }));
            }
            if proxy_routes.is_empty() {
                let _ = proxy.remove_host(host);
                return Err(warnings.join("; "));
            }
            let issues = proxy
                .set_host_routes(host, proxy_routes)
                .map_err(|e| e.to_string())?;
            warnings.extend(issues.iter().map(|i| i.to_string()));
            Ok(warnings)
        }
        Serving::Tcp { endpoint, upstream } => {
            let addrs = addresses(upstream).await?;
            proxy
                .set_tcp_service(endpoint, TcpUpstream::new(addrs), TcpLimits::default())
                .map_err(|e| e.to_string())?;
            Ok(Vec::new())
        }
        Serving::Address {
            address,
            ports,
            http,
        } => {
            let mut warnings = Vec::new();
            for (port, listeners) in http {
                let at = SocketAddr::new(*address, *port);
                let mut proxy_listeners = Vec::with_capacity(listeners.len());
                for l in listeners {
                    let mut routes = Vec::with_capacity(l.routes.len());
                    for spec in &l.routes {
                        match http_route(spec).await {
                            Ok((route, messages)) => {
                                routes.push(route);
                                warnings.extend(messages.into_iter().map(|m| {
                                    format!(
                                        "port {port} route {}{} of {}/{}: {m}",
                                        spec.host,
                                        spec.path,
                                        spec.origin.namespace,
                                        spec.origin.name
                                    )
                                }));
                            }
                            Err(m) => warnings.push(format!(
                                "port {port} route {}{} of {}/{}: {m}",
                                spec.host, spec.path, spec.origin.namespace, spec.origin.name
                            )),
                        }
                    }
                    proxy_listeners.push(tuna_proxy::ListenerRoutes {
                        hostname: l.hostname.clone(),
                        routes,
                        certificate: l.certificate.clone(),
                    });
                }
                let issues = proxy
                    .set_port_routes(at, proxy_listeners)
                    .map_err(|e| e.to_string())?;
                warnings.extend(issues.iter().map(|i| format!("port {port}: {i}")));
            }
            let mut failed = 0;
            for (port, action) in ports {
                let at = SocketAddr::new(*address, *port);
                let service = crate::edge::transport::address_service(at);
                // The rule's backends by weight, resolved as an HTTP
                // rule's are: one that does not resolve keeps its share.
                let (rule, messages) = gateway_rule(action).await;
                warnings.extend(messages.into_iter().map(|m| format!("port {port}: {m}")));
                let upstream = TcpUpstream {
                    addrs: Vec::new(),
                    weighted: rule
                        .backends
                        .into_iter()
                        .map(|t| TcpTarget {
                            addrs: t.addrs,
                            weight: t.weight,
                        })
                        .collect(),
                };
                if let Err(e) = proxy.set_tcp_service(&service, upstream, TcpLimits::default()) {
                    proxy.remove_tcp_service(&service);
                    warnings.push(format!("port {port}: {e}"));
                    failed += 1;
                }
            }
            if http.is_empty() && failed == ports.len() && !ports.is_empty() {
                return Err(warnings.join("; "));
            }
            Ok(warnings)
        }
    }
}

fn uninstall(proxy: &ProxyCore, serving: &Serving) {
    match serving {
        Serving::Http { host, .. } => {
            let _ = proxy.remove_host(host);
        }
        Serving::Tcp { endpoint, .. } => {
            proxy.remove_tcp_service(endpoint);
        }
        Serving::Address {
            address,
            ports,
            http,
        } => {
            for port in ports.keys() {
                let at = SocketAddr::new(*address, *port);
                proxy.remove_tcp_service(&crate::edge::transport::address_service(at));
            }
            for port in http.keys() {
                proxy.remove_port_routes(SocketAddr::new(*address, *port));
            }
        }
    }
}

fn public_port(state: &TransportState) -> Option<u16> {
    match state {
        TransportState::Serving { bound, .. } => bound.iter().find_map(|o| match &o.bound {
            Some(BoundTarget::Tcp { port }) => Some(*port),
            _ => None,
        }),
        _ => None,
    }
}

/// Why a tunnel task's inner loop ended.
enum Restart {
    /// Stop for good.
    Stop,
    /// The spec changed its binding or key: mint anew.
    Respec,
    /// Mint a new token (the edge closed the tunnel: expired, revoked …).
    Remint,
}

async fn run_tunnel(
    inner: Arc<Inner>,
    key: TunnelKey,
    mut desired: watch::Receiver<(u64, TunnelSpec)>,
    state: watch::Sender<TunnelState>,
    stop: CancellationToken,
    token_slot: Arc<Mutex<Option<TunnelToken>>>,
) {
    let id = key.id();
    let mut attempt: u32 = 0;
    let mut held: Option<(Arc<dyn EdgeApi>, MintedToken)> = None;
    let mut installed: Option<Serving> = None;
    loop {
        let (revision, spec) = desired.borrow_and_update().clone();
        // Mint a token for exactly this tunnel's bindings.
        let bindings = spec.serving.bindings();
        report(
            &inner,
            &key,
            &state,
            TunnelState::Pending {
                step: "minting a token",
            },
        );
        let mint = spec
            .edge
            .create_token(&spec.labels, &bindings, inner.token_ttl);
        tokio::pin!(mint);
        let minted = tokio::select! {
            m = &mut mint => m,
            _ = stop.cancelled() => {
                // The request may have reached the edge already: dropping it
                // would leave a live token nobody revokes. Let it finish
                // (bounded) and hand what it made to the end of the task.
                if let Ok(Ok(late)) = tokio::time::timeout(MINT_ON_STOP, mint).await
                    && let Some((edge, old)) = held.replace((Arc::clone(&spec.edge), late))
                {
                    revoke(&key, edge.as_ref(), &old.id).await;
                }
                break;
            }
        };
        let minted = match minted {
            Ok(m) => m,
            Err(e) => {
                let retrying = e.class() != ErrorClass::NeedsChange;
                tracing::warn!(tunnel = %key, error = %e, retrying, "could not mint a tunnel token");
                report(
                    &inner,
                    &key,
                    &state,
                    TunnelState::Failed {
                        message: e.to_string(),
                        retrying,
                    },
                );
                let wait = match e.class() {
                    ErrorClass::RateLimited(after) => Some(after),
                    ErrorClass::NeedsChange => None,
                    _ => Some(inner.retry.delay(attempt)),
                };
                attempt = attempt.saturating_add(1);
                if wait_or_change(&stop, &mut desired, wait).await {
                    break;
                }
                continue;
            }
        };
        attempt = 0;
        // A previous token (re-minting after a refusal or a spec change) goes.
        if let Some((edge, old)) = held.take() {
            revoke(&key, edge.as_ref(), &old.id).await;
        }
        *token_slot.lock().expect("token lock") = Some(minted.token.clone());
        let attached = match inner
            .agent
            .attach(id.clone(), minted.token.clone(), bindings.clone())
            .await
        {
            Ok(()) => inner
                .agent
                .tunnel_status(&id)
                .ok_or_else(|| "the agent forgot the tunnel".to_owned()),
            Err(e) => Err(e.to_string()),
        };
        held = Some((Arc::clone(&spec.edge), minted));
        let mut transport = match attached {
            Ok(rx) => rx,
            Err(message) => {
                report(
                    &inner,
                    &key,
                    &state,
                    TunnelState::Failed {
                        message,
                        retrying: true,
                    },
                );
                if wait_or_change(&stop, &mut desired, Some(inner.retry.delay(attempt))).await {
                    break;
                }
                attempt = attempt.saturating_add(1);
                continue;
            }
        };
        let restart = serve(
            &inner,
            &key,
            revision,
            &spec,
            &mut desired,
            &state,
            &stop,
            &mut transport,
            &mut installed,
            &mut held,
        )
        .await;
        match restart {
            Restart::Stop => break,
            Restart::Respec => {}
            Restart::Remint => {
                if wait_or_change(&stop, &mut desired, Some(inner.retry.delay(attempt))).await {
                    break;
                }
                attempt = attempt.saturating_add(1);
            }
        }
    }
    if let Some(serving) = installed.take() {
        uninstall(&inner.proxy, &serving);
    }
    let _ = inner.agent.detach(&id).await;
    let keep = inner.keep_tokens.load(std::sync::atomic::Ordering::SeqCst)
        && desired.borrow().1.keep_on_shutdown;
    if let Some((edge, token)) = held.take()
        && !keep
    {
        revoke(&key, edge.as_ref(), &token.id).await;
    }
    *token_slot.lock().expect("token lock") = None;
    report(&inner, &key, &state, TunnelState::Stopped);
}

/// Publishes a tunnel's new state and announces the change.
fn report(inner: &Inner, key: &TunnelKey, state: &watch::Sender<TunnelState>, value: TunnelState) {
    let changed = state.send_if_modified(|current| {
        if *current == value {
            false
        } else {
            *current = value;
            true
        }
    });
    if changed {
        // No receiver is fine: nobody is reporting status (standalone).
        let _ = inner.changes.send(key.clone());
    }
}

async fn revoke(key: &TunnelKey, edge: &dyn EdgeApi, id: &str) {
    if let Err(e) = gone_is_ok(edge.revoke_token(id).await) {
        // The token expires by itself within its TTL; the orphan sweep at the
        // next start revokes it too.
        tracing::warn!(tunnel = %key, error = %e, "could not revoke a tunnel token");
    }
}

/// Waits `wait` (or forever with `None`) unless the spec changes; true when stopped.
async fn wait_or_change(
    stop: &CancellationToken,
    desired: &mut watch::Receiver<(u64, TunnelSpec)>,
    wait: Option<Duration>,
) -> bool {
    let sleep = async {
        match wait {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = stop.cancelled() => true,
        _ = sleep => false,
        changed = desired.changed() => changed.is_err(),
    }
}

/// Serves with an attached token until something needs a new token or a stop.
#[allow(clippy::too_many_arguments)]
async fn serve(
    inner: &Arc<Inner>,
    key: &TunnelKey,
    mut revision: u64,
    spec: &TunnelSpec,
    desired: &mut watch::Receiver<(u64, TunnelSpec)>,
    state: &watch::Sender<TunnelState>,
    stop: &CancellationToken,
    transport: &mut watch::Receiver<TransportState>,
    installed: &mut Option<Serving>,
    held: &mut Option<(Arc<dyn EdgeApi>, MintedToken)>,
) -> Restart {
    let mut current = spec.clone();
    let renew_every = inner.token_ttl / 3;
    let mut renew =
        tokio::time::interval_at(tokio::time::Instant::now() + renew_every, renew_every);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let now = transport.borrow_and_update().clone();
        match &now {
            TransportState::Serving { session_id, .. } => {
                let warnings = match install(&inner.proxy, &current.serving).await {
                    Ok(w) => w,
                    Err(message) => vec![message],
                };
                *installed = Some(current.serving.clone());
                report(
                    inner,
                    key,
                    state,
                    TunnelState::Serving {
                        revision,
                        session_id: session_id.clone(),
                        port: public_port(&now),
                        warnings,
                    },
                );
            }
            TransportState::Pending => {
                report(
                    inner,
                    key,
                    state,
                    TunnelState::Pending {
                        step: "waiting for the edge",
                    },
                );
            }
            TransportState::Disconnected { reason } => {
                // Routes stay: streams only arrive through the edge, which
                // routes again once the agent is back.
                report(
                    inner,
                    key,
                    state,
                    TunnelState::Disconnected {
                        reason: reason.clone(),
                    },
                );
            }
            TransportState::Refused(r) | TransportState::Closed(r) => {
                if let Some(serving) = installed.take() {
                    uninstall(&inner.proxy, &serving);
                }
                tracing::warn!(tunnel = %key, code = %r.code, message = %r.message, "the edge refused the tunnel");
                report(
                    inner,
                    key,
                    state,
                    TunnelState::Refused {
                        code: r.code.to_string(),
                        message: r.message.clone(),
                    },
                );
                // A revoked or expired token is replaced; a refused binding
                // waits for a change (or a retry with backoff: a Domain may be
                // verified, a TCPEndpoint reserved in the meantime).
                return Restart::Remint;
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return Restart::Stop,
            changed = transport.changed() => {
                if changed.is_err() {
                    return Restart::Remint;
                }
            }
            changed = desired.changed() => {
                if changed.is_err() {
                    return Restart::Stop;
                }
                let (next_revision, next) = desired.borrow_and_update().clone();
                let rebind = next.serving.bindings() != current.serving.bindings()
                    || next.edge_identity != current.edge_identity
                    || next.labels != current.labels;
                if rebind {
                    if let Some(serving) = installed.take() {
                        uninstall(&inner.proxy, &serving);
                    }
                    return Restart::Respec;
                }
                current = next;
                revision = next_revision;
                // Same binding: routes swap on the next pass, no reconnect.
                transport.mark_changed();
            }
            _ = renew.tick() => {
                let Some((edge, token)) = held.as_mut() else { continue };
                match edge.renew_token(&token.id, inner.token_ttl).await {
                    Ok(expires_at) => token.expires_at = expires_at,
                    Err(e) => match e.class() {
                        ErrorClass::Retryable | ErrorClass::RateLimited(_) => {
                            tracing::warn!(tunnel = %key, error = %e, "token renewal failed; retrying at the next tick");
                        }
                        _ => {
                            // Expired, revoked or at the lifetime cap: a new
                            // token replaces it without detaching.
                            match remint_in_place(inner, key, &current, held).await {
                                Ok(()) => {}
                                Err(e) => tracing::warn!(tunnel = %key, error = %e, "could not replace the tunnel token"),
                            }
                        }
                    },
                }
            }
        }
    }
}

async fn remint_in_place(
    inner: &Arc<Inner>,
    key: &TunnelKey,
    spec: &TunnelSpec,
    held: &mut Option<(Arc<dyn EdgeApi>, MintedToken)>,
) -> crate::Result<()> {
    let minted = spec
        .edge
        .create_token(&spec.labels, &spec.serving.bindings(), inner.token_ttl)
        .await?;
    if let Err(e) = inner.agent.set_token(&key.id(), minted.token.clone()).await {
        tracing::warn!(tunnel = %key, error = %e, "could not hand the new token to the agent");
    }
    if let Some((edge, old)) = held.replace((Arc::clone(&spec.edge), minted)) {
        revoke(key, edge.as_ref(), &old.id).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::future::BoxFuture;
    use tuna_agent::Trust;
    use tuna_proxy::ProxyConfig;

    fn service_upstream(ip: &str, port: u16, endpoints: &[&str]) -> ResolvedUpstream {
        ResolvedUpstream {
            scheme: UpstreamScheme::Http,
            host: ip.into(),
            port,
            app_protocol: None,
            service: Some("shop/web".into()),
            endpoints: endpoints.iter().map(|e| e.parse().unwrap()).collect(),
        }
    }

    fn weighted(
        service: &str,
        weight: u32,
        upstream: Option<ResolvedUpstream>,
    ) -> crate::plan::gateway::WeightedBackend {
        crate::plan::gateway::WeightedBackend {
            namespace: "shop".into(),
            service: service.into(),
            port: Some(80),
            weight,
            upstream,
        }
    }

    fn spec(backend: RouteBackend) -> RouteSpec<RouteBackend> {
        RouteSpec {
            host: "shop.example".into(),
            path: "/".into(),
            path_type: tuna_routing::PathType::Prefix,
            backend,
            origin: tuna_routing::Origin::default(),
            tie_break: tuna_routing::TieBreak::default(),
            matcher: tuna_routing::Matcher::Ingress,
        }
    }

    /// A Gateway rule reaches the proxy with each weighted backend resolved
    /// as an Ingress backend would be (cluster IP, or headless endpoints),
    /// its filters and timeouts unchanged; a backend without an upstream
    /// keeps its weight with no address (its share is answered 500).
    #[tokio::test]
    async fn a_gateway_rule_resolves_each_weighted_backend() {
        let filters = vec![tuna_routing::action::Filter::RequestHeaderModifier(
            tuna_routing::action::HeaderModifier {
                set: vec![("x-a".into(), "1".into())],
                ..Default::default()
            },
        )];
        let timeouts = tuna_routing::action::Timeouts {
            request: Some(Duration::from_secs(3)),
            backend_request: None,
        };
        let action = GatewayAction {
            backends: vec![
                weighted("web", 1, Some(service_upstream("10.0.0.1", 80, &[]))),
                weighted(
                    "api",
                    3,
                    Some(service_upstream("api", 8080, &["10.1.0.1", "10.1.0.2"])),
                ),
                weighted("unchecked", 2, None),
            ],
            // A refused backendRef keeps its share, answered with 500.
            invalid: vec![crate::plan::gateway::InvalidBackend {
                namespace: "other".into(),
                name: "secret".into(),
                kind: "Service".into(),
                port: Some(80),
                weight: 4,
                reason: "RefNotPermitted".into(),
                message: "no ReferenceGrant".into(),
            }],
            filters: filters.clone(),
            timeouts,
        };
        let (route, warnings) = http_route(&spec(RouteBackend::Gateway(Arc::new(action))))
            .await
            .unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert!(route.backend.addrs.is_empty());
        let rule = route.backend.gateway.expect("a Gateway rule");
        let addrs =
            |s: &[&str]| -> Vec<SocketAddr> { s.iter().map(|a| a.parse().unwrap()).collect() };
        assert_eq!(
            rule.backends,
            vec![
                WeightedTarget {
                    addrs: addrs(&["10.0.0.1:80"]),
                    protocol: UpstreamProtocol::Http1,
                    weight: 1,
                },
                WeightedTarget {
                    addrs: addrs(&["10.1.0.1:8080", "10.1.0.2:8080"]),
                    protocol: UpstreamProtocol::Http1,
                    weight: 3,
                },
                WeightedTarget {
                    addrs: Vec::new(),
                    protocol: UpstreamProtocol::Http1,
                    weight: 2,
                },
                WeightedTarget {
                    addrs: Vec::new(),
                    protocol: UpstreamProtocol::Http1,
                    weight: 4,
                },
            ]
        );
        assert_eq!(rule.filters, filters);
        assert_eq!(rule.timeouts, timeouts);
    }

    /// A plan backend publishes its Gateway rule when it has one, else its
    /// upstream; neither: nothing.
    #[test]
    fn route_backend_of_a_planned_backend() {
        let upstream = service_upstream("10.0.0.1", 80, &[]);
        let plain = crate::plan::Backend {
            service: None,
            url: None,
            upstream: Some(upstream.clone()),
            gateway: None,
        };
        assert_eq!(
            RouteBackend::of(&plain),
            Some(RouteBackend::Upstream(upstream))
        );
        let action = Arc::new(GatewayAction::default());
        let gateway = crate::plan::Backend {
            upstream: None,
            gateway: Some(Arc::clone(&action)),
            ..plain.clone()
        };
        assert_eq!(
            RouteBackend::of(&gateway),
            Some(RouteBackend::Gateway(action))
        );
        let unresolved = crate::plan::Backend {
            upstream: None,
            ..plain
        };
        assert_eq!(RouteBackend::of(&unresolved), None);
    }

    /// A reconcile that publishes while the agent stops (its cleanup of a
    /// deleted Ingress, say) starts no tunnel: the token it would mint after
    /// the shutdown's sweep was left live at the edge (the chart suite, tests/e2e/chart.rs, saw one).
    #[tokio::test]
    async fn nothing_is_published_once_shutdown_began() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let edge: Arc<dyn EdgeApi> = Arc::new(
            crate::standalone::edge::Embedded::open(
                tuna_edge::MemoryAuthority::new(),
                "localhost",
                20000..=20001,
                dir.path(),
            )
            .unwrap(),
        );
        // An edge nobody listens on: the agent only dials, in the background.
        let publisher = Publisher::start(
            ProxyCore::new(ProxyConfig::default()),
            AgentConfig::new("127.0.0.1:9", Trust::SystemRoots),
        )
        .unwrap();
        publisher.shutdown().await;
        let (state, _) = publisher.publish(
            TunnelKey::Host("late.localhost".into()),
            TunnelSpec {
                serving: Serving::Http {
                    host: "late.localhost".into(),
                    routes: Vec::new(),
                },
                labels: BTreeMap::new(),
                edge,
                edge_identity: "operator".into(),
                keep_on_shutdown: false,
            },
        );
        assert_eq!(*state.borrow(), TunnelState::Stopped);
        assert!(
            publisher.keys().is_empty(),
            "a tunnel started after shutdown"
        );
    }

    /// A Gateway's address through a real edge (in process, real sockets):
    /// each TCP port's connections reach that port's upstream, raw, an HTTP
    /// port routes any `Host` by its listener, and the listeners close when
    /// the tunnel is unpublished.
    #[tokio::test]
    async fn an_address_serves_each_port_on_its_own_upstream() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let identity =
            tuna_edge::tls::self_signed_identity(dir.path(), &["localhost".to_owned()]).unwrap();
        let agent_tls = tuna_edge::tls::server_config(&identity, &[]).unwrap();
        let authority = tuna_edge::MemoryAuthority::new();
        let edge_server = tuna_edge::EdgeServer::start(
            tuna_edge::EdgeConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), agent_tls),
            Arc::new(authority.clone()),
            None,
        )
        .await
        .unwrap();
        let edge: Arc<dyn EdgeApi> = Arc::new(
            crate::standalone::edge::Embedded::open(
                authority,
                "localhost",
                20000..=20001,
                dir.path(),
            )
            .unwrap(),
        );
        // Two backends that name themselves, then echo.
        let mut upstreams = BTreeMap::new();
        let address: IpAddr = "127.0.100.20".parse().unwrap();
        let mut public = Vec::new();
        for name in ["one", "two"] {
            let backend = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let at = backend.local_addr().unwrap();
            tokio::spawn(async move {
                while let Ok((mut tcp, _)) = backend.accept().await {
                    tokio::spawn(async move {
                        let _ = tcp.write_all(format!("{name}\n").as_bytes()).await;
                        let (mut r, mut w) = tcp.split();
                        let _ = tokio::io::copy(&mut r, &mut w).await;
                    });
                }
            });
            let port = std::net::TcpListener::bind((address, 0))
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            public.push((port, name));
            let backend = crate::plan::gateway::WeightedBackend {
                namespace: "shop".into(),
                service: name.into(),
                port: None,
                weight: 1,
                upstream: Some(ResolvedUpstream {
                    scheme: UpstreamScheme::Tcp,
                    host: at.ip().to_string(),
                    port: at.port(),
                    app_protocol: None,
                    service: None,
                    endpoints: Vec::new(),
                }),
            };
            upstreams.insert(
                port,
                Arc::new(GatewayAction {
                    backends: vec![backend],
                    ..GatewayAction::default()
                }),
            );
        }
        // And an HTTP port: one listener for every host, one route to a
        // backend that answers with its name.
        let web = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let web_at = web.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = web.accept().await {
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && tcp.read_exact(&mut byte).await.is_ok() {
                        head.push(byte[0]);
                    }
                    let _ = tcp
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nweb",
                        )
                        .await;
                });
            }
        });
        let http_port = std::net::TcpListener::bind((address, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let route = RouteSpec {
            host: "*".into(),
            path: "/".into(),
            path_type: tuna_routing::PathType::Prefix,
            backend: RouteBackend::Upstream(ResolvedUpstream {
                scheme: UpstreamScheme::Http,
                host: web_at.ip().to_string(),
                port: web_at.port(),
                app_protocol: None,
                service: None,
                endpoints: Vec::new(),
            }),
            origin: tuna_routing::Origin::default(),
            tie_break: tuna_routing::TieBreak::default(),
            matcher: tuna_routing::Matcher::Gateway(
                Arc::new(tuna_routing::GatewayMatch::default()),
            ),
        };
        // And an HTTPS port: its TLS goes through the edge unterminated,
        // and the agent's proxy terminates it with the listener's
        // certificate.
        let https_port = std::net::TcpListener::bind((address, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let secure = rcgen::generate_simple_self_signed(vec!["secure.example".into()]).unwrap();
        let certificate = tuna_proxy::ServerCertificate::from_pem(
            secure.cert.pem().as_bytes(),
            secure.signing_key.serialize_pem().as_bytes(),
        )
        .unwrap();
        let http = BTreeMap::from([
            (
                http_port,
                vec![AddressListener {
                    hostname: None,
                    routes: vec![route.clone()],
                    certificate: None,
                }],
            ),
            (
                https_port,
                vec![AddressListener {
                    hostname: Some("secure.example".into()),
                    routes: vec![route],
                    certificate: Some(certificate),
                }],
            ),
        ]);
        let mut agent = AgentConfig::new(
            edge_server.agent_addr.to_string(),
            Trust::CaFile(identity.ca_file.clone().unwrap()),
        );
        agent.server_name = Some("localhost".into());
        let publisher = Publisher::start(ProxyCore::new(ProxyConfig::default()), agent).unwrap();
        let key = TunnelKey::Address("shop/edge".into());
        let (mut state, _) = publisher.publish(
            key.clone(),
            TunnelSpec {
                serving: Serving::Address {
                    address,
                    ports: upstreams,
                    http,
                },
                labels: BTreeMap::new(),
                edge,
                edge_identity: "operator".into(),
                keep_on_shutdown: false,
            },
        );
        let settled =
            tokio::time::timeout(Duration::from_secs(30), state.wait_for(|s| s.is_settled()))
                .await
                .expect("the tunnel never settled")
                .unwrap()
                .clone();
        assert!(
            matches!(settled, TunnelState::Serving { .. }),
            "{settled:?}"
        );
        for (port, name) in &public {
            let mut tcp = tokio::net::TcpStream::connect((address, *port))
                .await
                .unwrap();
            tcp.write_all(b"ping").await.unwrap();
            let mut back = vec![0u8; name.len() + 5];
            tokio::time::timeout(Duration::from_secs(30), tcp.read_exact(&mut back))
                .await
                .expect("no answer")
                .unwrap();
            assert_eq!(String::from_utf8(back).unwrap(), format!("{name}\nping"));
        }
        // The HTTP port routes any Host by its listener.
        let mut tcp = tokio::net::TcpStream::connect((address, http_port))
            .await
            .unwrap();
        tcp.write_all(b"GET /x HTTP/1.1\r\nHost: anything.example\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(30), tcp.read_to_string(&mut answer))
            .await
            .expect("no answer")
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("web"), "{answer}");
        // The HTTPS port: a client trusting the listener's certificate
        // (and nothing of the edge's) is served.
        let mut roots = rustls::RootCertStore::empty();
        roots.add(secure.cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect((address, https_port))
            .await
            .unwrap();
        let mut tls = tokio::time::timeout(
            Duration::from_secs(30),
            tokio_rustls::TlsConnector::from(Arc::new(client)).connect(
                rustls::pki_types::ServerName::try_from("secure.example").unwrap(),
                tcp,
            ),
        )
        .await
        .expect("no handshake")
        .unwrap();
        tls.write_all(b"GET /x HTTP/1.1\r\nHost: secure.example\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(30), tls.read_to_string(&mut answer))
            .await
            .expect("no answer")
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("web"), "{answer}");
        public.push((http_port, "http"));
        public.push((https_port, "https"));
        publisher.unpublish(&key).await;
        for (port, _) in &public {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while tokio::net::TcpStream::connect((address, *port))
                .await
                .is_ok()
            {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "port {port} still open"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        publisher.shutdown().await;
    }

    /// An edge whose token requests wait at a gate, then complete at the
    /// edge whether or not the caller still waits (as an HTTP request that
    /// was sent does).
    struct GatedMint {
        inner: Arc<dyn EdgeApi>,
        started: Arc<tokio::sync::Notify>,
        gate: Arc<tokio::sync::Semaphore>,
        /// A permit per token request the edge has answered.
        answered: Arc<tokio::sync::Semaphore>,
    }

    impl EdgeApi for GatedMint {
        fn whoami(&self) -> BoxFuture<'_, crate::Result<tuna_protocol::api::WhoAmI>> {
            self.inner.whoami()
        }
        fn ensure_domain<'a>(
            &'a self,
            request: &'a tuna_protocol::api::CreateDomain,
        ) -> BoxFuture<'a, crate::Result<tuna_agent::client::Reserved<tuna_protocol::api::Domain>>>
        {
            self.inner.ensure_domain(request)
        }
        fn verify_domain<'a>(
            &'a self,
            name: &'a str,
        ) -> BoxFuture<'a, crate::Result<tuna_protocol::api::Domain>> {
            self.inner.verify_domain(name)
        }
        fn list_domains(&self) -> BoxFuture<'_, crate::Result<Vec<tuna_protocol::api::Domain>>> {
            self.inner.list_domains()
        }
        fn delete_domain<'a>(&'a self, name: &'a str) -> BoxFuture<'a, crate::Result<()>> {
            self.inner.delete_domain(name)
        }
        fn ensure_tcp_endpoint<'a>(
            &'a self,
            request: &'a tuna_protocol::api::CreateTcpEndpoint,
        ) -> BoxFuture<
            'a,
            crate::Result<tuna_agent::client::Reserved<tuna_protocol::api::TcpEndpoint>>,
        > {
            self.inner.ensure_tcp_endpoint(request)
        }
        fn delete_tcp_endpoint<'a>(&'a self, alias: &'a str) -> BoxFuture<'a, crate::Result<()>> {
            self.inner.delete_tcp_endpoint(alias)
        }
        fn ensure_gateway_address<'a>(
            &'a self,
            request: &'a tuna_protocol::api::CreateGatewayAddress,
        ) -> BoxFuture<
            'a,
            crate::Result<tuna_agent::client::Reserved<tuna_protocol::api::GatewayAddress>>,
        > {
            self.inner.ensure_gateway_address(request)
        }
        fn delete_gateway_address(&self, address: IpAddr) -> BoxFuture<'_, crate::Result<()>> {
            self.inner.delete_gateway_address(address)
        }
        fn list_gateway_addresses(
            &self,
        ) -> BoxFuture<'_, crate::Result<Vec<tuna_protocol::api::GatewayAddress>>> {
            self.inner.list_gateway_addresses()
        }
        fn create_token<'a>(
            &'a self,
            labels: &'a BTreeMap<String, String>,
            bindings: &'a [Binding],
            ttl: Duration,
        ) -> BoxFuture<'a, crate::Result<MintedToken>> {
            let (inner, gate) = (Arc::clone(&self.inner), Arc::clone(&self.gate));
            let answered = Arc::clone(&self.answered);
            let (labels, bindings) = (labels.clone(), bindings.to_vec());
            self.started.notify_one();
            let sent = tokio::spawn(async move {
                let _pass = gate.acquire().await;
                let minted = inner.create_token(&labels, &bindings, ttl).await;
                answered.add_permits(1);
                minted
            });
            Box::pin(async move { sent.await.expect("mint task") })
        }
        fn renew_token<'a>(
            &'a self,
            id: &'a str,
            ttl: Duration,
        ) -> BoxFuture<'a, crate::Result<i64>> {
            self.inner.renew_token(id, ttl)
        }
        fn revoke_token<'a>(&'a self, id: &'a str) -> BoxFuture<'a, crate::Result<()>> {
            self.inner.revoke_token(id)
        }
        fn list_tokens<'a>(
            &'a self,
            selector: &'a str,
        ) -> BoxFuture<'a, crate::Result<Vec<tuna_protocol::api::Token>>> {
            self.inner.list_tokens(selector)
        }
    }

    /// A shutdown that comes while a token request is on its way revokes
    /// the token the edge minted for it (the chart suite on a real cluster
    /// saw one left live after `helm uninstall`).
    #[tokio::test]
    async fn a_token_minted_while_stopping_is_revoked() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let embedded: Arc<dyn EdgeApi> = Arc::new(
            crate::standalone::edge::Embedded::open(
                tuna_edge::MemoryAuthority::new(),
                "localhost",
                20000..=20001,
                dir.path(),
            )
            .unwrap(),
        );
        let started = Arc::new(tokio::sync::Notify::new());
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let answered = Arc::new(tokio::sync::Semaphore::new(0));
        let edge: Arc<dyn EdgeApi> = Arc::new(GatedMint {
            inner: Arc::clone(&embedded),
            started: Arc::clone(&started),
            gate: Arc::clone(&gate),
            answered: Arc::clone(&answered),
        });
        let publisher = Publisher::start(
            ProxyCore::new(ProxyConfig::default()),
            AgentConfig::new("127.0.0.1:9", Trust::SystemRoots),
        )
        .unwrap();
        let _ = publisher.publish(
            TunnelKey::Host("web.localhost".into()),
            TunnelSpec {
                serving: Serving::Http {
                    host: "web.localhost".into(),
                    routes: Vec::new(),
                },
                labels: BTreeMap::new(),
                edge,
                edge_identity: "operator".into(),
                keep_on_shutdown: false,
            },
        );
        started.notified().await;
        let stopping = tokio::spawn({
            let publisher = publisher.clone();
            async move { publisher.shutdown().await }
        });
        // The shutdown has cancelled the tunnel task's wait by now or does
        // so while the edge answers; either way the answer must be revoked.
        tokio::task::yield_now().await;
        gate.add_permits(1);
        stopping.await.unwrap();
        let _ = answered.acquire().await.unwrap();
        let live: Vec<_> = embedded
            .list_tokens("")
            .await
            .unwrap()
            .into_iter()
            .filter(|t| !t.expired)
            .collect();
        assert!(live.is_empty(), "left live: {live:?}");
    }
}
