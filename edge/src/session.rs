//! The edge's side of an agent connection: admission, handshake, the
//! session's tunnels (attach, detach, binding updates, each judged against
//! its own token), heartbeats, revocation, teardown.
//!
//! A session is authorised by its tunnels: the hello must carry at least one
//! tunnel the authority accepts, and a session whose last tunnel is gone is
//! closed after a grace period.
//!
//! The session loop never waits for the agent: control frames go through a
//! bounded queue to a writer task whose every write has a deadline, so an
//! agent that stops reading (or withholds flow-control window) cannot delay
//! a revocation — the tunnel is unrouted and its streams cut first, the
//! agent is told when it reads again, and a writer stuck past its deadline
//! ends the session. Missed revocation events (a lagging broadcast) and
//! expiries nobody announced are caught by re-checking every tunnel's grant
//! and bindings with the authority every heartbeat interval.
//!
//! An authority that cannot judge now ([`SessionAuthority::accepting`]: a
//! fleet replica whose copy of the store is older than the revocation
//! bound) judges nothing on an open session either: an `Attach`, or an
//! `UpdateBindings` that adds a binding, ends the session with
//! `go_away{unavailable}` — the answer its hello would get — and the agent
//! reconnects with backoff, to another replica or to this one once it can
//! judge again. (A per-tunnel `refused` would park the tunnel in the agent
//! for good.) Tunnels granted before keep serving until the authority says
//! they may not ([`SessionAuthority::serving`], asked every
//! [`SERVING_CHECK`]): then every session ends the same way.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{broadcast, mpsc};
use tokio::time::{Instant, timeout};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tuna_protocol::mux::{self, MuxStream};
use tuna_protocol::wire::{
    Attach, Binding, BindingOutcome, BoundTarget, ErrorCode, Frame, HANDSHAKE_TIMEOUT,
    HEARTBEAT_MISSES, MAX_BINDINGS, MAX_HELLO_LEN, PROTOCOL_VERSION, Preamble, Rejection,
    read_frames, validate_tunnel_id,
};

use crate::authority::{Grant, Revocation, SessionAuthority, TokenId};
use crate::budget::{EdgeLimits, PreAuthBudget, PreAuthSlot, source_key};
use crate::control::RateLimiter;
use crate::error::{Error, Result};
use crate::registry::{AgentSession, Registry, RouteOwner, SessionEvent, TunnelRoute};
use crate::tasks::TaskGuard;

/// How long a goodbye frame gets to leave before the connection is cut.
const GOODBYE_GRACE: Duration = Duration::from_millis(100);

/// How often a session asks whether its tunnels may keep serving
/// ([`SessionAuthority::serving`]): the outage bound is kept to within this.
pub(crate) const SERVING_CHECK: Duration = Duration::from_secs(1);

/// Everything an agent connection needs from the edge.
pub(crate) struct AgentContext {
    pub(crate) authority: Arc<dyn SessionAuthority>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) tls: TlsAcceptor,
    pub(crate) heartbeat: Duration,
    pub(crate) admission: Admission,
    pub(crate) tasks: TaskGuard,
}

/// What the edge admits: its limits and the state they are checked against
/// (unauthenticated connections and failed authentications per source — an
/// IPv4 address or an IPv6 /64 —, open tunnels and sessions per token and
/// account).
pub(crate) struct Admission {
    limits: EdgeLimits,
    pending: PreAuthBudget,
    auth_failures: RateLimiter,
    ledger: Mutex<Ledger>,
}

/// Open tunnels and sessions, counted for the quotas.
#[derive(Default)]
struct Ledger {
    tunnels_by_token: HashMap<TokenId, usize>,
    tunnels_by_account: HashMap<String, usize>,
    sessions_by_account: HashMap<String, usize>,
}

fn bump<K: std::hash::Hash + Eq + Clone>(map: &mut HashMap<K, usize>, key: &K) {
    *map.entry(key.clone()).or_insert(0) += 1;
}

fn drop_one<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

