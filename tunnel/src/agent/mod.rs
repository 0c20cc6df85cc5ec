//! The agent: one outbound connection to the edge carrying many tunnels,
//! each attached with its own tunnel token and bindings. Public connections
//! arrive as [`MuxStream`]s with their [`StreamMeta`], which names the tunnel.
//!
//! ```no_run
//! # async fn demo() -> tuna_tunnel::Result<()> {
//! use tuna_tunnel::agent::{Agent, AgentConfig, Trust};
//! use tuna_tunnel::wire::{Binding, TunnelToken};
//! let config = AgentConfig::new("edge.example:7443", Trust::SystemRoots);
//! let (handle, mut streams) = Agent::start_with_channel(config, 1024)?;
//! handle
//!     .attach("shop/web", TunnelToken::new("tunat_…"), vec![Binding::http("app.example")])
//!     .await?;
//! while let Some((stream, meta)) = streams.recv().await {
//!     // serve only what tunnel `meta.tunnel` publishes, e.g. serve_stream(stream, meta)
//!     # drop((stream, meta));
//! }
//! # drop(handle); Ok(()) }
//! ```
//!
//! * The agent connects once it has a tunnel, and reconnects by itself with
//!   jittered, capped exponential backoff; every reconnect re-attaches every
//!   tunnel (the first [`crate::wire::MAX_HELLO_TUNNELS`] in the hello, the
//!   rest right after it).
//! * [`AgentHandle::attach`], [`AgentHandle::detach`],
//!   [`AgentHandle::set_bindings`] and [`AgentHandle::set_token`] record the
//!   change (kept across reconnects) and send it at once when connected, as a
//!   control message, never as a reconnect. They do not wait for the edge;
//!   watch [`AgentHandle::tunnel_status`] for the outcome.
//! * A tunnel the edge refuses ([`TunnelStatus::Refused`]: bad token, no
//!   binding allowed, quota) or closes ([`TunnelStatus::Closed`]: token
//!   revoked or expired, binding taken over or released) is **not** retried
//!   by the agent, on this connection or after a reconnect, until the caller
//!   calls `attach` or `set_token` for it again — a fixed Secret or a
//!   re-minted token recovers it; retrying a token the edge refused would
//!   only be refused again.
//! * A data stream is handed to the [`StreamHandler`] only if its tunnel is
//!   attached and the stream's host (or TCP endpoint) is one of the bindings
//!   that tunnel declared; other streams are refused. When a tunnel closes,
//!   its open streams fail on their next read or write.
//!
//! Dropping the [`AgentHandle`] stops the agent.

mod session;
mod tls;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::mux::MuxStream;
use crate::wire::{
    Attach, Binding, BindingOutcome, Frame, MAX_ATTACH_LEN, MAX_BINDINGS, Rejection, StreamMeta,
    TunnelToken, validate_tunnel_id,
};
use crate::{Error, Result};

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
/// handle ([`AgentHandle::attach`]).
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

/// Where the connection to the edge stands; watch it with [`AgentHandle::status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentStatus {
    /// No tunnel to serve (none attached, or all refused/closed): not connected.
    Idle,
    /// Dialling or handshaking; `attempt` counts failures since the last session.
    Connecting {
        /// Consecutive failed attempts.
        attempt: u32,
    },
    /// A session is open and the edge has answered the tunnels of its hello.
    Connected {
        /// The edge's id of the session.
        session_id: String,
    },
    /// The edge refused the connection itself (e.g. a protocol version it
    /// does not speak). The agent keeps retrying with backoff.
    Rejected(Rejection),
    /// The session or an attempt failed for another reason; retrying.
    Disconnected {
        /// Human-readable cause.
        reason: String,
    },
    /// The handle was dropped or shut down.
    Stopped,
}

