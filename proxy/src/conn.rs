//! Getting downstream connections into Pingora: the TCP listener, tunnel
//! streams, and the first-request header gate.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};

use pingora::apps::ServerApp;
use pingora::protocols::GetSocketDigest;
use pingora::protocols::SocketDigest;
use pingora::protocols::l4::socket::SocketAddr as L4Addr;
use pingora::protocols::l4::stream::Stream;
use pingora::protocols::l4::virt::{VirtualSockOpt, VirtualSocket, VirtualSocketStream};
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio_util::sync::CancellationToken;

use crate::config::DownstreamLimits;
use crate::http::{Router, Shared};

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Adapts a caller's stream to Pingora's [`VirtualSocket`], which must be
/// `Sync`. The stream sits in a `Mutex` that is only ever reached through
/// `&mut self` (`Mutex::get_mut`), so it is never locked: it only lends the
/// wrapper `Sync` for a stream that is `Send` alone.
pub(crate) struct TunnelSocket<S> {
    inner: std::sync::Mutex<S>,
}

impl<S> TunnelSocket<S> {
    pub(crate) fn new(stream: S) -> Self {
        Self {
            inner: std::sync::Mutex::new(stream),
        }
    }

    fn stream(self: Pin<&mut Self>) -> Pin<&mut S>
    where
        S: Unpin,
    {
        let inner = self.get_mut().inner.get_mut();
        // A poisoned mutex only means a poll panicked earlier; the stream is
        // still the stream.
        Pin::new(inner.unwrap_or_else(|p| p.into_inner()))
    }
}

impl<S> fmt::Debug for TunnelSocket<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TunnelSocket")
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for TunnelSocket<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.stream().poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TunnelSocket<S> {
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

impl<S: AsyncRead + AsyncWrite + Unpin + Send> VirtualSocket for TunnelSocket<S> {
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
/// public client and local addresses. Writes are buffered like accepted TCP
/// connections' (see [`BufferedTcp`]), which also keeps a tunnel from
/// carrying a response header and its body as separate frames.
pub(crate) fn tunnel_stream<S>(
    stream: S,
    client: std::net::SocketAddr,
    local: Option<std::net::SocketAddr>,
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
    s
}

/// Outcome of the header gate.
enum Gate {
    /// Hand the stream to Pingora (bytes read so far were put back).
    Proceed,
    /// The connection is done (closed, rejected, timed out).
    Done,
}

/// Reads the first request header of a connection under the configured
/// limits before Pingora parses it. Pingora's own limits are fixed (1 MiB,
/// 256 fields), answer 400 rather than 431, and its header-read timer
/// restarts with every read, so a client trickling one byte at a time would
/// hold the connection for ever. Later requests on a keep-alive connection
/// are checked in `request_filter` and bounded by the keep-alive timeout.
async fn header_gate(
    stream: &mut Stream,
    limits: &DownstreamLimits,
    shared: &Shared,
    stopping: &CancellationToken,
) -> Gate {
    let deadline = tokio::time::Instant::now() + limits.header_read_timeout;
    let mut buf: Vec<u8> = Vec::with_capacity(2048);
    let mut scanned: usize = 0;
    loop {
        let read = tokio::select! {
            read = tokio::time::timeout_at(deadline, stream.read_buf(&mut buf)) => read,
            // An idle connection that has not started a request does not
            // hold up a graceful shutdown.
            _ = stopping.cancelled(), if buf.is_empty() => return Gate::Done,
        };
        match read {
            Err(_) => {
                if !buf.is_empty() {
                    shared.metrics.header_rejections.fetch_add(1, Relaxed);
                    reject(stream, 408, "Request Timeout").await;
                }
                return Gate::Done;
            }
            Ok(Err(_)) | Ok(Ok(0)) => return Gate::Done,
            Ok(Ok(_)) => {}
        }
        if buf.len() < H2_PREFACE.len() && H2_PREFACE.starts_with(&buf) {
            continue;
        }
        if buf.starts_with(H2_PREFACE) {
            // HTTP/2: header limits are enforced by the h2 server settings.
            stream.rewind(&buf);
            return Gate::Proceed;
        }
        // Look for the blank line that ends the header block (CRLF or bare
        // LF line ends, as httparse accepts both).
        let from = scanned.saturating_sub(3);
        let end = buf[from..].windows(2).enumerate().find_map(|(i, w)| {
            let at = from + i;
            if w == b"\n\n" {
                Some(at + 2)
            } else if w == b"\n\r" && buf.get(at + 2) == Some(&b'\n') {
                Some(at + 3)
            } else {
                None
            }
        });
        scanned = buf.len();
        match end {
            Some(end) => {
                let lines = buf[..end].iter().filter(|b| **b == b'\n').count();
                // Minus the request line and the blank line.
                let fields = lines.saturating_sub(2);
                if end > limits.max_header_bytes || fields > limits.max_header_count {
                    shared.metrics.header_rejections.fetch_add(1, Relaxed);
                    reject(stream, 431, "Request Header Fields Too Large").await;
                    return Gate::Done;
                }
                stream.rewind(&buf);
                return Gate::Proceed;
            }
            None if buf.len() > limits.max_header_bytes => {
                shared.metrics.header_rejections.fetch_add(1, Relaxed);
                reject(stream, 431, "Request Header Fields Too Large").await;
                return Gate::Done;
            }
            None => {}
        }
    }
}

async fn reject(stream: &mut Stream, status: u16, reason: &str) {
    let body = format!("{status} {reason}\n");
    let resp = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(resp.as_bytes()).await;
    let _ = stream.flush().await;
    let _ = stream.shutdown().await;
}

/// Serves one downstream connection to completion: gate, then Pingora.
pub(crate) async fn serve_connection(
    mut stream: Stream,
    app: Arc<HttpProxy<Router>>,
    shared: Arc<Shared>,
    shutdown: ShutdownWatch,
    stopping: CancellationToken,
) {
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
    if let Gate::Proceed = header_gate(&mut stream, &shared.config.limits, &shared, &stopping).await
    {
        let _ = app.process_new(Box::new(stream), &shutdown).await;
    }
}
