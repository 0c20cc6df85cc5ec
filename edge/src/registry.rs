//! Who serves what: public host → tunnel, public TCP port → tunnel, held
//! address and port (a Gateway's listener) → tunnel.
//!
//! A binding belongs to one tunnel (of one agent session) at a time. A tunnel
//! that claims a binding another tunnel holds takes it over — an agent that
//! reconnected before the edge noticed its old connection died, or a binding
//! moved from one tunnel to another; the authority has already checked that
//! the claimant's token may serve it. The displaced tunnel's session is told
//! ([`SessionEvent::Displaced`]) and closes that tunnel.
//!
//! A TCP port is taken over only between tunnels of one owner (account and
//! owner labels, [`RouteOwner`]): a bind that would displace a live tunnel of
//! another owner is refused, so that two tenants of one account naming the
//! same port (by alias and by number) cannot take turns on its connections.
//!
//! The tables sit behind `parking_lot` locks, which cannot be poisoned: a
//! panic somewhere while one is held does not stop routing for good.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tuna_protocol::mux::{self, Gate, MuxStream};
use tuna_protocol::wire::{Binding, BoundTarget, ErrorCode, Rejection, StreamKind, StreamMeta};

use crate::authority::Grant;
use crate::error::{Error, Result};
use crate::tasks::TaskGuard;

/// Most host names remembered as "served before" (for 503 instead of 404).
const MAX_OFFLINE_HOSTS: usize = 65_536;
/// First and longest pause after a failed accept on a TCP endpoint.
const ACCEPT_BACKOFF_MIN: std::time::Duration = std::time::Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(1);
/// Buffer size for each direction of a public TCP connection.
pub(crate) const TCP_COPY_BUFFER: usize = 64 * 1024;

/// One agent connection on the edge.
pub(crate) struct AgentSession {
    pub(crate) id: String,
    sender: h2::client::SendRequest<Bytes>,
    /// How long opening a stream may wait for the agent to grant one.
    open_timeout: std::time::Duration,
    /// Cancelled when the session ends; every tunnel's token is a child.
    pub(crate) closed: CancellationToken,
    /// What the registry tells the session's task (bindings taken away).
    events: mpsc::UnboundedSender<SessionEvent>,
}

impl AgentSession {
    pub(crate) fn new(
        id: String,
        sender: h2::client::SendRequest<Bytes>,
        open_timeout: std::time::Duration,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<SessionEvent>) {
        let (events, rx) = mpsc::unbounded_channel();
        let session = Arc::new(Self {
            id,
            sender,
            open_timeout,
            closed: CancellationToken::new(),
            events,
        });
        (session, rx)
    }
}

/// Something that happened to a session's tunnels outside its own task.
pub(crate) enum SessionEvent {
    /// Another tunnel took `target` over from `route`.
    Displaced {
        route: Arc<TunnelRoute>,
        target: BoundTarget,
    },
}

/// Whom a tunnel serves for: its credential's account and owner labels
/// ([`Grant::owner`]). Fleet hops have none (they are never bound here).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RouteOwner {
    account: String,
    labels: BTreeMap<String, String>,
}

impl RouteOwner {
    pub(crate) fn of(grant: &Grant) -> Self {
        Self {
            account: grant.account.clone(),
            labels: grant.owner.clone(),
        }
    }
}

/// One tunnel of an agent session: what a public host or TCP port routes to.
pub(crate) struct TunnelRoute {
    pub(crate) session: Arc<AgentSession>,
    /// The agent's id of the tunnel; every stream carries it.
    pub(crate) tunnel: String,
    /// Whom it serves for; fixed for the route's life (a tunnel id
    /// re-attached for another owner gets a new route).
    pub(crate) owner: RouteOwner,
    /// Cancelled when the tunnel closes (a child of the session's token):
    /// public connections watch it.
    pub(crate) closed: CancellationToken,
    /// Cuts the tunnel's open streams when it closes.
    gate: Arc<Gate>,
    /// What the tunnel serves: target → binding as the agent declared it.
    pub(crate) bound: Mutex<HashMap<BoundTarget, Binding>>,
}

