//! [`Agent::start`] and the [`AgentHandle`] it returns: one session per edge
//! address ([`Link`]), each carrying every tunnel, their states merged.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::{CancellationToken, DropGuard};
use tuna_protocol::mux::MuxStream;
use tuna_protocol::wire::{
    Attach, Binding, BindingOutcome, Frame, MAX_ATTACH_LEN, MAX_BINDINGS, StreamMeta, TunnelToken,
    validate_tunnel_id,
};

use crate::config::AgentConfig;
use crate::error::{Error, Result};
use crate::state::{AgentStatus, Desired, DesiredTunnel, Shared, StreamHandler, TunnelStatus};
use crate::{session, tls};

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
    use crate::config::Trust;
    use tuna_protocol::wire::{ErrorCode, Rejection};

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