impl Admission {
    pub(crate) fn new(limits: EdgeLimits) -> Self {
        Self {
            pending: PreAuthBudget::new(
                limits.max_pending_handshakes.max(1),
                limits.max_pending_handshakes_per_ip,
            ),
            auth_failures: RateLimiter::new(limits.auth_failures),
            ledger: Mutex::new(Ledger::default()),
            limits,
        }
    }

    /// A pre-authentication slot for a connection from `ip`, or `None` when
    /// the edge or the source has as many unauthenticated connections as
    /// allowed (the connection is then closed at once).
    fn admit(&self, ip: IpAddr) -> Option<PreAuthSlot> {
        self.pending.try_acquire(ip)
    }

    /// `Err(rate_limited)` when `ip` spent its budget of failed authentications.
    #[cfg(test)]
    fn auth_allowed(&self, ip: IpAddr) -> Result<(), Rejection> {
        self.auth_failures
            .peek(&source_key(ip).to_string())
            .map_err(|wait| {
                Rejection::new(
                    ErrorCode::RateLimited,
                    format!(
                        "too many failed tunnel authentications from {ip}; retry in {} s",
                        wait.as_secs().max(1)
                    ),
                )
            })
    }

    /// Charges one failed authentication to `ip` in advance, before a
    /// catch-up with the store (refunded with [`Admission::refund`] if the
    /// token turns out valid); `Err(rate_limited)` when the budget is spent.
    fn charge(&self, ip: IpAddr) -> Result<(), Rejection> {
        self.auth_failures
            .check(&source_key(ip).to_string())
            .map_err(|wait| {
                Rejection::new(
                    ErrorCode::RateLimited,
                    format!(
                        "too many failed tunnel authentications from {ip}; retry in {} s",
                        wait.as_secs().max(1)
                    ),
                )
            })
    }

    fn refund(&self, ip: IpAddr) {
        self.auth_failures.refund(&source_key(ip).to_string());
    }

    /// Counts a refusal against `ip` if it was a failed authentication.
    #[cfg(test)]
    fn note_refusal(&self, ip: IpAddr, reason: &Rejection) {
        if matches!(
            reason.code,
            ErrorCode::BadToken | ErrorCode::TokenExpired | ErrorCode::TokenRevoked
        ) {
            let _ = self.auth_failures.check(&source_key(ip).to_string());
        }
    }

    /// Reserves room for one more tunnel of `grant`; `new_session_account`
    /// when the session carries no tunnel of that account yet.
    fn reserve(&self, grant: &Grant, new_session_account: bool) -> Result<(), Rejection> {
        let limits = &self.limits;
        let mut ledger = self.ledger.lock();
        let exceeded = |what: String| Rejection::new(ErrorCode::QuotaExceeded, what);
        if !grant.api_key
            && ledger
                .tunnels_by_token
                .get(&grant.token_id)
                .copied()
                .unwrap_or(0)
                >= limits.max_tunnels_per_token
        {
            return Err(exceeded(format!(
                "tunnel token {} already has {} open tunnels (at most {}); detach one or mint a token per tunnel",
                grant.token_id, limits.max_tunnels_per_token, limits.max_tunnels_per_token
            )));
        }
        if ledger
            .tunnels_by_account
            .get(&grant.account)
            .copied()
            .unwrap_or(0)
            >= limits.max_tunnels_per_account
        {
            return Err(exceeded(format!(
                "the account has {} open tunnels, its quota (tuna-operator edge --max-tunnels-per-account)",
                limits.max_tunnels_per_account
            )));
        }
        if new_session_account
            && ledger
                .sessions_by_account
                .get(&grant.account)
                .copied()
                .unwrap_or(0)
                >= limits.max_sessions_per_account
        {
            return Err(exceeded(format!(
                "the account has tunnels on {} agent connections, its quota (tuna-operator edge --max-sessions-per-account); carry more tunnels per connection",
                limits.max_sessions_per_account
            )));
        }
        if !grant.api_key {
            bump(&mut ledger.tunnels_by_token, &grant.token_id);
        }
        bump(&mut ledger.tunnels_by_account, &grant.account);
        if new_session_account {
            bump(&mut ledger.sessions_by_account, &grant.account);
        }
        Ok(())
    }