/// The name the public HTTP path knows a route by.
pub(crate) type Session = TunnelRoute;

impl TunnelRoute {
    pub(crate) fn new(session: &Arc<AgentSession>, tunnel: String, owner: RouteOwner) -> Arc<Self> {
        Arc::new(Self {
            closed: session.closed.child_token(),
            session: Arc::clone(session),
            tunnel,
            owner,
            gate: Gate::new(),
            bound: Mutex::new(HashMap::new()),
        })
    }

    /// Opens a data stream to the agent for this tunnel. `meta.tunnel` must
    /// name this tunnel (the agent checks the stream against it).
    pub(crate) async fn open(&self, meta: &StreamMeta) -> Result<MuxStream> {
        if self.closed.is_cancelled() {
            return Err(Error::Closed("tunnel closed".into()));
        }
        if meta.tunnel != self.tunnel {
            return Err(Error::Protocol(format!(
                "stream metadata names tunnel {:?}, the route is tunnel {:?}",
                meta.tunnel, self.tunnel
            )));
        }
        let opening = mux::open_stream(&self.session.sender, meta, Arc::clone(&self.gate));
        let stream = tokio::time::timeout(self.session.open_timeout, opening)
            .await
            .map_err(|_| {
                Error::Closed(format!(
                    "the agent granted no stream within {:?}",
                    self.session.open_timeout
                ))
            })??;
        Ok(stream)
    }

    /// Ends the tunnel's streams and tells public connections it is gone.
    pub(crate) fn close(&self) {
        self.gate.close();
        self.closed.cancel();
    }

    /// The targets the tunnel serves now.
    pub(crate) fn targets(&self) -> Vec<BoundTarget> {
        self.bound.lock().keys().cloned().collect()
    }
}

struct PortEntry {
    route: Arc<TunnelRoute>,
    endpoint: String,
    listener: CancellationToken,
}

/// A listener on a held address and port (a Gateway's): its connections go
/// raw to one tunnel.
struct AddressEntry {
    route: Arc<TunnelRoute>,
    listener: CancellationToken,
}

/// What a public listener serves: a TCP endpoint's port on the edge's TCP
/// address, or one port of a held address.
#[derive(Clone, Copy, Debug)]
enum Listening {
    Port(u16),
    Address(SocketAddr),
}

impl std::fmt::Display for Listening {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listening::Port(port) => write!(f, "TCP port {port}"),
            Listening::Address(address) => write!(f, "address {address}"),
        }
    }
}

/// The other replicas of a fleet, as this registry needs them: a route to
/// one that serves a host or a TCP port. Implemented by the fleet's index
/// (`fleet.rs`), which the registry knows only through this.
pub(crate) trait Peers: Send + Sync {
    /// A route to a live replica that serves `host`.
    fn route_for_host(&self, host: &str) -> Option<Arc<TunnelRoute>>;
    /// A route to a live replica that serves TCP `port`.
    fn route_for_port(&self, port: u16) -> Option<Arc<TunnelRoute>>;
}

/// The routing table of the data plane.
/// How often a request waiting for its host's tunnel looks again, for a
/// tunnel that came back on another replica of a fleet.
const FLEET_LOOK: Duration = Duration::from_millis(250);

