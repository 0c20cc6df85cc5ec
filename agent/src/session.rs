//! The agent's connect–serve–reconnect loop, and the reconciliation of the
//! caller's tunnels with what the edge has been told on this connection.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use rand::Rng;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncWriteExt, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tuna_protocol::mux::{self, Gate, MuxStream};
use tuna_protocol::wire::{
    Attach, Binding, BindingOutcome, ErrorCode, Frame, HANDSHAKE_TIMEOUT, HEADER_KIND,
    HEARTBEAT_MISSES, MAX_HELLO_LEN, MAX_HELLO_TUNNELS, PROTOCOL_VERSION, Preamble, Rejection,
    StreamKind, StreamMeta, read_frames,
};

use crate::config::AgentConfig;
use crate::error::{Error, Result};
use crate::state::{AgentStatus, Shared, StreamHandler, TunnelStatus};

/// Tunnels reconciled per turn of the session loop.
const RECONCILE_BATCH: usize = 256;

/// Why a connection attempt or session ended.
enum End {
    /// The handle asked us to stop.
    Stop,
    /// Nothing to attach: wait for the caller.
    Idle,
    /// The edge refused every tunnel of the hello; those are parked now, the
    /// others may succeed at once.
    HelloRefused,
    /// The attempt or session failed; `established` if a session had opened.
    Lost { error: Error, established: bool },
}

pub(crate) async fn run(
    config: AgentConfig,
    connector: TlsConnector,
    server_name: ServerName<'static>,
    shared: Arc<Shared>,
    handler: Arc<dyn StreamHandler>,
    cancel: CancellationToken,
) {
    let mut attempt: u32 = 0;
    let connection = Connection {
        config: &config,
        connector: &connector,
        server_name: &server_name,
        shared: &shared,
        handler: &handler,
    };
    loop {
        let outcome = tokio::select! {
            _ = cancel.cancelled() => End::Stop,
            r = connection.attempt(attempt) => r,
        };
        let delay = match outcome {
            End::Stop => break,
            End::Idle => {
                shared.status.send_replace(AgentStatus::Idle);
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = shared.wake.notified() => {}
                }
                continue;
            }
            End::HelloRefused => config.backoff_initial,
            End::Lost { error, established } => {
                if established {
                    attempt = 0;
                }
                let status = match &error {
                    Error::Rejected(r) => AgentStatus::Rejected(r.clone()),
                    other => AgentStatus::Disconnected {
                        reason: other.to_string(),
                    },
                };
                tracing::warn!(edge = %config.edge_addr, error = %error, "tunnel connection ended; reconnecting");
                shared.status.send_replace(status);
                attempt = attempt.saturating_add(1);
                backoff(config.backoff_initial, config.backoff_max, attempt)
            }
        };
        // Changes made while waiting are recorded; the next session sends them.
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
    }
    shared.status.send_replace(AgentStatus::Stopped);
}

/// Full jitter over a capped exponential: uniform in [base/2, base].
pub(crate) fn backoff(initial: Duration, max: Duration, attempt: u32) -> Duration {
    let exp = initial.saturating_mul(1u32 << attempt.min(20));
    let base = exp.min(max);
    let half = base / 2;
    let jitter = rand::rng().random_range(0..=half.as_millis() as u64);
    half + Duration::from_millis(jitter)
}

/// What the accept loop needs to know of a tunnel to take its streams.
struct StreamScope {
    gate: Arc<Gate>,
    /// Declared HTTP hosts, lower case.
    hosts: HashSet<String>,
    /// Declared TCP endpoints (alias or port text, as declared).
    endpoints: HashSet<String>,
    /// Declared addresses and ports.
    addresses: HashSet<std::net::SocketAddr>,
}

impl StreamScope {
    fn new(gate: Arc<Gate>, bindings: &BTreeSet<Binding>) -> Self {
        let mut hosts = HashSet::new();
        let mut endpoints = HashSet::new();
        let mut addresses = HashSet::new();
        for b in bindings {
            match b {
                Binding::Http { host } => {
                    hosts.insert(host.to_ascii_lowercase());
                }
                Binding::Tcp { endpoint } => {
                    endpoints.insert(endpoint.clone());
                }
                Binding::Address { address, port } => {
                    addresses.insert(std::net::SocketAddr::new(*address, *port));
                }
            }
        }
        Self {
            gate,
            hosts,
            endpoints,
            addresses,
        }
    }