/// Where one tunnel stands; watch it with [`AgentHandle::tunnel_status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelStatus {
    /// Attached by the caller; waiting for a connection or the edge's answer.
    Pending,
    /// The edge serves the tunnel on this session.
    Serving {
        /// The session carrying it.
        session_id: String,
        /// Each binding and what the edge made of it (a target, or why not).
        bound: Vec<BindingOutcome>,
    },
    /// The edge refused the attach (bad or expired token, no binding
    /// allowed, quota). Retried only when the caller calls `attach` or
    /// `set_token` again.
    Refused(Rejection),
    /// The edge closed the tunnel (token revoked or expired, binding taken
    /// over or released). Retried only when the caller calls `attach` or
    /// `set_token` again.
    Closed(Rejection),
    /// The connection is lost; the tunnel is re-attached when it is back.
    Disconnected {
        /// Human-readable cause.
        reason: String,
    },
}

/// Receives the streams of public connections. Called on the agent's task:
/// spawn, don't block.
pub trait StreamHandler: Send + Sync + 'static {
    /// One public connection of tunnel `meta.tunnel` (HTTP/1.1 bytes or raw
    /// TCP, see `meta.kind`).
    fn handle(&self, stream: MuxStream, meta: StreamMeta);
}

impl<F> StreamHandler for F
where
    F: Fn(MuxStream, StreamMeta) + Send + Sync + 'static,
{
    fn handle(&self, stream: MuxStream, meta: StreamMeta) {
        self(stream, meta)
    }
}

/// A tunnel as the caller wants it.
pub(crate) struct DesiredTunnel {
    pub(crate) token: TunnelToken,
    pub(crate) bindings: BTreeSet<Binding>,
    /// Bumped by `attach` and `set_token`: a new attach goes to the edge.
    pub(crate) generation: u64,
    /// The generation the edge refused or closed: not attached again until
    /// the caller bumps the generation.
    pub(crate) parked: Option<u64>,
    /// The edge accepted it once (preferred in a hello: likely valid).
    pub(crate) served: bool,
    pub(crate) status: watch::Sender<TunnelStatus>,
}

impl DesiredTunnel {
    pub(crate) fn attachable(&self) -> bool {
        self.parked != Some(self.generation)
    }
}

/// What the caller asked for, and which tunnels changed since the agent's
/// task last looked.
#[derive(Default)]
pub(crate) struct Desired {
    pub(crate) tunnels: HashMap<String, DesiredTunnel>,
    pub(crate) dirty: Dirty,
    next_generation: u64,
}

/// Tunnels whose changes are not sent yet, in the order the caller made
/// them (a detach before an attach frees a quota the attach needs).
#[derive(Default)]
pub(crate) struct Dirty {
    order: VecDeque<String>,
    queued: HashSet<String>,
}

impl Dirty {
    pub(crate) fn insert(&mut self, id: &str) {
        if self.queued.insert(id.to_owned()) {
            self.order.push_back(id.to_owned());
        }
    }