pub(crate) struct Registry {
    hosts: RwLock<HashMap<String, Arc<TunnelRoute>>>,
    ports: RwLock<HashMap<u16, PortEntry>>,
    /// Listeners on held addresses (Gateways'), by address and port.
    addresses: RwLock<HashMap<SocketAddr, AddressEntry>>,
    /// Hosts whose tunnel went away, and when.
    offline: Mutex<HashMap<String, Instant>>,
    /// Woken whenever a host is bound, for the requests that wait for
    /// their host's tunnel to come back ([`Self::route_for_host_within`]).
    host_bound: tokio::sync::Notify,
    tcp_ip: IpAddr,
    tcp_ports: RangeInclusive<u16>,
    /// Ports whose listeners the caller opened: always accepting, routed
    /// while a tunnel binds them.
    prebound: HashSet<u16>,
    /// Who may connect to the TCP endpoints, and for how long.
    tcp_admission: TcpAdmission,
    tasks: TaskGuard,
    me: Weak<Registry>,
    /// Number of open agent sessions (for health and for tests).
    pub(crate) sessions: tokio::sync::watch::Sender<usize>,
    /// Failed accepts on TCP endpoint listeners (out of descriptors…).
    pub(crate) accept_errors: std::sync::atomic::AtomicU64,
    /// The other replicas' attachments, when this edge is one of a fleet.
    fleet: std::sync::OnceLock<Arc<dyn Peers>>,
    /// Listeners of ports only other replicas serve (a fleet's TCP
    /// endpoints are served by every replica).
    fleet_listeners: Mutex<HashMap<u16, CancellationToken>>,
    /// Woken when a local binding is added or removed (the fleet's lease
    /// task publishes the new set).
    pub(crate) changed: tokio::sync::Notify,
}

impl Registry {
    /// A registry whose TCP endpoints bind `tcp_ip` on ports of `tcp_ports`,
    /// except the ports of `prebound`, listeners opened by the caller.
    pub(crate) fn new(
        tcp_ip: IpAddr,
        tcp_ports: RangeInclusive<u16>,
        prebound: &[Arc<std::net::TcpListener>],
        tcp_admission: TcpAdmission,
        tasks: TaskGuard,
    ) -> Result<Arc<Self>> {
        let mut listeners = Vec::with_capacity(prebound.len());
        for l in prebound {
            let port = l.local_addr()?.port();
            let l = l.try_clone()?;
            l.set_nonblocking(true)?;
            listeners.push((port, TcpListener::from_std(l)?));
        }
        let registry = Arc::new_cyclic(|me| Self {
            hosts: RwLock::new(HashMap::new()),
            ports: RwLock::new(HashMap::new()),
            addresses: RwLock::new(HashMap::new()),
            offline: Mutex::new(HashMap::new()),
            host_bound: tokio::sync::Notify::new(),
            tcp_ip,
            tcp_ports,
            prebound: listeners.iter().map(|(port, _)| *port).collect(),
            tcp_admission,
            tasks,
            me: me.clone(),
            sessions: tokio::sync::watch::Sender::new(0),
            accept_errors: std::sync::atomic::AtomicU64::new(0),
            fleet: std::sync::OnceLock::new(),
            fleet_listeners: Mutex::new(HashMap::new()),
            changed: tokio::sync::Notify::new(),
        });
        for (port, listener) in listeners {
            registry.accept_loop(
                Listening::Port(port),
                listener,
                registry.tasks.cancel.clone(),
            );
        }
        Ok(registry)
    }

    /// The tunnel serving `host` (lower case, no port): a local one, or
    /// else the hop to a replica of the fleet that has one.
    pub(crate) fn session_for_host(&self, host: &str) -> Option<Arc<TunnelRoute>> {
        self.local_route_for_host(host)
            .or_else(|| self.fleet.get()?.route_for_host(host))
    }

    /// The local tunnel serving `host`; never a hop (what hopped streams use).
    pub(crate) fn local_route_for_host(&self, host: &str) -> Option<Arc<TunnelRoute>> {
        self.hosts.read().get(host).cloned()
    }

    /// Makes this registry route to the fleet's other replicas.
    #[cfg(feature = "postgres")]
    pub(crate) fn set_fleet(&self, index: Arc<dyn Peers>) {
        let _ = self.fleet.set(index);
    }

    /// The hosts and ports local tunnels serve now.
    #[cfg(feature = "postgres")]
    pub(crate) fn local_targets(&self) -> (Vec<String>, Vec<u16>) {
        let hosts = self.hosts.read().keys().cloned().collect();
        let ports = self.ports.read().keys().copied().collect();
        (hosts, ports)
    }

