//! One CONNECT connection: the head, the authorizer's decision, the TLS
//! handshake with a certificate of the listener's CA, then the core's HTTP
//! path pinned to the grant's upstream.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::ConnectConfig;
use super::grant::{Authority, ConnectRefusal, ConnectRequest, ProxyCredentials};
use super::recheck::LiveGrant;
use crate::accept::{accept_until, spawn_connection};
use crate::client::Scheme;
use crate::conn;
use crate::http::{Router, StreamScope};
use crate::inner::Inner;
use crate::metrics::ConnectOutcome;
use crate::shared::Shared;

/// The realm of `Proxy-Authenticate`.
const REALM: &str = "tuna-connectors";

/// The places of connections not granted yet: in all, and per client
/// address.
struct Unauthenticated {
    total: Arc<tokio::sync::Semaphore>,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    max_per_ip: usize,
}

/// One connection's place among those not granted yet; given back on drop
/// (when it is granted, refused or closed).
struct UnauthenticatedSlot {
    _total: tokio::sync::OwnedSemaphorePermit,
    ip: IpAddr,
    of: Arc<Unauthenticated>,
}

impl Unauthenticated {
    fn take(self: &Arc<Self>, ip: IpAddr) -> Option<UnauthenticatedSlot> {
        let total = self.total.clone().try_acquire_owned().ok()?;
        let mut per_ip = self.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        let n = per_ip.entry(ip).or_insert(0);
        if *n >= self.max_per_ip {
            return None;
        }
        *n += 1;
        Some(UnauthenticatedSlot {
            _total: total,
            ip,
            of: self.clone(),
        })
    }
}

impl Drop for UnauthenticatedSlot {
    fn drop(&mut self) {
        let mut per_ip = self.of.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                per_ip.remove(&self.ip);
            }
        }
    }
}

/// Accepts CONNECT connections until `stop` (or the core's shutdown).
pub(crate) async fn accept_connect(
    listener: TcpListener,
    config: Arc<ConnectConfig>,
    inner: Arc<Inner>,
    stop: CancellationToken,
) {
    // Strangers and granted callers have separate budgets: sockets that
    // never authenticate cannot take the places of those that did, and one
    // address cannot take all of the strangers' places.
    let granted = Arc::new(tokio::sync::Semaphore::new(
        config.limits.max_connections.max(1),
    ));
    let unauthenticated = Arc::new(Unauthenticated {
        total: Arc::new(tokio::sync::Semaphore::new(
            config.limits.max_unauthenticated.max(1),
        )),
        per_ip: Mutex::new(HashMap::new()),
        max_per_ip: config.limits.max_unauthenticated_per_ip.max(1),
    });
    let stopped = async {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = inner.stopping.cancelled() => {}
        }
    };
    accept_until(listener, stopped, "connect accept failed", |tcp, peer| {
        let metrics = &inner.shared.metrics;
        let Some(slot) = unauthenticated.take(peer.ip()) else {
            metrics.connect_outcome(ConnectOutcome::UnauthenticatedOverLimit);
            tracing::debug!(%peer, "connect listener: too many connections not granted yet");
            drop(tcp);
            return;
        };
        let _ = tcp.set_nodelay(true);
        let local = tcp.local_addr().unwrap_or(peer);
        let config = config.clone();
        let granted = granted.clone();
        let app = inner.app(Scheme::Https, false);
        let shared = inner.shared.clone();
        let watch = inner.shutdown_tx.subscribe();
        let stopping = inner.stopping.clone();
        spawn_connection(&inner, async move {
            serve(
                tcp, peer, local, &config, slot, granted, app, shared, watch, stopping,
            )
            .await;
        });
    })
    .await;
}

