//! The standalone process: embedded edge (or a remote one), the publisher
//! (proxy core + tunnels), and the file watcher that applies changes live.
//!
//! # Shape
//!
//! ```text
//! client ─► edge (public HTTP / TCP listeners) ══ tunnels ══► proxy core ─► backend
//!              ▲ reservations, tokens                ▲ publish / unpublish
//!           EdgeApi ◄──── Runtime::apply(changes) ───┘ ◄── FileProvider::poll
//! ```
//!
//! - **One tunnel per host / TCP endpoint, one token per tunnel** (DESIGN §3):
//!   a host published by Ingresses or by an http Tunnel gets a tunnel bound to
//!   that host alone, with a token allowed only that binding; a tcp Tunnel or a
//!   TCPRoute gets one bound to its endpoint.
//! - **Route changes never reconnect.** A changed path or upstream only swaps
//!   the host's routes in the proxy core.
//! - **Removal revokes.** When a host or TCP endpoint leaves the files, its
//!   tunnel stops, its token is revoked at the edge (any session still using it
//!   is closed by the edge), and the proxy forgets its routes.
//! - **No lock across an await.** One task owns the runtime and applies
//!   changes; readers see snapshots published on a watch channel.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tuna_agent::{AgentConfig, Trust};
use tuna_crds::ReclaimPolicy;
use tuna_edge::{EdgeConfig, EdgeHandle, EdgeServer, MemoryAuthority};
use tuna_protocol::api::{CreateDomain, CreateTcpEndpoint};
use tuna_protocol::wire::TunnelToken;
use tuna_proxy::{ProxyConfig, ProxyCore};

use super::desired::{DesiredOptions, DesiredState, HttpRouteSpec, PublishedTcp, SkippedItem};
use super::diff::{Change, diff};
use super::edge::{
    Embedded, INSTANCE_LABEL, OWNER_LABEL, instance_id, owner_label, revoke_orphans,
};
use super::provider::FileProvider;
use super::report::{PublicAddresses, render};
use crate::Error;
use crate::edge::api::{EdgeApi, RemoteEdge as RemoteEdgeApi, gone_is_ok};
pub use crate::edge::publisher::TunnelKey;
use crate::edge::publisher::{Publisher, Serving, TunnelSpec, TunnelState};
use crate::plan::tunnel::PortOrAlias;

/// How long applying a change waits for new tunnels to connect before it
/// reports them as not (yet) connected; they keep retrying in the background.
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// A remote edge to use instead of the embedded one.
#[derive(Debug, Clone)]
pub struct RemoteEdge {
    /// Base URL of its REST API, e.g. `https://edge.example.com:7444`.
    pub api_url: String,
    /// `host:port` agents dial.
    pub agent_addr: String,
    /// The API key (tunnels:write and tunnels:connect).
    pub api_key: tuna_protocol::api::Secret,
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
    /// Listeners of TCP endpoint ports opened by the caller (socket
    /// activation, tests that bind port 0), served by the embedded edge.
    pub tcp_listeners: Vec<Arc<std::net::TcpListener>>,
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
            tcp_listeners: Vec::new(),
            data_dir,
            poll_interval: Duration::from_millis(500),
            remote: None,
            print_reports: false,
        }
    }
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

/// What readers of a running process see.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    report: String,
    state: DesiredState,
    tcp: BTreeMap<String, SocketAddr>,
}

struct Runtime {
    publisher: Publisher,
    edge: Arc<dyn EdgeApi>,
    /// Labels every token carries besides its owner (the remote instance id).
    labels: BTreeMap<String, String>,
    public_http_port: Option<u16>,
    tcp_host: IpAddr,
    provider: FileProvider,
    /// Problems found while applying (unresolvable upstream, edge refusal…).
    problems: Vec<SkippedItem>,
    /// Hosts reserved at the edge (fqdn → how), for reclaim on removal.
    hosts_reserved: BTreeMap<String, Reservation>,
    /// TCP endpoints reserved at the edge (alias → how).
    tcp_reserved: BTreeMap<String, Reservation>,
    /// tcp Tunnel → its public address.
    tcp_addrs: BTreeMap<String, SocketAddr>,
}

