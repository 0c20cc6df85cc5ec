//! The agent's connect–serve–reconnect loop.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use rustls::pki_types::ServerName;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout};
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;

use super::{AgentConfig, AgentStatus, Command, Shared, StreamHandler};
use crate::mux;
use crate::wire::{
    Binding, BindingOutcome, Error, ErrorCode, Frame, HANDSHAKE_TIMEOUT, HEADER_KIND,
    HEARTBEAT_MISSES, PROTOCOL_VERSION, Preamble, Result, StreamMeta,
};

/// Why a session ended.
enum End {
    /// The handle asked us to stop.
    Stop,
    /// The session ran and then ended; `Err` for why.
    Lost(Error),
}

pub(crate) async fn run(
    config: AgentConfig,
    connector: TlsConnector,
    server_name: ServerName<'static>,
    shared: Arc<Shared>,
    mut commands: mpsc::Receiver<Command>,
    handler: Arc<dyn StreamHandler>,
    cancel: CancellationToken,
) {
    let mut attempt: u32 = 0;
    loop {
        shared
            .status
            .send_replace(AgentStatus::Connecting { attempt });
        let outcome = tokio::select! {
            _ = cancel.cancelled() => End::Stop,
            r = session(&config, &connector, &server_name, &shared, &mut commands, &handler, &mut attempt) => r,
        };
        let error = match outcome {
            End::Stop => break,
            End::Lost(e) => e,
        };
        let status = match &error {
            Error::Rejected(r) => AgentStatus::Rejected(r.clone()),
            other => AgentStatus::Disconnected {
                reason: other.to_string(),
            },
        };
        tracing::warn!(edge = %config.edge_addr, error = %error, "tunnel session ended; reconnecting");
        shared.status.send_replace(status);
        attempt = attempt.saturating_add(1);
        let delay = backoff(config.backoff_initial, config.backoff_max, attempt);
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        // While waiting, binding changes are recorded for the next handshake.
        loop {
            tokio::select! {
                _ = cancel.cancelled() => {
                    shared.status.send_replace(AgentStatus::Stopped);
                    return;
                }
                _ = &mut sleep => break,
                cmd = commands.recv() => match cmd {
                    Some(Command::Update { add, remove, reply }) => {
                        apply_offline(&shared, add, remove);
                        let _ = reply.send(Ok(Vec::new()));
                    }
                    None => {
                        shared.status.send_replace(AgentStatus::Stopped);
                        return;
                    }
                },
            }
        }
    }
    shared.status.send_replace(AgentStatus::Stopped);
}

fn apply_offline(shared: &Shared, add: Vec<Binding>, remove: Vec<Binding>) {
    let mut desired = shared.desired.lock().expect("bindings lock poisoned");
    for b in remove {
        desired.remove(&b);
    }
    desired.extend(add);
}

/// Full jitter over a capped exponential: uniform in [base/2, base].
pub(crate) fn backoff(initial: Duration, max: Duration, attempt: u32) -> Duration {
    let exp = initial.saturating_mul(1u32 << attempt.min(20));
    let base = exp.min(max);
    let half = base / 2;
    let jitter = rand::rng().random_range(0..=half.as_millis() as u64);
    half + Duration::from_millis(jitter)
}

async fn session(
    config: &AgentConfig,
    connector: &TlsConnector,
    server_name: &ServerName<'static>,
    shared: &Shared,
    commands: &mut mpsc::Receiver<Command>,
    handler: &Arc<dyn StreamHandler>,
    attempt: &mut u32,
) -> End {
    let handshake = timeout(
        HANDSHAKE_TIMEOUT,
        handshake(config, connector, server_name, shared, handler),
    )
    .await;
    let (mut control, accept_task, session_id, heartbeat) = match handshake {
        Err(_) => return End::Lost(Error::HandshakeTimeout(HANDSHAKE_TIMEOUT)),
        Ok(Err(e)) => return End::Lost(e),
        Ok(Ok(parts)) => parts,
    };
    let accept_task = AbortOnDrop(accept_task);
    *attempt = 0;
    tracing::info!(edge = %config.edge_addr, session = %session_id, "tunnel session open");
    shared.status.send_replace(AgentStatus::Connected {
        session_id: session_id.clone(),
    });

    let (read_half, mut write_half) = tokio::io::split(control.take_stream());
    let (frames_tx, mut frames) = mpsc::channel::<Result<Frame>>(64);
    let _reader = AbortOnDrop(tokio::spawn(read_frames(read_half, frames_tx)));
    let mut pending: HashMap<u64, Pending> = HashMap::new();
    let mut next_id: u64 = 1;
    let mut seq: u64 = 0;
    let mut tick = tokio::time::interval_at(Instant::now() + heartbeat, heartbeat);
    let mut last_seen = Instant::now();
    let mut accept_done = accept_task;

    let end = loop {
        tokio::select! {
            r = &mut accept_done.0 => {
                let reason = match r {
                    Ok(Ok(())) => Error::Closed("the edge closed the tunnel connection".into()),
                    Ok(Err(e)) => e,
                    Err(e) => Error::Closed(format!("stream acceptor failed: {e}")),
                };
                break reason;
            }
            frame = frames.recv() => {
                last_seen = Instant::now();
                match frame {
                    Some(Ok(Frame::Heartbeat { .. })) => {}
                    Some(Ok(Frame::BindingsUpdated { id, results })) => {
                        if let Some(p) = pending.remove(&id) {
                            apply_online(shared, &p, &results);
                            let _ = p.reply.send(Ok(results));
                        }
                    }
                    // An edge restart is a disconnect, not a refusal of this agent.
                    Some(Ok(Frame::GoAway(r))) if r.code == ErrorCode::ShuttingDown => {
                        break Error::Closed(r.message);
                    }
                    Some(Ok(Frame::GoAway(r))) => break Error::Rejected(r),
                    Some(Ok(other)) => break Error::Protocol(format!("unexpected frame on the control stream: {other:?}")),
                    Some(Err(e)) => break e,
                    None => break Error::Closed("control stream ended".into()),
                }
            }
            cmd = commands.recv() => match cmd {
                Some(Command::Update { add, remove, reply }) => {
                    let id = next_id;
                    next_id += 1;
                    let frame = Frame::UpdateBindings { id, add: add.clone(), remove: remove.clone() };
                    if let Err(e) = frame.write_to(&mut write_half).await {
                        let _ = reply.send(Err(Error::Closed(format!("control stream: {e}"))));
                        break e;
                    }
                    pending.insert(id, Pending { add, remove, reply });
                }
                None => return End::Stop,
            },
            _ = tick.tick() => {
                if last_seen.elapsed() > heartbeat * HEARTBEAT_MISSES {
                    break Error::Rejected(crate::wire::Rejection::new(
                        ErrorCode::HeartbeatTimeout,
                        format!("no word from the edge for {:?}", last_seen.elapsed()),
                    ));
                }
                seq += 1;
                if let Err(e) = (Frame::Heartbeat { seq }).write_to(&mut write_half).await {
                    break e;
                }
            }
        }
    };
    // Outstanding updates: record them for the next handshake.
    for (_, p) in pending.drain() {
        apply_offline(shared, p.add, p.remove);
        let _ = p.reply.send(Ok(Vec::new()));
    }
    let _ = write_half.shutdown().await;
    End::Lost(end)
}