/// What the CONNECT head said.
enum Head {
    Partial,
    Connect {
        len: usize,
        authority: Authority,
        credentials: Option<ProxyCredentials>,
    },
    Reject(u16, &'static str),
}

fn parse_head(buf: &[u8], shared: &Shared) -> Head {
    let limits = &shared.config.limits;
    let mut storage = tuna_http1::header_buf();
    let req = match tuna_http1::parse_request(buf, &mut storage, limits.max_header_bytes) {
        Ok(Some(req)) => req,
        Ok(None) => return Head::Partial,
        Err(e) => return Head::Reject(e.status(), "the request head cannot be read\n"),
    };
    if req.headers.len() > limits.max_header_count {
        return Head::Reject(431, "too many header fields\n");
    }
    if req.method != "CONNECT" {
        return Head::Reject(
            405,
            "this proxy only tunnels: send CONNECT host:port (https:// servers)\n",
        );
    }
    if req.framing != tuna_http1::Framing::Empty {
        return Head::Reject(400, "a CONNECT request has no body\n");
    }
    let Some(authority) = Authority::parse(req.target) else {
        return Head::Reject(400, "the CONNECT target must be host:port\n");
    };
    let mut auth = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("proxy-authorization"));
    let credentials = match (auth.next(), auth.next()) {
        (Some(h), None) => ProxyCredentials::from_header(h.value),
        _ => None,
    };
    Head::Connect {
        len: req.len,
        authority,
        credentials,
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        403 => "Forbidden",
        429 => "Too Many Requests",
        405 => "Method Not Allowed",
        407 => "Proxy Authentication Required",
        503 => "Service Unavailable",
        500 => "Internal Server Error",
        s => crate::pages::reason(s),
    }
}

/// Answers the CONNECT itself and closes.
async fn refuse(tcp: &mut TcpStream, status: u16, message: &str) {
    refuse_after(tcp, status, message, None).await
}

