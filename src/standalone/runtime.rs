//! The standalone process: embedded edge (or a remote one), one agent session per
//! published host or TCP endpoint, the proxy core, and the file watcher that
//! applies changes live.
//!
//! # Shape
//!
//! ```text
//! client ─► edge (public HTTP / TCP listeners) ══ agent session per tunnel ══► proxy core ─► backend
//!                     ▲ tokens, TCP ports                  ▲ set_host_routes / set_tcp_service
//!                EdgeControl ◄──────────── Runtime::apply(changes) ◄── FileProvider::poll
//! ```
//!
//! - **One tunnel per host / TCP endpoint, one token per tunnel** (DESIGN §3): a
//!   host published by Ingresses or by an http Tunnel gets an agent session bound
//!   to that host alone, with a token allowed only that binding; a tcp Tunnel gets
//!   one bound to its endpoint.
//! - **Route changes never reconnect.** A changed path or upstream only swaps the
//!   host's routes in the proxy core; the session keeps its id.
//! - **Removal revokes.** When a host or TCP endpoint leaves the files, its agent
//!   stops, its token is revoked at the edge (any session still using it is
//!   closed by the edge), and the proxy forgets its routes.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, watch};
use tokio_util::sync::CancellationToken;
use tuna_proxy::{
    ConnInfo, HttpBackend, HttpRoute, ProxyConfig, ProxyCore, Scheme, TcpLimits, TcpUpstream,
    TlsUpstream, UpstreamProtocol,
};
use tuna_tunnel::agent::{Agent, AgentConfig, AgentHandle, Trust};
use tuna_tunnel::edge::{EdgeConfig, EdgeHandle, EdgeServer, MemoryAuthority};
use tuna_tunnel::mux::MuxStream;
use tuna_tunnel::wire::{Binding, StreamKind, StreamMeta, TunnelToken};

use super::Error;
use super::desired::{DesiredOptions, DesiredState, HttpRouteSpec, PublishedTcp, SkippedItem};
use super::diff::{Change, diff};
use super::edge::{EdgeControl, Embedded, IssuedToken, Remote, TOKEN_RENEW_EVERY};
use super::provider::FileProvider;
use super::report::{PublicAddresses, render};
use crate::translate::service::{ResolvedUpstream, UpstreamScheme};
use crate::translate::tunnel::PortOrAlias;
use tuna_crds::ReclaimPolicy;

/// How long a new tunnel may take to connect before it is reported as not
/// (yet) connected; it keeps retrying in the background.
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// A remote edge to use instead of the embedded one.
#[derive(Debug, Clone)]
pub struct RemoteEdge {
    /// Base URL of its REST API, e.g. `https://edge.example.com:7444`.
    pub api_url: String,
    /// `host:port` agents dial.
    pub agent_addr: String,
    /// The API key (tunnels:write and tunnels:connect).
    pub api_key: tuna_tunnel::api::Secret,
    /// PEM CA file to trust for the API and the agent listener (a self-hosted
    /// edge's `tls/ca.pem`); `None`: the system roots.
    pub ca_file: Option<PathBuf>,
}

/// Settings of a standalone process.
#[derive(Debug, Clone)]
pub struct StandaloneConfig {
    /// `-f` files and directories.
    pub paths: Vec<PathBuf>,
    /// Public HTTP listener of the embedded edge.
    pub http_listen: SocketAddr,
    /// Base domain of the embedded edge.
    pub base_domain: String,
    /// Ports of TCP endpoints (embedded edge).
    pub tcp_port_range: RangeInclusive<u16>,
    /// Address TCP endpoints listen on (embedded edge).
    pub tcp_bind: IpAddr,
    /// State: the embedded edge's CA and TCP port allocations.
    pub data_dir: PathBuf,
    /// How often the files are checked.
    pub poll_interval: Duration,
    /// Use this edge instead of an embedded one.
    pub remote: Option<RemoteEdge>,
    /// Print the report to stdout on every change (the command does; tests don't).
    pub print_reports: bool,
}

