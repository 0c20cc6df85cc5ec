//! What the caller wants and where it stands: the statuses the handle
//! publishes, the stream handler, and the state the handle and the session
//! task share.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tuna_protocol::mux::MuxStream;
use tuna_protocol::wire::{Binding, BindingOutcome, Rejection, StreamMeta, TunnelToken};

/// Where the connection to the edge stands; watch it with
/// [`AgentHandle::status`](crate::AgentHandle::status).
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

/// Where one tunnel stands; watch it with
/// [`AgentHandle::tunnel_status`](crate::AgentHandle::tunnel_status).
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
    pub(crate) next_generation: u64,
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
    pub(crate) fn changed(&self, desired: &mut Desired, id: &str) {
        desired.dirty.insert(id);
        self.wake.notify_one();
    }
}