    /// Returns what [`Admission::reserve`] took; `last_of_account` when the
    /// session carries no other tunnel of the account.
    fn release(&self, grant: &Grant, last_of_account: bool) {
        let mut ledger = self.ledger.lock();
        if !grant.api_key {
            drop_one(&mut ledger.tunnels_by_token, &grant.token_id);
        }
        drop_one(&mut ledger.tunnels_by_account, &grant.account);
        if last_of_account {
            drop_one(&mut ledger.sessions_by_account, &grant.account);
        }
    }
}

/// Serves one agent connection until it ends.
pub(crate) async fn serve_agent(tcp: TcpStream, peer: SocketAddr, ctx: Arc<AgentContext>) {
    let _guard = ctx.tasks.clone();
    let Some(slot) = ctx.admission.admit(peer.ip()) else {
        tracing::debug!(%peer, "too many unauthenticated agent connections; closing");
        return;
    };
    let _ = tcp.set_nodelay(true);
    let cancel = ctx.tasks.cancel.clone();
    // Subscribe before authenticating so a revocation racing the handshake is seen.
    let revocations = ctx.authority.revocations();
    // A full budget may take the slot back for a newcomer before the hello
    // is judged (the slot is released once it is, and never evicted then).
    let evicted = slot.evicted();
    let result = tokio::select! {
        _ = cancel.cancelled() => return,
        _ = evicted.cancelled() => {
            tracing::debug!(%peer, "unauthenticated agent connection gave way to a newcomer");
            return;
        }
        r = run(tcp, peer, &ctx, revocations, slot) => r,
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
    peer: SocketAddr,
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
    // A replica that cannot know of recent revocations judges no one.
    if let Err(r) = ctx.authority.accepting() {
        return reject(tls, r).await;
    }
    let mut judged = Vec::with_capacity(tunnels.len());
    for attach in tunnels {
        let verdict = judge(ctx, peer.ip(), &attach).await;
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
    mut revocations: broadcast::Receiver<Revocation>,
    slot: PreAuthSlot,
) -> Result<()> {
    let limits = &ctx.admission.limits;
    let (mut tls, agent, judged) = timeout(limits.pre_auth_timeout, pre_auth(tcp, peer, ctx))
        .await
        .map_err(|_| Error::HandshakeTimeout(limits.pre_auth_timeout))??;
    // Authenticated: the connection no longer counts as pending.
    drop(slot);

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
    let driver = AbortOnDropHandle::new(driver);
    let control = timeout(HANDSHAKE_TIMEOUT, mux::open_control(&sender))
        .await
        .map_err(|_| Error::HandshakeTimeout(HANDSHAKE_TIMEOUT))??;

    let (session, mut events) =
        AgentSession::new(session_id.clone(), sender, limits.open_stream_timeout);
    let (read_half, write_half) = tokio::io::split(control);
    let writer = ControlWriter::spawn(
        write_half,
        limits.control_queue,
        limits.control_write_timeout,
    );
    let mut state = SessionState {
        ctx: Arc::clone(ctx),
        session: Arc::clone(&session),
        peer,
        tunnels: HashMap::new(),
        accounts: HashMap::new(),
        writer,
    };
    ctx.registry.sessions.send_modify(|n| *n += 1);
    tracing::info!(%peer, session = %session_id, %agent, "agent session open");

    for (attach, verdict) in judged {
        let answer = state.install(attach, verdict);
        state.send(answer);
    }
    let goodbye = state.serve(read_half, &mut revocations, &mut events).await;
    state.close_all();
    ctx.registry
        .sessions
        .send_modify(|n| *n = n.saturating_sub(1));
    session.closed.cancel();
    let writer = state.writer;
    match &goodbye {
        Some(reason) => {
            tracing::info!(session = %session_id, reason = %reason, "closing agent session");
            writer.finish(Some(Frame::GoAway(reason.clone()))).await;
        }
        None => {
            tracing::info!(session = %session_id, "agent session closed");
            writer.finish(None).await;
        }
    }
    drop(driver);
    Ok(())
}

/// The control stream's write side: a bounded queue drained by a task whose
/// every write has a deadline. Queueing never waits.
struct ControlWriter {
    queue: mpsc::Sender<Frame>,
    /// Cancelled when a write failed or missed its deadline, or the queue
    /// overflowed: the agent does not read; the session ends.
    failed: CancellationToken,
    task: tokio::task::JoinHandle<WriteHalf<MuxStream>>,
}

impl ControlWriter {
    fn spawn(mut half: WriteHalf<MuxStream>, capacity: usize, deadline: Duration) -> Self {
        let (queue, mut frames) = mpsc::channel::<Frame>(capacity.max(1));
        let failed = CancellationToken::new();
        let signal = failed.clone();
        let task = tokio::spawn(async move {
            while let Some(frame) = frames.recv().await {
                let name = frame.name();
                match timeout(deadline, frame.write_to(&mut half)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "control stream write failed");
                        signal.cancel();
                        break;
                    }
                    Err(_) => {
                        tracing::info!(
                            frame = name,
                            ?deadline,
                            "the agent took no control frame in time; ending its session"
                        );
                        signal.cancel();
                        break;
                    }
                }
            }
            half
        });
        Self {
            queue,
            failed,
            task,
        }
    }

    fn send(&self, frame: Frame) {
        if self.queue.try_send(frame).is_err() {
            tracing::info!("the agent lets its control frames pile up; ending its session");
            self.failed.cancel();
        }
    }

    /// Sends the goodbye (if the stream still works), closes the stream.
    async fn finish(self, goodbye: Option<Frame>) {
        let working = !self.failed.is_cancelled();
        if working && let Some(frame) = goodbye {
            let _ = self.queue.try_send(frame);
        }
        drop(self.queue);
        if !working {
            self.task.abort();
            return;
        }
        if let Ok(Ok(mut half)) = timeout(GOODBYE_GRACE * 5, self.task).await {
            let _ = half.shutdown().await;
            // Let h2 put the frames on the wire; the agent closes on receipt.
            tokio::time::sleep(GOODBYE_GRACE).await;
        }
    }
}