impl StandaloneConfig {
    /// Defaults for `paths` (HTTP on 127.0.0.1:8080, base domain `localhost`,
    /// TCP ports 30000–30999 on 127.0.0.1).
    pub fn new(paths: Vec<PathBuf>, data_dir: PathBuf) -> Self {
        Self {
            paths,
            http_listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            base_domain: "localhost".into(),
            tcp_port_range: 30000..=30999,
            tcp_bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            data_dir,
            poll_interval: Duration::from_millis(500),
            remote: None,
            print_reports: false,
        }
    }
}

/// What a tunnel session serves.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TunnelKey {
    /// An HTTP host.
    Host(String),
    /// A tcp Tunnel, `namespace/name`.
    Tcp(String),
}

impl std::fmt::Display for TunnelKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Host(h) => write!(f, "host {h}"),
            Self::Tcp(t) => write!(f, "tcp Tunnel {t}"),
        }
    }
}

struct Session {
    token: IssuedToken,
    agent: AgentHandle,
    /// For TCP: the endpoint key the proxy core knows the service by.
    tcp_key: Option<String>,
    /// For TCP: the public address.
    tcp_addr: Option<SocketAddr>,
}

/// How a reservation came to be, deciding whether removal releases it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reservation {
    /// It existed before (made elsewhere): never released (DESIGN §3, adoption).
    adopted: bool,
    /// The resource's `reclaimPolicy` (`Delete` for hosts of http Tunnels).
    policy: ReclaimPolicy,
}

impl Reservation {
    fn releasable(self) -> bool {
        !self.adopted && self.policy == ReclaimPolicy::Delete
    }
}

struct Runtime {
    proxy: ProxyCore,
    control: EdgeControl,
    agent_addr: String,
    trust: Trust,
    server_name: Option<String>,
    public_http_port: Option<u16>,
    tcp_host: IpAddr,
    sessions: BTreeMap<TunnelKey, Session>,
    provider: FileProvider,
    /// Problems found while applying (unresolvable upstream, edge refusal…).
    problems: Vec<SkippedItem>,
    /// Hosts reserved at the edge (fqdn → how), for reclaim on removal.
    hosts_reserved: BTreeMap<String, Reservation>,
    /// TCP endpoints reserved at the edge (alias → how).
    tcp_reserved: BTreeMap<String, Reservation>,
    report: String,
}

/// A running standalone process (see the module docs). Dropping it stops
/// everything without waiting; [`Standalone::shutdown`] revokes tokens and waits.
pub struct Standalone {
    runtime: Arc<Mutex<Runtime>>,
    edge: Option<EdgeHandle>,
    http_addr: Option<SocketAddr>,
    agent_addr: String,
    ca_file: Option<PathBuf>,
    generation: watch::Receiver<u64>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn to_proxy_scheme(s: tuna_tunnel::wire::Scheme) -> Scheme {
    match s {
        tuna_tunnel::wire::Scheme::Http => Scheme::Http,
        tuna_tunnel::wire::Scheme::Https => Scheme::Https,
    }
}

async fn resolve(upstream: &ResolvedUpstream) -> Result<Vec<SocketAddr>, String> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((upstream.host.as_str(), upstream.port))
        .await
        .map_err(|e| format!("cannot resolve {}: {e}", upstream.authority()))?
        .collect();
    if addrs.is_empty() {
        return Err(format!("{} resolves to no address", upstream.authority()));
    }
    Ok(addrs)
}

async fn http_route(spec: &HttpRouteSpec) -> Result<HttpRoute, String> {
    let addrs = resolve(&spec.backend).await?;
    let protocol = match spec.backend.scheme {
        UpstreamScheme::Https => UpstreamProtocol::Tls(TlsUpstream {
            sni: spec.backend.host.clone(),
            // A Service stands for workloads that often use self-signed
            // certificates; a literal external host is verified.
            verify: spec.backend.service.is_none() && spec.backend.host.parse::<IpAddr>().is_err(),
            h2: false,
        }),
        _ if spec.backend.is_h2c() => UpstreamProtocol::H2c,
        _ => UpstreamProtocol::Http1,
    };
    Ok(HttpRoute {
        path: spec.path.clone(),
        path_type: spec.path_type,
        backend: HttpBackend { addrs, protocol },
        origin: spec.origin.clone(),
        tie_break: spec.tie_break.clone(),
    })
}

