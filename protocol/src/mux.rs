//! Streams multiplexed over one agent connection: HTTP/2 with reversed roles.
//!
//! The edge is the h2 client and opens every stream; the agent is the h2
//! server. A stream is a plain byte pipe ([`MuxStream`]): the request body
//! carries edge→agent bytes, the response body agent→edge bytes, and
//! `END_STREAM` is a half-close. Windows are large ([`STREAM_WINDOW`],
//! [`CONNECTION_WINDOW`]) because small per-stream windows are what capped
//! yamux-based tunnels at 10–15 Mbit/s; the measurement behind choosing h2
//! over yamux is in `docs/tunnel-protocol.md`.
//!
//! Neither side caps "locally reset streams": h2 counts them over the whole
//! life of a connection (1024 by default) as a guard for short-lived public
//! connections, but one tunnel session carries millions of streams, and a
//! frame that crosses a reset on the wire (an ordinary race when either side
//! abandons a stream) makes h2 send such a reset. With the cap, a busy
//! session was torn down within seconds (measured: connection-per-request
//! load through the edge). The peer is authenticated, and a session that
//! provokes resets only slows itself.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use h2::{RecvStream, SendStream};
use http::{Method, Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::{Error, Result};
use crate::wire::{HEADER_KIND, StreamMeta};

/// Per-stream receive window: one stream can have this much in flight
/// (≈ 335 Mbit/s at 100 ms RTT, as Go's HTTP/2 transport).
pub const STREAM_WINDOW: u32 = 4 * 1024 * 1024;
/// Receive window shared by all streams of one connection: 64 full stream
/// windows. A stream whose reader stops (a public client that reads
/// nothing) keeps its share until it ends, so this many such streams are
/// what it takes to stall a session or a peer link for everyone else on it
/// (with 8 MiB streams in 64 MiB, eight did); it is also each connection's
/// bound on received data held in memory.
pub const CONNECTION_WINDOW: u32 = 64 * STREAM_WINDOW;
/// Largest DATA frame; bigger frames mean fewer frame headers per byte.
pub const MAX_FRAME_SIZE: u32 = 256 * 1024;
/// Upper bound of concurrently open streams per agent connection.
pub const MAX_STREAMS: u32 = 16 * 1024;
/// Largest chunk handed to h2 per write (bounds the copy per call).
const MAX_WRITE: usize = 256 * 1024;

/// Writes smaller than this are gathered (copied); larger ones go straight
/// to TLS, so bulk transfers pay no copy and no held-back flush.
const SMALL_WRITE: usize = 16 * 1024;
/// Most bytes gathered before they are written out anyway.
const COALESCE_LIMIT: usize = 64 * 1024;

/// The transport under h2 on both sides: gathers h2's small writes and
/// holds a flush back for one scheduler turn, so that frames other streams
/// queue in that turn leave in the same TLS record and system call.
///
/// h2 flushes its connection every time it is woken, so without this each
/// small response left in a record and a `writev` of its own (measured on
/// the agent: one `writev` per keep-alive response). Large writes (bulk
/// DATA frames) pass straight through, without a copy or a held-back flush.
pub struct Coalesced<T> {
    inner: T,
    buf: Vec<u8>,
    /// A flush was held back once already; the next one goes through.
    yielded: bool,
    /// A large write went through since the last flush: bulk transfer,
    /// where the rest of a partly written frame must not be gathered.
    bulk: bool,
}

impl<T> Coalesced<T> {
    /// Wraps the TLS stream an h2 connection runs on.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            yielded: false,
            bulk: false,
        }
    }
}