    fn admits(&self, kind: &StreamKind) -> bool {
        match kind {
            StreamKind::Http { host, .. } => self.hosts.contains(host),
            StreamKind::Tcp { endpoint, .. } => self.endpoints.contains(endpoint),
            StreamKind::Address { address } => self.addresses.contains(address),
        }
    }
}

/// Tunnel id → what its streams may carry, shared with the accept loop.
type Scopes = Arc<RwLock<HashMap<String, Arc<StreamScope>>>>;

/// What this connection told the edge about one tunnel.
struct Sent {
    generation: u64,
    bindings: BTreeSet<Binding>,
    /// `seq` of the latest attach sent, and the highest answered.
    attach_seq: u64,
    answered_seq: u64,
    /// The edge serves it; `outcomes` is its view of the bindings.
    serving: bool,
    outcomes: Vec<BindingOutcome>,
    gate: Arc<Gate>,
}

struct Connection<'a> {
    config: &'a AgentConfig,
    connector: &'a TlsConnector,
    server_name: &'a ServerName<'static>,
    shared: &'a Arc<Shared>,
    handler: &'a Arc<dyn StreamHandler>,
}

type ClientTls = tokio_rustls::client::TlsStream<TcpStream>;

impl Connection<'_> {
    /// One connection attempt and, if it succeeds, the session until it ends.
    async fn attempt(&self, attempt: u32) -> End {
        let hello = self.hello_tunnels();
        if hello.is_empty() {
            return End::Idle;
        }
        self.shared
            .status
            .send_replace(AgentStatus::Connecting { attempt });
        let handshake = timeout(HANDSHAKE_TIMEOUT, self.handshake(&hello)).await;
        let (tls, session_id, heartbeat) = match handshake {
            Err(_) => {
                return End::Lost {
                    error: Error::HandshakeTimeout(HANDSHAKE_TIMEOUT),
                    established: false,
                };
            }
            Ok(Err(end)) => return end,
            Ok(Ok(parts)) => parts,
        };
        let mut session = AgentSession {
            shared: Arc::clone(self.shared),
            session_id: session_id.clone(),
            sent: HashMap::new(),
            scopes: Arc::new(RwLock::new(HashMap::new())),
            next_seq: 1,
            write_deadline: heartbeat * HEARTBEAT_MISSES,
            hello_unanswered: hello.len(),
        };
        for (id, generation, attach) in hello {
            session.record_attach(&id, generation, &attach.bindings, attach.seq);
        }
        session.next_seq = MAX_HELLO_TUNNELS as u64 + 1;
        let error = match timeout(HANDSHAKE_TIMEOUT, session.start_h2(tls, self.handler)).await {
            Err(_) => Error::HandshakeTimeout(HANDSHAKE_TIMEOUT),
            Ok(Err(e)) => e,
            Ok(Ok((control, accept))) => {
                tracing::info!(edge = %self.config.edge_addr, session = %session_id, "tunnel session open");
                let end = session.serve(control, accept, heartbeat).await;
                session.disconnect(&end);
                return match end {
                    End::Lost { error, .. } => End::Lost {
                        error,
                        established: true,
                    },
                    other => other,
                };
            }
        };
        let end = End::Lost {
            error,
            established: false,
        };
        session.disconnect(&end);
        end
    }

    /// Up to [`MAX_HELLO_TUNNELS`] attachable tunnels (those served before
    /// first) that fit into one hello.
    fn hello_tunnels(&self) -> Vec<(String, u64, Attach)> {
        let desired = self.shared.desired.lock();
        let mut candidates: Vec<(&String, &crate::state::DesiredTunnel)> = desired
            .tunnels
            .iter()
            .filter(|(_, t)| t.attachable())
            .collect();
        candidates.sort_by_key(|(id, t)| (!t.served, *id));
        let mut picked = Vec::new();
        // Room for the hello's own fields.
        let mut budget = MAX_HELLO_LEN - 256 - self.config.agent_name.len();
        for (id, t) in candidates {
            if picked.len() == MAX_HELLO_TUNNELS {
                break;
            }
            let attach = Attach {
                tunnel: id.clone(),
                seq: picked.len() as u64 + 1,
                token: t.token.clone(),
                bindings: t.bindings.iter().cloned().collect(),
            };
            let len = Frame::Attach(attach.clone())
                .encode()
                .map(|b| b.len())
                .unwrap_or(usize::MAX);
            if len > budget {
                if picked.is_empty() {
                    continue;
                }
                break;
            }
            budget -= len;
            picked.push((id.clone(), t.generation, attach));
        }
        picked
    }

    /// TLS, preamble, hello, and the edge's answer. `Err` is how the attempt ends.
    async fn handshake(
        &self,
        hello: &[(String, u64, Attach)],
    ) -> std::result::Result<(ClientTls, String, Duration), End> {
        let lost = |error: Error| End::Lost {
            error,
            established: false,
        };
        let tcp = TcpStream::connect(&self.config.edge_addr)
            .await
            .map_err(|e| lost(e.into()))?;
        tcp.set_nodelay(true).map_err(|e| lost(e.into()))?;
        let mut tls = self
            .connector
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| {
                lost(Error::Tls(format!(
                    "TLS handshake with {}: {e}",
                    self.config.edge_addr
                )))
            })?;
        let preamble = Preamble {
            version: PROTOCOL_VERSION,
        };
        tls.write_all(&preamble.encode())
            .await
            .map_err(|e| lost(e.into()))?;
        Frame::Hello {
            agent: self.config.agent_name.clone(),
            tunnels: hello.iter().map(|(_, _, a)| a.clone()).collect(),
        }
        .write_to(&mut tls)
        .await
        .map_err(|e| lost(e.into()))?;
        let mut refused_any = false;
        loop {
            match Frame::read_from(&mut tls)
                .await
                .map_err(|e| lost(e.into()))?
            {
                Frame::Welcome {
                    session_id,
                    heartbeat_ms,
                } => {
                    let heartbeat = Duration::from_millis(heartbeat_ms.clamp(100, 600_000));
                    return Ok((tls, session_id, heartbeat));
                }
                Frame::Refused {
                    tunnel,
                    seq,
                    reason,
                } => {
                    if let Some((id, generation, _)) = hello
                        .iter()
                        .find(|(id, _, a)| *id == tunnel && a.seq == seq)
                    {
                        refused_any = true;
                        park(self.shared, id, *generation, TunnelStatus::Refused(reason));
                    }
                }
                Frame::Reject(r) if refused_any => {
                    tracing::warn!(edge = %self.config.edge_addr, reason = %r, "the edge refused every tunnel of the hello");
                    return Err(End::HelloRefused);
                }
                Frame::Reject(r) => return Err(lost(Error::Rejected(r))),
                other => {
                    return Err(lost(Error::Protocol(format!(
                        "expected welcome, got {}",
                        other.name()
                    ))));
                }
            }
        }
    }
}