    /// Listens on the ports in `remote` (served by other replicas) that no
    /// local tunnel binds, and stops listening on the ones no longer there.
    /// Ports outside this edge's range are left alone.
    #[cfg(feature = "postgres")]
    pub(crate) fn set_fleet_ports(&self, remote: HashSet<u16>) {
        let ports = self.ports.read();
        let mut fleet = self.fleet_listeners.lock();
        fleet.retain(|port, cancel| {
            let keep = remote.contains(port);
            if !keep {
                cancel.cancel();
            }
            keep
        });
        for port in remote {
            if ports.contains_key(&port)
                || fleet.contains_key(&port)
                || !(self.tcp_ports.contains(&port) || self.prebound.contains(&port))
            {
                continue;
            }
            match self.listen(port) {
                Ok(cancel) => {
                    fleet.insert(port, cancel);
                }
                Err(e) => {
                    tracing::warn!(port, reason = %e.message, "cannot serve a fleet TCP endpoint here")
                }
            }
        }
    }

    /// Whether a tunnel served `host` before and is gone now.
    pub(crate) fn host_went_offline(&self, host: &str) -> bool {
        self.offline.lock().contains_key(host)
    }

    /// The tunnel serving `host`, as [`Self::session_for_host`]; when there
    /// is none but one went away less than `grace` ago, waits for a tunnel
    /// to bind it again until `grace` after it went away. A host no tunnel
    /// ever served, or offline for longer, answers at once.
    pub(crate) async fn route_for_host_within(
        &self,
        host: &str,
        grace: Duration,
    ) -> Option<Arc<TunnelRoute>> {
        loop {
            // Registered before the look, so that a bind in between wakes it.
            let bound = self.host_bound.notified();
            tokio::pin!(bound);
            bound.as_mut().enable();
            if let Some(route) = self.session_for_host(host) {
                return Some(route);
            }
            let went = *self.offline.lock().get(host)?;
            let deadline = went + grace;
            if Instant::now() >= deadline {
                return None;
            }
            // A bind on this replica wakes it at once; one on another
            // replica of a fleet is seen at the next look.
            let look = match self.fleet.get() {
                Some(_) => deadline.min(Instant::now() + FLEET_LOOK),
                None => deadline,
            };
            let _ = tokio::time::timeout_at(look.into(), bound).await;
        }
    }

    /// The local tunnel serving TCP `port` and the endpoint's name; never a hop.
    pub(crate) fn local_route_for_port(&self, port: u16) -> Option<(Arc<TunnelRoute>, String)> {
        self.ports
            .read()
            .get(&port)
            .map(|e| (Arc::clone(&e.route), e.endpoint.clone()))
    }

    fn route_for_port(&self, port: u16) -> Option<(Arc<TunnelRoute>, String)> {
        self.local_route_for_port(port).or_else(|| {
            let route = self.fleet.get()?.route_for_port(port)?;
            Some((route, port.to_string()))
        })
    }

    /// The local tunnel serving a held `address` and port. Addresses are
    /// never served across a fleet: each lives on the host that has it.
    pub(crate) fn local_route_for_address(&self, address: SocketAddr) -> Option<Arc<TunnelRoute>> {
        self.addresses
            .read()
            .get(&address)
            .map(|e| Arc::clone(&e.route))
    }

    /// Where a connection accepted on `listening` goes now, and what its
    /// stream says it is.
    fn route_for(&self, listening: Listening) -> Option<(Arc<TunnelRoute>, StreamKind)> {
        match listening {
            Listening::Port(port) => self
                .route_for_port(port)
                .map(|(route, endpoint)| (route, StreamKind::Tcp { endpoint, port })),
            Listening::Address(address) => self
                .local_route_for_address(address)
                .map(|route| (route, StreamKind::Address { address })),
        }
    }