fn tcp_key(endpoint: &PortOrAlias) -> String {
    match endpoint {
        PortOrAlias::Port(p) => p.to_string(),
        PortOrAlias::Alias(a) => a.clone(),
    }
}

impl Runtime {
    fn problem(&mut self, object: String, reason: &str, message: String) {
        tracing::warn!(%object, reason, %message, "not applied");
        self.problems.push(SkippedItem {
            source: None,
            object,
            reason: reason.into(),
            message,
        });
    }

    fn start_agent(&self, token: &TunnelToken, binding: Binding) -> Result<AgentHandle, Error> {
        let mut config =
            AgentConfig::new(self.agent_addr.clone(), token.clone(), self.trust.clone());
        config.server_name = self.server_name.clone();
        config.bindings = vec![binding];
        config.agent_name = format!("tuna-operator-standalone/{}", env!("CARGO_PKG_VERSION"));
        let proxy = self.proxy.clone();
        Agent::start(config, move |stream: MuxStream, meta: StreamMeta| {
            let proxy = proxy.clone();
            tokio::spawn(async move {
                match meta.kind {
                    StreamKind::Http { scheme, host } => {
                        // The stream was opened for one host: the proxy
                        // serves that one only (421 for any other).
                        let info = ConnInfo {
                            client_addr: meta.client_addr,
                            local_addr: None,
                            scheme: to_proxy_scheme(scheme),
                            trusted: true,
                            host: Some(host),
                        };
                        proxy.serve_stream(stream, info).await;
                    }
                    StreamKind::Tcp { endpoint, .. } => {
                        let info = ConnInfo {
                            client_addr: meta.client_addr,
                            local_addr: None,
                            scheme: Scheme::Http,
                            trusted: true,
                            host: None,
                        };
                        if let Err(e) = proxy.serve_tcp_stream(&endpoint, stream, info).await {
                            tracing::debug!(%endpoint, error = %e, "tcp stream ended");
                        }
                    }
                }
            });
        })
        .map_err(|e| Error::Edge(format!("starting an agent: {e}")))
    }

    async fn open_session(
        &mut self,
        key: &TunnelKey,
        binding: Binding,
        owner: &str,
    ) -> Result<(), Error> {
        let token = self
            .control
            .create_token(owner, std::slice::from_ref(&binding))
            .await?;
        let agent = match self.start_agent(&token.token, binding) {
            Ok(a) => a,
            Err(e) => {
                let _ = self.control.revoke_token(&token.id).await;
                return Err(e);
            }
        };
        if tokio::time::timeout(CONNECT_WAIT, agent.connected())
            .await
            .is_err()
        {
            let status = agent.status().borrow().clone();
            self.problem(key.to_string(), "TunnelNotConnected", format!("still connecting after {CONNECT_WAIT:?} ({status:?}); retrying in the background"));
        }
        self.sessions.insert(
            key.clone(),
            Session {
                token,
                agent,
                tcp_key: None,
                tcp_addr: None,
            },
        );
        Ok(())
    }

    async fn close_session(&mut self, key: &TunnelKey) {
        if let Some(session) = self.sessions.remove(key) {
            session.agent.shutdown().await;
            if let Err(e) = self.control.revoke_token(&session.token.id).await {
                self.problem(key.to_string(), "TokenNotRevoked", e.to_string());
            }
            if let Some(k) = session.tcp_key {
                self.proxy.remove_tcp_service(&k);
            }
        }
    }

    async fn apply(&mut self, changes: Vec<Change>) {
        self.problems.clear();
        let state = self.provider.state().clone();
        self.reserve_new(&state).await;
        for change in changes {
            match change {
                Change::HostRemoved { host } => {
                    if let Err(e) = self.proxy.remove_host(&host) {
                        self.problem(format!("host {host}"), "ProxyError", e.to_string());
                    }
                    self.close_session(&TunnelKey::Host(host)).await;
                }
                Change::HostSet { host, routes } => self.set_host(&state, &host, &routes).await,
                Change::TcpRemoved { tunnel, .. } => {
                    self.close_session(&TunnelKey::Tcp(tunnel)).await
                }
                Change::TcpSet {
                    tunnel,
                    tcp,
                    previous,
                } => self.set_tcp(&tunnel, &tcp, previous.as_ref()).await,
                Change::TunnelAdded(_) | Change::TunnelRemoved(_) => {}
            }
        }
        self.release_removed(&state).await;
        self.report = self.render();
    }