struct Pending {
    add: Vec<Binding>,
    remove: Vec<Binding>,
    reply: oneshot::Sender<Result<Vec<BindingOutcome>>>,
}

fn apply_online(shared: &Shared, pending: &Pending, results: &[BindingOutcome]) {
    let mut desired = shared.desired.lock().expect("bindings lock poisoned");
    for b in &pending.remove {
        desired.remove(b);
    }
    for b in &pending.add {
        let refused = results.iter().any(|r| &r.binding == b && r.error.is_some());
        if !refused {
            desired.insert(b.clone());
        }
    }
}

/// The control stream, taken out once the session is set up.
struct Control(Option<mux::MuxStream>);

impl Control {
    fn take_stream(&mut self) -> mux::MuxStream {
        self.0.take().expect("control stream taken twice")
    }
}

type Handshaken = (
    Control,
    tokio::task::JoinHandle<Result<()>>,
    String,
    Duration,
);

async fn handshake(
    config: &AgentConfig,
    connector: &TlsConnector,
    server_name: &ServerName<'static>,
    shared: &Shared,
    handler: &Arc<dyn StreamHandler>,
) -> Result<Handshaken> {
    let tcp = TcpStream::connect(&config.edge_addr).await?;
    tcp.set_nodelay(true)?;
    let mut tls = connector
        .connect(server_name.clone(), tcp)
        .await
        .map_err(|e| Error::Tls(format!("TLS handshake with {}: {e}", config.edge_addr)))?;
    let bindings: Vec<Binding> = shared
        .desired
        .lock()
        .expect("bindings lock poisoned")
        .iter()
        .cloned()
        .collect();
    tls.write_all(
        &Preamble {
            version: PROTOCOL_VERSION,
        }
        .encode(),
    )
    .await?;
    Frame::Hello {
        token: config.token.clone(),
        bindings,
        agent: config.agent_name.clone(),
    }
    .write_to(&mut tls)
    .await?;
    let (session_id, heartbeat) = match Frame::read_from(&mut tls).await? {
        Frame::Welcome {
            session_id,
            heartbeat_ms,
            ..
        } => (
            session_id,
            Duration::from_millis(heartbeat_ms.clamp(100, 600_000)),
        ),
        Frame::Reject(r) => return Err(Error::Rejected(r)),
        other => return Err(Error::Protocol(format!("expected welcome, got {other:?}"))),
    };
    // From here the TLS stream speaks h2; the edge opens the control stream first.
    let mut conn = mux::server_builder()
        .handshake(mux::Coalesced::new(tls))
        .await?;
    let (request, respond) = conn
        .accept()
        .await
        .ok_or_else(|| Error::Closed("edge closed before opening the control stream".into()))??;
    if request.headers().get(HEADER_KIND).map(|v| v.as_bytes()) != Some(b"control") {
        return Err(Error::Protocol(
            "the first stream is not the control stream".into(),
        ));
    }
    let (_, control) = mux::accept_stream(request, respond)?;
    let accept = tokio::spawn(accept_streams(conn, Arc::clone(handler)));
    Ok((Control(Some(control)), accept, session_id, heartbeat))
}

/// Drives the h2 connection and hands every data stream to the handler.
/// Returns when the edge closes the connection.
async fn accept_streams(
    mut conn: h2::server::Connection<
        mux::Coalesced<tokio_rustls::client::TlsStream<TcpStream>>,
        bytes::Bytes,
    >,
    handler: Arc<dyn StreamHandler>,
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
        match mux::accept_stream(request, respond) {
            Ok((_, stream)) => handler.handle(stream, meta),
            Err(e) => tracing::warn!(error = %e, "could not answer a stream"),
        }
    }
    Ok(())
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

/// Aborts the task when dropped, so a session's helpers die with it.
pub(crate) struct AbortOnDrop<T>(pub(crate) tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
