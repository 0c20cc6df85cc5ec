//! The byte relay for public HTTP/1.1 connections.
//!
//! The edge needs three things from a request: its host (to pick the
//! session), where it ends (so the next request on the connection can go
//! elsewhere), and which of its fields stop here. The relay parses the head
//! with the codec the agent's proxy core shares (`tuna-http1`), writes the
//! head again without hop-by-hop fields and — unless the peer is a trusted
//! proxy — without the client-address and request-id fields
//! ([`tuna_http1::FORWARDING`]), forwards the body bytes unchanged to the
//! tunnel stream bound to this (connection, host), and copies the response
//! back unchanged, tracking its framing to know where it ends. One task per
//! public connection moves every byte.
//!
//! The relay is strict where a relay could be fooled: what the codec
//! refuses (ambiguous framing, a bad or second `Host`, a `Connection` that
//! names a framing field, ...) is answered with 400 and the connection
//! closed; a response's bytes are forwarded only up to the end its framing
//! gives, so an agent can never inject bytes into the next exchange, which
//! may belong to another tenant; a request that may have reached the agent
//! is sent again only if it is idempotent. Anything the relay does not
//! handle (upgrades such as WebSocket, HTTP/1.0, `CONNECT`, absolute-form
//! targets, h2 with prior knowledge) is handed, with the bytes already
//! read, to the hyper path ([`hyper_path::serve`]) at a request boundary.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::{Instant, timeout, timeout_at};
use tokio_util::sync::CancellationToken;
use tuna_http1::{BodyTracker, Framing};
use tuna_protocol::mux::MuxStream;
use tuna_protocol::wire::{StreamKind, StreamMeta};

use crate::budget::PreAuthSlot;
use crate::hyper_path;
use crate::page::Page;
use crate::public::{MAX_IDLE_PER_CONNECTION, Peer, PublicLimits};
use crate::registry::{Registry, Session};

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

/// What the relay keeps of a request head once it is parsed.
struct RequestHead {
    /// Bytes of the head in the read buffer, blank line included.
    len: usize,
    /// Routing key: the `Host` field's host, lower case, without port or
    /// trailing dot; `None` when the request names no host.
    host: Option<String>,
    framing: Framing,
    is_head: bool,
    close: bool,
    idempotent: bool,
}

/// What to do with the bytes at the start of a connection's read buffer.
enum Parsed {
    Partial,
    /// Relay it; its head as forwarded is in `out`.
    Relay(RequestHead),
    /// Valid HTTP, but for the hyper path.
    Handoff,
    /// Refuse with this page and close.
    Reject(Page),
}