    /// Starts serving `target` through `route`, taking it over from any
    /// other tunnel — for a TCP port, only from a tunnel of the same owner
    /// or one already closed.
    pub(crate) fn bind(
        &self,
        route: &Arc<TunnelRoute>,
        binding: &Binding,
        target: &BoundTarget,
    ) -> Result<(), Rejection> {
        let displaced = match target {
            BoundTarget::Http { host } => {
                let previous = self.hosts.write().insert(host.clone(), Arc::clone(route));
                self.offline.lock().remove(host);
                self.host_bound.notify_waiters();
                previous.filter(|p| !Arc::ptr_eq(p, route))
            }
            BoundTarget::Tcp { port } => {
                let endpoint = match binding {
                    Binding::Tcp { endpoint } => endpoint.clone(),
                    Binding::Http { .. } | Binding::Address { .. } => port.to_string(),
                };
                let mut ports = self.ports.write();
                if let Some(entry) = ports.get_mut(port) {
                    if held_by_another_owner(&entry.route, route) {
                        // Not "newest wins" across owners: the displaced
                        // owner's agent would re-attach, and the two would
                        // take turns on the port's connections.
                        return Err(Rejection::new(
                            ErrorCode::BindingNotAllowed,
                            format!(
                                "TCP port {port} is served by a live tunnel of another owner \
                                 (its token's account or owner labels differ); a port moves \
                                 to another owner only once that tunnel has closed"
                            ),
                        ));
                    }
                    let previous = std::mem::replace(&mut entry.route, Arc::clone(route));
                    entry.endpoint = endpoint;
                    Some(previous).filter(|p| !Arc::ptr_eq(p, route))
                } else {
                    if !self.tcp_ports.contains(port) && !self.prebound.contains(port) {
                        return Err(Rejection::new(
                            ErrorCode::BindingUnavailable,
                            format!(
                                "port {port} is outside this edge's TCP range {}-{}",
                                self.tcp_ports.start(),
                                self.tcp_ports.end()
                            ),
                        ));
                    }
                    // A port other replicas serve is listened on already.
                    let fleet = self.fleet_listeners.lock().remove(port);
                    let listener = match fleet {
                        Some(listener) => listener,
                        None => self.listen(*port)?,
                    };
                    ports.insert(
                        *port,
                        PortEntry {
                            route: Arc::clone(route),
                            endpoint,
                            listener,
                        },
                    );
                    None
                }
            }
            BoundTarget::Address { address, port } => {
                let key = SocketAddr::new(*address, *port);
                let mut addresses = self.addresses.write();
                if let Some(entry) = addresses.get_mut(&key) {
                    if held_by_another_owner(&entry.route, route) {
                        return Err(Rejection::new(
                            ErrorCode::BindingNotAllowed,
                            format!(
                                "{key} is served by a live tunnel of another owner; it moves \
                                 to another owner only once that tunnel has closed"
                            ),
                        ));
                    }
                    let previous = std::mem::replace(&mut entry.route, Arc::clone(route));
                    Some(previous).filter(|p| !Arc::ptr_eq(p, route))
                } else {
                    let listener = self.listen_on(Listening::Address(key))?;
                    addresses.insert(
                        key,
                        AddressEntry {
                            route: Arc::clone(route),
                            listener,
                        },
                    );
                    None
                }
            }
        };
        route.bound.lock().insert(target.clone(), binding.clone());
        self.changed.notify_one();
        if let Some(previous) = displaced {
            tracing::info!(
                ?target,
                from_session = %previous.session.id,
                from_tunnel = %previous.tunnel,
                to_session = %route.session.id,
                to_tunnel = %route.tunnel,
                "binding moved to another tunnel"
            );
            previous.bound.lock().remove(target);
            // The session may be gone already; then nobody needs telling.
            let _ = previous.session.events.send(SessionEvent::Displaced {
                route: Arc::clone(&previous),
                target: target.clone(),
            });
        }
        Ok(())
    }

