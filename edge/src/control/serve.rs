//! Serving an axum `Router` over TLS (HTTP/1.1 and HTTP/2 by ALPN), and one
//! connection of it ([`serve_connection`], also what the edge's API
//! listener uses).
//!
//! Connections are served by the protocol ALPN chose, not by sniffing the
//! first bytes: a sniffing server waits for those bytes before any HTTP
//! timer exists, so a client that finishes TLS and then says nothing held its
//! connection forever. HTTP/1.1 connections get a header timer (a request's
//! headers must arrive within it, and an idle keep-alive connection closes
//! after it); HTTP/2 connections are pinged at that interval and closed when
//! a ping goes unanswered.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::Service as _;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::budget::PreAuthSlot;

/// A client that has not finished the TLS handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A client that has not sent a request's headers by then is dropped.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Concurrent requests on one HTTP/2 connection.
const MAX_H2_STREAMS: u32 = 64;

/// Set in a response's extensions by the router's authentication when the
/// request's key was accepted: the connection has authenticated.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Authenticated;

/// The address a request came from, in every request's extensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

/// Serves `router` on `listener` over TLS until `shutdown` is cancelled.
///
/// On shutdown it stops accepting and aborts open connections, so every
/// clone of the router (and the control plane it holds, with its store
/// lock) is released when this future returns: an edge restarted in the
/// same process can open the same data dir again.
pub async fn serve_https(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: axum::Router,
    shutdown: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(tls);
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
            // Reap finished connection tasks so the set stays small.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (tcp, peer) = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                // Out of file descriptors and similar: back off instead of spinning.
                tracing::warn!(error = %e, "REST API accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let router = router.clone();
        connections.spawn(serve_tls_connection(
            tcp,
            peer,
            acceptor,
            router,
            HEADER_READ_TIMEOUT,
        ));
    }
    connections.shutdown().await;
}

/// The TLS handshake (bounded), then [`serve_connection`] by the ALPN chosen.
pub async fn serve_tls_connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    router: axum::Router,
    header_timeout: Duration,
) {
    serve_tls_connection_pre_auth(tcp, peer, acceptor, router, header_timeout, None).await;
}

/// [`serve_tls_connection`] holding `pre_auth` (the connection's place in
/// the edge's pre-authentication budget) until the connection has carried
/// an authenticated request; see [`serve_connection_pre_auth`].
pub(crate) async fn serve_tls_connection_pre_auth(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    router: axum::Router,
    header_timeout: Duration,
    pre_auth: Option<PreAuthSlot>,
) {
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "REST API TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "REST API TLS handshake timed out");
            return;
        }
    };
    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
    serve_connection_pre_auth(stream, h2, peer, router, header_timeout, pre_auth).await;
}

/// Serves one connection of `router`: HTTP/2 if `h2` (ALPN said so), else
/// HTTP/1.1, with the timers described in the module docs. Every request
/// carries [`ClientAddr`] of `peer`.
pub async fn serve_connection<I>(
    io: I,
    h2: bool,
    peer: SocketAddr,
    router: axum::Router,
    header_timeout: Duration,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    serve_connection_pre_auth(io, h2, peer, router, header_timeout, None).await;
}

/// [`serve_connection`] holding `pre_auth` until a response of the
/// connection carries [`Authenticated`] (the router's authentication
/// passed for one of its requests).
///
/// Why not until the first complete request head: sending one is free
/// (`GET / HTTP/1.1` and a blank line, answered 404 or 401), after which an
/// idle keep-alive connection would cost a descriptor for the whole header
/// timeout outside any budget. A connection that never authenticates
/// therefore counts as long as it is open; one that did is a key holder's,
/// bounded by the key's request rate and the account's quotas instead.
pub(crate) async fn serve_connection_pre_auth<I>(
    io: I,
    h2: bool,
    peer: SocketAddr,
    router: axum::Router,
    header_timeout: Duration,
    pre_auth: Option<PreAuthSlot>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let inner = TowerToHyperService::new(router);
    let pre_auth = Arc::new(parking_lot::Mutex::new(pre_auth));
    let held = Arc::clone(&pre_auth);
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(ClientAddr(peer));
        let pre_auth = Arc::clone(&pre_auth);
        let call = inner.call(request);
        async move {
            let response = call.await?;
            if response.extensions().get::<Authenticated>().is_some() {
                pre_auth.lock().take();
            }
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    // A connection that holds a pre-auth slot and has not authenticated
    // within the header timeout is closed: an HTTP/2 client answers pings
    // without ever sending a request, and an HTTP/1.1 one may send a
    // refused request every few seconds; either would hold its slot
    // forever.
    let unauthenticated = async move {
        if held.lock().is_none() {
            return std::future::pending().await;
        }
        tokio::time::sleep(header_timeout).await;
        if held.lock().is_none() {
            std::future::pending::<()>().await;
        }
    };
    let io = TokioIo::new(io);
    let serving = async {
        if h2 {
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .keep_alive_interval(Some(header_timeout))
                .keep_alive_timeout(header_timeout)
                .max_concurrent_streams(MAX_H2_STREAMS)
                .serve_connection(io, service)
                .await
        } else {
            hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(io, service)
                .await
        }
    };
    let result = tokio::select! {
        r = serving => r,
        () = unauthenticated => {
            tracing::debug!(%peer, "REST API connection without an authenticated request in the header timeout; closing");
            return;
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "REST API connection ended with an error");
    }
}
