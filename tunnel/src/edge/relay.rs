//! The byte relay for public HTTP/1.1 connections.
//!
//! The edge only needs two things from a request: its `Host` (to pick the
//! session) and where it ends (so the next request on the connection can go
//! elsewhere). So the relay parses the head with `httparse`, forwards the
//! head and body bytes unchanged to the tunnel stream bound to this
//! (connection, host), and copies the response back unchanged, tracking its
//! framing to know where it ends. No re-serialisation, no second HTTP stack
//! on the stream, no extra task: one task per public connection moves every
//! byte. Hop-by-hop headers travel on to the agent, whose proxy core strips
//! them (it is the next hop); the persistence headers the client sees are
//! the agent's, and the edge keeps its side of the connection consistent
//! with them (`Connection: close`, close-delimited bodies).
//!
//! The relay is strict where a verbatim relay could be fooled: ambiguous
//! request framing (Transfer-Encoding with Content-Length, differing
//! Content-Lengths, a coding other than `chunked`) is answered with 400 and
//! the connection closed; a response's bytes are forwarded only up to the
//! end its framing gives, so an agent can never inject bytes into the next
//! exchange, which may belong to another tenant. Anything the relay does not
//! handle (upgrades such as WebSocket, HTTP/1.0, `CONNECT`, absolute-form
//! targets, h2 with prior knowledge) is handed, with the bytes already read,
//! to the full HTTP server ([`public::serve_hyper`]) at a request boundary.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::{Instant, timeout, timeout_at};
use tokio_util::sync::CancellationToken;

use super::http1::{self, BodyTracker, Framing, RequestHead, RequestParse};
use super::public::{self, HEADER_READ_TIMEOUT, MAX_IDLE_PER_CONNECTION, Page};
use super::registry::{Registry, Session};
use crate::mux::MuxStream;
use crate::wire::{Scheme, StreamKind, StreamMeta};

/// Initial size of the request and response buffers.
const BUFFER: usize = 16 * 1024;
/// Read size while streaming a body.
const BODY_READ: usize = 64 * 1024;
/// How long a closing connection keeps draining what the client still
/// sends, so that the kernel does not answer it with a reset that would
/// destroy the response just written.
const LINGER: Duration = Duration::from_secs(2);
/// Most bytes drained while lingering.
const LINGER_BYTES: usize = 1024 * 1024;
/// How long a retired stream may take to end from the agent's side.
const STREAM_FINISH: Duration = Duration::from_secs(1);
/// Most retired streams a connection keeps until it closes.
const MAX_RETIRED: usize = 4;

/// How a relayed connection ended.
enum Outcome {
    Close,
    /// Continue on the full HTTP server with the bytes read so far.
    Handoff,
}

/// What follows an exchange.
enum Next {
    KeepAlive,
    Close,
}

struct IdleStream {
    host: String,
    session: Arc<Session>,
    stream: MuxStream,
}

struct Relay<IO> {
    io: IO,
    client_addr: SocketAddr,
    scheme: Scheme,
    registry: Arc<Registry>,
    /// Bytes read from the client and not yet forwarded.
    buf: BytesMut,
    /// Response bytes read from the current stream.
    resp: BytesMut,
    idle: Vec<IdleStream>,
    /// Streams done with, finished (not reset) when the connection closes.
    retired: Vec<MuxStream>,
}

/// Serves one public HTTP/1.1 connection until it closes or the edge shuts down.
pub(crate) async fn serve<IO>(
    io: IO,
    client_addr: SocketAddr,
    scheme: Scheme,
    registry: Arc<Registry>,
    cancel: CancellationToken,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut relay = Relay {
        io,
        client_addr,
        scheme,
        registry,
        buf: BytesMut::with_capacity(BUFFER),
        resp: BytesMut::new(),
        idle: Vec::new(),
        retired: Vec::new(),
    };
    let outcome = tokio::select! {
        _ = cancel.cancelled() => return,
        o = relay.run() => o,
    };
    match outcome {
        Outcome::Close => {
            let streams: Vec<MuxStream> = (relay.idle.drain(..).map(|i| i.stream))
                .chain(relay.retired.drain(..))
                .collect();
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = async { tokio::join!(linger_close(&mut relay.io), finish_streams(streams)) } => {}
            }
        }
        Outcome::Handoff => {
            let Relay {
                io, buf, registry, ..
            } = relay;
            let io = Prefixed {
                prefix: buf.freeze(),
                io,
            };
            public::serve_hyper(io, client_addr, scheme, registry, cancel).await;
        }
    }
}