    /// Stops serving `target` through `route` (no-op if another tunnel holds it).
    pub(crate) fn unbind(&self, route: &Arc<TunnelRoute>, target: &BoundTarget) {
        route.bound.lock().remove(target);
        self.changed.notify_one();
        match target {
            BoundTarget::Http { host } => {
                let mut hosts = self.hosts.write();
                if hosts.get(host).is_some_and(|r| Arc::ptr_eq(r, route)) {
                    hosts.remove(host);
                    let mut offline = self.offline.lock();
                    if offline.len() >= MAX_OFFLINE_HOSTS {
                        offline.clear();
                    }
                    offline.insert(host.clone(), Instant::now());
                }
            }
            BoundTarget::Tcp { port } => {
                let mut ports = self.ports.write();
                if ports
                    .get(port)
                    .is_some_and(|e| Arc::ptr_eq(&e.route, route))
                    && let Some(entry) = ports.remove(port)
                {
                    let remote = self
                        .fleet
                        .get()
                        .is_some_and(|f| f.route_for_port(*port).is_some());
                    if remote {
                        // Another replica serves it still: keep listening.
                        self.fleet_listeners.lock().insert(*port, entry.listener);
                    } else {
                        entry.listener.cancel();
                    }
                }
            }
            BoundTarget::Address { address, port } => {
                let key = SocketAddr::new(*address, *port);
                let mut addresses = self.addresses.write();
                if addresses
                    .get(&key)
                    .is_some_and(|e| Arc::ptr_eq(&e.route, route))
                    && let Some(entry) = addresses.remove(&key)
                {
                    entry.listener.cancel();
                }
            }
        }
    }

    /// Forgets everything `route` served.
    pub(crate) fn remove_route(&self, route: &Arc<TunnelRoute>) {
        for target in route.targets() {
            self.unbind(route, &target);
        }
    }

    /// Binds the public TCP port now (so a busy port is reported to the
    /// agent) and serves it until cancelled. A prebound port is served already.
    fn listen(&self, port: u16) -> Result<CancellationToken, Rejection> {
        if self.prebound.contains(&port) {
            return Ok(CancellationToken::new());
        }
        self.listen_on(Listening::Port(port))
    }

    /// Binds the listener of `listening` now and serves it until cancelled.
    fn listen_on(&self, listening: Listening) -> Result<CancellationToken, Rejection> {
        let unavailable = |e: std::io::Error| {
            Rejection::new(
                ErrorCode::BindingUnavailable,
                format!("cannot listen on {listening}: {e}"),
            )
        };
        let at = match listening {
            Listening::Port(port) => SocketAddr::new(self.tcp_ip, port),
            Listening::Address(address) => address,
        };
        let std_listener = std::net::TcpListener::bind(at).map_err(unavailable)?;
        std_listener.set_nonblocking(true).map_err(unavailable)?;
        let listener = TcpListener::from_std(std_listener).map_err(unavailable)?;
        let cancel = self.tasks.cancel.child_token();
        self.accept_loop(listening, listener, cancel.clone());
        Ok(cancel)
    }