    /// Up to `n` ids, oldest change first.
    pub(crate) fn take(&mut self, n: usize) -> Vec<String> {
        let n = n.min(self.order.len());
        let batch: Vec<String> = self.order.drain(..n).collect();
        for id in &batch {
            self.queued.remove(id);
        }
        batch
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// State shared by the handle and the agent task.
pub(crate) struct Shared {
    pub(crate) desired: Mutex<Desired>,
    /// Wakes the task: a tunnel changed.
    pub(crate) wake: Notify,
    pub(crate) status: watch::Sender<AgentStatus>,
}

impl Shared {
    fn changed(&self, desired: &mut Desired, id: &str) {
        desired.dirty.insert(id);
        self.wake.notify_one();
    }
}

fn check_tunnel(id: &str, token: &TunnelToken, bindings: &BTreeSet<Binding>) -> Result<()> {
    validate_tunnel_id(id).map_err(|r| Error::Config(r.message))?;
    if bindings.len() > MAX_BINDINGS {
        return Err(Error::Config(format!(
            "tunnel {id:?} has {} bindings; at most {MAX_BINDINGS}",
            bindings.len()
        )));
    }
    for b in bindings {
        b.validate().map_err(|r| Error::Config(r.message))?;
    }
    let frame = Frame::Attach(Attach {
        tunnel: id.to_owned(),
        seq: u64::MAX,
        token: token.clone(),
        bindings: bindings.iter().cloned().collect(),
    });
    let len = frame.encode().map(|b| b.len()).unwrap_or(usize::MAX);
    if len > MAX_ATTACH_LEN {
        return Err(Error::Config(format!(
            "tunnel {id:?} with its token and bindings takes {len} bytes; at most {MAX_ATTACH_LEN} (split it into several tunnels)"
        )));
    }
    Ok(())
}

/// One session's machinery: the agent of one edge address.
struct Link {
    status: watch::Receiver<AgentStatus>,
    shared: Arc<Shared>,
    _guard: DropGuard,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Link {
    fn start(config: AgentConfig, handler: Arc<dyn StreamHandler>) -> Result<Self> {
        let connector = tls::connector(&config.trust)?;
        let server_name = tls::server_name(&config)?;
        let (status, status_rx) = watch::channel(AgentStatus::Idle);
        let shared = Arc::new(Shared {
            desired: Mutex::new(Desired::default()),
            wake: Notify::new(),
            status,
        });
        let cancel = CancellationToken::new();
        let task = tokio::spawn(session::run(
            config,
            connector,
            server_name,
            Arc::clone(&shared),
            handler,
            cancel.clone(),
        ));
        Ok(Self {
            status: status_rx,
            shared,
            _guard: cancel.drop_guard(),
            task: Some(task),
        })
    }

    /// A watch of the connection's status (wait with `wait_for`).
    fn status(&self) -> watch::Receiver<AgentStatus> {
        self.status.clone()
    }

    /// Attaches tunnel `id` with `token` and `bindings`, or replaces the
    /// token and bindings of an attached one (and retries it if the edge had
    /// refused or closed it). Recorded at once and kept across reconnects;
    /// sent now if connected. Does not wait for the edge: see
    /// [`AgentHandle::tunnel_status`] or [`AgentHandle::serving`].
    /// Fails on an unusable id or bindings, or when the agent stopped.
    async fn attach(
        &self,
        id: impl Into<String>,
        token: TunnelToken,
        bindings: Vec<Binding>,
    ) -> Result<()> {
        let id = id.into();
        let bindings: BTreeSet<Binding> = bindings.into_iter().collect();
        check_tunnel(&id, &token, &bindings)?;
        self.alive()?;
        let mut desired = self.shared.desired.lock();
        desired.next_generation += 1;
        let generation = desired.next_generation;
        match desired.tunnels.get_mut(&id) {
            Some(t) => {
                let was_parked = !t.attachable();
                t.token = token;
                t.bindings = bindings;
                t.generation = generation;
                if was_parked {
                    t.status.send_replace(TunnelStatus::Pending);
                }
            }
            None => {
                let (status, _) = watch::channel(TunnelStatus::Pending);
                desired.tunnels.insert(
                    id.clone(),
                    DesiredTunnel {
                        token,
                        bindings,
                        generation,
                        parked: None,
                        served: false,
                        status,
                    },
                );
            }
        }
        self.shared.changed(&mut desired, &id);
        Ok(())
    }

    /// Detaches tunnel `id`: the edge stops serving it and its open streams
    /// end. Watches of its status see their sender go away. Detaching an
    /// unknown id does nothing.
    async fn detach(&self, id: &str) -> Result<()> {
        self.alive()?;
        let mut desired = self.shared.desired.lock();
        if desired.tunnels.remove(id).is_some() {
            self.shared.changed(&mut desired, id);
        }
        Ok(())
    }

    /// Replaces the bindings of tunnel `id`; only the difference travels, as
    /// one control message on the open session. A refused binding shows in
    /// the tunnel's status (`Serving { bound }` with an error) and stays
    /// declared: it is judged again at the next attach.
    async fn set_bindings(&self, id: &str, bindings: Vec<Binding>) -> Result<()> {
        let bindings: BTreeSet<Binding> = bindings.into_iter().collect();
        self.alive()?;
        let mut desired = self.shared.desired.lock();
        let tunnel = desired
            .tunnels
            .get_mut(id)
            .ok_or_else(|| Error::UnknownTunnel(id.to_owned()))?;
        check_tunnel(id, &tunnel.token, &bindings)?;
        if tunnel.bindings != bindings {
            tunnel.bindings = bindings;
            self.shared.changed(&mut desired, id);
        }
        Ok(())
    }

    /// Replaces the token of tunnel `id` (a renewed or re-minted token) for
    /// that tunnel only: the edge re-attaches it with the new token without
    /// interrupting it; a refused or closed tunnel is retried.
    async fn set_token(&self, id: &str, token: TunnelToken) -> Result<()> {
        self.alive()?;
        let mut desired = self.shared.desired.lock();
        desired.next_generation += 1;
        let generation = desired.next_generation;
        let tunnel = desired
            .tunnels
            .get_mut(id)
            .ok_or_else(|| Error::UnknownTunnel(id.to_owned()))?;
        check_tunnel(id, &token, &tunnel.bindings)?;
        let was_parked = !tunnel.attachable();
        tunnel.token = token;
        tunnel.generation = generation;
        if was_parked {
            tunnel.status.send_replace(TunnelStatus::Pending);
        }
        self.shared.changed(&mut desired, id);
        Ok(())
    }

    /// A watch of tunnel `id`'s status; `None` if it is not attached.
    fn tunnel_status(&self, id: &str) -> Option<watch::Receiver<TunnelStatus>> {
        self.shared
            .desired
            .lock()
            .tunnels
            .get(id)
            .map(|t| t.status.subscribe())
    }

    /// The ids of the attached tunnels, sorted.
    fn tunnels(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.shared.desired.lock().tunnels.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// The bindings tunnel `id` declares.
    fn bindings(&self, id: &str) -> Option<BTreeSet<Binding>> {
        self.shared
            .desired
            .lock()
            .tunnels
            .get(id)
            .map(|t| t.bindings.clone())
    }

    fn alive(&self) -> Result<()> {
        if matches!(*self.status.borrow(), AgentStatus::Stopped) {
            return Err(Error::Closed("agent stopped".into()));
        }
        Ok(())
    }

    /// Stops the agent and waits until its session is closed.
    async fn shutdown(mut self) {
        if let Some(task) = self.task.take() {
            drop(std::mem::replace(
                &mut self._guard,
                CancellationToken::new().drop_guard(),
            ));
            let _ = task.await;
        }
    }
}

/// Entry point; see the module docs.
pub struct Agent;

impl Agent {
    /// Starts the agent task; public connections go to `handler`. It
    /// connects once a tunnel is attached. Fails only on unusable
    /// configuration (e.g. unreadable CA file).
    ///
    /// With several edge addresses ([`AgentConfig::edge_addr`] holding
    /// `host:port` entries separated by commas, or a host name resolving to
    /// several addresses), one session per address, each carrying every
    /// tunnel: see [`AgentHandle::tunnel_status`] for how their states combine.
    pub fn start(config: AgentConfig, handler: impl StreamHandler) -> Result<AgentHandle> {
        let handler: Arc<dyn StreamHandler> = Arc::new(handler);
        let targets = edge_targets(&config)?;
        let links = targets
            .into_iter()
            .map(|(addr, name)| {
                let mut link = config.clone();
                link.edge_addr = addr;
                link.server_name = config.server_name.clone().or(name);
                Link::start(link, Arc::clone(&handler))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(AgentHandle::new(links))
    }

    /// Like [`Agent::start`], but yields streams on a bounded channel; when the
    /// channel is full, new streams are refused (reset) rather than queued.
    pub fn start_with_channel(
        config: AgentConfig,
        capacity: usize,
    ) -> Result<(AgentHandle, mpsc::Receiver<(MuxStream, StreamMeta)>)> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let handle = Self::start(config, move |stream: MuxStream, meta: StreamMeta| {
            if tx.try_send((stream, meta)).is_err() {
                tracing::warn!("stream channel full or closed; refusing a public connection");
            }
        })?;
        Ok((handle, rx))
    }
}

/// The addresses to hold a session with, each with the TLS name to check
/// when it is not the address's own host: every comma-separated entry of
/// `edge_addr`; a host name resolving to several addresses gives one per
/// address (checked against the name). A name resolving to one address (or
/// not at all, yet) stays a name, dialled afresh at each reconnect, so a
/// replaced replica with a new address is found again.
fn edge_targets(config: &AgentConfig) -> Result<Vec<(String, Option<String>)>> {
    let mut targets: Vec<(String, Option<String>)> = Vec::new();
    for entry in config.edge_addr.split(',').map(str::trim) {
        if entry.is_empty() {
            continue;
        }
        let host = match entry.rsplit_once(':') {
            Some((host, port)) if port.parse::<u16>().is_ok() => {
                host.trim_start_matches('[').trim_end_matches(']')
            }
            _ => {
                return Err(Error::Config(format!(
                    "edge address {entry:?} is not host:port"
                )));
            }
        };
        let mut resolved: Vec<String> = Vec::new();
        if host.parse::<std::net::IpAddr>().is_err() {
            // A blocking lookup, once at start (the system resolver; the
            // agent dials names the same way).
            use std::net::ToSocketAddrs;
            if let Ok(addrs) = entry.to_socket_addrs() {
                for a in addrs {
                    let a = a.to_string();
                    if !resolved.contains(&a) {
                        resolved.push(a);
                    }
                }
            }
        }
        if resolved.len() > 1 {
            for a in resolved {
                targets.push((a, Some(host.to_owned())));
            }
        } else {
            targets.push((entry.to_owned(), None));
        }
    }
    targets.dedup();
    if targets.is_empty() {
        return Err(Error::Config("no edge address given".into()));
    }
    Ok(targets)
}

/// Controls a running agent. Dropping it stops the agent and closes its
/// sessions.
pub struct AgentHandle {
    links: Vec<Link>,
    /// The combined status (the only link's, with one address).
    status: watch::Receiver<AgentStatus>,
    /// Combined tunnel statuses, with several links.
    merged: Mutex<HashMap<String, watch::Receiver<TunnelStatus>>>,
    /// Ends the tasks that combine statuses.
    cancel: CancellationToken,
}

impl Drop for AgentHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl AgentHandle {
    fn new(links: Vec<Link>) -> Self {
        let cancel = CancellationToken::new();
        let status = if links.len() == 1 {
            links[0].status()
        } else {
            let inner: Vec<_> = links.iter().map(Link::status).collect();
            let (tx, rx) = watch::channel(merge_agent(&inner));
            tokio::spawn(merge_task(inner, tx, merge_agent, cancel.clone()));
            rx
        };
        Self {
            links,
            status,
            merged: Mutex::new(HashMap::new()),
            cancel,
        }
    }

    /// A watch of the connection's status (wait with `wait_for`). With
    /// several edge addresses: `Connected` while any session is open (the
    /// first one's id), else the first address's status.
    pub fn status(&self) -> watch::Receiver<AgentStatus> {
        self.status.clone()
    }

    /// The number of sessions the agent keeps (one per edge address).
    pub fn sessions(&self) -> usize {
        self.links.len()
    }

    /// The id of the open session, if any.
    pub fn session_id(&self) -> Option<String> {
        match &*self.status.borrow() {
            AgentStatus::Connected { session_id } => Some(session_id.clone()),
            _ => None,
        }
    }

    /// Waits until a session is open and returns its id.
    pub async fn connected(&self) -> Result<String> {
        let mut rx = self.status.clone();
        let status = rx
            .wait_for(|s| matches!(s, AgentStatus::Connected { .. } | AgentStatus::Stopped))
            .await
            .map_err(|_| Error::Closed("agent stopped".into()))?;
        match &*status {
            AgentStatus::Connected { session_id } => Ok(session_id.clone()),
            _ => Err(Error::Closed("agent stopped".into())),
        }
    }

    /// Attaches tunnel `id` with `token` and `bindings`, or replaces the
    /// token and bindings of an attached one (and retries it if the edge had
    /// refused or closed it), on every session. Recorded at once and kept
    /// across reconnects; sent now if connected. Does not wait for the edge:
    /// see [`AgentHandle::tunnel_status`] or [`AgentHandle::serving`].
    /// Fails on an unusable id or bindings, or when the agent stopped.
    pub async fn attach(
        &self,
        id: impl Into<String>,
        token: TunnelToken,
        bindings: Vec<Binding>,
    ) -> Result<()> {
        let id = id.into();
        for link in &self.links {
            link.attach(id.clone(), token.clone(), bindings.clone())
                .await?;
        }
        if self.links.len() > 1 {
            let mut merged = self.merged.lock();
            if let std::collections::hash_map::Entry::Vacant(entry) = merged.entry(id) {
                let inner: Vec<_> = self
                    .links
                    .iter()
                    .filter_map(|l| l.tunnel_status(entry.key()))
                    .collect();
                let (tx, rx) = watch::channel(merge_tunnel(&inner));
                tokio::spawn(merge_task(inner, tx, merge_tunnel, self.cancel.clone()));
                entry.insert(rx);
            }
        }
        Ok(())
    }

    /// Detaches tunnel `id`: the edge stops serving it and its open streams
    /// end. Watches of its status see their sender go away. Detaching an
    /// unknown id does nothing.
    pub async fn detach(&self, id: &str) -> Result<()> {
        for link in &self.links {
            link.detach(id).await?;
        }
        self.merged.lock().remove(id);
        Ok(())
    }

    /// Replaces the bindings of tunnel `id`; only the difference travels, as
    /// one control message on each open session. A refused binding shows in
    /// the tunnel's status (`Serving { bound }` with an error) and stays
    /// declared: it is judged again at the next attach.
    pub async fn set_bindings(&self, id: &str, bindings: Vec<Binding>) -> Result<()> {
        for link in &self.links {
            link.set_bindings(id, bindings.clone()).await?;
        }
        Ok(())
    }

    /// Replaces the token of tunnel `id` (a renewed or re-minted token) for
    /// that tunnel only: the edge re-attaches it with the new token without
    /// interrupting it; a refused or closed tunnel is retried.
    pub async fn set_token(&self, id: &str, token: TunnelToken) -> Result<()> {
        for link in &self.links {
            link.set_token(id, token.clone()).await?;
        }
        Ok(())
    }

    /// A watch of tunnel `id`'s status; `None` if it is not attached. With
    /// several sessions the states combine: `Serving` while any session
    /// serves it (losing one replica moves no tunnel out of `Serving`), else
    /// `Closed` or `Refused` when an edge said so, else `Pending`, else
    /// `Disconnected`.
    pub fn tunnel_status(&self, id: &str) -> Option<watch::Receiver<TunnelStatus>> {
        if self.links.len() == 1 {
            return self.links[0].tunnel_status(id);
        }
        self.merged.lock().get(id).cloned()
    }

    /// Waits until tunnel `id` is served and returns its binding outcomes;
    /// `Err(Rejected)` if the edge refuses or closes it, `Err(UnknownTunnel)`
    /// if it is (or gets) detached.
    pub async fn serving(&self, id: &str) -> Result<Vec<BindingOutcome>> {
        let mut rx = self
            .tunnel_status(id)
            .ok_or_else(|| Error::UnknownTunnel(id.to_owned()))?;
        let status = rx
            .wait_for(|s| {
                matches!(
                    s,
                    TunnelStatus::Serving { .. }
                        | TunnelStatus::Refused(_)
                        | TunnelStatus::Closed(_)
                )
            })
            .await
            .map_err(|_| Error::UnknownTunnel(id.to_owned()))?
            .clone();
        match status {
            TunnelStatus::Serving { bound, .. } => Ok(bound),
            TunnelStatus::Refused(r) | TunnelStatus::Closed(r) => Err(Error::Rejected(r)),
            TunnelStatus::Pending | TunnelStatus::Disconnected { .. } => {
                unreachable!("wait_for returned a status it does not wait for")
            }
        }
    }

    /// The ids of the attached tunnels, sorted.
    pub fn tunnels(&self) -> Vec<String> {
        self.links[0].tunnels()
    }

    /// The bindings tunnel `id` declares.
    pub fn bindings(&self, id: &str) -> Option<BTreeSet<Binding>> {
        self.links[0].bindings(id)
    }

    /// Stops the agent and waits until its sessions are closed.
    pub async fn shutdown(mut self) {
        for link in std::mem::take(&mut self.links) {
            link.shutdown().await;
        }
        self.cancel.cancel();
    }
}

/// Keeps `out` at `merge` of `inner` until every inner sender is gone (or
/// `cancel`).
async fn merge_task<T: Clone + PartialEq + Send + Sync + 'static>(
    mut inner: Vec<watch::Receiver<T>>,
    out: watch::Sender<T>,
    merge: fn(&[watch::Receiver<T>]) -> T,
    cancel: CancellationToken,
) {
    loop {
        for rx in &mut inner {
            rx.borrow_and_update();
        }
        let now = merge(&inner);
        out.send_if_modified(|current| {
            let changed = *current != now;
            if changed {
                *current = now;
            }
            changed
        });
        let changes = inner.iter_mut().map(|rx| Box::pin(rx.changed()));
        let (changed, _, _) = tokio::select! {
            _ = cancel.cancelled() => return,
            c = futures::future::select_all(changes) => c,
        };
        if changed.is_err() {
            // Detached (every link drops its sender together) or stopped.
            return;
        }
    }
}

fn merge_agent(inner: &[watch::Receiver<AgentStatus>]) -> AgentStatus {
    let all: Vec<AgentStatus> = inner.iter().map(|rx| rx.borrow().clone()).collect();
    all.iter()
        .find(|s| matches!(s, AgentStatus::Connected { .. }))
        .or_else(|| all.iter().find(|s| !matches!(s, AgentStatus::Stopped)))
        .or(all.first())
        .cloned()
        .unwrap_or(AgentStatus::Stopped)
}

fn merge_tunnel(inner: &[watch::Receiver<TunnelStatus>]) -> TunnelStatus {
    let all: Vec<TunnelStatus> = inner.iter().map(|rx| rx.borrow().clone()).collect();
    let rank = |s: &TunnelStatus| match s {
        TunnelStatus::Serving { .. } => 0,
        TunnelStatus::Closed(_) => 1,
        TunnelStatus::Refused(_) => 2,
        TunnelStatus::Pending => 3,
        TunnelStatus::Disconnected { .. } => 4,
    };
    all.into_iter()
        .min_by_key(rank)
        .unwrap_or(TunnelStatus::Pending)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ErrorCode;

    #[test]
    fn every_comma_separated_address_is_one_session() {
        let config = AgentConfig::new(
            "127.0.0.2:7443, 127.0.0.3:7443,,127.0.0.2:7443",
            Trust::SystemRoots,
        );
        let targets: Vec<String> = edge_targets(&config)
            .unwrap()
            .into_iter()
            .map(|(a, _)| a)
            .collect();
        assert_eq!(
            targets,
            ["127.0.0.2:7443", "127.0.0.3:7443", "127.0.0.2:7443"]
        );
        let bad = AgentConfig::new("127.0.0.2:7443,nope", Trust::SystemRoots);
        assert!(edge_targets(&bad).is_err());
        let empty = AgentConfig::new(" , ", Trust::SystemRoots);
        assert!(edge_targets(&empty).is_err());
    }

    #[test]
    fn a_tunnel_serving_on_any_session_is_serving() {
        let serving = TunnelStatus::Serving {
            session_id: "ses_b".into(),
            bound: Vec::new(),
        };
        let down = TunnelStatus::Disconnected {
            reason: "killed".into(),
        };
        let revoked = TunnelStatus::Closed(Rejection::new(ErrorCode::TokenRevoked, "revoked"));
        let merged = |states: &[TunnelStatus]| {
            let rx: Vec<_> = states.iter().map(|s| watch::channel(s.clone()).1).collect();
            merge_tunnel(&rx)
        };
        assert_eq!(merged(&[down.clone(), serving.clone()]), serving);
        assert_eq!(merged(&[revoked.clone(), serving.clone()]), serving);
        assert_eq!(merged(&[down.clone(), revoked.clone()]), revoked);
        assert_eq!(
            merged(&[down.clone(), TunnelStatus::Pending]),
            TunnelStatus::Pending
        );
        assert_eq!(merged(&[down.clone(), down.clone()]), down);
    }
}