/// A tunnel open on this session.
struct EdgeTunnel {
    grant: Grant,
    route: Arc<TunnelRoute>,
}

/// The session's task state: its tunnels and the control writer.
struct SessionState {
    ctx: Arc<AgentContext>,
    session: Arc<AgentSession>,
    peer: SocketAddr,
    tunnels: HashMap<String, EdgeTunnel>,
    /// Open tunnels per account (for the sessions-per-account quota).
    accounts: HashMap<String, usize>,
    writer: ControlWriter,
}

impl SessionState {
    fn send(&self, frame: Frame) {
        self.writer.send(frame);
    }

    /// The control loop; returns the goodbye to send, if any.
    async fn serve(
        &mut self,
        read_half: tokio::io::ReadHalf<MuxStream>,
        revocations: &mut broadcast::Receiver<Revocation>,
        events: &mut mpsc::UnboundedReceiver<SessionEvent>,
    ) -> Option<Rejection> {
        let heartbeat = self.ctx.heartbeat;
        let (frames_tx, mut frames) = mpsc::channel::<tuna_protocol::Result<Frame>>(64);
        let _reader = AbortOnDropHandle::new(tokio::spawn(read_frames(read_half, frames_tx)));
        let mut tick = tokio::time::interval_at(Instant::now() + heartbeat, heartbeat);
        let mut serving_tick =
            tokio::time::interval_at(Instant::now() + SERVING_CHECK, SERVING_CHECK);
        serving_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_seen = Instant::now();
        let mut empty_since: Option<Instant> = None;
        let mut seq = 0u64;
        let cancel = self.ctx.tasks.cancel.clone();
        let failed = self.writer.failed.clone();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => {
                    return Some(Rejection::new(ErrorCode::ShuttingDown, "the edge is shutting down; reconnect later"));
                }
                _ = failed.cancelled() => return None,
                revoked = revocations.recv() => match revoked {
                    Ok(Revocation::Token(id)) => {
                        let reason = Rejection::new(ErrorCode::TokenRevoked, format!("tunnel token {id} was revoked"));
                        let hit: Vec<String> = self
                            .tunnels
                            .iter()
                            .filter(|(_, t)| t.grant.token_id == id)
                            .map(|(name, _)| name.clone())
                            .collect();
                        for tunnel in hit {
                            self.close_tunnel(&tunnel, reason.clone());
                        }
                    }
                    Ok(Revocation::Target(target)) => {
                        let hit: Vec<String> = self
                            .tunnels
                            .iter()
                            .filter(|(_, t)| t.route.targets().contains(&target))
                            .map(|(name, _)| name.clone())
                            .collect();
                        for tunnel in hit {
                            let reason = Rejection::new(
                                ErrorCode::BindingReleased,
                                format!("{} was released at the edge", describe(&target)),
                            );
                            self.close_tunnel(&tunnel, reason);
                        }
                    }
                    // Handled with the address bindings (issue 41); until
                    // then the heartbeat re-check ends them.
                    Ok(Revocation::Address(_)) => {}
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::info!(session = %self.session.id, missed, "revocation events missed; re-checking every tunnel");
                        self.recheck().await;
                    }
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
                            self.close_tunnel(&route.tunnel, reason);
                        }
                    }
                },
                frame = frames.recv() => {
                    last_seen = Instant::now();
                    let answer = match frame {
                        Some(Ok(Frame::Heartbeat { .. })) => None,
                        Some(Ok(Frame::Attach(attach))) => {
                            // Judged on a stale copy it could be granted on a
                            // revoked token: end the session instead.
                            if let Err(r) = self.ctx.authority.accepting() {
                                tracing::info!(session = %self.session.id, tunnel = %attach.tunnel, "an attach this edge cannot judge now; ending the session");
                                return Some(r);
                            }
                            let verdict = judge(&self.ctx, self.peer.ip(), &attach).await;
                            Some(self.install(attach, verdict))
                        }
                        Some(Ok(Frame::Detach { tunnel })) => {
                            self.detach(&tunnel);
                            None
                        }
                        Some(Ok(Frame::UpdateBindings { tunnel, seq, add, remove })) => {
                            // Likewise a binding released and reserved by
                            // another account since the copy was made.
                            if !add.is_empty()
                                && let Err(r) = self.ctx.authority.accepting()
                            {
                                tracing::info!(session = %self.session.id, %tunnel, "a binding update this edge cannot judge now; ending the session");
                                return Some(r);
                            }
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
                    if let Some(answer) = answer {
                        self.send(answer);
                    }
                }
                _ = serving_tick.tick() => {
                    if let Err(r) = self.ctx.authority.serving() {
                        return Some(r);
                    }
                }
                _ = tick.tick() => {
                    if last_seen.elapsed() > heartbeat * HEARTBEAT_MISSES {
                        return Some(Rejection::new(ErrorCode::HeartbeatTimeout, "no heartbeat from the agent"));
                    }
                    self.recheck().await;
                    if self.tunnels.is_empty() {
                        let since = *empty_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= self.ctx.admission.limits.empty_session_grace {
                            return Some(Rejection::new(ErrorCode::NoTunnels, "the session carries no tunnel; attach one to open a new session"));
                        }
                    } else {
                        empty_since = None;
                    }
                    seq += 1;
                    self.send(Frame::Heartbeat { seq });
                }
            }
        }
    }

    /// Asks the authority about every tunnel again: its grant (revoked,
    /// expired, renewed) and each binding (released, no longer allowed).
    async fn recheck(&mut self) {
        let names: Vec<String> = self.tunnels.keys().cloned().collect();
        for name in names {
            let Some(tunnel) = self.tunnels.get(&name) else {
                continue;
            };
            let (grant, route) = (tunnel.grant.clone(), Arc::clone(&tunnel.route));
            let fresh = match self.ctx.authority.refresh(&grant).await {
                Ok(fresh) if fresh.expires_at <= SystemTime::now() => Err(Rejection::new(
                    ErrorCode::TokenExpired,
                    format!(
                        "tunnel token {} has expired; renew it or create a new one",
                        grant.token_id
                    ),
                )),
                other => other,
            };
            let fresh = match fresh {
                Ok(fresh) => fresh,
                Err(reason) => {
                    self.close_tunnel(&name, reason);
                    continue;
                }
            };
            let bound: Vec<(BoundTarget, Binding)> = route
                .bound
                .lock()
                .iter()
                .map(|(t, b)| (t.clone(), b.clone()))
                .collect();
            let mut lost = None;
            for (target, binding) in bound {
                match self.ctx.authority.check_binding(&fresh, &binding).await {
                    Ok(now) if now == target => {}
                    Ok(_) | Err(_) => {
                        lost = Some(Rejection::new(
                            ErrorCode::BindingReleased,
                            format!(
                                "{} is no longer this tunnel's to serve ({binding})",
                                describe(&target)
                            ),
                        ));
                        break;
                    }
                }
            }
            match lost {
                Some(reason) => self.close_tunnel(&name, reason),
                None => {
                    if let Some(t) = self.tunnels.get_mut(&name) {
                        t.grant = fresh;
                    }
                }
            }
        }
    }

    /// Opens (or replaces) a judged tunnel in the registry; the answer to send.
    fn install(&mut self, attach: Attach, verdict: Result<Judged, Rejection>) -> Frame {
        let Attach { tunnel, seq, .. } = attach;
        let refused = |tunnel, reason| Frame::Refused {
            tunnel,
            seq,
            reason,
        };
        let judged = match verdict {
            Ok(j) => j,
            Err(reason) => {
                // A failed re-attach closes what the tunnel served before.
                self.detach(&tunnel);
                return refused(tunnel, reason);
            }
        };
        // Quotas: a new tunnel, or a replacement with another token.
        let previous = self.tunnels.get(&tunnel).map(|t| t.grant.clone());
        let same_grant = previous.as_ref().is_some_and(|p| {
            p.token_id == judged.grant.token_id && p.account == judged.grant.account
        });
        if !same_grant {
            let new_account = !self.accounts.contains_key(&judged.grant.account);
            if let Err(reason) = self.ctx.admission.reserve(&judged.grant, new_account) {
                self.detach(&tunnel);
                return refused(tunnel, reason);
            }
            *self
                .accounts
                .entry(judged.grant.account.clone())
                .or_insert(0) += 1;
            if let Some(previous) = &previous {
                self.release(previous);
            }
        }
        let owner = RouteOwner::of(&judged.grant);
        let route = match self.tunnels.get(&tunnel) {
            Some(existing) if existing.route.owner == owner => Arc::clone(&existing.route),
            Some(existing) => {
                // Re-attached with another owner's token: nothing it served
                // carries over (its quota was given back above).
                self.ctx.registry.remove_route(&existing.route);
                existing.route.close();
                TunnelRoute::new(&self.session, tunnel.clone(), owner)
            }
            None => TunnelRoute::new(&self.session, tunnel.clone(), owner),
        };
        // The grant is recorded first, so a failure below releases it.
        self.tunnels.insert(
            tunnel.clone(),
            EdgeTunnel {
                grant: judged.grant.clone(),
                route: Arc::clone(&route),
            },
        );
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
            let reason = first_error.expect("a refused binding has a reason");
            return refused(tunnel, reason);
        }
        tracing::debug!(session = %self.session.id, %tunnel, token = %judged.grant.token_id, bindings = kept.len(), "tunnel attached");
        Frame::Attached {
            tunnel,
            seq,
            bound: outcomes,
        }
    }

    /// Gives back a tunnel's quota.
    fn release(&mut self, grant: &Grant) {
        let last = match self.accounts.get_mut(&grant.account) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                self.accounts.remove(&grant.account);
                true
            }
            None => false,
        };
        self.ctx.admission.release(grant, last);
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
                .iter()
                .find(|(_, b)| *b == binding)
                .map(|(t, _)| t.clone());
            if let Some(target) = target {
                self.ctx.registry.unbind(&route, &target);
            }
        }
        let mut results = Vec::with_capacity(add.len());
        for binding in add {
            let full = route.bound.lock().len() >= MAX_BINDINGS;
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

    /// Closes a tunnel: unroutes it, cuts its streams, gives back its quota.
    /// Not answered (the agent asked, or is told separately).
    fn detach(&mut self, tunnel: &str) {
        if let Some(t) = self.tunnels.remove(tunnel) {
            self.ctx.registry.remove_route(&t.route);
            t.route.close();
            self.release(&t.grant);
            tracing::debug!(session = %self.session.id, %tunnel, "tunnel detached");
        }
    }

    /// Closes a tunnel on the edge's initiative and tells the agent why. The
    /// tunnel stops serving before anything is written.
    fn close_tunnel(&mut self, tunnel: &str, reason: Rejection) {
        if self.tunnels.contains_key(tunnel) {
            self.detach(tunnel);
            tracing::info!(session = %self.session.id, %tunnel, reason = %reason, "tunnel closed");
            self.send(Frame::TunnelClosed {
                tunnel: tunnel.to_owned(),
                reason,
            });
        }
    }

    /// Unroutes every tunnel (the session ends).
    fn close_all(&mut self) {
        let names: Vec<String> = self.tunnels.keys().cloned().collect();
        for name in names {
            self.detach(&name);
        }
    }
}

