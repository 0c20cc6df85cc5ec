//! Getting downstream connections served: the fast path first, then
//! Pingora, from the TCP listener or from tunnel streams.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};

use pingora::apps::ServerApp;
use pingora::protocols::SocketDigest;
use pingora::protocols::l4::socket::SocketAddr as L4Addr;
use pingora::protocols::l4::stream::Stream;
use pingora::protocols::l4::virt::{VirtualSockOpt, VirtualSocket, VirtualSocketStream};
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{GetProxyDigest, GetSocketDigest};
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;

use crate::h1;
use crate::http::{Router, StreamScope};
use crate::shared::Shared;

/// Adapts a caller's stream to Pingora's [`VirtualSocket`], which must be
/// `Sync`. The stream sits in a `Mutex` that is only ever reached through
/// `&mut self` (`Mutex::get_mut`), so it is never locked: it only lends the
/// wrapper `Sync` for a stream that is `Send` alone.
///
/// Dropped, it shuts the stream down (on a task of its own): Pingora drops
/// a connection it ends on an error path (a rule's timeout answered 504)
/// without shutting it down, and a tunnel stream dropped unfinished is
/// reset, which lets the edge discard the answer still in flight. A stream
/// already shut down is not affected.
pub(crate) struct TunnelSocket<S: AsyncWrite + Unpin + Send + 'static> {
    inner: std::sync::Mutex<Option<S>>,
}

impl<S: AsyncWrite + Unpin + Send + 'static> TunnelSocket<S> {
    pub(crate) fn new(stream: S) -> Self {
        Self {
            inner: std::sync::Mutex::new(Some(stream)),
        }
    }

    fn stream(self: Pin<&mut Self>) -> Pin<&mut S> {
        let inner = self.get_mut().inner.get_mut();
        // A poisoned mutex only means a poll panicked earlier; the stream is
        // still the stream.
        let stream = inner.unwrap_or_else(|p| p.into_inner());
        Pin::new(stream.as_mut().expect("the stream is taken only on drop"))
    }
}

impl<S: AsyncWrite + Unpin + Send + 'static> Drop for TunnelSocket<S> {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        if let (Some(mut stream), Ok(runtime)) =
            (inner.take(), tokio::runtime::Handle::try_current())
        {
            runtime.spawn(async move {
                let _ = tokio::io::AsyncWriteExt::shutdown(&mut stream).await;
            });
        }
    }
}

impl<S: AsyncWrite + Unpin + Send + 'static> fmt::Debug for TunnelSocket<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TunnelSocket")
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> AsyncRead for TunnelSocket<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.stream().poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin + Send + 'static> AsyncWrite for TunnelSocket<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.stream().poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.stream().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.stream().poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.stream().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> VirtualSocket for TunnelSocket<S> {
    fn set_socket_option(&self, _opt: VirtualSockOpt) -> std::io::Result<()> {
        // Socket options of the tunnel's carrier connection are the
        // tunnel's business.
        Ok(())
    }
}

/// An accepted TCP connection with a small write buffer, as a Pingora
/// virtual socket.
///
/// Pingora's own listeners give accepted streams a write buffer of one MSS
/// (`DEFAULT_L4_WRITE_BUFFER_SIZE`) and its HTTP/1 writer relies on it: the
/// response header is written unflushed so that it leaves in one segment
/// with a known-length body. The buffer setter is crate-private, and a
/// `Stream` built from a bare `TcpStream` writes unbuffered — one `send`
/// for the header and another for the body, which on the benchmark cost
/// more than all of the routing. So the buffer lives here, below Pingora.
pub(crate) struct BufferedTcp {
    inner: tokio::io::BufWriter<tokio::net::TcpStream>,
}

impl BufferedTcp {
    pub(crate) fn new(tcp: tokio::net::TcpStream) -> Self {
        Self {
            inner: tokio::io::BufWriter::with_capacity(WRITE_BUFFER, tcp),
        }
    }
}

impl fmt::Debug for BufferedTcp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BufferedTcp")
    }
}