/// A running standalone process (see the module docs). Dropping it stops
/// everything without waiting; [`Standalone::shutdown`] revokes tokens and waits.
pub struct Standalone {
    publisher: Publisher,
    edge: Option<EdgeHandle>,
    http_addr: Option<SocketAddr>,
    agent_addr: String,
    ca_file: Option<PathBuf>,
    snapshot: watch::Receiver<Snapshot>,
    generation: watch::Receiver<u64>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

fn tcp_alias(endpoint: &PortOrAlias) -> String {
    match endpoint {
        PortOrAlias::Port(p) => format!("port-{p}"),
        PortOrAlias::Alias(a) => a.clone(),
    }
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

    fn spec(&self, owner: &str, serving: Serving) -> TunnelSpec {
        let mut labels = self.labels.clone();
        labels.insert(OWNER_LABEL.to_owned(), owner_label(owner));
        TunnelSpec {
            serving,
            labels,
            edge: Arc::clone(&self.edge),
            edge_identity: "standalone".to_owned(),
            keep_on_shutdown: false,
        }
    }

    async fn apply(&mut self, changes: Vec<Change>) {
        self.problems.clear();
        let state = self.provider.state().clone();
        self.reserve_new(&state).await;
        let mut touched: Vec<(TunnelKey, u64)> = Vec::new();
        for change in changes {
            match change {
                Change::HostRemoved { host } => {
                    self.publisher.unpublish(&TunnelKey::Host(host)).await;
                }
                Change::HostSet { host, routes } => {
                    if let Some(revision) = self.set_host(&state, &host, routes).await {
                        touched.push((TunnelKey::Host(host), revision));
                    }
                }
                Change::TcpRemoved { tunnel, .. } => {
                    self.tcp_addrs.remove(&tunnel);
                    self.publisher.unpublish(&TunnelKey::Tcp(tunnel)).await;
                }
                Change::TcpSet { tunnel, tcp, .. } => {
                    if let Some(revision) = self.set_tcp(&tunnel, &tcp).await {
                        touched.push((TunnelKey::Tcp(tunnel), revision));
                    }
                }
            }
        }
        self.release_removed(&state).await;
        // Report tunnels that did not come up (they keep trying).
        let states: Vec<(TunnelKey, u64, watch::Receiver<TunnelState>)> = touched
            .into_iter()
            .filter_map(|(k, r)| Some((k.clone(), r, self.publisher.state(&k)?)))
            .collect();
        let _ = tokio::time::timeout(CONNECT_WAIT, async {
            for (_, revision, s) in &states {
                let _ = s.clone().wait_for(|s| s.reached(*revision)).await;
            }
        })
        .await;
        for (key, _, s) in states {
            let now = s.borrow().clone();
            match now {
                TunnelState::Serving { warnings, .. } => {
                    for w in warnings {
                        self.problem(key.to_string(), "UpstreamUnresolvable", w);
                    }
                }
                TunnelState::Refused { code, message } => {
                    self.problem(key.to_string(), "TunnelRefused", format!("{code}: {message}"))
                }
                TunnelState::Failed { message, .. } => {
                    self.problem(key.to_string(), "TunnelFailed", message)
                }
                other => self.problem(
                    key.to_string(),
                    "TunnelNotConnected",
                    format!(
                        "still connecting after {CONNECT_WAIT:?} ({other:?}); retrying in the background"
                    ),
                ),
            }
        }
    }

    /// Reserves the Domains and TCPEndpoints of the files that are not reserved
    /// yet: before any tunnel binds them.
    async fn reserve_new(&mut self, state: &DesiredState) {
        for d in &state.domains {
            if self.hosts_reserved.contains_key(&d.fqdn) {
                continue;
            }
            let request = if d.custom {
                CreateDomain {
                    subdomain: None,
                    domain: Some(d.fqdn.clone()),
                }
            } else {
                CreateDomain {
                    subdomain: Some(d.fqdn.split('.').next().unwrap_or(&d.fqdn).to_owned()),
                    domain: None,
                }
            };
            match self.edge.ensure_domain(&request).await {
                Ok(r) => {
                    self.hosts_reserved.insert(
                        d.fqdn.clone(),
                        Reservation {
                            adopted: r.adopted,
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
            let request = CreateTcpEndpoint {
                alias: ep.alias.clone(),
                port: None,
            };
            match self.edge.ensure_tcp_endpoint(&request).await {
                Ok(r) => {
                    self.tcp_reserved.insert(
                        ep.alias.clone(),
                        Reservation {
                            adopted: r.adopted,
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
        let published = self.publisher.keys();
        let gone: Vec<(String, Reservation)> = self
            .hosts_reserved
            .iter()
            .filter(|(fqdn, _)| {
                !state.domains.iter().any(|d| &d.fqdn == *fqdn)
                    && !published.contains(&TunnelKey::Host((*fqdn).clone()))
            })
            .map(|(f, r)| (f.clone(), *r))
            .collect();
        for (fqdn, r) in gone {
            self.hosts_reserved.remove(&fqdn);
            if r.releasable()
                && let Err(e) = gone_is_ok(self.edge.delete_domain(&fqdn).await)
            {
                self.problem(format!("host {fqdn}"), "ReleaseFailed", e.to_string());
            }
        }
        let in_use: Vec<String> = state.tcp.values().map(|t| tcp_alias(&t.endpoint)).collect();
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
                && let Err(e) = gone_is_ok(self.edge.delete_tcp_endpoint(&alias).await)
            {
                self.problem(
                    format!("TCP endpoint {alias}"),
                    "ReleaseFailed",
                    e.to_string(),
                );
            }
        }
    }

    /// Publishes a host; false when it could not even be started.
    async fn set_host(
        &mut self,
        state: &DesiredState,
        host: &str,
        routes: Vec<HttpRouteSpec>,
    ) -> Option<u64> {
        // A host no Domain reserves is an http Tunnel's subdomain: reserve it
        // for the tunnel's lifetime.
        if !self.hosts_reserved.contains_key(host) {
            let request = CreateDomain {
                subdomain: Some(host.split('.').next().unwrap_or(host).to_owned()),
                domain: None,
            };
            match self.edge.ensure_domain(&request).await {
                Ok(r) => {
                    self.hosts_reserved.insert(
                        host.to_owned(),
                        Reservation {
                            adopted: r.adopted,
                            policy: ReclaimPolicy::Delete,
                        },
                    );
                }
                Err(e) => {
                    self.problem(format!("host {host}"), "ReservationFailed", e.to_string());
                    return None;
                }
            }
        }
        let owner = state
            .hosts
            .get(host)
            .and_then(|p| p.publishers.first())
            .map(ToString::to_string)
            .unwrap_or_else(|| host.to_owned());
        let spec = self.spec(
            &owner,
            Serving::Http {
                host: host.to_owned(),
                routes,
            },
        );
        Some(
            self.publisher
                .publish(TunnelKey::Host(host.to_owned()), spec)
                .1,
        )
    }

    async fn set_tcp(&mut self, tunnel: &str, tcp: &PublishedTcp) -> Option<u64> {
        let alias = tcp_alias(&tcp.endpoint);
        let request = CreateTcpEndpoint {
            alias: alias.clone(),
            port: match tcp.endpoint {
                PortOrAlias::Port(p) => Some(p),
                PortOrAlias::Alias(_) => None,
            },
        };
        let reserved = match self.edge.ensure_tcp_endpoint(&request).await {
            Ok(r) => r,
            Err(e) => {
                self.problem(
                    super::desired::tcp_owner(tunnel),
                    "ReservationFailed",
                    e.to_string(),
                );
                return None;
            }
        };
        self.tcp_reserved.entry(alias).or_insert(Reservation {
            adopted: reserved.adopted,
            policy: ReclaimPolicy::Delete,
        });
        self.tcp_addrs.insert(
            tunnel.to_owned(),
            SocketAddr::new(self.tcp_host, reserved.object.port),
        );
        let spec = self.spec(
            tunnel,
            Serving::Tcp {
                endpoint: tcp_key(&tcp.endpoint),
                upstream: tcp.upstream.clone(),
            },
        );
        Some(
            self.publisher
                .publish(TunnelKey::Tcp(tunnel.to_owned()), spec)
                .1,
        )
    }

    fn snapshot(&self) -> Snapshot {
        let mut state = self.provider.state().clone();
        state.skipped.extend(self.problems.iter().cloned());
        let addresses = PublicAddresses {
            http_port: self.public_http_port,
            tcp: self.tcp_addrs.clone(),
        };
        Snapshot {
            report: render(&state, &addresses),
            state: self.provider.state().clone(),
            tcp: self.tcp_addrs.clone(),
        }
    }
}

/// What `start` builds for the embedded or the remote edge.
struct EdgeParts {
    api: Arc<dyn EdgeApi>,
    labels: BTreeMap<String, String>,
    handle: Option<EdgeHandle>,
    agent_addr: String,
    trust: Trust,
    server_name: Option<String>,
    ca_file: Option<PathBuf>,
    public_http_port: Option<u16>,
    tcp_host: IpAddr,
}

async fn embedded_edge(config: &StandaloneConfig) -> Result<EdgeParts, Error> {
    let names = vec![
        config.base_domain.clone(),
        format!("*.{}", config.base_domain),
    ];
    let identity = tuna_edge::tls::self_signed_identity(&config.data_dir, &names)
        .map_err(|e| Error::StandaloneEdge(format!("edge TLS: {e}")))?;
    let ca_file = identity
        .ca_file
        .clone()
        .ok_or_else(|| Error::StandaloneEdge("the edge generated no CA file".into()))?;
    let agent_tls = tuna_edge::tls::server_config(&identity, &[])
        .map_err(|e| Error::StandaloneEdge(format!("edge TLS: {e}")))?;
    let mut edge_config = EdgeConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), agent_tls);
    edge_config.http_addr = Some(config.http_listen);
    edge_config.tcp_bind_ip = config.tcp_bind;
    edge_config.tcp_ports = config.tcp_port_range.clone();
    edge_config.tcp_listeners = config.tcp_listeners.clone();
    let authority = MemoryAuthority::new();
    let embedded = Embedded::open(
        authority.clone(),
        &config.base_domain,
        config.tcp_port_range.clone(),
        &config.data_dir,
    )?;
    let edge = EdgeServer::start(edge_config, Arc::new(authority), None)
        .await
        .map_err(|e| Error::StandaloneEdge(format!("starting the embedded edge: {e}")))?;
    Ok(EdgeParts {
        api: Arc::new(embedded),
        labels: BTreeMap::new(),
        agent_addr: edge.agent_addr.to_string(),
        public_http_port: edge.http_addr.map(|a| a.port()),
        handle: Some(edge),
        trust: Trust::CaFile(ca_file.clone()),
        server_name: Some("localhost".to_owned()),
        ca_file: Some(ca_file),
        tcp_host: config.tcp_bind,
    })
}

/// The first call to a remote edge's API (`whoami`), retried while the edge
/// answers `429`: its budget for the key (or for a source address the key
/// shares, on an older edge) refills, so waiting is the fix, and exiting
/// would only restart the process into the same answer. The wait is the
/// edge's `Retry-After`, else a doubling backoff from 1 s, at most 30 s;
/// any other error ends the start as before.
async fn first_call(api: &RemoteEdgeApi, url: &str) -> Result<tuna_protocol::api::WhoAmI, Error> {
    let mut backoff = Duration::from_secs(1);
    loop {
        match api.whoami().await {
            Ok(who) => return Ok(who),
            Err(e) => match e.class() {
                crate::error::ErrorClass::RateLimited(retry_after) => {
                    let wait = retry_after.max(backoff).min(Duration::from_secs(30));
                    tracing::warn!(api = %url, wait_ms = wait.as_millis() as u64, "the edge API is rate limiting this client; retrying");
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
                _ => return Err(Error::StandaloneEdge(format!("edge API {url}: {e}"))),
            },
        }
    }
}

async fn remote_edge(config: &StandaloneConfig, remote: &RemoteEdge) -> Result<EdgeParts, Error> {
    let mut options =
        tuna_agent::client::ClientOptions::new(remote.api_url.clone(), remote.api_key.clone());
    if let Some(ca) = &remote.ca_file {
        options = options.with_ca_file(ca.clone());
    }
    let client = tuna_agent::client::TunaClient::new(options)
        .map_err(|e| Error::StandaloneEdge(format!("edge API client: {e}")))?;
    let api = RemoteEdgeApi::new(client);
    let who = first_call(&api, &remote.api_url).await?;
    tracing::info!(account = %who.account, base_domain = %who.base_domain, "connected to the edge API");
    // One instance id per data dir: a restart finds its own orphans.
    let instance = instance_id(&config.data_dir)?;
    match revoke_orphans(&api, &instance).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(revoked = n, "revoked tunnel tokens left by an earlier run"),
        Err(e) => tracing::warn!(error = %e, "could not revoke tokens left by an earlier run"),
    }
    let first_agent = remote.agent_addr.split(',').next().unwrap_or_default();
    let tcp_host = tokio::net::lookup_host(first_agent)
        .await
        .ok()
        .and_then(|mut a| a.next())
        .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |a| a.ip());
    Ok(EdgeParts {
        api: Arc::new(api),
        labels: BTreeMap::from([(INSTANCE_LABEL.to_owned(), instance)]),
        handle: None,
        agent_addr: remote.agent_addr.clone(),
        trust: match &remote.ca_file {
            Some(ca) => Trust::CaFile(ca.clone()),
            None => Trust::SystemRoots,
        },
        server_name: None,
        ca_file: remote.ca_file.clone(),
        public_http_port: None,
        tcp_host,
    })
}

impl Standalone {
    /// Starts everything and applies the files once; returns when every tunnel
    /// is connected (or reported as not connected after a bounded wait).
    pub async fn start(config: StandaloneConfig) -> Result<Self, Error> {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(Error::file("create", &config.data_dir))?;
        let options = DesiredOptions {
            base_domain: config.base_domain.to_ascii_lowercase(),
            ..DesiredOptions::default()
        };
        let provider = FileProvider::new(config.paths.clone(), options);
        let parts = match &config.remote {
            None => embedded_edge(&config).await?,
            Some(remote) => remote_edge(&config, remote).await?,
        };
        let http_addr = parts.handle.as_ref().and_then(|e| e.http_addr);

        let proxy = ProxyCore::new(ProxyConfig::default());
        let mut agent = AgentConfig::new(parts.agent_addr.clone(), parts.trust);
        agent.server_name = parts.server_name;
        agent.agent_name = format!("tuna-operator-standalone/{}", env!("CARGO_PKG_VERSION"));
        let publisher = Publisher::start(proxy, agent)
            .map_err(|e| Error::StandaloneEdge(format!("starting the tunnel agent: {e}")))?;
        let mut runtime = Runtime {
            publisher: publisher.clone(),
            edge: parts.api,
            labels: parts.labels,
            public_http_port: parts.public_http_port,
            tcp_host: parts.tcp_host,
            provider,
            problems: Vec::new(),
            hosts_reserved: BTreeMap::new(),
            tcp_reserved: BTreeMap::new(),
            tcp_addrs: BTreeMap::new(),
        };
        let initial = diff(&DesiredState::default(), runtime.provider.state());
        runtime.apply(initial).await;
        let (snapshot_tx, snapshot) = watch::channel(runtime.snapshot());
        let (generation_tx, generation) = watch::channel(0u64);
        let stop = CancellationToken::new();
        // The watcher owns the runtime: poll, apply, publish a snapshot.
        let task = {
            let stop = stop.clone();
            let interval = config.poll_interval;
            let print = config.print_reports;
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tick.tick() => {}
                    }
                    let Some(changes) = runtime.provider.poll() else {
                        continue;
                    };
                    tracing::info!(changes = changes.len(), "manifests changed");
                    runtime.apply(changes).await;
                    let snap = runtime.snapshot();
                    if print {
                        println!("{}", snap.report);
                    }
                    snapshot_tx.send_replace(snap);
                    generation_tx.send_modify(|g| *g += 1);
                }
            })
        };
        Ok(Self {
            publisher,
            edge: parts.handle,
            http_addr,
            agent_addr: parts.agent_addr,
            ca_file: parts.ca_file,
            snapshot,
            generation,
            stop,
            task: Some(task),
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
        self.snapshot.borrow().report.clone()
    }

    /// The current desired state.
    pub async fn state(&self) -> DesiredState {
        self.snapshot.borrow().state.clone()
    }

    /// Counts applied file changes; wait on it to see a change go live.
    pub fn generation(&self) -> watch::Receiver<u64> {
        self.generation.clone()
    }

    /// Public TCP address of a tcp Tunnel (`namespace/name`) or a TCPRoute
    /// (`TCPRoute/namespace/name`).
    pub async fn tcp_address(&self, tunnel: &str) -> Option<SocketAddr> {
        self.snapshot.borrow().tcp.get(tunnel).copied()
    }

    /// Session id of each published tunnel (`None` while not connected).
    pub async fn session_ids(&self) -> BTreeMap<TunnelKey, Option<String>> {
        self.publisher
            .keys()
            .into_iter()
            .map(|k| {
                let id = self.publisher.state(&k).and_then(|s| match &*s.borrow() {
                    TunnelState::Serving { session_id, .. } => Some(session_id.clone()),
                    _ => None,
                });
                (k, id)
            })
            .collect()
    }

    /// The token of a tunnel, for diagnostics and tests (never logged).
    pub async fn token(&self, key: &TunnelKey) -> Option<TunnelToken> {
        self.publisher.token(key)
    }

    /// Stops watching, closes every tunnel and revokes its token, drains the
    /// proxy and stops the embedded edge.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.publisher.shutdown().await;
        if let Some(edge) = self.edge.take() {
            edge.shutdown().await;
        }
    }
}

impl Drop for Standalone {
    /// Without [`Standalone::shutdown`] (a crash, a test): the watch stops and
    /// the tunnel tasks end with the handle, their tokens left at the edge for
    /// the next start to revoke; none lives on to renew or re-mint one.
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.publisher.abandon();
    }
}