impl<T: AsyncWrite + Unpin> Coalesced<T> {
    /// Writes out everything gathered.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut written = 0;
        while written < self.buf.len() {
            match Pin::new(&mut self.inner).poll_write(cx, &self.buf[written..]) {
                Poll::Ready(Ok(0)) => {
                    self.buf.drain(..written);
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => written += n,
                Poll::Ready(Err(e)) => {
                    self.buf.drain(..written);
                    return Poll::Ready(Err(e));
                }
                Poll::Pending => {
                    self.buf.drain(..written);
                    return Poll::Pending;
                }
            }
        }
        self.buf.clear();
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalesced<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesced<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let direct = this.bulk || data.len() >= SMALL_WRITE;
        if direct || this.buf.len() + data.len() > COALESCE_LIMIT {
            ready!(this.poll_drain(cx))?;
            if direct {
                this.bulk = true;
                return Pin::new(&mut this.inner).poll_write(cx, data);
            }
        }
        this.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let direct = this.bulk || total >= SMALL_WRITE;
        if direct || this.buf.len() + total > COALESCE_LIMIT {
            ready!(this.poll_drain(cx))?;
            if direct {
                this.bulk = true;
                return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
            }
        }
        for b in bufs {
            this.buf.extend_from_slice(b);
        }
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.buf.is_empty() && !this.yielded {
            this.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        ready!(this.poll_drain(cx))?;
        this.yielded = false;
        ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        this.bulk = false;
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// Closes every stream of one tunnel at once: a stream opened under a gate
/// fails its next read or write once the gate is closed (and resets the h2
/// stream, so the peer learns too). A revoked tunnel thus stops moving bytes
/// even on streams that were open before, without tearing down the session.
#[derive(Debug, Default)]
pub struct Gate {
    closed: AtomicBool,
}

impl Gate {
    /// An open gate.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Closes the gate for good.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Whether [`Gate::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// The h2 client configuration the edge uses on an agent connection.
pub fn client_builder() -> h2::client::Builder {
    let mut b = h2::client::Builder::new();
    b.initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME_SIZE)
        .max_send_buffer_size(MAX_WRITE * 4)
        .max_local_error_reset_streams(None)
        .enable_push(false);
    b
}

/// The h2 server configuration the agent uses.
pub fn server_builder() -> h2::server::Builder {
    let mut b = h2::server::Builder::new();
    b.initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME_SIZE)
        .max_send_buffer_size(MAX_WRITE * 4)
        .max_local_error_reset_streams(None)
        .max_concurrent_streams(MAX_STREAMS);
    b
}

/// What the edge sends to open a stream.
fn stream_request(
    kind_headers: impl FnOnce(&mut http::HeaderMap) -> Result<()>,
) -> Result<Request<()>> {
    let mut req = Request::builder()
        .method(Method::POST)
        .uri("http://tuna.tunnel/stream")
        .body(())
        .map_err(|e| Error::Protocol(e.to_string()))?;
    kind_headers(req.headers_mut())?;
    Ok(req)
}

/// Opens a data stream carrying `meta` (edge side), under `gate`.
pub async fn open_stream(
    sender: &h2::client::SendRequest<Bytes>,
    meta: &StreamMeta,
    gate: Arc<Gate>,
) -> Result<MuxStream> {
    let req = stream_request(|h| meta.write_headers(h))?;
    let mut stream = open(sender, req).await?;
    stream.gate = Some(gate);
    Ok(stream)
}

/// Opens the control stream (edge side, first stream of a session).
pub async fn open_control(sender: &h2::client::SendRequest<Bytes>) -> Result<MuxStream> {
    let req = stream_request(|h| {
        h.insert(HEADER_KIND, http::HeaderValue::from_static("control"));
        Ok(())
    })?;
    open(sender, req).await
}

async fn open(sender: &h2::client::SendRequest<Bytes>, req: Request<()>) -> Result<MuxStream> {
    let mut sender = sender.clone().ready().await?;
    let (response, send) = sender.send_request(req, false)?;
    // At the peer's concurrency limit h2 queues the stream unopened; this
    // handle is ready again once it is opened (at once when a slot was free),
    // so a caller's timeout around `open` bounds the wait for capacity.
    let _ = sender.ready().await?;
    Ok(MuxStream {
        send,
        recv: RecvState::Pending(response),
        buf: Bytes::new(),
        shut: false,
        gate: None,
    })
}

/// Accepts a stream on the agent side: answers `200` at once so the edge can
/// read without a round trip, and returns the byte pipe.
pub fn accept_stream(
    request: Request<RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
) -> Result<(http::request::Parts, MuxStream)> {
    let (parts, recv) = request.into_parts();
    let response = Response::builder()
        .status(StatusCode::OK)
        .body(())
        .map_err(|e| Error::Protocol(e.to_string()))?;
    let send = respond.send_response(response, false)?;
    Ok((
        parts,
        MuxStream {
            send,
            recv: RecvState::Streaming(recv),
            buf: Bytes::new(),
            shut: false,
            gate: None,
        },
    ))
}

enum RecvState {
    /// Edge side before the agent's response head arrived.
    Pending(h2::client::ResponseFuture),
    Streaming(RecvStream),
    Done,
}

/// One multiplexed byte stream: `AsyncRead + AsyncWrite`. Shutdown sends
/// `END_STREAM` (a TCP half-close); dropping it unfinished resets the stream.
pub struct MuxStream {
    send: SendStream<Bytes>,
    recv: RecvState,
    buf: Bytes,
    shut: bool,
    /// The tunnel's gate; closed: the stream is cut.
    gate: Option<Arc<Gate>>,
}

impl MuxStream {
    /// Puts the stream under `gate` (agent side: the gate of the stream's tunnel).
    pub fn set_gate(&mut self, gate: Arc<Gate>) {
        self.gate = Some(gate);
    }

    /// `Err` once the stream's gate is closed; resets the h2 stream then.
    fn check_gate(&mut self) -> io::Result<()> {
        match &self.gate {
            Some(gate) if gate.is_closed() => {
                if !matches!(self.recv, RecvState::Done) || !self.shut {
                    self.send.send_reset(h2::Reason::CANCEL);
                    self.recv = RecvState::Done;
                    self.shut = true;
                }
                Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the stream's tunnel was closed",
                ))
            }
            _ => Ok(()),
        }
    }
}