/// Parks tunnel `id` if the caller has not changed it since `generation`
/// was sent; otherwise the newer attach goes out at the next reconcile.
fn park(shared: &Shared, id: &str, generation: u64, status: TunnelStatus) {
    let mut desired = shared.desired.lock();
    let Some(t) = desired.tunnels.get_mut(id) else {
        return;
    };
    if t.generation == generation {
        t.parked = Some(generation);
        t.status.send_replace(status);
    } else {
        shared.changed(&mut desired, id);
    }
}

/// An open session: what the edge was told, and the streams' scopes.
struct AgentSession {
    shared: Arc<Shared>,
    session_id: String,
    sent: HashMap<String, Sent>,
    scopes: Scopes,
    next_seq: u64,
    /// A control write that takes longer than this ends the session.
    write_deadline: Duration,
    /// Hello tunnels the edge has not answered yet; the status says
    /// `Connected` once they are (so `connected()` means "tunnels judged").
    hello_unanswered: usize,
}

type Control = WriteHalf<MuxStream>;

impl AgentSession {
    fn record_attach(&mut self, id: &str, generation: u64, bindings: &[Binding], seq: u64) {
        let bindings: BTreeSet<Binding> = bindings.iter().cloned().collect();
        let gate = Gate::new();
        self.scopes.write().insert(
            id.to_owned(),
            Arc::new(StreamScope::new(Arc::clone(&gate), &bindings)),
        );
        self.sent.insert(
            id.to_owned(),
            Sent {
                generation,
                bindings,
                attach_seq: seq,
                answered_seq: 0,
                serving: false,
                outcomes: Vec::new(),
                gate,
            },
        );
    }

    fn forget(&mut self, id: &str) {
        if let Some(s) = self.sent.remove(id) {
            s.gate.close();
        }
        self.scopes.write().remove(id);
    }