    /// Accepts public TCP connections on `listening` and forwards each to
    /// the tunnel bound to it at that moment (none: the connection closes).
    fn accept_loop(&self, listening: Listening, listener: TcpListener, stop: CancellationToken) {
        let registry = self.me.clone();
        let guard = self.tasks.clone();
        tokio::spawn(async move {
            let _guard = guard;
            let mut backoff = ACCEPT_BACKOFF_MIN;
            loop {
                let accepted = tokio::select! {
                    _ = stop.cancelled() => return,
                    a = listener.accept() => a,
                };
                let (tcp, client_addr) = match accepted {
                    Ok(a) => {
                        backoff = ACCEPT_BACKOFF_MIN;
                        a
                    }
                    Err(e) => {
                        // Out of descriptors (EMFILE) and the like: the
                        // pending connection stays, so retrying at once spins.
                        if let Some(registry) = registry.upgrade() {
                            registry
                                .accept_errors
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        tracing::warn!(%listening, error = %e, retry_in = ?backoff, "accept on TCP endpoint failed");
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                        continue;
                    }
                };
                let Some(registry) = registry.upgrade() else {
                    return;
                };
                let admission = &registry.tcp_admission;
                if crate::proxy_header::is_trusted(&admission.trusted_proxies, client_addr) {
                    let registry = Arc::clone(&registry);
                    tokio::spawn(async move {
                        let mut tcp = tcp;
                        let client = match crate::proxy_header::client_of(&mut tcp, client_addr)
                            .await
                        {
                            Ok(client) => client,
                            Err(e) => {
                                tracing::debug!(peer = %client_addr, error = %e, "closing a trusted proxy's connection");
                                return;
                            }
                        };
                        let admission = &registry.tcp_admission;
                        let Some(slot) = admission.budget.try_acquire(client.ip()) else {
                            tracing::debug!(%listening, %client, "TCP endpoint connection cap reached; closing");
                            return;
                        };
                        if let Some((route, kind)) = registry.route_for(listening) {
                            let timeouts = admission.timeouts;
                            forward_tcp(tcp, client, kind, route, timeouts, slot).await;
                        }
                    });
                    continue;
                }
                // Refused at accept, before anything else is spent on it.
                let Some(slot) = admission.budget.try_acquire(client_addr.ip()) else {
                    tracing::debug!(%listening, client = %client_addr, "TCP endpoint connection cap reached; closing");
                    continue;
                };
                let Some((route, kind)) = registry.route_for(listening) else {
                    continue;
                };
                let timeouts = admission.timeouts;
                tokio::spawn(forward_tcp(tcp, client_addr, kind, route, timeouts, slot));
            }
        });
    }
}

/// Whether `holder`, serving a TCP port or an address now, is a live tunnel
/// of another owner than `claimant`'s: then the claimant may not take it.
fn held_by_another_owner(holder: &Arc<TunnelRoute>, claimant: &Arc<TunnelRoute>) -> bool {
    !Arc::ptr_eq(holder, claimant)
        && holder.owner != claimant.owner
        && !holder.closed.is_cancelled()
}

/// Who may connect to the public TCP endpoints, and for how long: one
/// budget over every endpoint (its total and per-client caps), the
/// timeouts, and the trusted proxies whose PROXY v2 header names the client.
#[derive(Clone)]
pub(crate) struct TcpAdmission {
    pub(crate) budget: crate::budget::PreAuthBudget,
    pub(crate) timeouts: TcpTimeouts,
    pub(crate) trusted_proxies: Arc<[crate::public::IpCidr]>,
}

impl TcpAdmission {
    pub(crate) fn new(
        limits: &crate::budget::EdgeLimits,
        trusted_proxies: &[crate::public::IpCidr],
    ) -> Self {
        Self {
            budget: crate::budget::PreAuthBudget::new_fixed(
                limits.max_tcp_connections,
                limits.max_tcp_connections_per_ip,
            ),
            timeouts: TcpTimeouts {
                first_byte: limits.tcp_first_byte_timeout,
                idle: limits.tcp_idle_timeout,
            },
            trusted_proxies: Arc::from(trusted_proxies.to_vec()),
        }
    }
}

/// See [`crate::budget::EdgeLimits::tcp_first_byte_timeout`] and `tcp_idle_timeout`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TcpTimeouts {
    pub(crate) first_byte: std::time::Duration,
    pub(crate) idle: std::time::Duration,
}

