//! The edge's side of an agent connection: handshake, the session's tunnels
//! (attach, detach, binding updates, each judged against its own token),
//! heartbeats, revocation, teardown.
//!
//! A session is authorised by its tunnels: the hello must carry at least one
//! tunnel the authority accepts, and a session whose last tunnel is gone is
//! closed after a grace period.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{broadcast, mpsc};
use tokio::time::{Instant, timeout};
use tokio_rustls::TlsAcceptor;

use super::authority::{Grant, SessionAuthority, TokenId};
use super::registry::{AgentSession, Registry, SessionEvent, TunnelRoute};
use super::tasks::TaskGuard;
use crate::mux::{self, MuxStream};
use crate::wire::{
    Attach, Binding, BindingOutcome, BoundTarget, Error, ErrorCode, Frame, HANDSHAKE_TIMEOUT,
    HEARTBEAT_MISSES, MAX_BINDINGS, MAX_HELLO_LEN, PRE_AUTH_TIMEOUT, PROTOCOL_VERSION, Preamble,
    Rejection, Result, validate_tunnel_id,
};

/// How long a goodbye frame gets to leave before the connection is cut.
const GOODBYE_GRACE: Duration = Duration::from_millis(100);

/// Everything an agent connection needs from the edge.
pub(crate) struct AgentContext {
    pub(crate) authority: Arc<dyn SessionAuthority>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) tls: TlsAcceptor,
    pub(crate) heartbeat: Duration,
    pub(crate) tasks: TaskGuard,
}

impl AgentContext {
    /// How long a session without tunnels stays open (agents attach more).
    fn empty_grace(&self) -> Duration {
        self.heartbeat * HEARTBEAT_MISSES
    }
}

/// Serves one agent connection until it ends.
pub(crate) async fn serve_agent(tcp: TcpStream, peer: SocketAddr, ctx: Arc<AgentContext>) {
    let _guard = ctx.tasks.clone();
    let _ = tcp.set_nodelay(true);
    let cancel = ctx.tasks.cancel.clone();
    // Subscribe before authenticating so a revocation racing the handshake is seen.
    let revocations = ctx.authority.revocations();
    let result = tokio::select! {
        _ = cancel.cancelled() => return,
        r = run(tcp, peer, &ctx, revocations) => r,
    };
    if let Err(e) = result {
        tracing::info!(%peer, error = %e, "agent connection ended");
    }
}

/// A hello tunnel after judging.
struct Judged {
    grant: Grant,
    /// Each binding with its target, or why it is refused.
    checked: Vec<(Binding, Result<BoundTarget, Rejection>)>,
}

type Tls = tokio_rustls::server::TlsStream<TcpStream>;

/// Reads the preamble and hello and judges the hello's tunnels; `Err` when
/// the connection is refused (the refusal has been sent).
async fn pre_auth(
    tcp: TcpStream,
    ctx: &AgentContext,
) -> Result<(Tls, String, Vec<(Attach, Result<Judged, Rejection>)>)> {
    let mut tls = ctx
        .tls
        .accept(tcp)
        .await
        .map_err(|e| Error::Tls(format!("agent TLS handshake: {e}")))?;
    let mut preamble = [0u8; Preamble::LEN];
    tls.read_exact(&mut preamble).await?;
    let preamble = Preamble::decode(&preamble)?;
    if preamble.version != PROTOCOL_VERSION {
        let r = Rejection::new(
            ErrorCode::VersionMismatch,
            format!(
                "this edge speaks tunnel protocol version {PROTOCOL_VERSION}, the agent version {}; upgrade the older side",
                preamble.version
            ),
        );
        return reject(tls, r).await;
    }
    let (agent, tunnels) = match Frame::read_limited(&mut tls, MAX_HELLO_LEN).await? {
        Frame::Hello { agent, tunnels } => (agent, tunnels),
        other => {
            let r = Rejection::new(
                ErrorCode::BadRequest,
                format!("expected hello, got {}", other.name()),
            );
            return reject(tls, r).await;
        }
    };
    if tunnels.is_empty() {
        let r = Rejection::new(ErrorCode::BadRequest, "the hello attaches no tunnel");
        return reject(tls, r).await;
    }
    let mut judged = Vec::with_capacity(tunnels.len());
    for attach in tunnels {
        let verdict = judge(ctx, &attach).await;
        judged.push((attach, verdict));
    }
    if judged.iter().all(|(_, v)| v.is_err()) {
        for (attach, verdict) in &judged {
            if let Err(reason) = verdict {
                let refused = Frame::Refused {
                    tunnel: attach.tunnel.clone(),
                    seq: attach.seq,
                    reason: reason.clone(),
                };
                refused.write_to(&mut tls).await?;
            }
        }
        let first = judged
            .into_iter()
            .find_map(|(_, v)| v.err())
            .expect("the hello has a tunnel");
        let r = Rejection::new(
            first.code,
            format!(
                "no tunnel of the hello was accepted; the first: {}",
                first.message
            ),
        );
        return reject(tls, r).await;
    }
    Ok((tls, agent, judged))
}