    /// h2 on the TLS stream, the control stream, and the accept loop.
    async fn start_h2(
        &self,
        tls: ClientTls,
        handler: &Arc<dyn StreamHandler>,
    ) -> Result<(MuxStream, tokio::task::JoinHandle<Result<()>>)> {
        let mut conn = mux::server_builder()
            .handshake(mux::Coalesced::new(tls))
            .await?;
        let (request, respond) = conn.accept().await.ok_or_else(|| {
            Error::Closed("edge closed before opening the control stream".into())
        })??;
        if request.headers().get(HEADER_KIND).map(|v| v.as_bytes()) != Some(b"control") {
            return Err(Error::Protocol(
                "the first stream is not the control stream".into(),
            ));
        }
        let (_, control) = mux::accept_stream(request, respond)?;
        let accept = tokio::spawn(accept_streams(
            conn,
            Arc::clone(handler),
            Arc::clone(&self.scopes),
        ));
        Ok((control, accept))
    }

    async fn serve(
        &mut self,
        control: MuxStream,
        accept: tokio::task::JoinHandle<Result<()>>,
        heartbeat: Duration,
    ) -> End {
        let mut accept = AbortOnDropHandle::new(accept);
        let (read_half, mut writer) = tokio::io::split(control);
        let (frames_tx, mut frames) = mpsc::channel::<tuna_protocol::Result<Frame>>(64);
        let _reader = AbortOnDropHandle::new(tokio::spawn(read_frames(read_half, frames_tx)));
        let mut tick = tokio::time::interval_at(Instant::now() + heartbeat, heartbeat);
        let mut last_seen = Instant::now();
        let mut seq: u64 = 0;
        // Everything the caller wants that the hello did not carry.
        {
            let mut desired = self.shared.desired.lock();
            let ids: Vec<String> = desired.tunnels.keys().cloned().collect();
            for id in &ids {
                desired.dirty.insert(id);
            }
        }
        let lost = |error: Error| End::Lost {
            error,
            established: true,
        };
        let end = loop {
            if let Err(e) = self.reconcile(&mut writer).await {
                break lost(e);
            }
            tokio::select! {
                r = &mut accept => {
                    let error = match r {
                        Ok(Ok(())) => Error::Closed("the edge closed the tunnel connection".into()),
                        Ok(Err(e)) => e,
                        Err(e) => Error::Closed(format!("stream acceptor failed: {e}")),
                    };
                    break lost(error);
                }
                _ = self.shared.wake.notified() => {}
                frame = frames.recv() => {
                    last_seen = Instant::now();
                    match frame {
                        Some(Ok(Frame::GoAway(r))) => {
                            // An edge restart or an idle session is a disconnect,
                            // not a refusal of this agent.
                            if matches!(r.code, ErrorCode::ShuttingDown | ErrorCode::NoTunnels) {
                                break lost(Error::Closed(r.to_string()));
                            }
                            break lost(Error::Rejected(r));
                        }
                        Some(Ok(frame)) => {
                            if let Err(e) = self.on_frame(frame) {
                                break lost(e);
                            }
                        }
                        Some(Err(e)) => break lost(e.into()),
                        None => break lost(Error::Closed("control stream ended".into())),
                    }
                }
                _ = tick.tick() => {
                    if last_seen.elapsed() > heartbeat * HEARTBEAT_MISSES {
                        break lost(Error::Rejected(Rejection::new(
                            ErrorCode::HeartbeatTimeout,
                            format!("no word from the edge for {:?}", last_seen.elapsed()),
                        )));
                    }
                    seq += 1;
                    if let Err(e) = self.write(&mut writer, Frame::Heartbeat { seq }).await {
                        break lost(e);
                    }
                }
            }
        };
        let _ = writer.shutdown().await;
        end
    }