/// A stream that notes that a byte moved through it (either way).
struct Watched<S> {
    inner: S,
    moved: Arc<std::sync::atomic::AtomicBool>,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.moved.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        poll
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(poll, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.moved.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        poll
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Resolves once `moved` stayed unset for the first-byte timeout (the
/// first period) or for the idle timeout (every later one).
async fn idle(moved: Arc<std::sync::atomic::AtomicBool>, timeouts: TcpTimeouts) {
    let mut period = timeouts.first_byte;
    loop {
        tokio::time::sleep(period).await;
        if !moved.swap(false, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        period = timeouts.idle;
    }
}

async fn forward_tcp(
    tcp: tokio::net::TcpStream,
    client_addr: SocketAddr,
    kind: StreamKind,
    route: Arc<TunnelRoute>,
    timeouts: TcpTimeouts,
    _slot: crate::budget::PreAuthSlot,
) {
    let _ = tcp.set_nodelay(true);
    let moved = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tcp = Watched {
        inner: tcp,
        moved: Arc::clone(&moved),
    };
    let listening = match &kind {
        StreamKind::Address { address } => Listening::Address(*address),
        StreamKind::Tcp { port, .. } => Listening::Port(*port),
        StreamKind::Http { .. } => return,
    };
    let meta = StreamMeta {
        client_addr,
        kind,
        tunnel: route.tunnel.clone(),
    };
    let mut stream = match route.open(&meta).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(%listening, error = %e, "could not open a stream for a TCP client");
            return;
        }
    };
    let closed = route.closed.clone();
    tokio::select! {
        _ = closed.cancelled() => {}
        () = idle(moved, timeouts) => {
            tracing::debug!(%listening, client = %client_addr, "TCP endpoint connection idle; closing");
        }
        r = tokio::io::copy_bidirectional_with_sizes(&mut tcp, &mut stream, TCP_COPY_BUFFER, TCP_COPY_BUFFER) => {
            if let Err(e) = r {
                tracing::debug!(%listening, error = %e, "TCP endpoint connection ended with an error");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Arc<Registry> {
        let (guard, _set) = crate::tasks::task_set();
        Registry::new(
            "127.0.0.1".parse().unwrap(),
            1..=1,
            &[],
            TcpAdmission::new(&crate::budget::EdgeLimits::default(), &[]),
            guard,
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_panic_while_a_table_is_locked_does_not_stop_routing() {
        let registry = registry();
        let r = Arc::clone(&registry);
        let panicked = std::thread::spawn(move || {
            let _hosts = r.hosts.write();
            let _offline = r.offline.lock();
            panic!("a bug while holding the routing tables");
        })
        .join();
        assert!(panicked.is_err());
        // Lookups keep working after the panic.
        assert!(registry.session_for_host("app.example").is_none());
        assert!(!registry.host_went_offline("app.example"));
    }

    /// Counts the accept errors of `port`'s accept loop while a pending
    /// connection cannot be accepted (no file descriptor left). Runs in a
    /// child process whose descriptor limit the parent lowered.
    #[test]
    fn accept_errors_back_off_instead_of_spinning() {
        if std::env::var_os("TUNA_EMFILE_CHILD").is_some() {
            return emfile_child();
        }
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg("ulimit -n 64 && exec \"$0\" --exact --nocapture registry::tests::accept_errors_back_off_instead_of_spinning")
            .arg(&exe)
            .env("TUNA_EMFILE_CHILD", "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("accept errors:"), "{stdout}");
    }

    fn emfile_child() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let listener = Arc::new(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
            let port = listener.local_addr().unwrap().port();
            let (guard, _set) = crate::tasks::task_set();
            let registry = Registry::new(
                "127.0.0.1".parse().unwrap(),
                1..=1,
                &[listener],
                TcpAdmission::new(&crate::budget::EdgeLimits::default(), &[]),
                guard,
            )
            .unwrap();
            let _client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            // Use up every descriptor left.
            let mut hoard = Vec::new();
            while let Ok(f) = std::fs::File::open("/dev/null") {
                hoard.push(f);
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let errors = registry
                .accept_errors
                .load(std::sync::atomic::Ordering::Relaxed);
            drop(hoard);
            println!("accept errors: {errors}");
            // Backing off from 10 ms doubling to 1 s: a handful in 500 ms;
            // a spinning loop makes tens of thousands.
            assert!(
                errors < 50,
                "the accept loop spun: {errors} errors in 500 ms"
            );
        });
    }
}