async fn run(
    tcp: TcpStream,
    peer: SocketAddr,
    ctx: &Arc<AgentContext>,
    mut revocations: broadcast::Receiver<TokenId>,
) -> Result<()> {
    let (mut tls, agent, judged) = timeout(PRE_AUTH_TIMEOUT, pre_auth(tcp, ctx))
        .await
        .map_err(|_| Error::HandshakeTimeout(PRE_AUTH_TIMEOUT))??;

    let session_id = new_session_id();
    Frame::Welcome {
        session_id: session_id.clone(),
        heartbeat_ms: ctx.heartbeat.as_millis() as u64,
    }
    .write_to(&mut tls)
    .await?;
    let (sender, connection) = timeout(
        HANDSHAKE_TIMEOUT,
        mux::client_builder().handshake(mux::Coalesced::new(tls)),
    )
    .await
    .map_err(|_| Error::HandshakeTimeout(HANDSHAKE_TIMEOUT))??;
    let driver = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "agent h2 connection ended");
        }
    });
    let driver = AbortOnDrop(driver);
    let control = timeout(HANDSHAKE_TIMEOUT, mux::open_control(&sender))
        .await
        .map_err(|_| Error::HandshakeTimeout(HANDSHAKE_TIMEOUT))??;

    let (session, mut events) = AgentSession::new(session_id.clone(), sender);
    let (read_half, write_half) = tokio::io::split(control);
    let mut state = SessionState {
        ctx: Arc::clone(ctx),
        session: Arc::clone(&session),
        tunnels: HashMap::new(),
        writer: write_half,
    };
    ctx.registry.sessions.send_modify(|n| *n += 1);
    tracing::info!(%peer, session = %session_id, %agent, "agent session open");

    let goodbye = match state.answer_hello(judged).await {
        Ok(()) => state.serve(read_half, &mut revocations, &mut events).await,
        Err(e) => {
            tracing::debug!(session = %session_id, error = %e, "control stream write failed");
            None
        }
    };
    state.close_all();
    ctx.registry
        .sessions
        .send_modify(|n| *n = n.saturating_sub(1));
    session.closed.cancel();
    if let Some(reason) = &goodbye {
        tracing::info!(session = %session_id, reason = %reason, "closing agent session");
        if Frame::GoAway(reason.clone())
            .write_to(&mut state.writer)
            .await
            .is_ok()
        {
            let _ = state.writer.shutdown().await;
            // Let h2 put the frame on the wire; the agent closes on receipt.
            tokio::time::sleep(GOODBYE_GRACE).await;
        }
    } else {
        tracing::info!(session = %session_id, "agent session closed");
    }
    drop(driver);
    Ok(())
}

/// A tunnel open on this session.
struct EdgeTunnel {
    grant: Grant,
    route: Arc<TunnelRoute>,
}

/// The session's task state: its tunnels and the control stream's write half.
struct SessionState {
    ctx: Arc<AgentContext>,
    session: Arc<AgentSession>,
    tunnels: HashMap<String, EdgeTunnel>,
    writer: WriteHalf<MuxStream>,
}

