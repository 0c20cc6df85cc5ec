//! The edge's side of an agent connection: handshake, registration, control
//! loop (binding updates, heartbeats, revocation), teardown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{broadcast, mpsc};
use tokio::time::{Instant, timeout};
use tokio_rustls::TlsAcceptor;

use super::authority::{Grant, SessionAuthority, TokenId};
use super::registry::{Registry, Session};
use super::tasks::TaskGuard;
use crate::mux;
use crate::wire::{
    Binding, BindingOutcome, BoundTarget, Error, ErrorCode, Frame, HANDSHAKE_TIMEOUT,
    HEARTBEAT_MISSES, PROTOCOL_VERSION, Preamble, Rejection, Result,
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

async fn run(
    tcp: TcpStream,
    peer: SocketAddr,
    ctx: &Arc<AgentContext>,
    mut revocations: broadcast::Receiver<TokenId>,
) -> Result<()> {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let handshake = timeout(HANDSHAKE_TIMEOUT, async {
        let mut tls = ctx.tls.accept(tcp).await.map_err(|e| Error::Tls(format!("agent TLS handshake: {e}")))?;
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
        let (token, bindings, agent) = match Frame::read_from(&mut tls).await? {
            Frame::Hello { token, bindings, agent } => (token, bindings, agent),
            other => {
                let r = Rejection::new(ErrorCode::BadRequest, format!("expected hello, got {}", frame_name(&other)));
                return reject(tls, r).await;
            }
        };
        let grant = match authenticate(ctx, &token).await {
            Ok(g) => g,
            Err(r) => return reject(tls, r).await,
        };
        let mut targets = Vec::with_capacity(bindings.len());
        for binding in &bindings {
            match check(ctx, &grant, binding).await {
                Ok(target) => targets.push((binding.clone(), target)),
                Err(r) => return reject(tls, r).await,
            }
        }
        Ok((tls, grant, targets, agent))
    })
    .await
    .map_err(|_| Error::HandshakeTimeout(HANDSHAKE_TIMEOUT))??;
    let (mut tls, grant, targets, agent) = handshake;

    let session_id = new_session_id();
    // h2 needs the connection; the session needs h2's sender. Register after
    // the h2 handshake, but answer Welcome first: the agent starts h2 on it.
    let welcome_bound: Vec<BindingOutcome> = targets
        .iter()
        .map(|(b, t)| BindingOutcome {
            binding: b.clone(),
            bound: Some(t.clone()),
            error: None,
        })
        .collect();
    // A TCP port that cannot be bound after Welcome ends the session with GoAway.
    Frame::Welcome {
        session_id: session_id.clone(),
        heartbeat_ms: ctx.heartbeat.as_millis() as u64,
        bound: welcome_bound,
    }
    .write_to(&mut tls)
    .await?;
    let remaining = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_secs(1));
    let (sender, connection) = timeout(
        remaining,
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
    let control = timeout(remaining, mux::open_control(&sender))
        .await
        .map_err(|_| Error::HandshakeTimeout(HANDSHAKE_TIMEOUT))??;

    let session = Arc::new(Session::new(session_id.clone(), sender));
    let (read_half, mut write_half) = tokio::io::split(control);
    let mut failed = None;
    for (binding, target) in &targets {
        if let Err(r) = ctx.registry.bind(&session, binding, target) {
            failed = Some(r);
            break;
        }
    }
    if let Some(r) = failed {
        ctx.registry.remove_session(&session);
        let _ = Frame::GoAway(r.clone()).write_to(&mut write_half).await;
        tokio::time::sleep(GOODBYE_GRACE).await;
        return Err(Error::Rejected(r));
    }
    ctx.registry.sessions.send_modify(|n| *n += 1);
    tracing::info!(%peer, session = %session_id, token = %grant.token_id, %agent, bindings = targets.len(), "agent session open");

    let (frames_tx, mut frames) = mpsc::channel::<Result<Frame>>(64);
    let _reader = AbortOnDrop(tokio::spawn(read_frames(read_half, frames_tx)));
    let mut tick = tokio::time::interval_at(Instant::now() + ctx.heartbeat, ctx.heartbeat);
    let mut last_seen = Instant::now();
    let mut seq = 0u64;
    let cancel = ctx.tasks.cancel.clone();

    let goodbye: Option<Rejection> = loop {
        tokio::select! {
            _ = cancel.cancelled() => break Some(Rejection::new(ErrorCode::ShuttingDown, "the edge is shutting down; reconnect later")),
            revoked = revocations.recv() => match revoked {
                Ok(id) if id == grant.token_id => {
                    break Some(Rejection::new(ErrorCode::TokenRevoked, format!("tunnel token {id} was revoked")));
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => {}
            },
            frame = frames.recv() => {
                last_seen = Instant::now();
                match frame {
                    Some(Ok(Frame::Heartbeat { .. })) => {}
                    Some(Ok(Frame::UpdateBindings { id, add, remove })) => {
                        let results = update(ctx, &grant, &session, add, remove).await;
                        if let Err(e) = (Frame::BindingsUpdated { id, results }).write_to(&mut write_half).await {
                            tracing::debug!(error = %e, "control stream write failed");
                            break None;
                        }
                    }
                    Some(Ok(other)) => break Some(Rejection::new(
                        ErrorCode::BadRequest,
                        format!("unexpected {} frame on the control stream", frame_name(&other)),
                    )),
                    Some(Err(e)) => {
                        tracing::debug!(session = %session_id, error = %e, "control stream ended");
                        break None;
                    }
                    None => break None,
                }
            }
            _ = tick.tick() => {
                if last_seen.elapsed() > ctx.heartbeat * HEARTBEAT_MISSES {
                    break Some(Rejection::new(ErrorCode::HeartbeatTimeout, "no heartbeat from the agent"));
                }
                seq += 1;
                if (Frame::Heartbeat { seq }).write_to(&mut write_half).await.is_err() {
                    break None;
                }
            }
        }
    };
    // Unroute first, so no new public connection picks this session.
    ctx.registry.remove_session(&session);
    ctx.registry
        .sessions
        .send_modify(|n| *n = n.saturating_sub(1));
    session.closed.cancel();
    if let Some(reason) = &goodbye {
        tracing::info!(session = %session_id, reason = %reason, "closing agent session");
        if Frame::GoAway(reason.clone())
            .write_to(&mut write_half)
            .await
            .is_ok()
        {
            let _ = write_half.shutdown().await;
            // Let h2 put the frame on the wire; the agent closes on receipt.
            tokio::time::sleep(GOODBYE_GRACE).await;
        }
    } else {
        tracing::info!(session = %session_id, "agent session closed");
    }
    drop(driver);
    Ok(())
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

async fn update(
    ctx: &AgentContext,
    grant: &Grant,
    session: &Arc<Session>,
    add: Vec<Binding>,
    remove: Vec<Binding>,
) -> Vec<BindingOutcome> {
    for binding in &remove {
        let target = session
            .bound
            .lock()
            .expect("bindings poisoned")
            .iter()
            .find(|(_, b)| *b == binding)
            .map(|(t, _)| t.clone());
        if let Some(target) = target {
            ctx.registry.unbind(session, &target);
        }
    }
    let mut results = Vec::with_capacity(add.len());
    for binding in add {
        let outcome = match check(ctx, grant, &binding)
            .await
            .and_then(|t| ctx.registry.bind(session, &binding, &t).map(|()| t))
        {
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
        };
        results.push(outcome);
    }
    results
}

async fn reject<T>(mut tls: tokio_rustls::server::TlsStream<TcpStream>, r: Rejection) -> Result<T> {
    let _ = Frame::Reject(r.clone()).write_to(&mut tls).await;
    let _ = tls.shutdown().await;
    Err(Error::Rejected(r))
}

fn frame_name(frame: &Frame) -> &'static str {
    match frame {
        Frame::Hello { .. } => "hello",
        Frame::Welcome { .. } => "welcome",
        Frame::Reject(_) => "reject",
        Frame::UpdateBindings { .. } => "update_bindings",
        Frame::BindingsUpdated { .. } => "bindings_updated",
        Frame::Heartbeat { .. } => "heartbeat",
        Frame::GoAway(_) => "go_away",
    }
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