/// Parses the request head at the start of `buf` and writes the head to
/// forward into `out`: the request line, then every field but the
/// hop-by-hop ones and, from a peer that is not a trusted proxy, the
/// client-address and request-id fields.
fn parse_request(buf: &[u8], trusted: bool, out: &mut Vec<u8>) -> Parsed {
    let mut storage = tuna_http1::header_buf();
    let req = match tuna_http1::parse_request(buf, &mut storage, tuna_http1::MAX_HEAD) {
        Ok(Some(req)) => req,
        Ok(None) => return Parsed::Partial,
        // "PRI * HTTP/2.0" (h2 with prior knowledge) and other versions.
        Err(tuna_http1::Error::Version) => return Parsed::Handoff,
        Err(tuna_http1::Error::HeadTooLarge | tuna_http1::Error::TooManyHeaders) => {
            return Parsed::Reject(Page::head_too_large());
        }
        Err(tuna_http1::Error::Invalid(reason) | tuna_http1::Error::Body(reason)) => {
            return Parsed::Reject(Page::bad_request(reason));
        }
        Err(tuna_http1::Error::Malformed) => {
            return Parsed::Reject(Page::bad_request("malformed request head"));
        }
    };
    if req.minor != 1
        || req.method == "CONNECT"
        || !(req.is_origin_form() || req.target == "*")
        || req.upgrade
    {
        return Parsed::Handoff;
    }
    out.clear();
    out.extend_from_slice(req.method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(req.target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for h in req.headers {
        if (!trusted && tuna_http1::is_forwarding(h.name)) || req.is_hop_by_hop(h.name) {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    if req.close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Parsed::Relay(RequestHead {
        len: req.len,
        host: req.host.map(|h| h.name.to_ascii_lowercase()),
        framing: req.framing,
        is_head: req.is_head(),
        close: req.close,
        idempotent: req.is_idempotent(),
    })
}

struct Relay<IO> {
    io: IO,
    peer: Peer,
    registry: Arc<Registry>,
    /// Bytes read from the client and not yet forwarded.
    buf: BytesMut,
    /// The current request as forwarded: its rewritten head and the body
    /// bytes read with it.
    out: Vec<u8>,
    /// Response bytes read from the current stream.
    resp: BytesMut,
    idle: Vec<IdleStream>,
    /// Streams done with, finished (not reset) when the connection closes.
    retired: Vec<MuxStream>,
    /// The connection's place in its listener's pre-auth budget, given up
    /// with the first complete request head.
    pre_auth: Option<PreAuthSlot>,
}

/// Serves one public HTTP/1.1 connection until it closes or the edge shuts down.
pub(crate) async fn serve<IO>(
    io: IO,
    peer: Peer,
    registry: Arc<Registry>,
    cancel: CancellationToken,
    pre_auth: Option<PreAuthSlot>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut relay = Relay {
        io,
        peer,
        registry,
        buf: BytesMut::with_capacity(BUFFER),
        out: Vec::with_capacity(1024),
        resp: BytesMut::new(),
        idle: Vec::new(),
        retired: Vec::new(),
        pre_auth,
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
                io,
                buf,
                registry,
                pre_auth,
                ..
            } = relay;
            let io = Prefixed {
                prefix: buf.freeze(),
                io,
            };
            hyper_path::serve(io, peer, registry, cancel, pre_auth).await;
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
    /// No response head within [`PublicLimits::response`]; nothing was
    /// forwarded.
    TimedOut,
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
    /// [`PublicLimits::header_read`] for it, idle keep-alive time included
    /// (as on the hyper path), which cuts off slow-header clients.
    async fn read_head(&mut self) -> Result<RequestHead, Outcome> {
        let deadline = Instant::now() + self.peer.limits.header_read;
        loop {
            if !self.buf.is_empty() {
                match parse_request(&self.buf, self.peer.trusted, &mut self.out) {
                    Parsed::Partial => {}
                    Parsed::Relay(head) => {
                        self.pre_auth = None;
                        return Ok(head);
                    }
                    Parsed::Handoff => return Err(Outcome::Handoff),
                    Parsed::Reject(page) => {
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
                    tracing::debug!(client = %self.peer.client_addr, "no complete request head in time");
                    return Err(Outcome::Close);
                }
            }
        }
    }

    async fn write_page(&mut self, page: &Page, close: bool, is_head: bool) -> io::Result<()> {
        let page = page.to_http1(close, !is_head);
        let write = async {
            self.io.write_all(&page).await?;
            self.io.flush().await
        };
        timeout(self.peer.limits.write, write)
            .await
            .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()))
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
            Err(e) => {
                let page = Page::bad_request(&e.to_string());
                return self.refuse(&head, None, page).await;
            }
        };
        let request_end = head.len + buffered_body;
        // The request as it goes to the agent: its rewritten head, then the
        // body bytes read with it, in one write.
        self.out.extend_from_slice(&self.buf[head.len..request_end]);
        let complete = body.is_done().then_some(request_end);
        let Some(host) = head.host.as_deref() else {
            return self.refuse(&head, complete, Page::no_host()).await;
        };
        let grace = self.peer.limits.reconnect_grace;
        let Some(session) = self.registry.route_for_host_within(host, grace).await else {
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

        let limits = self.peer.limits;
        let outcome = if complete.is_some() {
            // The whole request is buffered: send it, relay the response, and
            // if an idle stream turns out dead before any response byte, send
            // an idempotent request again on a new one. Anything else may
            // have reached the agent and had its effect already.
            loop {
                let sent = timeout(limits.write, stream.write_all(&self.out)).await;
                let result = match sent {
                    Ok(Ok(())) => {
                        relay_response(
                            &mut stream,
                            &mut self.io,
                            &mut self.resp,
                            head.is_head,
                            &limits,
                        )
                        .await
                    }
                    _ => Err(ResponseError::NoResponse),
                };
                match result {
                    Err(ResponseError::NoResponse) if reused && head.idempotent => {
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
                &self.out,
                &mut self.resp,
                &mut stream,
                request_end,
                body,
                head.is_head,
                &limits,
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
            Err(ResponseError::TimedOut) => {
                tracing::debug!(host, "the agent did not answer in time");
                self.refuse(&head, None, Page::gateway_timeout(host)).await
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
            client_addr: self.peer.client_addr,
            kind: StreamKind::Http {
                host: host.to_owned(),
                scheme: self.peer.scheme,
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
/// Each read from the client waits at most [`PublicLimits::body_read`],
/// each write [`PublicLimits::write`].
#[allow(clippy::too_many_arguments)]
async fn stream_request<IO>(
    io: &mut IO,
    buf: &mut BytesMut,
    first: &[u8],
    resp: &mut BytesMut,
    stream: &mut MuxStream,
    buffered: usize,
    mut body: BodyTracker,
    is_head: bool,
    limits: &PublicLimits,
) -> Result<(ResponseEnd, bool), ResponseError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    if !matches!(
        timeout(limits.write, stream.write_all(first)).await,
        Ok(Ok(()))
    ) {
        return Err(ResponseError::NoResponse);
    }
    buf.advance(buffered);
    let (mut client_r, mut client_w) = tokio::io::split(io);
    let (mut stream_r, mut stream_w) = tokio::io::split(stream);
    let timed_out = |_| io::Error::from(io::ErrorKind::TimedOut);
    let upload = async {
        loop {
            buf.reserve(BODY_READ);
            let read = timeout(limits.body_read, client_r.read_buf(buf));
            if read.await.map_err(timed_out)?? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "client closed mid-body",
                ));
            }
            let n = body
                .feed(buf)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            timeout(limits.write, stream_w.write_all(&buf[..n]))
                .await
                .map_err(timed_out)??;
            buf.advance(n);
            if body.is_done() {
                return Ok::<_, io::Error>(());
            }
        }
    };
    let download = relay_response(&mut stream_r, &mut client_w, resp, is_head, limits);
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
    limits: &PublicLimits,
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
                match response_head(resp, is_head) {
                    Ok(Some(head)) => break head,
                    Ok(None) => {}
                    Err(_) if forwarded => return Err(ResponseError::Broken),
                    Err(reason) => return Err(ResponseError::Bad(reason)),
                }
            }
            resp.reserve(BUFFER / 2);
            match timeout(limits.response, stream.read_buf(resp)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ if forwarded => return Err(ResponseError::Broken),
                Err(_) => return Err(ResponseError::TimedOut),
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
        if head.informational {
            write_timed(client, &resp[..head.len], limits)
                .await
                .map_err(broken)?;
            resp.advance(head.len);
            forwarded = true;
            continue;
        }
        let mut body = BodyTracker::new(head.framing);
        let n = match body.feed(&resp[head.len..]) {
            Ok(n) => n,
            Err(_) if forwarded => return Err(ResponseError::Broken),
            Err(_) => return Err(ResponseError::Bad("response body framing")),
        };
        let end = head.len + n;
        write_timed(client, &resp[..end], limits)
            .await
            .map_err(broken)?;
        let mut extra = resp.len() > end;
        let mut close = head.close;
        while !body.is_done() {
            resp.clear();
            resp.reserve(BODY_READ);
            match timeout(limits.response, stream.read_buf(resp)).await {
                Ok(Ok(0)) if head.framing == Framing::UntilClose => {
                    close = true;
                    break;
                }
                Ok(Ok(n)) if n > 0 => {}
                _ => return Err(ResponseError::Broken),
            }
            let n = body.feed(resp).map_err(|_| ResponseError::Broken)?;
            write_timed(client, &resp[..n], limits)
                .await
                .map_err(broken)?;
            extra = resp.len() > n;
        }
        if extra {
            tracing::debug!("the agent sent bytes after its response; dropping the stream");
        }
        return Ok(ResponseEnd {
            close,
            reusable: !close && !extra,
        });
    }
}

/// Writes and flushes within [`PublicLimits::write`].
async fn write_timed<W: AsyncWrite + Unpin>(
    w: &mut W,
    bytes: &[u8],
    limits: &PublicLimits,
) -> io::Result<()> {
    let write = async {
        w.write_all(bytes).await?;
        w.flush().await
    };
    timeout(limits.write, write)
        .await
        .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()))
}

/// What the relay keeps of a response head.
struct ResponseHead {
    len: usize,
    status: u16,
    framing: Framing,
    close: bool,
    informational: bool,
}

/// Parses a response head with the shared codec. The relay forwards
/// response heads as they are, so a `Content-Length` beside
/// `Transfer-Encoding` — which a client might believe instead — is refused
/// rather than passed on.
fn response_head(buf: &[u8], is_head: bool) -> Result<Option<ResponseHead>, &'static str> {
    let mut storage = tuna_http1::header_buf();
    let resp = match tuna_http1::parse_response(buf, &mut storage, is_head) {
        Ok(Some(resp)) => resp,
        Ok(None) => return Ok(None),
        Err(tuna_http1::Error::Invalid(reason) | tuna_http1::Error::Body(reason)) => {
            return Err(reason);
        }
        Err(tuna_http1::Error::HeadTooLarge) => return Err("response head too large"),
        Err(tuna_http1::Error::TooManyHeaders) => return Err("too many response header fields"),
        Err(tuna_http1::Error::Version | tuna_http1::Error::Malformed) => {
            return Err("malformed response head");
        }
    };
    if resp.conflicting_length {
        return Err("both Transfer-Encoding and Content-Length");
    }
    Ok(Some(ResponseHead {
        len: resp.len,
        status: resp.status,
        framing: resp.framing,
        close: resp.close || resp.status == 101,
        informational: resp.is_informational(),
    }))
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
