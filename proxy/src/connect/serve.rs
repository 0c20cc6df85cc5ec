//! One CONNECT connection: the head, the authorizer's decision, the TLS
//! handshake with a certificate of the listener's CA, then the core's HTTP
//! path pinned to the grant's upstream.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};

use http::HeaderValue;
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Authority, ConnectConfig, ConnectRequest, ProxyCredentials};
use crate::conn;
use crate::http::{Pinned, Router, StreamScope};
use crate::metrics::ConnectOutcome;
use crate::routes::CompiledBackend;
use crate::shared::Shared;
use crate::{Inner, Scheme};

/// The realm of `Proxy-Authenticate`.
const REALM: &str = "tuna-connectors";

/// Accepts CONNECT connections until `stop` (or the core's shutdown).
pub(crate) async fn accept_connect(
    listener: TcpListener,
    config: Arc<ConnectConfig>,
    inner: Arc<Inner>,
    stop: CancellationToken,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(
        config.limits.max_connections.max(1),
    ));
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            _ = inner.stopping.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("connect accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let metrics = &inner.shared.metrics;
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics.connect_outcome(ConnectOutcome::OverLimit);
            tracing::debug!(%peer, "connect listener connection limit reached");
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let local = tcp.local_addr().unwrap_or(peer);
        let config = config.clone();
        let app = inner.app(Scheme::Https, false);
        let shared = inner.shared.clone();
        let watch = inner.shutdown_tx.subscribe();
        let stopping = inner.stopping.clone();
        let cut = inner.cut.clone();
        inner.tracker.spawn(async move {
            tokio::select! {
                _ = serve(tcp, peer, local, &config, app, shared, watch, stopping) => {}
                _ = cut.cancelled() => {}
            }
            drop(permit);
        });
    }
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
        405 => "Method Not Allowed",
        407 => "Proxy Authentication Required",
        503 => "Service Unavailable",
        500 => "Internal Server Error",
        s => crate::pages::reason(s),
    }
}

/// Answers the CONNECT itself and closes.
async fn refuse(tcp: &mut TcpStream, status: u16, message: &str) {
    let mut extra = String::new();
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
        config.authorizer.authorize(request),
    )
    .await;
    let grant = match decided {
        Ok(Ok(grant)) => grant,
        Ok(Err(refusal)) => {
            metrics.connect_outcome(match refusal.status() {
                407 => ConnectOutcome::Unauthenticated,
                403 => ConnectOutcome::Forbidden,
                _ => ConnectOutcome::Unavailable,
            });
            tracing::debug!(%peer, target = %authority, status = refusal.status(), reason = refusal.message(), "CONNECT refused");
            let mut message = refusal.message().to_owned();
            message.push('\n');
            refuse(&mut tcp, refusal.status(), &message).await;
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
    let (server_config, authorization) = match (
        config.ca.server_config(&authority.host),
        HeaderValue::from_str(grant.authorization.expose()),
    ) {
        (Ok(c), Ok(mut a)) => {
            a.set_sensitive(true);
            (c, a)
        }
        (Err(e), _) => {
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
        (_, Err(_)) => {
            metrics.connect_outcome(ConnectOutcome::Unavailable);
            refuse(
                &mut tcp,
                500,
                "the connector's credentials cannot be sent in a header\n",
            )
            .await;
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
    tracing::debug!(%peer, target = %authority, grant = %grant.label, "CONNECT granted");
    let backend = Arc::new(CompiledBackend::pinned(
        &grant.target,
        config.limits.upstream_idle,
        metrics.connect_http.clone(),
        &shared.config,
    ));
    // The Host of every request must name the CONNECT host, in the form the
    // codec compares (IPv6 literals keep their brackets there).
    let bound: Arc<str> = if authority.host.contains(':') {
        format!("[{}]", authority.host).into()
    } else {
        authority.host.clone().into()
    };
    let scope = StreamScope {
        host: bound.clone(),
        pinned: Some(Arc::new(Pinned {
            backend,
            authorization,
            label: grant.label.clone().into(),
        })),
    };
    metrics.connect_active.fetch_add(1, Relaxed);
    conn::serve_connection(
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
    )
    .await;
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
