//! Who serves what: public host → session, public TCP port → session.
//!
//! A binding belongs to one session at a time. A newer session of the same
//! grant takes a binding over (an agent that reconnected before the edge
//! noticed its old connection died); the authority has already checked that
//! the new session may serve it.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, RwLock, Weak};

use bytes::Bytes;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::tasks::TaskGuard;
use crate::mux::{self, MuxStream};
use crate::wire::{Binding, BoundTarget, ErrorCode, Rejection, Result, StreamKind, StreamMeta};

/// Most host names remembered as "served before" (for 503 instead of 404).
const MAX_OFFLINE_HOSTS: usize = 65_536;
/// Buffer size for each direction of a public TCP connection.
pub(crate) const TCP_COPY_BUFFER: usize = 64 * 1024;

/// One agent connection on the edge.
pub(crate) struct Session {
    pub(crate) id: String,
    sender: h2::client::SendRequest<Bytes>,
    /// Cancelled when the session ends; public connections watch it.
    pub(crate) closed: CancellationToken,
    /// What the session serves: target → binding as the agent declared it.
    pub(crate) bound: Mutex<HashMap<BoundTarget, Binding>>,
}

impl Session {
    pub(crate) fn new(id: String, sender: h2::client::SendRequest<Bytes>) -> Self {
        Self {
            id,
            sender,
            closed: CancellationToken::new(),
            bound: Mutex::new(HashMap::new()),
        }
    }

    /// Opens a data stream to the agent.
    pub(crate) async fn open(&self, meta: &StreamMeta) -> Result<MuxStream> {
        if self.closed.is_cancelled() {
            return Err(crate::wire::Error::Closed("session ended".into()));
        }
        mux::open_stream(&self.sender, meta).await
    }
}

struct PortEntry {
    session: Arc<Session>,
    endpoint: String,
    listener: CancellationToken,
}

/// The routing table of the data plane.
pub(crate) struct Registry {
    hosts: RwLock<HashMap<String, Arc<Session>>>,
    ports: RwLock<HashMap<u16, PortEntry>>,
    offline: Mutex<HashSet<String>>,
    tcp_ip: IpAddr,
    tcp_ports: RangeInclusive<u16>,
    tasks: TaskGuard,
    me: Weak<Registry>,
    /// Number of open agent sessions (for health and for tests).
    pub(crate) sessions: tokio::sync::watch::Sender<usize>,
}

