//! The agent: dials the edge, authenticates, declares bindings and yields
//! the public connections the edge forwards, as [`MuxStream`]s with their
//! [`StreamMeta`].
//!
//! ```no_run
//! # async fn demo() -> tuna_tunnel::wire::Result<()> {
//! use tuna_tunnel::agent::{Agent, AgentConfig, Trust};
//! use tuna_tunnel::wire::{Binding, TunnelToken};
//! let mut config = AgentConfig::new("edge.example:7443", TunnelToken::new("…"), Trust::SystemRoots);
//! config.bindings = vec![Binding::http("app.example")];
//! let (handle, mut streams) = Agent::start_with_channel(config, 1024)?;
//! while let Some((stream, meta)) = streams.recv().await {
//!     // hand `stream` to the proxy core, e.g. serve_stream(stream, meta)
//!     # drop((stream, meta));
//! }
//! # drop(handle); Ok(()) }
//! ```
//!
//! The agent reconnects by itself with jittered, capped exponential backoff.
//! Binding changes ([`AgentHandle::set_bindings`]) travel as control messages
//! on the open session, never as a reconnect. Dropping the [`AgentHandle`]
//! stops the agent.

mod session;
mod tls;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::mux::MuxStream;
use crate::wire::{Binding, BindingOutcome, Error, Rejection, Result, StreamMeta, TunnelToken};

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

/// How to reach and authenticate to the edge.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// `host:port` of the edge's agent listener.
    pub edge_addr: String,
    /// Name checked against the edge's certificate; defaults to the host of `edge_addr`.
    pub server_name: Option<String>,
    /// Trust anchors for the edge's certificate.
    pub trust: Trust,
    /// The tunnel token (masked in `Debug`).
    pub token: TunnelToken,
    /// Bindings declared in every handshake (kept up to date by `set_bindings`).
    pub bindings: Vec<Binding>,
    /// First reconnect delay.
    pub backoff_initial: Duration,
    /// Reconnect delays never exceed this.
    pub backoff_max: Duration,
    /// Identity sent in `Hello`, for the edge's logs.
    pub agent_name: String,
}

impl AgentConfig {
    /// A config with default backoff (0.5 s doubling to 30 s) and no bindings.
    pub fn new(edge_addr: impl Into<String>, token: TunnelToken, trust: Trust) -> Self {
        Self {
            edge_addr: edge_addr.into(),
            server_name: None,
            trust,
            token,
            bindings: Vec::new(),
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            agent_name: concat!("tuna-tunnel/", env!("CARGO_PKG_VERSION")).to_owned(),
        }
    }
}

/// Where the agent stands; watch it with [`AgentHandle::status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentStatus {
    /// Dialling or handshaking; `attempt` counts failures since the last session.
    Connecting {
        /// Consecutive failed attempts.
        attempt: u32,
    },
    /// A session is open.
    Connected {
        /// The edge's id of the session.
        session_id: String,
    },
    /// The edge refused the agent (bad token, binding not allowed, …) or ended
    /// the session (token revoked). The agent keeps retrying with backoff.
    Rejected(Rejection),
    /// The session or an attempt failed for another reason; retrying.
    Disconnected {
        /// Human-readable cause.
        reason: String,
    },
    /// The handle was dropped or shut down.
    Stopped,
}

/// Receives the streams of public connections. Called on the agent's task:
/// spawn, don't block.
pub trait StreamHandler: Send + Sync + 'static {
    /// One public connection (HTTP/1.1 bytes or raw TCP, see `meta.kind`).
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

pub(crate) enum Command {
    Update {
        add: Vec<Binding>,
        remove: Vec<Binding>,
        reply: oneshot::Sender<Result<Vec<BindingOutcome>>>,
    },
}

/// State shared by the handle and the agent task.
pub(crate) struct Shared {
    pub(crate) desired: Mutex<BTreeSet<Binding>>,
    pub(crate) status: watch::Sender<AgentStatus>,
}

/// Entry point; see the module docs.
pub struct Agent;

impl Agent {
    /// Starts the agent task; public connections go to `handler`.
    /// Fails only on unusable configuration (e.g. unreadable CA file).
    pub fn start(config: AgentConfig, handler: impl StreamHandler) -> Result<AgentHandle> {
        let connector = tls::connector(&config.trust)?;
        let server_name = tls::server_name(&config)?;
        let (status, status_rx) = watch::channel(AgentStatus::Connecting { attempt: 0 });
        let shared = Arc::new(Shared {
            desired: Mutex::new(config.bindings.iter().cloned().collect()),
            status,
        });
        let (commands_tx, commands_rx) = mpsc::channel(64);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(session::run(
            config,
            connector,
            server_name,
            Arc::clone(&shared),
            commands_rx,
            Arc::new(handler),
            cancel.clone(),
        ));
        Ok(AgentHandle {
            commands: commands_tx,
            status: status_rx,
            shared,
            _guard: cancel.drop_guard(),
            task: Some(task),
        })
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

/// Controls a running agent. Dropping it stops the agent and closes its session.
pub struct AgentHandle {
    commands: mpsc::Sender<Command>,
    status: watch::Receiver<AgentStatus>,
    shared: Arc<Shared>,
    _guard: DropGuard,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl AgentHandle {
    /// A watch of the agent's status (wait with `wait_for`).
    pub fn status(&self) -> watch::Receiver<AgentStatus> {
        self.status.clone()
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

    /// Replaces the declared bindings with `bindings`, sending only the
    /// difference over the open session. Returns the outcome of each added
    /// binding; refused ones are dropped from the declared set. With no
    /// session open the set is just stored (declared at the next connect)
    /// and the result is empty.
    pub async fn set_bindings(&self, bindings: Vec<Binding>) -> Result<Vec<BindingOutcome>> {
        let wanted: BTreeSet<Binding> = bindings.into_iter().collect();
        let (add, remove) = {
            let current = self.current_bindings();
            let add = wanted.difference(&current).cloned().collect::<Vec<_>>();
            let remove = current.difference(&wanted).cloned().collect::<Vec<_>>();
            (add, remove)
        };
        self.update(add, remove).await
    }

    /// Adds one binding; see [`AgentHandle::set_bindings`].
    pub async fn add_binding(&self, binding: Binding) -> Result<Vec<BindingOutcome>> {
        self.update(vec![binding], Vec::new()).await
    }

    /// Removes one binding; see [`AgentHandle::set_bindings`].
    pub async fn remove_binding(&self, binding: Binding) -> Result<()> {
        self.update(Vec::new(), vec![binding]).await.map(|_| ())
    }

    /// The bindings the agent currently declares.
    pub fn current_bindings(&self) -> BTreeSet<Binding> {
        self.shared
            .desired
            .lock()
            .expect("bindings lock poisoned")
            .clone()
    }

    async fn update(&self, add: Vec<Binding>, remove: Vec<Binding>) -> Result<Vec<BindingOutcome>> {
        if add.is_empty() && remove.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(Command::Update { add, remove, reply })
            .await
            .map_err(|_| Error::Closed("agent stopped".into()))?;
        rx.await
            .map_err(|_| Error::Closed("agent stopped".into()))?
    }

    /// Stops the agent and waits until its session is closed.
    pub async fn shutdown(mut self) {
        if let Some(task) = self.task.take() {
            drop(std::mem::replace(
                &mut self._guard,
                CancellationToken::new().drop_guard(),
            ));
            let _ = task.await;
        }
    }
}