impl AsyncRead for BufferedTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for BufferedTcp {
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

impl VirtualSocket for BufferedTcp {
    fn set_socket_option(&self, opt: VirtualSockOpt) -> std::io::Result<()> {
        match opt {
            VirtualSockOpt::NoDelay => self.inner.get_ref().set_nodelay(true),
            _ => Ok(()),
        }
    }
}

const WRITE_BUFFER: usize = pingora::protocols::l4::stream::DEFAULT_L4_WRITE_BUFFER_SIZE;

/// Wraps an accepted TCP connection as a Pingora [`Stream`].
pub(crate) fn tcp_stream(
    tcp: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    local: std::net::SocketAddr,
) -> Stream {
    #[cfg(unix)]
    let fd = std::os::unix::io::AsRawFd::as_raw_fd(&tcp);
    #[cfg(not(unix))]
    let fd = -1;
    let mut s = Stream::from(VirtualSocketStream::new(Box::new(BufferedTcp::new(tcp))));
    // Both addresses are known from accept(): filling them in saves a
    // getpeername/getsockname per request.
    let digest = SocketDigest::from_raw_fd(fd);
    let _ = digest.peer_addr.set(Some(L4Addr::Inet(peer)));
    let _ = digest.local_addr.set(Some(L4Addr::Inet(local)));
    s.set_socket_digest(digest);
    s
}

/// Wraps a caller's stream as a Pingora [`Stream`] whose digest reports the
/// public client and local addresses, and the one host the stream may
/// serve (and its pinned upstream, if any: see [`StreamScope`]). Writes are buffered like accepted TCP
/// connections' (see [`BufferedTcp`]), which also keeps a tunnel from
/// carrying a response header and its body as separate frames.
pub(crate) fn tunnel_stream<S>(
    stream: S,
    client: std::net::SocketAddr,
    local: Option<std::net::SocketAddr>,
    scope: Option<StreamScope>,
) -> Stream
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut s = Stream::from(VirtualSocketStream::new(Box::new(TunnelSocket::new(
        stream,
    ))));
    // fd -1: the digest never needs the descriptor because both addresses
    // are filled in here.
    let digest = SocketDigest::from_raw_fd(-1);
    let _ = digest.peer_addr.set(Some(L4Addr::Inet(client)));
    let unspecified = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
    let _ = digest
        .local_addr
        .set(Some(L4Addr::Inet(local.unwrap_or(unspecified))));
    s.set_socket_digest(digest);
    if let Some(scope) = scope {
        let carrier =
            pingora::http::ResponseHeader::build(200, Some(0)).expect("a 200 head builds");
        s.set_proxy_digest(ProxyDigest::new(Box::new(carrier), Some(Box::new(scope))));
    }
    s
}

/// Serves one downstream connection to completion: the HTTP/1.1 fast
/// path first (`h1`), then — if a request needs it — Pingora, which gets
/// the stream (built by `wrap`) with the bytes already read put back.
/// A `pinned` connection (an intercepted CONNECT) goes to Pingora with its
/// first request, once the fast path has checked its head.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve_connection<S>(
    mut io: S,
    client_ip: std::net::IpAddr,
    scheme: crate::client::Scheme,
    trusted: bool,
    host: Option<Arc<str>>,
    pinned: bool,
    is_socket: bool,
    wrap: impl FnOnce(S) -> Stream,
    app: Arc<HttpProxy<Router>>,
    shared: Arc<Shared>,
    shutdown: ShutdownWatch,
    stopping: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let metrics = &shared.metrics;
    metrics.http_connections_total.fetch_add(1, Relaxed);
    metrics.http_connections_active.fetch_add(1, Relaxed);
    struct Active<'a>(&'a std::sync::atomic::AtomicI64);
    impl Drop for Active<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Relaxed);
        }
    }
    let _active = Active(&metrics.http_connections_active);
    let ctx = h1::ConnCtx {
        shared: &shared,
        client_ip,
        scheme,
        trusted,
        host: host.as_deref(),
        pinned,
        stopping: &stopping,
    };
    match h1::serve(&mut io, &ctx).await {
        h1::Outcome::HandOff(read) => {
            let mut stream = wrap(io);
            stream.rewind(&read);
            let _ = app.process_new(Box::new(stream), &shutdown).await;
        }
        // A socket is closed by dropping it; a tunnel stream may need its
        // end of stream said explicitly.
        h1::Outcome::Closed if !is_socket => {
            use tokio::io::AsyncWriteExt;
            let _ = io.shutdown().await;
        }
        h1::Outcome::Closed => {}
    }
}