    /// Reserves the Domains and TCPEndpoints of the files that are not reserved
    /// yet: before any tunnel binds them.
    async fn reserve_new(&mut self, state: &DesiredState) {
        for d in &state.domains {
            if self.hosts_reserved.contains_key(&d.fqdn) {
                continue;
            }
            let result = if d.custom {
                self.control.reserve_host(None, Some(&d.fqdn)).await
            } else {
                let label = d.fqdn.split('.').next().unwrap_or(&d.fqdn).to_owned();
                self.control.reserve_host(Some(&label), None).await
            };
            match result {
                Ok(adopted) => {
                    self.hosts_reserved.insert(
                        d.fqdn.clone(),
                        Reservation {
                            adopted,
                            policy: d.reclaim_policy,
                        },
                    );
                }
                Err(e) => self.problem(
                    format!("Domain {}/{}", d.namespace, d.name),
                    "ReservationFailed",
                    e.to_string(),
                ),
            }
        }
        for ep in &state.tcp_endpoints {
            if self.tcp_reserved.contains_key(&ep.alias) {
                continue;
            }
            match self.control.reserve_tcp(Some(&ep.alias), None).await {
                Ok((_, _, adopted)) => {
                    self.tcp_reserved.insert(
                        ep.alias.clone(),
                        Reservation {
                            adopted,
                            policy: ep.reclaim_policy,
                        },
                    );
                }
                Err(e) => self.problem(
                    format!("TCPEndpoint {}/{}", ep.namespace, ep.name),
                    "ReservationFailed",
                    e.to_string(),
                ),
            }
        }
    }

    /// Releases reservations whose resource left the files (and whose host or
    /// endpoint no tunnel still serves), honouring `reclaimPolicy` and adoption.
    async fn release_removed(&mut self, state: &DesiredState) {
        let gone: Vec<(String, Reservation)> = self
            .hosts_reserved
            .iter()
            .filter(|(fqdn, _)| {
                !state.domains.iter().any(|d| &d.fqdn == *fqdn)
                    && !self
                        .sessions
                        .contains_key(&TunnelKey::Host((*fqdn).clone()))
            })
            .map(|(f, r)| (f.clone(), *r))
            .collect();
        for (fqdn, r) in gone {
            self.hosts_reserved.remove(&fqdn);
            if r.releasable()
                && let Err(e) = self.control.release_host(&fqdn).await
            {
                self.problem(format!("host {fqdn}"), "ReleaseFailed", e.to_string());
            }
        }
        let in_use: Vec<String> = state
            .tcp
            .values()
            .map(|t| match &t.endpoint {
                PortOrAlias::Alias(a) => a.clone(),
                PortOrAlias::Port(p) => format!("port-{p}"),
            })
            .collect();
        let gone: Vec<(String, Reservation)> = self
            .tcp_reserved
            .iter()
            .filter(|(alias, _)| {
                !state.tcp_endpoints.iter().any(|e| &e.alias == *alias) && !in_use.contains(alias)
            })
            .map(|(a, r)| (a.clone(), *r))
            .collect();
        for (alias, r) in gone {
            self.tcp_reserved.remove(&alias);
            if r.releasable()
                && let Err(e) = self.control.release_tcp(&alias).await
            {
                self.problem(
                    format!("TCP endpoint {alias}"),
                    "ReleaseFailed",
                    e.to_string(),
                );
            }
        }
    }