/// [`refuse`], with `Retry-After` if given.
async fn refuse_after(tcp: &mut TcpStream, status: u16, message: &str, retry_after: Option<u64>) {
    let mut extra = String::new();
    if let Some(secs) = retry_after {
        extra.push_str(&format!("retry-after: {secs}\r\n"));
    }
    if status == 407 {
        extra.push_str(&format!("proxy-authenticate: Basic realm=\"{REALM}\"\r\n"));
    }
    if status == 405 {
        extra.push_str("allow: CONNECT\r\n");
    }
    let resp = format!(
        "HTTP/1.1 {status} {}\r\n{extra}content-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{message}",
        reason(status),
        message.len()
    );
    let _ = tcp.write_all(resp.as_bytes()).await;
    let _ = tcp.flush().await;
    let _ = tcp.shutdown().await;
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    mut tcp: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    config: &ConnectConfig,
    slot: UnauthenticatedSlot,
    granted: Arc<tokio::sync::Semaphore>,
    app: Arc<HttpProxy<Router>>,
    shared: Arc<Shared>,
    shutdown: ShutdownWatch,
    stopping: CancellationToken,
) {
    let metrics = &shared.metrics;
    let deadline = Instant::now() + config.limits.handshake_timeout;
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let (len, authority, credentials) = loop {
        match parse_head(&buf, &shared) {
            Head::Connect {
                len,
                authority,
                credentials,
            } => break (len, authority, credentials),
            Head::Reject(status, message) => {
                metrics.connect_outcome(ConnectOutcome::BadRequest);
                refuse(&mut tcp, status, message).await;
                return;
            }
            Head::Partial => {}
        }
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(4096);
        }
        match tokio::time::timeout_at(deadline, tcp.read_buf(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(_)) => {}
            Err(_) => {
                metrics.connect_outcome(ConnectOutcome::Timeout);
                if !buf.is_empty() {
                    refuse(&mut tcp, 408, "the CONNECT request took too long\n").await;
                }
                return;
            }
        }
    };
    let Some(credentials) = credentials else {
        metrics.connect_outcome(ConnectOutcome::Unauthenticated);
        refuse(
            &mut tcp,
            407,
            "proxy credentials are required: Proxy-Authorization: Basic base64(<namespace>/<connector>:<token>)\n",
        )
        .await;
        return;
    };
    let request = ConnectRequest {
        authority: authority.clone(),
        credentials,
        client_addr: peer,
    };
    let decided = tokio::time::timeout(
        config.limits.authorize_timeout,
        config.authorizer.authorize(request.clone()),
    )
    .await;
    let grant = match decided {
        Ok(Ok(grant)) => grant,
        Ok(Err(refusal)) => {
            metrics.connect_outcome(match refusal {
                ConnectRefusal::Unauthenticated(_) => ConnectOutcome::Unauthenticated,
                ConnectRefusal::Forbidden(_) => ConnectOutcome::Forbidden,
                ConnectRefusal::TooManyRequests { .. } => ConnectOutcome::TooManyRequests,
                ConnectRefusal::Unavailable(_) => ConnectOutcome::Unavailable,
            });
            tracing::debug!(%peer, target = %authority, status = refusal.status(), reason = refusal.message(), "CONNECT refused");
            let mut message = refusal.message().to_owned();
            message.push('\n');
            refuse_after(
                &mut tcp,
                refusal.status(),
                &message,
                refusal.retry_after_secs(),
            )
            .await;
            return;
        }
        Err(_) => {
            metrics.connect_outcome(ConnectOutcome::Unavailable);
            refuse(
                &mut tcp,
                503,
                "the proxy could not check the credentials in time; try again\n",
            )
            .await;
            return;
        }
    };
    // Granted: the connection leaves the strangers' budget for the granted
    // one.
    drop(slot);
    let Ok(_permit) = granted.try_acquire_owned() else {
        metrics.connect_outcome(ConnectOutcome::OverLimit);
        tracing::debug!(%peer, "connect listener connection limit reached");
        refuse_after(
            &mut tcp,
            503,
            "the proxy has too many open connections; try again\n",
            Some(1),
        )
        .await;
        return;
    };
    let server_config = match config.ca.server_config(&authority.host) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(target = %authority, error = %e, "cannot sign a certificate for a CONNECT target");
            metrics.connect_outcome(ConnectOutcome::Unavailable);
            refuse(
                &mut tcp,
                500,
                "the proxy cannot present a certificate for this host\n",
            )
            .await;
            return;
        }
    };
    let live = match LiveGrant::new(
        grant,
        config.authorizer.clone(),
        request,
        config.limits.authorize_timeout,
        config.limits.upstream_idle,
        metrics.connect_http.clone(),
        shared.clone(),
    ) {
        Ok(live) => Arc::new(live),
        Err(refusal) => {
            metrics.connect_outcome(ConnectOutcome::Unavailable);
            let mut message = refusal.message().to_owned();
            message.push('\n');
            refuse(&mut tcp, 500, &message).await;
            return;
        }
    };
    if tcp
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    let rest = buf.split_off(len);
    let acceptor = tokio_rustls::TlsAcceptor::from(server_config);
    let tls_deadline = Instant::now() + config.limits.handshake_timeout;
    let tls = match tokio::time::timeout_at(tls_deadline, acceptor.accept(Prefixed::new(rest, tcp)))
        .await
    {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            metrics.connect_outcome(ConnectOutcome::TlsFailed);
            tracing::debug!(%peer, target = %authority, error = %e, "TLS handshake after CONNECT failed");
            return;
        }
        Err(_) => {
            metrics.connect_outcome(ConnectOutcome::Timeout);
            return;
        }
    };
    metrics.connect_outcome(ConnectOutcome::Granted);
    tracing::debug!(%peer, target = %authority, grant = %live.label(), "CONNECT granted");
    // The Host of every request must name the CONNECT host, in the form the
    // codec compares (IPv6 literals keep their brackets there).
    let bound: Arc<str> = if authority.host.contains(':') {
        format!("[{}]", authority.host).into()
    } else {
        authority.host.clone().into()
    };
    let scope = StreamScope {
        tls_name: None,
        host: Some(bound.clone()),
        port: None,
        pinned: Some(live.clone()),
    };
    metrics.connect_active.fetch_add(1, Relaxed);
    let serving = conn::serve_connection(
        tls,
        peer.ip(),
        Scheme::Https,
        false,
        Some(bound),
        true,
        false,
        move |s| conn::tunnel_stream(s, peer, Some(local), Some(scope)),
        app,
        shared.clone(),
        shutdown,
        stopping,
    );
    tokio::pin!(serving);
    tokio::select! {
        _ = &mut serving => {}
        refusal = live.until_refused() => {
            tracing::info!(%peer, target = %authority, status = refusal.status(), reason = refusal.message(), "CONNECT connection closed: a re-check refused it");
            if live.answering() {
                // A request is sending the refusal (its response closes
                // the connection); it gets a moment to, no more.
                let _ = tokio::time::timeout(config.limits.handshake_timeout, &mut serving).await;
            }
        }
    }
    metrics.connect_active.fetch_sub(1, Relaxed);
}

/// A stream with bytes already read from it put back in front.
pub(crate) struct Prefixed<S> {
    prefix: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    fn new(prefix: Vec<u8>, inner: S) -> Self {
        Self {
            prefix,
            pos: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.pos < this.prefix.len() {
            let n = (this.prefix.len() - this.pos).min(buf.remaining());
            buf.put_slice(&this.prefix[this.pos..this.pos + n]);
            this.pos += n;
            if this.pos == this.prefix.len() {
                this.prefix = Vec::new();
                this.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