    async fn write(&self, writer: &mut Control, frame: Frame) -> Result<()> {
        match timeout(self.write_deadline, frame.write_to(writer)).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(Error::Closed(format!(
                "a control write to the edge took longer than {:?}",
                self.write_deadline
            ))),
        }
    }

    /// Sends what changed since the edge was last told (attaches, detaches,
    /// binding diffs), a batch at a time: between batches the loop reads the
    /// edge's answers, so neither side's control window fills up.
    async fn reconcile(&mut self, writer: &mut Control) -> Result<()> {
        let batch: Vec<String> = {
            let mut desired = self.shared.desired.lock();
            let batch = desired.dirty.take(RECONCILE_BATCH);
            if !desired.dirty.is_empty() {
                self.shared.wake.notify_one();
            }
            batch
        };
        for id in batch {
            if let Some(frame) = self.next_frame(&id) {
                self.write(writer, frame).await?;
            }
        }
        Ok(())
    }

    /// The frame that brings the edge's view of tunnel `id` to what the
    /// caller wants, updating the local record (and stream scopes) first.
    fn next_frame(&mut self, id: &str) -> Option<Frame> {
        let wanted = {
            let desired = self.shared.desired.lock();
            desired
                .tunnels
                .get(id)
                .filter(|t| t.attachable())
                .map(|t| (t.generation, t.token.clone(), t.bindings.clone()))
        };
        let Some((generation, token, bindings)) = wanted else {
            return self.sent.contains_key(id).then(|| {
                self.forget(id);
                Frame::Detach {
                    tunnel: id.to_owned(),
                }
            });
        };
        let seq = self.next_seq;
        match self.sent.get_mut(id) {
            Some(s) if s.generation == generation => {
                if s.bindings == bindings {
                    return None;
                }
                self.next_seq += 1;
                let add: Vec<Binding> = bindings.difference(&s.bindings).cloned().collect();
                let remove: Vec<Binding> = bindings_removed(&s.bindings, &bindings);
                let scope = StreamScope::new(Arc::clone(&s.gate), &bindings);
                s.outcomes.retain(|o| bindings.contains(&o.binding));
                s.bindings = bindings;
                self.scopes.write().insert(id.to_owned(), Arc::new(scope));
                Some(Frame::UpdateBindings {
                    tunnel: id.to_owned(),
                    seq,
                    add,
                    remove,
                })
            }
            Some(s) => {
                // A new token (or a retry): the edge replaces the tunnel's grant.
                self.next_seq += 1;
                let scope = StreamScope::new(Arc::clone(&s.gate), &bindings);
                s.generation = generation;
                s.attach_seq = seq;
                s.bindings = bindings.clone();
                self.scopes.write().insert(id.to_owned(), Arc::new(scope));
                Some(Frame::Attach(Attach {
                    tunnel: id.to_owned(),
                    seq,
                    token,
                    bindings: bindings.into_iter().collect(),
                }))
            }
            None => {
                self.next_seq += 1;
                let list: Vec<Binding> = bindings.iter().cloned().collect();
                self.record_attach(id, generation, &list, seq);
                self.set_status(id, TunnelStatus::Pending);
                Some(Frame::Attach(Attach {
                    tunnel: id.to_owned(),
                    seq,
                    token,
                    bindings: list,
                }))
            }
        }
    }

    fn set_status(&self, id: &str, status: TunnelStatus) {
        if let Some(t) = self.shared.desired.lock().tunnels.get(id) {
            t.status.send_if_modified(|s| {
                let changed = *s != status;
                *s = status;
                changed
            });
        }
    }

    fn serving_status(&self, s: &Sent) -> TunnelStatus {
        TunnelStatus::Serving {
            session_id: self.session_id.clone(),
            bound: s.outcomes.clone(),
        }
    }

    /// Applies one frame from the edge.
    fn on_frame(&mut self, frame: Frame) -> Result<()> {
        let hello_answer = match &frame {
            Frame::Attached { seq, .. } | Frame::Refused { seq, .. } => {
                *seq <= MAX_HELLO_TUNNELS as u64
            }
            _ => false,
        };
        self.apply(frame)?;
        if hello_answer && self.hello_unanswered > 0 {
            self.hello_unanswered -= 1;
            if self.hello_unanswered == 0 {
                self.shared.status.send_replace(AgentStatus::Connected {
                    session_id: self.session_id.clone(),
                });
            }
        }
        Ok(())
    }

    fn apply(&mut self, frame: Frame) -> Result<()> {
        match frame {
            Frame::Heartbeat { .. } => {}
            Frame::Attached { tunnel, seq, bound } => {
                let Some(s) = self.sent.get_mut(&tunnel) else {
                    return Ok(());
                };
                s.answered_seq = s.answered_seq.max(seq);
                if seq < s.attach_seq {
                    // A newer attach is on its way; its answer counts.
                    return Ok(());
                }
                s.serving = true;
                s.outcomes = bound;
                let generation = s.generation;
                let status = self.serving_status(&self.sent[&tunnel]);
                let mut desired = self.shared.desired.lock();
                if let Some(t) = desired.tunnels.get_mut(&tunnel)
                    && t.generation == generation
                {
                    t.served = true;
                    t.parked = None;
                    t.status.send_replace(status);
                }
            }
            Frame::Refused {
                tunnel,
                seq,
                reason,
            } => {
                let Some(s) = self.sent.get_mut(&tunnel) else {
                    return Ok(());
                };
                s.answered_seq = s.answered_seq.max(seq);
                if seq < s.attach_seq {
                    return Ok(());
                }
                let generation = s.generation;
                tracing::warn!(%tunnel, reason = %reason, "the edge refused a tunnel");
                self.forget(&tunnel);
                park(
                    &self.shared,
                    &tunnel,
                    generation,
                    TunnelStatus::Refused(reason),
                );
            }
            Frame::BindingsUpdated {
                tunnel, results, ..
            } => {
                let Some(s) = self.sent.get_mut(&tunnel) else {
                    return Ok(());
                };
                for result in results {
                    if !s.bindings.contains(&result.binding) {
                        continue;
                    }
                    match s.outcomes.iter_mut().find(|o| o.binding == result.binding) {
                        Some(o) => *o = result,
                        None => s.outcomes.push(result),
                    }
                }
                if s.serving {
                    let status = self.serving_status(&self.sent[&tunnel]);
                    self.set_status(&tunnel, status);
                }
            }
            Frame::TunnelClosed { tunnel, reason } => {
                let Some(s) = self.sent.get_mut(&tunnel) else {
                    return Ok(());
                };
                if s.answered_seq < s.attach_seq {
                    // The edge closed what it had; the attach in flight decides.
                    s.serving = false;
                    return Ok(());
                }
                let generation = s.generation;
                tracing::warn!(%tunnel, reason = %reason, "the edge closed a tunnel");
                self.forget(&tunnel);
                park(
                    &self.shared,
                    &tunnel,
                    generation,
                    TunnelStatus::Closed(reason),
                );
            }
            other => {
                return Err(Error::Protocol(format!(
                    "unexpected {} frame on the control stream",
                    other.name()
                )));
            }
        }
        Ok(())
    }

    /// The connection is gone: tunnels it carried wait for the next one.
    fn disconnect(&mut self, end: &End) {
        let reason = match end {
            End::Lost { error, .. } => error.to_string(),
            _ => "the connection closed".to_owned(),
        };
        for (_, s) in self.sent.drain() {
            s.gate.close();
        }
        self.scopes.write().clear();
        let desired = self.shared.desired.lock();
        for t in desired.tunnels.values().filter(|t| t.attachable()) {
            t.status.send_replace(TunnelStatus::Disconnected {
                reason: reason.clone(),
            });
        }
    }
}