    async fn set_host(&mut self, state: &DesiredState, host: &str, routes: &[HttpRouteSpec]) {
        let mut proxy_routes = Vec::with_capacity(routes.len());
        for spec in routes {
            match http_route(spec).await {
                Ok(r) => proxy_routes.push(r),
                Err(message) => self.problem(
                    format!(
                        "route {host}{} of {}/{}",
                        spec.path, spec.origin.namespace, spec.origin.name
                    ),
                    "UpstreamUnresolvable",
                    message,
                ),
            }
        }
        if proxy_routes.is_empty() {
            let _ = self.proxy.remove_host(host);
            self.close_session(&TunnelKey::Host(host.to_owned())).await;
            return;
        }
        match self.proxy.set_host_routes(host, proxy_routes) {
            Ok(issues) => {
                for issue in issues {
                    self.problem(
                        issue.origin().to_string(),
                        issue.reason(),
                        issue.to_string(),
                    );
                }
            }
            Err(e) => {
                self.problem(format!("host {host}"), "ProxyError", e.to_string());
                return;
            }
        }
        let key = TunnelKey::Host(host.to_owned());
        if self.sessions.contains_key(&key) {
            return;
        }
        // A host no Domain reserves is an http Tunnel's subdomain: reserve it
        // for the tunnel's lifetime.
        if !self.hosts_reserved.contains_key(host) {
            let label = host.split('.').next().unwrap_or(host).to_owned();
            match self.control.reserve_host(Some(&label), None).await {
                Ok(adopted) => {
                    self.hosts_reserved.insert(
                        host.to_owned(),
                        Reservation {
                            adopted,
                            policy: ReclaimPolicy::Delete,
                        },
                    );
                }
                Err(e) => {
                    self.problem(format!("host {host}"), "ReservationFailed", e.to_string());
                    return;
                }
            }
        }
        let owner = state
            .hosts
            .get(host)
            .and_then(|p| p.publishers.first())
            .map(ToString::to_string)
            .unwrap_or_else(|| host.to_owned());
        if let Err(e) = self.open_session(&key, Binding::http(host), &owner).await {
            self.problem(key.to_string(), "TunnelFailed", e.to_string());
        }
    }

    async fn set_tcp(&mut self, tunnel: &str, tcp: &PublishedTcp, previous: Option<&PublishedTcp>) {
        let key = TunnelKey::Tcp(tunnel.to_owned());
        if previous.is_some_and(|p| p.endpoint != tcp.endpoint) {
            self.close_session(&key).await;
        }
        let addrs = match resolve(&tcp.upstream).await {
            Ok(a) => a,
            Err(message) => {
                self.problem(format!("Tunnel {tunnel}"), "UpstreamUnresolvable", message);
                self.close_session(&key).await;
                return;
            }
        };
        let endpoint_key = tcp_key(&tcp.endpoint);
        if let Err(e) =
            self.proxy
                .set_tcp_service(&endpoint_key, TcpUpstream { addrs }, TcpLimits::default())
        {
            self.problem(format!("Tunnel {tunnel}"), "ProxyError", e.to_string());
            return;
        }
        if self.sessions.contains_key(&key) {
            return;
        }
        let (alias, port) = match &tcp.endpoint {
            PortOrAlias::Alias(a) => (Some(a.as_str()), None),
            PortOrAlias::Port(p) => (None, Some(*p)),
        };
        let (reserved_alias, public_port, adopted) =
            match self.control.reserve_tcp(alias, port).await {
                Ok(r) => r,
                Err(e) => {
                    self.problem(
                        format!("Tunnel {tunnel}"),
                        "ReservationFailed",
                        e.to_string(),
                    );
                    return;
                }
            };
        self.tcp_reserved
            .entry(reserved_alias)
            .or_insert(Reservation {
                adopted,
                policy: ReclaimPolicy::Delete,
            });
        if let Err(e) = self
            .open_session(&key, Binding::tcp(endpoint_key.clone()), tunnel)
            .await
        {
            self.problem(key.to_string(), "TunnelFailed", e.to_string());
            return;
        }
        if let Some(s) = self.sessions.get_mut(&key) {
            s.tcp_key = Some(endpoint_key);
            s.tcp_addr = Some(SocketAddr::new(self.tcp_host, public_port));
        }
    }

    fn addresses(&self) -> PublicAddresses {
        let mut a = PublicAddresses {
            http_port: self.public_http_port,
            ..Default::default()
        };
        for (key, s) in &self.sessions {
            if let (TunnelKey::Tcp(t), Some(addr)) = (key, s.tcp_addr) {
                a.tcp.insert(t.clone(), addr);
            }
        }
        a
    }

    fn render(&self) -> String {
        let mut state = self.provider.state().clone();
        state.skipped.extend(self.problems.iter().cloned());
        render(&state, &self.addresses())
    }
}