/// Half-closes, then reads what the client still sends until it closes too
/// (bounded in time and bytes).
async fn linger_close<IO: AsyncRead + AsyncWrite + Unpin>(io: &mut IO) {
    if timeout(LINGER, io.shutdown()).await.is_err() {
        return;
    }
    let _ = timeout(LINGER, async {
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < LINGER_BYTES {
            match io.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}

/// Ends streams the way TCP ends a connection: our `END_STREAM`, then the
/// agent's. Dropping a stream instead resets it, and the agent's frames
/// already on the wire then arrive for a stream h2 may have forgotten.
async fn finish_streams(streams: Vec<MuxStream>) {
    if streams.is_empty() {
        return;
    }
    let finishing = streams.into_iter().map(|mut stream| async move {
        if stream.shutdown().await.is_err() {
            return;
        }
        let mut sink = [0u8; 1024];
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    });
    let _ = timeout(STREAM_FINISH, futures::future::join_all(finishing)).await;
}

/// Why relaying a response failed.
enum ResponseError {
    /// The stream ended or failed before a single response byte: the agent
    /// closed an idle stream; a fresh one may succeed.
    NoResponse,
    /// The agent's response cannot be relayed; nothing was forwarded.
    Bad(&'static str),
    /// Failed after part of the response was forwarded, or the client is
    /// gone: only closing is left.
    Broken,
}

/// How a relayed response ended.
struct ResponseEnd {
    /// The public connection must close after it.
    close: bool,
    /// The stream can carry another exchange.
    reusable: bool,
}

impl<IO> Relay<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    async fn run(&mut self) -> Outcome {
        loop {
            let head = match self.read_head().await {
                Ok(head) => head,
                Err(outcome) => return outcome,
            };
            match self.exchange(head).await {
                Next::KeepAlive => {}
                Next::Close => return Outcome::Close,
            }
        }
    }

    /// Reads until a complete request head is buffered. The client has
    /// [`HEADER_READ_TIMEOUT`] for it, idle keep-alive time included (as
    /// on the hyper path), which cuts off slow-header clients.
    async fn read_head(&mut self) -> Result<RequestHead, Outcome> {
        let deadline = Instant::now() + HEADER_READ_TIMEOUT;
        loop {
            if !self.buf.is_empty() {
                match http1::parse_request(&self.buf) {
                    RequestParse::Partial => {}
                    RequestParse::Relay(head) => return Ok(head),
                    RequestParse::Handoff => return Err(Outcome::Handoff),
                    RequestParse::Reject(reject) => {
                        let page = match reject {
                            http1::Reject::BadRequest(reason) => Page::bad_request(reason),
                            http1::Reject::HeadTooLarge => Page::head_too_large(),
                        };
                        let _ = self.write_page(&page, true, false).await;
                        return Err(Outcome::Close);
                    }
                }
            }
            self.buf.reserve(BUFFER / 2);
            match timeout_at(deadline, self.io.read_buf(&mut self.buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                Ok(_) => return Err(Outcome::Close),
                Err(_) => {
                    tracing::debug!(client = %self.client_addr, "no complete request head in time");
                    return Err(Outcome::Close);
                }
            }
        }
    }

    async fn write_page(&mut self, page: &Page, close: bool, is_head: bool) -> io::Result<()> {
        self.io.write_all(&page.to_http1(close, !is_head)).await?;
        self.io.flush().await
    }

    /// Answers a request with a page of the edge's own. The connection stays
    /// open only if the request's body is already buffered (it is skipped).
    async fn refuse(&mut self, head: &RequestHead, request_end: Option<usize>, page: Page) -> Next {
        let keep = request_end.filter(|_| !head.close);
        if let Some(end) = keep {
            self.buf.advance(end);
        }
        let written = self.write_page(&page, keep.is_none(), head.is_head).await;
        if written.is_err() || keep.is_none() {
            return Next::Close;
        }
        Next::KeepAlive
    }

    async fn exchange(&mut self, head: RequestHead) -> Next {
        let mut body = BodyTracker::new(head.framing);
        let buffered_body = match body.feed(&self.buf[head.len..]) {
            Ok(n) => n,
            Err(e) => return self.refuse(&head, None, Page::bad_request(e.0)).await,
        };
        let request_end = head.len + buffered_body;
        let complete = body.is_done().then_some(request_end);
        let Some(host) = head.host.as_deref() else {
            return self.refuse(&head, complete, Page::no_host()).await;
        };
        let Some(session) = self.registry.session_for_host(host) else {
            let page = Page::not_routed(&self.registry, host);
            return self.refuse(&head, complete, page).await;
        };
        let (mut stream, mut reused) = match self.take_idle(host, &session) {
            Some(stream) => (stream, true),
            None => match self.open(host, &session).await {
                Some(stream) => (stream, false),
                None => {
                    return self.refuse(&head, complete, Page::bad_gateway(host)).await;
                }
            },
        };

        let outcome = if complete.is_some() {
            // The whole request is buffered: send it, relay the response, and
            // if an idle stream turns out dead, send it again on a new one.
            loop {
                let sent = stream.write_all(&self.buf[..request_end]).await;
                let result = match sent {
                    Ok(()) => {
                        relay_response(&mut stream, &mut self.io, &mut self.resp, head.is_head)
                            .await
                    }
                    Err(_) => Err(ResponseError::NoResponse),
                };
                match result {
                    Err(ResponseError::NoResponse) if reused => {
                        reused = false;
                        match self.open(host, &session).await {
                            Some(fresh) => stream = fresh,
                            None => break Err(ResponseError::NoResponse),
                        }
                    }
                    other => break other.map(|end| (end, true)),
                }
            }
        } else {
            stream_request(
                &mut self.io,
                &mut self.buf,
                &mut self.resp,
                &mut stream,
                request_end,
                body,
                head.is_head,
            )
            .await
        };
        match outcome {
            Ok((end, uploaded)) => {
                if complete.is_some() {
                    self.buf.advance(request_end);
                }
                if end.reusable && uploaded {
                    self.put_idle(host, session, stream);
                } else if uploaded {
                    self.retire(stream);
                }
                if end.close || head.close || !uploaded {
                    Next::Close
                } else {
                    Next::KeepAlive
                }
            }
            Err(ResponseError::NoResponse) => {
                tracing::debug!(host, "the tunnel stream ended without a response");
                self.refuse(&head, None, Page::bad_gateway(host)).await
            }
            Err(ResponseError::Bad(reason)) => {
                tracing::debug!(host, reason, "the agent's response cannot be relayed");
                self.refuse(&head, None, Page::bad_gateway(host)).await
            }
            Err(ResponseError::Broken) => Next::Close,
        }
    }

    fn take_idle(&mut self, host: &str, session: &Arc<Session>) -> Option<MuxStream> {
        let mut i = 0;
        while i < self.idle.len() {
            let entry = &mut self.idle[i];
            if entry.session.closed.is_cancelled() {
                self.idle.remove(i);
            } else if !is_quiet(&mut entry.stream) {
                // The agent ended it (or said something unasked): finish it.
                let entry = self.idle.remove(i);
                self.retire(entry.stream);
            } else {
                i += 1;
            }
        }
        let pos = self
            .idle
            .iter()
            .position(|i| i.host == host && Arc::ptr_eq(&i.session, session))?;
        Some(self.idle.remove(pos).stream)
    }

    /// Keeps a stream for the next request to its host; the least recently
    /// used one makes room (a host that moved to a newer session leaves
    /// streams nobody takes any more).
    fn put_idle(&mut self, host: &str, session: Arc<Session>, stream: MuxStream) {
        if self.idle.len() >= MAX_IDLE_PER_CONNECTION {
            let oldest = self.idle.remove(0);
            self.retire(oldest.stream);
        }
        self.idle.push(IdleStream {
            host: host.to_owned(),
            session,
            stream,
        });
    }

    /// Keeps a stream that is done with until the connection closes, to end
    /// it cleanly then ([`finish_streams`]); past a few, it is just dropped.
    fn retire(&mut self, stream: MuxStream) {
        if self.retired.len() < MAX_RETIRED {
            self.retired.push(stream);
        }
    }

    async fn open(&self, host: &str, session: &Session) -> Option<MuxStream> {
        let meta = StreamMeta {
            client_addr: self.client_addr,
            kind: StreamKind::Http {
                host: host.to_owned(),
                scheme: self.scheme,
            },
            tunnel: session.tunnel.clone(),
        };
        match session.open(&meta).await {
            Ok(stream) => Some(stream),
            Err(e) => {
                tracing::debug!(host, error = %e, "could not open a stream to the agent");
                None
            }
        }
    }
}

/// Whether an idle stream has nothing to say: no end, no reset, no bytes
/// nobody asked for. Anything else makes it unfit for the next exchange.
fn is_quiet(stream: &mut MuxStream) -> bool {
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    let mut byte = [0u8; 1];
    let mut probe = ReadBuf::new(&mut byte);
    Pin::new(stream).poll_read(&mut cx, &mut probe).is_pending()
}

/// A request whose body is still arriving: the body is pumped to the stream
/// while the response comes back (the agent may answer `100 Continue`
/// first, or answer early). Returns whether the whole body went through.
async fn stream_request<IO>(
    io: &mut IO,
    buf: &mut BytesMut,
    resp: &mut BytesMut,
    stream: &mut MuxStream,
    buffered: usize,
    mut body: BodyTracker,
    is_head: bool,
) -> Result<(ResponseEnd, bool), ResponseError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    if stream.write_all(&buf[..buffered]).await.is_err() {
        return Err(ResponseError::NoResponse);
    }
    buf.advance(buffered);
    let (mut client_r, mut client_w) = tokio::io::split(io);
    let (mut stream_r, mut stream_w) = tokio::io::split(stream);
    let upload = async {
        loop {
            buf.reserve(BODY_READ);
            if client_r.read_buf(buf).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "client closed mid-body",
                ));
            }
            let n = body
                .feed(buf)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.0))?;
            stream_w.write_all(&buf[..n]).await?;
            buf.advance(n);
            if body.is_done() {
                return Ok::<_, io::Error>(());
            }
        }
    };
    let download = relay_response(&mut stream_r, &mut client_w, resp, is_head);
    tokio::pin!(upload, download);
    let mut uploaded = false;
    loop {
        tokio::select! {
            end = &mut download => return end.map(|end| (end, uploaded)),
            up = &mut upload, if !uploaded => match up {
                Ok(()) => uploaded = true,
                Err(e) => {
                    tracing::debug!(error = %e, "request body not relayed");
                    return Err(ResponseError::Broken);
                }
            },
        }
    }
}