fn bindings_removed(before: &BTreeSet<Binding>, after: &BTreeSet<Binding>) -> Vec<Binding> {
    before.difference(after).cloned().collect()
}

/// Drives the h2 connection and hands every data stream whose tunnel and
/// host (or endpoint) check out to the handler. Returns when the edge
/// closes the connection.
async fn accept_streams(
    mut conn: h2::server::Connection<mux::Coalesced<ClientTls>, bytes::Bytes>,
    handler: Arc<dyn StreamHandler>,
    scopes: Scopes,
) -> Result<()> {
    while let Some(next) = conn.accept().await {
        let (request, mut respond) = next?;
        let meta = match StreamMeta::from_headers(request.headers()) {
            Ok(meta) => meta,
            Err(e) => {
                tracing::warn!(error = %e, "refusing a stream without valid metadata");
                respond.send_reset(h2::Reason::PROTOCOL_ERROR);
                continue;
            }
        };
        let scope = scopes.read().get(&meta.tunnel).cloned();
        let Some(scope) = scope.filter(|s| s.admits(&meta.kind)) else {
            tracing::warn!(tunnel = %meta.tunnel, kind = ?meta.kind, "refusing a stream its tunnel does not serve");
            respond.send_reset(h2::Reason::REFUSED_STREAM);
            continue;
        };
        match mux::accept_stream(request, respond) {
            Ok((_, mut stream)) => {
                stream.set_gate(Arc::clone(&scope.gate));
                handler.handle(stream, meta);
            }
            Err(e) => tracing::warn!(error = %e, "could not answer a stream"),
        }
    }
    Ok(())
}