fn describe(target: &BoundTarget) -> String {
    match target {
        BoundTarget::Http { host } => format!("host {host}"),
        BoundTarget::Tcp { port } => format!("TCP port {port}"),
        BoundTarget::Address { address, port } => {
            format!("address {}", std::net::SocketAddr::new(*address, *port))
        }
    }
}

/// Authenticates an attach's token and checks each of its bindings. Refused
/// when the token is not valid, or when it names bindings and none is allowed.
/// Judges one attach from `ip`; a failed authentication is charged to
/// `ip`'s budget (before the store round trip when there is one).
async fn judge(ctx: &AgentContext, ip: IpAddr, attach: &Attach) -> Result<Judged, Rejection> {
    validate_tunnel_id(&attach.tunnel)?;
    if attach.bindings.len() > MAX_BINDINGS {
        return Err(Rejection::new(
            ErrorCode::BadRequest,
            format!("a tunnel may have at most {MAX_BINDINGS} bindings"),
        ));
    }
    let grant = match authenticate(ctx, &attach.token).await {
        Ok(grant) => grant,
        // A token minted elsewhere a moment ago may not be in this copy
        // yet: catch up once, charged before the round trip, and only for a
        // token of the right shape.
        Err(refused) if ctx.authority.may_catch_up(&attach.token) => {
            ctx.admission.charge(ip)?;
            if !ctx.authority.catch_up().await {
                return Err(refused);
            }
            let grant = authenticate(ctx, &attach.token).await?;
            ctx.admission.refund(ip);
            grant
        }
        // No round trip to pay for, but counted: once the source's budget
        // is spent its refusals say so (a guesser is told to slow down).
        Err(refused) => {
            return Err(match ctx.admission.charge(ip) {
                Ok(()) => refused,
                Err(limited) => limited,
            });
        }
    };
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
    token: &tuna_protocol::wire::TunnelToken,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::RateLimit;

    /// Issue 30, item 1: the agent listener counts an IPv6 client by its
    /// /64, as every other listener does, for unauthenticated connections and
    /// for failed authentications: one host owns a /64, so counting each
    /// address would give it 2^64 budgets.
    #[test]
    fn agent_admission_counts_ipv6_sources_per_slash_64() {
        let admission = Admission::new(EdgeLimits {
            max_pending_handshakes: 8,
            max_pending_handshakes_per_ip: 1,
            auth_failures: RateLimit {
                burst: 1,
                per_second: 0.001,
            },
            ..EdgeLimits::default()
        });
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let same_64: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other_64: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        let held = admission.admit(a).expect("the first connection");
        assert!(admission.admit(same_64).is_none(), "same /64: over budget");
        assert!(admission.admit(other_64).is_some(), "another /64");
        drop(held);
        assert!(admission.admit(same_64).is_some(), "freed on drop");

        let bad = Rejection::new(ErrorCode::BadToken, "bad token");
        admission.note_refusal(a, &bad);
        admission.note_refusal(a, &bad);
        assert!(
            admission.auth_allowed(same_64).is_err(),
            "same /64 is limited"
        );
        assert!(admission.auth_allowed(other_64).is_ok());
    }
}