impl SessionState {
    async fn send(&mut self, frame: Frame) -> Result<()> {
        frame.write_to(&mut self.writer).await
    }

    /// Installs the hello's accepted tunnels and answers each.
    async fn answer_hello(
        &mut self,
        judged: Vec<(Attach, Result<Judged, Rejection>)>,
    ) -> Result<()> {
        for (attach, verdict) in judged {
            let answer = self.install(attach, verdict);
            self.send(answer).await?;
        }
        Ok(())
    }

    /// The control loop; returns the goodbye to send, if any.
    async fn serve(
        &mut self,
        read_half: tokio::io::ReadHalf<MuxStream>,
        revocations: &mut broadcast::Receiver<TokenId>,
        events: &mut mpsc::UnboundedReceiver<SessionEvent>,
    ) -> Option<Rejection> {
        let heartbeat = self.ctx.heartbeat;
        let (frames_tx, mut frames) = mpsc::channel::<Result<Frame>>(64);
        let _reader = AbortOnDrop(tokio::spawn(read_frames(read_half, frames_tx)));
        let mut tick = tokio::time::interval_at(Instant::now() + heartbeat, heartbeat);
        let mut last_seen = Instant::now();
        let mut empty_since: Option<Instant> = None;
        let mut seq = 0u64;
        let cancel = self.ctx.tasks.cancel.clone();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => {
                    return Some(Rejection::new(ErrorCode::ShuttingDown, "the edge is shutting down; reconnect later"));
                }
                revoked = revocations.recv() => match revoked {
                    Ok(id) => {
                        let reason = Rejection::new(ErrorCode::TokenRevoked, format!("tunnel token {id} was revoked"));
                        let hit: Vec<String> = self
                            .tunnels
                            .iter()
                            .filter(|(_, t)| t.grant.token_id == id)
                            .map(|(name, _)| name.clone())
                            .collect();
                        for tunnel in hit {
                            if self.close_tunnel(&tunnel, reason.clone()).await.is_err() {
                                return None;
                            }
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => {}
                },
                Some(event) = events.recv() => match event {
                    SessionEvent::Displaced { route, target } => {
                        let current = self
                            .tunnels
                            .get(&route.tunnel)
                            .is_some_and(|t| Arc::ptr_eq(&t.route, &route));
                        if current {
                            let reason = Rejection::new(
                                ErrorCode::BindingTakenOver,
                                format!("{} is now served by another tunnel", describe(&target)),
                            );
                            if self.close_tunnel(&route.tunnel, reason).await.is_err() {
                                return None;
                            }
                        }
                    }
                },
                frame = frames.recv() => {
                    last_seen = Instant::now();
                    let answer = match frame {
                        Some(Ok(Frame::Heartbeat { .. })) => None,
                        Some(Ok(Frame::Attach(attach))) => {
                            let verdict = judge(&self.ctx, &attach).await;
                            Some(self.install(attach, verdict))
                        }
                        Some(Ok(Frame::Detach { tunnel })) => {
                            self.detach(&tunnel);
                            None
                        }
                        Some(Ok(Frame::UpdateBindings { tunnel, seq, add, remove })) => {
                            self.update(tunnel, seq, add, remove).await
                        }
                        Some(Ok(other)) => return Some(Rejection::new(
                            ErrorCode::BadRequest,
                            format!("unexpected {} frame on the control stream", other.name()),
                        )),
                        Some(Err(e)) => {
                            tracing::debug!(session = %self.session.id, error = %e, "control stream ended");
                            return None;
                        }
                        None => return None,
                    };
                    if let Some(answer) = answer
                        && let Err(e) = self.send(answer).await
                    {
                        tracing::debug!(error = %e, "control stream write failed");
                        return None;
                    }
                }
                _ = tick.tick() => {
                    if last_seen.elapsed() > heartbeat * HEARTBEAT_MISSES {
                        return Some(Rejection::new(ErrorCode::HeartbeatTimeout, "no heartbeat from the agent"));
                    }
                    if self.tunnels.is_empty() {
                        let since = *empty_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= self.ctx.empty_grace() {
                            return Some(Rejection::new(ErrorCode::NoTunnels, "the session carries no tunnel; attach one to open a new session"));
                        }
                    } else {
                        empty_since = None;
                    }
                    seq += 1;
                    if self.send(Frame::Heartbeat { seq }).await.is_err() {
                        return None;
                    }
                }
            }
        }
    }