impl std::fmt::Debug for MuxStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MuxStream")
            .field("buffered", &self.buf.len())
            .finish()
    }
}

fn to_io(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e
            .into_io()
            .unwrap_or_else(|| io::Error::other("h2 I/O error"));
    }
    io::Error::new(io::ErrorKind::ConnectionReset, e)
}

impl AsyncRead for MuxStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.check_gate()?;
        loop {
            if !this.buf.is_empty() {
                let n = this.buf.len().min(out.remaining());
                out.put_slice(&this.buf[..n]);
                this.buf.advance(n);
                return Poll::Ready(Ok(()));
            }
            match &mut this.recv {
                RecvState::Pending(response) => {
                    let response = ready!(Pin::new(response).poll(cx)).map_err(to_io)?;
                    if response.status() != StatusCode::OK {
                        this.recv = RecvState::Done;
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::ConnectionRefused,
                            format!("agent refused the stream with {}", response.status()),
                        )));
                    }
                    this.recv = RecvState::Streaming(response.into_body());
                }
                RecvState::Streaming(recv) => match ready!(recv.poll_data(cx)) {
                    Some(Ok(data)) => {
                        // Release at once: the window then only bounds what
                        // sits in h2's queue, and `buf` holds at most one frame.
                        let _ = recv.flow_control().release_capacity(data.len());
                        this.buf = data;
                    }
                    Some(Err(e)) => {
                        this.recv = RecvState::Done;
                        return Poll::Ready(Err(to_io(e)));
                    }
                    None => {
                        this.recv = RecvState::Done;
                        return Poll::Ready(Ok(()));
                    }
                },
                RecvState::Done => return Poll::Ready(Ok(())),
            }
        }
    }
}

use std::future::Future;

impl AsyncWrite for MuxStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        self.check_gate()?;
        if self.shut {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "stream already shut down",
            )));
        }
        let want = buf.len().min(MAX_WRITE);
        self.send.reserve_capacity(want);
        loop {
            let available = self.send.capacity();
            if available > 0 {
                let n = available.min(want);
                self.send
                    .send_data(Bytes::copy_from_slice(&buf[..n]), false)
                    .map_err(to_io)?;
                return Poll::Ready(Ok(n));
            }
            match ready!(self.send.poll_capacity(cx)) {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Poll::Ready(Err(to_io(e))),
                None => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "stream closed by peer",
                    )));
                }
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // h2's connection task writes queued frames on its own.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.shut {
            self.shut = true;
            self.send.reserve_capacity(0);
            self.send.send_data(Bytes::new(), true).map_err(to_io)?;
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// Records every write that reaches it.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<Vec<u8>>,
        flushes: usize,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.writes.push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.flushes += 1;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn small_writes_leave_together_large_ones_directly_in_order() {
        let mut c = Coalesced::new(Recorder::default());
        c.write_all(b"one").await.unwrap();
        c.write_all(b"two").await.unwrap();
        assert!(c.inner.writes.is_empty(), "small writes wait for the flush");
        c.flush().await.unwrap();
        assert_eq!(c.inner.writes, vec![b"onetwo".to_vec()]);
        assert_eq!(c.inner.flushes, 1);

        let big = vec![7u8; SMALL_WRITE];
        c.write_all(b"x").await.unwrap();
        c.write_all(&big).await.unwrap();
        // After a large write, the rest of the cycle goes straight through.
        c.write_all(b"tail").await.unwrap();
        assert_eq!(c.inner.writes[1..], [b"x".to_vec(), big, b"tail".to_vec()]);
        c.flush().await.unwrap();
        c.write_all(b"small again").await.unwrap();
        assert_eq!(c.inner.writes.len(), 4, "a flush ends bulk mode");
        c.shutdown().await.unwrap();
        assert_eq!(c.inner.writes[4], b"small again".to_vec());
    }
}