impl Standalone {
    /// Starts everything and applies the files once; returns when every tunnel
    /// is connected (or reported as not connected after a bounded wait).
    pub async fn start(config: StandaloneConfig) -> Result<Self, Error> {
        std::fs::create_dir_all(&config.data_dir).map_err(|source| Error::Io {
            path: config.data_dir.clone(),
            source,
        })?;
        let options = DesiredOptions {
            base_domain: config.base_domain.to_ascii_lowercase(),
            ..DesiredOptions::default()
        };
        let provider = FileProvider::new(config.paths.clone(), options);

        let (control, edge, agent_addr, trust, server_name, ca_file, public_http_port, tcp_host) =
            match &config.remote {
                None => {
                    let names = vec![
                        config.base_domain.clone(),
                        format!("*.{}", config.base_domain),
                    ];
                    let identity = tuna_tunnel::tls::self_signed_identity(&config.data_dir, &names)
                        .map_err(|e| Error::Edge(format!("edge TLS: {e}")))?;
                    let ca_file = identity
                        .ca_file
                        .clone()
                        .ok_or_else(|| Error::Edge("the edge generated no CA file".into()))?;
                    let agent_tls = tuna_tunnel::tls::server_config(&identity, &[])
                        .map_err(|e| Error::Edge(format!("edge TLS: {e}")))?;
                    let mut edge_config =
                        EdgeConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), agent_tls);
                    edge_config.http_addr = Some(config.http_listen);
                    edge_config.tcp_bind_ip = config.tcp_bind;
                    edge_config.tcp_ports = config.tcp_port_range.clone();
                    let authority = MemoryAuthority::new();
                    let embedded = Embedded::open(
                        authority.clone(),
                        config.tcp_port_range.clone(),
                        &config.data_dir,
                    )?;
                    let edge = EdgeServer::start(edge_config, Arc::new(authority), None)
                        .await
                        .map_err(|e| Error::Edge(format!("starting the embedded edge: {e}")))?;
                    let agent_addr = edge.agent_addr.to_string();
                    let http_port = edge.http_addr.map(|a| a.port());
                    (
                        EdgeControl::Embedded(embedded),
                        Some(edge),
                        agent_addr,
                        Trust::CaFile(ca_file.clone()),
                        Some("localhost".to_owned()),
                        Some(ca_file),
                        http_port,
                        config.tcp_bind,
                    )
                }
                Some(remote) => {
                    let mut options = tuna_tunnel::api::ClientOptions::new(
                        remote.api_url.clone(),
                        remote.api_key.clone(),
                    );
                    if let Some(ca) = &remote.ca_file {
                        options = options.with_ca_file(ca.clone());
                    }
                    let client = tuna_tunnel::api::TunaClient::new(options)
                        .map_err(|e| Error::Edge(format!("edge API client: {e}")))?;
                    let who = client
                        .whoami()
                        .await
                        .map_err(|e| Error::Edge(format!("edge API {}: {e}", remote.api_url)))?;
                    tracing::info!(account = %who.account, base_domain = %who.base_domain, "connected to the edge API");
                    // One instance id per data dir: a restart finds its own orphans.
                    let instance = super::edge::instance_id(&config.data_dir)?;
                    let remote_control = Remote::new(client, instance);
                    match remote_control.revoke_orphans().await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(
                            revoked = n,
                            "revoked tunnel tokens left by an earlier run"
                        ),
                        Err(e) => {
                            tracing::warn!(error = %e, "could not revoke tokens left by an earlier run")
                        }
                    }
                    let trust = match &remote.ca_file {
                        Some(ca) => Trust::CaFile(ca.clone()),
                        None => Trust::SystemRoots,
                    };
                    let tcp_host = tokio::net::lookup_host(remote.agent_addr.as_str())
                        .await
                        .ok()
                        .and_then(|mut a| a.next())
                        .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |a| a.ip());
                    (
                        EdgeControl::Remote(remote_control),
                        None,
                        remote.agent_addr.clone(),
                        trust,
                        None,
                        remote.ca_file.clone(),
                        None,
                        tcp_host,
                    )
                }
            };
        let http_addr = edge.as_ref().and_then(|e| e.http_addr);

        let proxy = ProxyCore::new(ProxyConfig::default());
        let runtime = Runtime {
            proxy,
            control,
            agent_addr: agent_addr.clone(),
            trust,
            server_name,
            public_http_port,
            tcp_host,
            sessions: BTreeMap::new(),
            provider,
            problems: Vec::new(),
            hosts_reserved: BTreeMap::new(),
            tcp_reserved: BTreeMap::new(),
            report: String::new(),
        };
        let runtime = Arc::new(Mutex::new(runtime));
        {
            let mut rt = runtime.lock().await;
            let initial = diff(&DesiredState::default(), rt.provider.state());
            rt.apply(initial).await;
        }
        let (generation_tx, generation) = watch::channel(0u64);
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        // The watcher: poll, apply, reprint.
        {
            let runtime = runtime.clone();
            let stop = stop.clone();
            let interval = config.poll_interval;
            let print = config.print_reports;
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tick.tick() => {}
                    }
                    let mut rt = runtime.lock().await;
                    let Some(changes) = rt.provider.poll() else {
                        continue;
                    };
                    tracing::info!(changes = changes.len(), "manifests changed");
                    rt.apply(changes).await;
                    if print {
                        println!("{}", rt.report);
                    }
                    drop(rt);
                    generation_tx.send_modify(|g| *g += 1);
                }
            }));
        }
        // Token renewal.
        {
            let runtime = runtime.clone();
            let stop = stop.clone();
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(TOKEN_RENEW_EVERY);
                tick.tick().await;
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tick.tick() => {}
                    }
                    let rt = runtime.lock().await;
                    for (key, s) in &rt.sessions {
                        if let Err(e) = rt.control.renew_token(&s.token.id).await {
                            tracing::warn!(tunnel = %key, error = %e, "token renewal failed");
                        }
                    }
                }
            }));
        }
        Ok(Self {
            runtime,
            edge,
            http_addr,
            agent_addr,
            ca_file,
            generation,
            stop,
            tasks,
        })
    }

    /// The public HTTP address of the embedded edge.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// The address agents dial (embedded or remote edge).
    pub fn agent_addr(&self) -> &str {
        &self.agent_addr
    }

    /// The CA file agents trust (embedded edge: generated in the data dir).
    pub fn ca_file(&self) -> Option<&PathBuf> {
        self.ca_file.as_ref()
    }

    /// The latest report (also printed on every change).
    pub async fn report(&self) -> String {
        self.runtime.lock().await.report.clone()
    }

    /// The current desired state.
    pub async fn state(&self) -> DesiredState {
        self.runtime.lock().await.provider.state().clone()
    }

    /// Counts applied file changes; wait on it to see a change go live.
    pub fn generation(&self) -> watch::Receiver<u64> {
        self.generation.clone()
    }

    /// Public TCP address of a tcp Tunnel (`namespace/name`).
    pub async fn tcp_address(&self, tunnel: &str) -> Option<SocketAddr> {
        self.runtime
            .lock()
            .await
            .sessions
            .get(&TunnelKey::Tcp(tunnel.to_owned()))
            .and_then(|s| s.tcp_addr)
    }

    /// Session id of each tunnel currently connected.
    pub async fn session_ids(&self) -> BTreeMap<TunnelKey, Option<String>> {
        self.runtime
            .lock()
            .await
            .sessions
            .iter()
            .map(|(k, s)| (k.clone(), s.agent.session_id()))
            .collect()
    }

    /// The token of a tunnel, for diagnostics and tests (never logged).
    pub async fn token(&self, key: &TunnelKey) -> Option<TunnelToken> {
        self.runtime
            .lock()
            .await
            .sessions
            .get(key)
            .map(|s| s.token.token.clone())
    }

    /// Stops watching, closes every tunnel and revokes its token, drains the
    /// proxy and stops the embedded edge.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        let mut rt = self.runtime.lock().await;
        let keys: Vec<TunnelKey> = rt.sessions.keys().cloned().collect();
        for key in keys {
            rt.close_session(&key).await;
        }
        rt.proxy.shutdown().await;
        drop(rt);
        if let Some(edge) = self.edge.take() {
            edge.shutdown().await;
        }
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