    /// Opens (or replaces) a judged tunnel in the registry; the answer to send.
    fn install(&mut self, attach: Attach, verdict: Result<Judged, Rejection>) -> Frame {
        let Attach { tunnel, seq, .. } = attach;
        let judged = match verdict {
            Ok(j) => j,
            Err(reason) => {
                // A failed re-attach closes what the tunnel served before.
                self.detach(&tunnel);
                return Frame::Refused {
                    tunnel,
                    seq,
                    reason,
                };
            }
        };
        let route = match self.tunnels.get(&tunnel) {
            Some(existing) => Arc::clone(&existing.route),
            None => TunnelRoute::new(&self.session, tunnel.clone()),
        };
        let had_bindings = !judged.checked.is_empty();
        let mut outcomes = Vec::with_capacity(judged.checked.len());
        let mut first_error = None;
        let mut kept = Vec::new();
        for (binding, checked) in judged.checked {
            let bound = checked.and_then(|target| {
                self.ctx
                    .registry
                    .bind(&route, &binding, &target)
                    .map(|()| target)
            });
            match bound {
                Ok(target) => {
                    kept.push(target.clone());
                    outcomes.push(BindingOutcome {
                        binding,
                        bound: Some(target),
                        error: None,
                    });
                }
                Err(reason) => {
                    first_error.get_or_insert_with(|| reason.clone());
                    outcomes.push(BindingOutcome {
                        binding,
                        bound: None,
                        error: Some(reason),
                    });
                }
            }
        }
        // What the tunnel served before and no longer declares.
        for target in route.targets() {
            if !kept.contains(&target) {
                self.ctx.registry.unbind(&route, &target);
            }
        }
        if had_bindings && kept.is_empty() {
            self.detach(&tunnel);
            route.close();
            let reason = first_error.expect("a refused binding has a reason");
            return Frame::Refused {
                tunnel,
                seq,
                reason,
            };
        }
        tracing::debug!(session = %self.session.id, %tunnel, token = %judged.grant.token_id, bindings = kept.len(), "tunnel attached");
        self.tunnels.insert(
            tunnel.clone(),
            EdgeTunnel {
                grant: judged.grant,
                route,
            },
        );
        Frame::Attached {
            tunnel,
            seq,
            bound: outcomes,
        }
    }

    /// Applies a binding update of one tunnel; `None` if it is not open
    /// (the agent sent it before learning the tunnel was closed).
    async fn update(
        &mut self,
        tunnel: String,
        seq: u64,
        add: Vec<Binding>,
        remove: Vec<Binding>,
    ) -> Option<Frame> {
        let (grant, route) = match self.tunnels.get(&tunnel) {
            Some(t) => (t.grant.clone(), Arc::clone(&t.route)),
            None => {
                tracing::debug!(session = %self.session.id, %tunnel, "binding update for a tunnel that is not open");
                return None;
            }
        };
        for binding in &remove {
            let target = route
                .bound
                .lock()
                .expect("bindings poisoned")
                .iter()
                .find(|(_, b)| *b == binding)
                .map(|(t, _)| t.clone());
            if let Some(target) = target {
                self.ctx.registry.unbind(&route, &target);
            }
        }
        let mut results = Vec::with_capacity(add.len());
        for binding in add {
            let full = route.bound.lock().expect("bindings poisoned").len() >= MAX_BINDINGS;
            let outcome = if full {
                Err(Rejection::new(
                    ErrorCode::BadRequest,
                    format!("a tunnel may have at most {MAX_BINDINGS} bindings"),
                ))
            } else {
                check(&self.ctx, &grant, &binding)
                    .await
                    .and_then(|t| self.ctx.registry.bind(&route, &binding, &t).map(|()| t))
            };
            results.push(match outcome {
                Ok(target) => BindingOutcome {
                    binding,
                    bound: Some(target),
                    error: None,
                },
                Err(r) => BindingOutcome {
                    binding,
                    bound: None,
                    error: Some(r),
                },
            });
        }
        Some(Frame::BindingsUpdated {
            tunnel,
            seq,
            results,
        })
    }

