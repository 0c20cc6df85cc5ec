//! The state every clone of a [`crate::ProxyCore`] shares: the Pingora
//! applications, the route registry, the listeners, the TCP services and
//! the shutdown signals. The accept loops, the admin listener and the
//! CONNECT listener read it; only the core changes it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use pingora::proxy::HttpProxy;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::Scheme;
use crate::http::Router;
use crate::routes::Registry;
use crate::shared::Shared;
use crate::tcp::TcpEndpoint;

/// A listener's accept loop: cancelled by `stop`, awaited as `task`.
pub(crate) struct TcpListenerHandle {
    pub(crate) stop: CancellationToken,
    pub(crate) task: JoinHandle<()>,
}

pub(crate) struct Inner {
    pub(crate) shared: Arc<Shared>,
    /// One Pingora application per (scheme, trusted); see `http::Router`.
    pub(crate) apps: [Arc<HttpProxy<Router>>; 4],
    /// The next table, changed one host at a time; a change makes its
    /// snapshot live before the lock is released, so snapshots go live in
    /// the order of the changes.
    pub(crate) registry: Mutex<Registry>,
    pub(crate) tcp_listeners: Mutex<HashMap<SocketAddr, TcpListenerHandle>>,
    pub(crate) connect_listeners: Mutex<HashMap<SocketAddr, TcpListenerHandle>>,
    pub(crate) tcp_services: ArcSwap<HashMap<String, Arc<TcpEndpoint>>>,
    pub(crate) tcp_services_write: Mutex<()>,
    pub(crate) shutdown_tx: watch::Sender<bool>,
    /// Stops the HTTP accept loops.
    pub(crate) stopping: CancellationToken,
    /// Cuts every connection when the grace period is over.
    pub(crate) cut: CancellationToken,
    /// Stops the admin listener after the drain.
    pub(crate) admin_stop: CancellationToken,
    pub(crate) tracker: TaskTracker,
    pub(crate) ready: AtomicBool,
}

impl Inner {
    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && !*self.shutdown_tx.borrow()
    }

    pub(crate) fn app(&self, scheme: Scheme, trusted: bool) -> Arc<HttpProxy<Router>> {
        let i = (scheme == Scheme::Https) as usize * 2 + trusted as usize;
        self.apps[i].clone()
    }
}