/// Copies one response (after any 1xx) from the stream to the client, exactly
/// up to its end.
async fn relay_response<R, W>(
    stream: &mut R,
    client: &mut W,
    resp: &mut BytesMut,
    is_head: bool,
) -> Result<ResponseEnd, ResponseError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    resp.clear();
    let mut forwarded = false;
    let broken = |_| ResponseError::Broken;
    loop {
        let head = loop {
            if !resp.is_empty() {
                match http1::parse_response(resp, is_head) {
                    Ok(Some(head)) => break head,
                    Ok(None) => {}
                    Err(_) if forwarded => return Err(ResponseError::Broken),
                    Err(e) => return Err(ResponseError::Bad(e.0)),
                }
            }
            resp.reserve(BUFFER / 2);
            match stream.read_buf(resp).await {
                Ok(n) if n > 0 => {}
                _ if forwarded => return Err(ResponseError::Broken),
                _ if resp.is_empty() => return Err(ResponseError::NoResponse),
                _ => return Err(ResponseError::Bad("response head cut short")),
            }
        };
        if head.status == 101 {
            // Upgrades never take this path: the agent answered something
            // the client did not ask for.
            return Err(if forwarded {
                ResponseError::Broken
            } else {
                ResponseError::Bad("101 to a request without upgrade")
            });
        }
        if head.is_informational() {
            client.write_all(&resp[..head.len]).await.map_err(broken)?;
            client.flush().await.map_err(broken)?;
            resp.advance(head.len);
            forwarded = true;
            continue;
        }
        let mut body = BodyTracker::new(head.framing);
        let n = match body.feed(&resp[head.len..]) {
            Ok(n) => n,
            Err(_) if forwarded => return Err(ResponseError::Broken),
            Err(e) => return Err(ResponseError::Bad(e.0)),
        };
        let end = head.len + n;
        client.write_all(&resp[..end]).await.map_err(broken)?;
        let mut extra = resp.len() > end;
        let mut close = head.close;
        while !body.is_done() {
            resp.clear();
            resp.reserve(BODY_READ);
            match stream.read_buf(resp).await {
                Ok(0) if head.framing == Framing::UntilClose => {
                    close = true;
                    break;
                }
                Ok(n) if n > 0 => {}
                _ => return Err(ResponseError::Broken),
            }
            let n = body.feed(resp).map_err(|_| ResponseError::Broken)?;
            client.write_all(&resp[..n]).await.map_err(broken)?;
            extra = resp.len() > n;
        }
        client.flush().await.map_err(broken)?;
        if extra {
            tracing::debug!("the agent sent bytes after its response; dropping the stream");
        }
        return Ok(ResponseEnd {
            close,
            reusable: !close && !extra,
        });
    }
}

/// A connection whose first bytes were already read: they are read again
/// first (for the hand-off to the full HTTP server).
struct Prefixed<IO> {
    prefix: Bytes,
    io: IO,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Prefixed<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(out.remaining());
            out.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, out)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Prefixed<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