    /// Closes a tunnel at the agent's request (no answer).
    fn detach(&mut self, tunnel: &str) {
        if let Some(t) = self.tunnels.remove(tunnel) {
            self.ctx.registry.remove_route(&t.route);
            t.route.close();
            tracing::debug!(session = %self.session.id, %tunnel, "tunnel detached");
        }
    }

    /// Closes a tunnel on the edge's initiative and tells the agent why.
    async fn close_tunnel(&mut self, tunnel: &str, reason: Rejection) -> Result<()> {
        if self.tunnels.contains_key(tunnel) {
            self.detach(tunnel);
            tracing::info!(session = %self.session.id, %tunnel, reason = %reason, "tunnel closed");
            self.send(Frame::TunnelClosed {
                tunnel: tunnel.to_owned(),
                reason,
            })
            .await?;
        }
        Ok(())
    }

    /// Unroutes every tunnel (the session ends).
    fn close_all(&mut self) {
        for (_, t) in self.tunnels.drain() {
            self.ctx.registry.remove_route(&t.route);
            t.route.close();
        }
    }
}

fn describe(target: &BoundTarget) -> String {
    match target {
        BoundTarget::Http { host } => format!("host {host}"),
        BoundTarget::Tcp { port } => format!("TCP port {port}"),
    }
}

/// Authenticates an attach's token and checks each of its bindings. Refused
/// when the token is not valid, or when it names bindings and none is allowed.
async fn judge(ctx: &AgentContext, attach: &Attach) -> Result<Judged, Rejection> {
    validate_tunnel_id(&attach.tunnel)?;
    if attach.bindings.len() > MAX_BINDINGS {
        return Err(Rejection::new(
            ErrorCode::BadRequest,
            format!("a tunnel may have at most {MAX_BINDINGS} bindings"),
        ));
    }
    let grant = authenticate(ctx, &attach.token).await?;
    let mut checked = Vec::with_capacity(attach.bindings.len());
    for binding in &attach.bindings {
        if checked.iter().any(|(b, _)| b == binding) {
            continue;
        }
        checked.push((binding.clone(), check(ctx, &grant, binding).await));
    }
    if !checked.is_empty() && checked.iter().all(|(_, r)| r.is_err()) {
        let first = checked
            .into_iter()
            .find_map(|(_, r)| r.err())
            .expect("checked is not empty");
        return Err(first);
    }
    Ok(Judged { grant, checked })
}

async fn authenticate(
    ctx: &AgentContext,
    token: &crate::wire::TunnelToken,
) -> Result<Grant, Rejection> {
    let grant = ctx.authority.authenticate(token).await?;
    if grant.expires_at <= SystemTime::now() {
        return Err(Rejection::new(
            ErrorCode::TokenExpired,
            format!(
                "tunnel token {} has expired; renew it or create a new one",
                grant.token_id
            ),
        ));
    }
    Ok(grant)
}

async fn check(
    ctx: &AgentContext,
    grant: &Grant,
    binding: &Binding,
) -> Result<BoundTarget, Rejection> {
    binding.validate()?;
    ctx.authority.check_binding(grant, binding).await
}

async fn reject<T>(mut tls: Tls, r: Rejection) -> Result<T> {
    let _ = Frame::Reject(r.clone()).write_to(&mut tls).await;
    let _ = tls.shutdown().await;
    Err(Error::Rejected(r))
}

fn new_session_id() -> String {
    use rand::Rng;
    let n: u64 = rand::rng().random();
    format!("ses_{n:016x}")
}

async fn read_frames<R: tokio::io::AsyncRead + Unpin>(
    mut reader: R,
    frames: mpsc::Sender<Result<Frame>>,
) {
    loop {
        let frame = Frame::read_from(&mut reader).await;
        let failed = frame.is_err();
        if frames.send(frame).await.is_err() || failed {
            return;
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