impl Registry {
    pub(crate) fn new(
        tcp_ip: IpAddr,
        tcp_ports: RangeInclusive<u16>,
        tasks: TaskGuard,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            hosts: RwLock::new(HashMap::new()),
            ports: RwLock::new(HashMap::new()),
            offline: Mutex::new(HashSet::new()),
            tcp_ip,
            tcp_ports,
            tasks,
            me: me.clone(),
            sessions: tokio::sync::watch::Sender::new(0),
        })
    }

    /// The session serving `host` (lower case, no port).
    pub(crate) fn session_for_host(&self, host: &str) -> Option<Arc<Session>> {
        self.hosts
            .read()
            .expect("host table poisoned")
            .get(host)
            .cloned()
    }

    /// Whether a session served `host` before and is gone now.
    pub(crate) fn host_went_offline(&self, host: &str) -> bool {
        self.offline
            .lock()
            .expect("offline set poisoned")
            .contains(host)
    }

    fn session_for_port(&self, port: u16) -> Option<(Arc<Session>, String)> {
        self.ports
            .read()
            .expect("port table poisoned")
            .get(&port)
            .map(|e| (Arc::clone(&e.session), e.endpoint.clone()))
    }

    /// Starts serving `target` through `session`.
    pub(crate) fn bind(
        &self,
        session: &Arc<Session>,
        binding: &Binding,
        target: &BoundTarget,
    ) -> Result<(), Rejection> {
        match target {
            BoundTarget::Http { host } => {
                let previous = self
                    .hosts
                    .write()
                    .expect("host table poisoned")
                    .insert(host.clone(), Arc::clone(session));
                if let Some(previous) = previous.filter(|p| !Arc::ptr_eq(p, session)) {
                    tracing::info!(host, from = %previous.id, to = %session.id, "host moved to a newer session");
                    previous
                        .bound
                        .lock()
                        .expect("bindings poisoned")
                        .remove(target);
                }
                self.offline
                    .lock()
                    .expect("offline set poisoned")
                    .remove(host);
            }
            BoundTarget::Tcp { port } => {
                let endpoint = match binding {
                    Binding::Tcp { endpoint } => endpoint.clone(),
                    Binding::Http { .. } => port.to_string(),
                };
                let mut ports = self.ports.write().expect("port table poisoned");
                if let Some(entry) = ports.get_mut(port) {
                    if !Arc::ptr_eq(&entry.session, session) {
                        tracing::info!(port, from = %entry.session.id, to = %session.id, "TCP endpoint moved to a newer session");
                        entry
                            .session
                            .bound
                            .lock()
                            .expect("bindings poisoned")
                            .remove(target);
                    }
                    entry.session = Arc::clone(session);
                    entry.endpoint = endpoint;
                } else {
                    if !self.tcp_ports.contains(port) {
                        return Err(Rejection::new(
                            ErrorCode::BindingUnavailable,
                            format!(
                                "port {port} is outside this edge's TCP range {}-{}",
                                self.tcp_ports.start(),
                                self.tcp_ports.end()
                            ),
                        ));
                    }
                    let listener = self.listen(*port)?;
                    ports.insert(
                        *port,
                        PortEntry {
                            session: Arc::clone(session),
                            endpoint,
                            listener,
                        },
                    );
                }
            }
        }
        session
            .bound
            .lock()
            .expect("bindings poisoned")
            .insert(target.clone(), binding.clone());
        Ok(())
    }

    /// Stops serving `target` through `session` (no-op if another session holds it).
    pub(crate) fn unbind(&self, session: &Arc<Session>, target: &BoundTarget) {
        session
            .bound
            .lock()
            .expect("bindings poisoned")
            .remove(target);
        match target {
            BoundTarget::Http { host } => {
                let mut hosts = self.hosts.write().expect("host table poisoned");
                if hosts.get(host).is_some_and(|s| Arc::ptr_eq(s, session)) {
                    hosts.remove(host);
                    let mut offline = self.offline.lock().expect("offline set poisoned");
                    if offline.len() >= MAX_OFFLINE_HOSTS {
                        offline.clear();
                    }
                    offline.insert(host.clone());
                }
            }
            BoundTarget::Tcp { port } => {
                let mut ports = self.ports.write().expect("port table poisoned");
                if ports
                    .get(port)
                    .is_some_and(|e| Arc::ptr_eq(&e.session, session))
                    && let Some(entry) = ports.remove(port)
                {
                    entry.listener.cancel();
                }
            }
        }
    }

    /// Forgets everything `session` served.
    pub(crate) fn remove_session(&self, session: &Arc<Session>) {
        let targets: Vec<BoundTarget> = session
            .bound
            .lock()
            .expect("bindings poisoned")
            .keys()
            .cloned()
            .collect();
        for target in targets {
            self.unbind(session, &target);
        }
    }

    /// Binds the public TCP port now (so a busy port is reported to the
    /// agent) and serves it until cancelled.
    fn listen(&self, port: u16) -> Result<CancellationToken, Rejection> {
        let unavailable = |e: std::io::Error| {
            Rejection::new(
                ErrorCode::BindingUnavailable,
                format!("cannot listen on TCP port {port}: {e}"),
            )
        };
        let std_listener =
            std::net::TcpListener::bind(SocketAddr::new(self.tcp_ip, port)).map_err(unavailable)?;
        std_listener.set_nonblocking(true).map_err(unavailable)?;
        let listener = TcpListener::from_std(std_listener).map_err(unavailable)?;
        let cancel = self.tasks.cancel.child_token();
        let registry = self.me.clone();
        let guard = self.tasks.clone();
        let stop = cancel.clone();
        tokio::spawn(async move {
            let _guard = guard;
            loop {
                let accepted = tokio::select! {
                    _ = stop.cancelled() => return,
                    a = listener.accept() => a,
                };
                let (tcp, client_addr) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(port, error = %e, "accept on TCP endpoint failed");
                        continue;
                    }
                };
                let Some(registry) = registry.upgrade() else {
                    return;
                };
                let Some((session, endpoint)) = registry.session_for_port(port) else {
                    continue;
                };
                tokio::spawn(forward_tcp(tcp, client_addr, port, endpoint, session));
            }
        });
        Ok(cancel)
    }
}

async fn forward_tcp(
    mut tcp: tokio::net::TcpStream,
    client_addr: SocketAddr,
    port: u16,
    endpoint: String,
    session: Arc<Session>,
) {
    let _ = tcp.set_nodelay(true);
    let meta = StreamMeta {
        client_addr,
        kind: StreamKind::Tcp { endpoint, port },
    };
    let mut stream = match session.open(&meta).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(port, error = %e, "could not open a stream for a TCP client");
            return;
        }
    };
    let closed = session.closed.clone();
    tokio::select! {
        _ = closed.cancelled() => {}
        r = tokio::io::copy_bidirectional_with_sizes(&mut tcp, &mut stream, TCP_COPY_BUFFER, TCP_COPY_BUFFER) => {
            if let Err(e) = r {
                tracing::debug!(port, error = %e, "TCP endpoint connection ended with an error");
            }
        }
    }
}
