//! The HTTP/1.1 fast path: plain proxied requests relayed without Pingora.
//!
//! Every downstream connection starts here. A request is served here when
//! it is the common case — HTTP/1.1, origin-form target, one `Host`, a body
//! delimited by `Content-Length` (or none), no `Upgrade`/`Expect`/
//! `Transfer-Encoding`, routed to an HTTP/1.1 backend. Its head is parsed
//! once with the codec the edge shares (`tuna-http1`, borrowing the read
//! buffer), the upstream head is written straight from those slices with
//! the header policy applied, and the response is relayed with its framing
//! tracked but its body never decoded: a keep-alive request costs two reads
//! and two writes and no allocation. What the codec refuses is answered
//! here (400/431, 421 for a host the tunnel stream does not serve); what
//! the fast path does not serve — h2c, WebSocket, chunked uploads,
//! HTTP/1.0, absolute-form targets, h2c/TLS backends, Gateway API rules
//! (their filters, weights and timeouts are Pingora's hooks') — hands the
//! connection, with the bytes already read, to Pingora (`conn.rs`), which
//! serves it to the end. Why: Pingora's per-request HTTP/1 path cost 2.7×
//! nginx's CPU per request in `benches/proxy.sh`, almost all of it outside
//! our hooks.
//!
//! The policy is the one `http.rs` applies in Pingora's hooks: the same
//! hop-by-hop stripping, `X-Forwarded-*`, request id, 404/502/504 pages,
//! retry rules (connect failures of idempotent requests on the next
//! address; a pooled connection found closed before any response byte is
//! retried on a new one when the request is idempotent and was sent whole),
//! limits (431 for big or many headers, 408 for slow ones) and metrics.

use std::fmt;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use tuna_http1::{BodyTracker, Framing};

use crate::client::Scheme;
use crate::http::{RequestView, route_lookup};
use crate::metrics::UpstreamErrorCause;
use crate::pages::{error_page, reason};
use crate::routes::CompiledBackend;
use crate::shared::Shared;

/// Read size while relaying bodies.
const IO_CHUNK: usize = 64 * 1024;

/// What a connection is, for the request path.
pub(crate) struct ConnCtx<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) client_ip: IpAddr,
    pub(crate) scheme: Scheme,
    pub(crate) trusted: bool,
    /// The one host a tunnel stream may serve ([`crate::ConnInfo::host`]).
    pub(crate) host: Option<&'a str>,
    /// Pingora serves every request: an intercepted CONNECT (its upstream is
    /// TLS), or a port of a Gateway's address (its own route table).
    pub(crate) pinned: bool,
    pub(crate) stopping: &'a CancellationToken,
}

/// How the fast path left a connection.
pub(crate) enum Outcome {
    /// Served to the end (closed by either side, rejected or timed out).
    Closed,
    /// The next request is not for the fast path: Pingora takes the
    /// connection, starting with these bytes already read from it.
    HandOff(Vec<u8>),
}

/// A request id: a trusted hop's (up to 128 bytes) or our own 24 hex digits.
struct RequestId {
    buf: [u8; 128],
    len: usize,
}

impl RequestId {
    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only ASCII graphic bytes get here (see `is_valid_request_id`).
        f.write_str(std::str::from_utf8(self.as_bytes()).unwrap_or("?"))
    }
}

/// A parsed request, its upstream head already written to `out`.
struct Request {
    head_len: usize,
    body_len: u64,
    idempotent: bool,
    is_head: bool,
    client_close: bool,
    /// The backend and round-robin start; `None` answers 404 with `not_found`.
    route: Option<(Arc<CompiledBackend>, usize)>,
    not_found: String,
    id: RequestId,
    span: tracing::Span,
}

enum Head {
    Partial,
    Ready(Box<Request>),
    HandOff,
    Reject(u16),
}

/// A request head of the fast path, as a route lookup reads it.
struct FastRequest<'a, 'b, 'h>(&'a tuna_http1::Request<'b, 'h>);

impl RequestView for FastRequest<'_, '_, '_> {
    fn method(&self) -> &str {
        self.0.method
    }
    fn header(&self, name_lower: &str) -> Option<&str> {
        let h = self.0.headers.iter().find(|h| eq(h.name, name_lower))?;
        std::str::from_utf8(h.value).ok()
    }
}

fn is_valid_request_id(v: &[u8]) -> bool {
    !v.is_empty() && v.len() <= 128 && v.iter().all(u8::is_ascii_graphic)
}

fn eq(name: &str, lower: &str) -> bool {
    name.eq_ignore_ascii_case(lower)
}

/// Parses a request head in `buf` (with the codec both hops share) and, if
/// it is for the fast path, writes the upstream request head to `out`.
fn analyze(buf: &[u8], c: &ConnCtx<'_>, out: &mut Vec<u8>) -> Head {
    let config = &c.shared.config;
    let limits = &config.limits;
    let mut storage = tuna_http1::header_buf();
    let req = match tuna_http1::parse_request(buf, &mut storage, limits.max_header_bytes) {
        Ok(Some(req)) => req,
        Ok(None) => return Head::Partial,
        // The h2c preface: Pingora serves h2c.
        Err(tuna_http1::Error::Version) => return Head::HandOff,
        // Refused here, whichever path would serve the request: what the
        // codec refuses, no hop forwards.
        Err(e) => return Head::Reject(e.status()),
    };
    if req.headers.len() > limits.max_header_count {
        return Head::Reject(431);
    }
    // Requests the fast path does not serve itself; Pingora serves them,
    // the bound host checked in its `request_filter`.
    if req.minor != 1
        || !req.is_origin_form()
        || req.method == "CONNECT"
        || req.upgrade
        || req.expect
        || req.framing == Framing::Chunked
    {
        return Head::HandOff;
    }
    let Some(host) = req.host else {
        // RFC 9112 §3.2: an HTTP/1.1 request without Host is a 400.
        return Head::Reject(400);
    };
    if let Some(bound) = c.host
        && !host.is(bound)
    {
        return Head::Reject(421);
    }
    if c.pinned {
        return Head::HandOff;
    }
    let target = req.target;
    let method = req.method;

    let snapshot = c.shared.snapshot.load();
    let view = FastRequest(&req);
    let (route, not_found) = match route_lookup(&snapshot.table, host.name, target, &view) {
        Some(m) if !m.backend.is_http1() => return Head::HandOff,
        Some(m) => {
            let backend = m.backend.clone();
            let start = backend.start_index();
            (Some((backend, start)), String::new())
        }
        None => {
            let path = target.split('?').next().unwrap_or(target);
            let body = format!(
                "404 Not Found: no route for host {} and path {path}\n",
                host.value
            );
            (None, body)
        }
    };

    let id_header = config.request_id_header.as_str();
    let incoming_id = req
        .headers
        .iter()
        .filter(|_| c.trusted)
        .find(|h| eq(h.name, id_header) && is_valid_request_id(h.value))
        .map(|h| h.value);
    let mut id = RequestId {
        buf: [0; 128],
        len: 0,
    };
    match incoming_id {
        Some(v) => {
            id.buf[..v.len()].copy_from_slice(v);
            id.len = v.len();
        }
        None => {
            c.shared.write_request_id(&mut id.buf[..24]);
            id.len = 24;
        }
    }
    let span = tracing::info_span!("request", id = %id, method = %method, host = %host.value);

    if route.is_some() {
        out.clear();
        out.extend_from_slice(method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(target.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        let mut forwarded_for = Vec::new();
        for h in req.headers.iter() {
            let name = h.name;
            if eq(name, "x-forwarded-for") {
                if c.trusted {
                    forwarded_for.push(h.value);
                }
                continue;
            }
            // Set below from what this hop knows; `Forwarded`, `X-Real-IP`
            // (and the like) only from a trusted hop.
            let skip = eq(name, "x-forwarded-host")
                || eq(name, "x-forwarded-proto")
                || eq(name, id_header)
                || (!c.trusted && tuna_http1::is_forwarding(name))
                || req.is_hop_by_hop(name);
            if !skip {
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(h.value);
                out.extend_from_slice(b"\r\n");
            }
        }
        out.extend_from_slice(b"x-forwarded-for: ");
        for v in forwarded_for {
            out.extend_from_slice(v);
            out.extend_from_slice(b", ");
        }
        let _ = write!(out, "{}", c.client_ip);
        out.extend_from_slice(b"\r\nx-forwarded-host: ");
        out.extend_from_slice(host.value.as_bytes());
        out.extend_from_slice(b"\r\nx-forwarded-proto: ");
        out.extend_from_slice(c.scheme.as_str().as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(id_header.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(id.as_bytes());
        out.extend_from_slice(b"\r\n\r\n");
    }

    let body_len = match req.framing {
        Framing::Length(n) => n,
        _ => 0,
    };
    Head::Ready(Box::new(Request {
        head_len: req.len,
        body_len,
        idempotent: req.is_idempotent(),
        is_head: req.is_head(),
        client_close: req.close,
        route,
        not_found,
        id,
        span,
    }))
}

/// What `analyze_response` found.
struct Response {
    head_len: usize,
    status: u16,
    body: Framing,
    /// The upstream connection may carry another request afterwards.
    reusable: bool,
    /// The downstream connection closes after this response.
    close: bool,
}

/// Parses an upstream response head in `buf` (the shared codec) and writes
/// the downstream head to `out`. `Ok(None)`: incomplete.
fn analyze_response(
    buf: &[u8],
    req: &Request,
    c: &ConnCtx<'_>,
    out: &mut Vec<u8>,
) -> Result<Option<Response>, ()> {
    let mut storage = tuna_http1::header_buf();
    let resp = match tuna_http1::parse_response(buf, &mut storage, req.is_head) {
        Ok(Some(resp)) => resp,
        Ok(None) => return Ok(None),
        Err(_) => return Err(()),
    };
    if resp.status == 101 {
        // We never asked for an upgrade.
        return Err(());
    }
    let status = resp.status;
    let informational = resp.is_informational();
    let body = resp.framing;
    // A message with both framings was sent by something that may
    // disagree with us about where it ends: do not reuse that connection
    // (and its Content-Length is not forwarded: `is_hop_by_hop`).
    let reusable = !resp.close && !resp.conflicting_length;
    let close = !informational
        && (req.client_close || body == Framing::UntilClose || c.stopping.is_cancelled());

    let id_header = c.shared.config.request_id_header.as_str();
    out.clear();
    let _ = write!(out, "HTTP/1.1 {status} ");
    out.extend_from_slice(resp.reason.as_bytes());
    out.extend_from_slice(b"\r\n");
    for h in resp.headers.iter() {
        let name = h.name;
        let skip = resp.is_hop_by_hop(name) || (!informational && eq(name, id_header));
        if !skip {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(h.value);
            out.extend_from_slice(b"\r\n");
        }
    }
    if !informational {
        out.extend_from_slice(id_header.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(req.id.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(Some(Response {
        head_len: resp.len,
        status,
        body,
        reusable,
        close,
    }))
}

/// Serves a downstream connection until it closes or needs Pingora.
pub(crate) async fn serve<D>(down: &mut D, c: &ConnCtx<'_>) -> Outcome
where
    D: AsyncRead + AsyncWrite + Unpin,
{
    let limits = &c.shared.config.limits;
    let mut inbuf: Vec<u8> = Vec::with_capacity(4096);
    let mut out: Vec<u8> = Vec::with_capacity(4096);
    let mut upbuf: Vec<u8> = Vec::new();
    // The first request must arrive whole within the header timeout of
    // the connection's start; later ones within the keep-alive idle time
    // for their first byte and the header timeout from there.
    let mut deadline = tokio::time::Instant::now() + limits.header_read_timeout;
    loop {
        let req = loop {
            if !inbuf.is_empty() {
                match analyze(&inbuf, c, &mut out) {
                    Head::Ready(req) => break req,
                    Head::HandOff => {
                        c.shared.metrics.pingora_handoffs.fetch_add(1, Relaxed);
                        return Outcome::HandOff(inbuf);
                    }
                    Head::Reject(status) => {
                        c.shared.metrics.header_rejections.fetch_add(1, Relaxed);
                        reject(down, status).await;
                        return Outcome::Closed;
                    }
                    Head::Partial => {}
                }
            }
            if inbuf.capacity() - inbuf.len() < 1024 {
                inbuf.reserve(4096);
            }
            let idle = inbuf.is_empty();
            let read = tokio::select! {
                biased;
                // An idle connection does not hold up a graceful shutdown.
                _ = c.stopping.cancelled(), if idle => return Outcome::Closed,
                read = tokio::time::timeout_at(deadline, down.read_buf(&mut inbuf)) => read,
            };
            match read {
                Ok(Ok(0)) | Ok(Err(_)) => return Outcome::Closed,
                Ok(Ok(_)) => {
                    if idle {
                        deadline = tokio::time::Instant::now() + limits.header_read_timeout;
                    }
                }
                Err(_) => {
                    if !idle {
                        c.shared.metrics.header_rejections.fetch_add(1, Relaxed);
                        reject(down, 408).await;
                    }
                    return Outcome::Closed;
                }
            }
        };
        let start = Instant::now();
        let (status, keep_going) = match &req.route {
            None => answer_not_found(down, c, &mut inbuf, &req).await,
            Some((backend, rr_start)) => {
                let backend = backend.clone();
                let rr_start = *rr_start;
                let mut io = Io {
                    down: &mut *down,
                    c,
                    inbuf: &mut inbuf,
                    out: &mut out,
                    upbuf: &mut upbuf,
                };
                io.proxy(&req, &backend, rr_start).await
            }
        };
        let metrics = &c.shared.metrics;
        metrics.fast_path_requests.fetch_add(1, Relaxed);
        if status > 0 {
            match &req.route {
                Some((backend, _)) => backend.stats.record(status),
                None => metrics.unrouted.record(status),
            }
        }
        let elapsed = start.elapsed();
        metrics.observe_latency(elapsed);
        tracing::debug!(
            parent: &req.span,
            status,
            micros = elapsed.as_micros() as u64,
            "request done"
        );
        if !keep_going || c.stopping.is_cancelled() {
            // The caller closes the stream (for a socket, dropping it sends
            // the FIN: no separate shutdown call per connection).
            return Outcome::Closed;
        }
        deadline = tokio::time::Instant::now() + limits.keepalive_idle;
    }
}

/// Answers a request that matched no route, like the Pingora path does.
async fn answer_not_found<D>(
    down: &mut D,
    c: &ConnCtx<'_>,
    inbuf: &mut Vec<u8>,
    req: &Request,
) -> (u16, bool)
where
    D: AsyncWrite + Unpin,
{
    tracing::debug!(parent: &req.span, "no route");
    // The body of a request we do not forward is not read: the connection
    // closes after the answer unless there was none.
    let keep = req.body_len == 0 && !req.client_close && !c.stopping.is_cancelled();
    let resp = local_response(c, 404, &req.not_found, req.is_head, &req.id, !keep);
    inbuf.drain(..req.head_len);
    let ok = down.write_all(&resp).await.is_ok() && down.flush().await.is_ok();
    (404, keep && ok)
}

fn local_response(
    c: &ConnCtx<'_>,
    status: u16,
    body: &str,
    head_only: bool,
    id: &RequestId,
    close: bool,
) -> Vec<u8> {
    let reason = reason(status);
    let mut resp = Vec::with_capacity(256 + body.len());
    let _ = write!(
        resp,
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\n{}: ",
        body.len(),
        c.shared.config.request_id_header.as_str()
    );
    resp.extend_from_slice(id.as_bytes());
    resp.extend_from_slice(b"\r\n");
    if close {
        resp.extend_from_slice(b"connection: close\r\n");
    }
    resp.extend_from_slice(b"\r\n");
    if !head_only {
        resp.extend_from_slice(body.as_bytes());
    }
    resp
}

/// Answers 400/408/421/431/505 before any request was routed, and closes.
async fn reject<D: AsyncWrite + Unpin>(down: &mut D, status: u16) {
    let body = error_page(status);
    let reason = reason(status);
    let resp = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = down.write_all(resp.as_bytes()).await;
    let _ = down.flush().await;
    let _ = down.shutdown().await;
}

async fn connect(addr: SocketAddr, limit: Duration) -> Result<TcpStream, UpstreamErrorCause> {
    match tokio::time::timeout(limit, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            Ok(s)
        }
        Ok(Err(e)) => Err(match e.kind() {
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::HostUnreachable => {
                UpstreamErrorCause::ConnectRefused
            }
            _ => UpstreamErrorCause::Other,
        }),
        Err(_) => Err(UpstreamErrorCause::ConnectTimeout),
    }
}

/// Why a proxied exchange failed before the response head went out.
enum Failure {
    /// Answer this status (502/504) and close.
    Answer(u16),
    /// The downstream went away or broke framing: just close.
    Close,
}

/// The buffers of one connection, lent to one request.
struct Io<'a, D> {
    down: &'a mut D,
    c: &'a ConnCtx<'a>,
    inbuf: &'a mut Vec<u8>,
    out: &'a mut Vec<u8>,
    upbuf: &'a mut Vec<u8>,
}

impl<D: AsyncRead + AsyncWrite + Unpin> Io<'_, D> {
    /// Proxies one request; returns the status (0: none was sent) and
    /// whether the downstream connection carries on.
    async fn proxy(&mut self, req: &Request, backend: &CompiledBackend, rr: usize) -> (u16, bool) {
        match self.exchange(req, backend, rr).await {
            Ok(result) => result,
            Err(Failure::Answer(status)) => {
                let body = error_page(status);
                let resp = local_response(self.c, status, body, req.is_head, &req.id, true);
                let _ = self.down.write_all(&resp).await;
                let _ = self.down.flush().await;
                (status, false)
            }
            Err(Failure::Close) => (0, false),
        }
    }

    async fn exchange(
        &mut self,
        req: &Request,
        backend: &CompiledBackend,
        rr: usize,
    ) -> Result<(u16, bool), Failure> {
        let c = self.c;
        let config = &c.shared.config;
        let metrics = &c.shared.metrics;
        let pool = &c.shared.pool;

        // The request body bytes already read go out with the head.
        let avail = (self.inbuf.len() - req.head_len) as u64;
        let buffered = avail.min(req.body_len) as usize;
        let whole = buffered as u64 == req.body_len;
        self.out
            .extend_from_slice(&self.inbuf[req.head_len..req.head_len + buffered]);
        self.inbuf.drain(..req.head_len + buffered);

        let attempts = config
            .max_connect_attempts
            .min(backend.addr_count().max(2))
            .max(1);
        let mut attempt = 0;
        let mut fresh_only = false;
        let (mut up, addr, resp) = loop {
            let addr = backend.addr(rr + attempt);
            let pooled = if fresh_only { None } else { pool.take(addr) };
            let reused = pooled.is_some();
            let mut up = match pooled {
                Some(up) => up,
                None => match connect(addr, config.upstream.connect).await {
                    Ok(up) => up,
                    Err(cause) => {
                        metrics.upstream_error(cause);
                        tracing::debug!(parent: &req.span, %addr, ?cause, "connect failed");
                        attempt += 1;
                        if req.idempotent && attempt < attempts {
                            continue;
                        }
                        return Err(Failure::Answer(match cause {
                            UpstreamErrorCause::ConnectTimeout => 504,
                            _ => 502,
                        }));
                    }
                },
            };
            // A pooled connection that the upstream closed shows up as a
            // failed write or an end of stream before any response byte.
            // The upstream never processed the request, so it is sent
            // again on a new connection if that is safe.
            let retry_stale = reused && req.idempotent && whole;
            match tokio::time::timeout(config.upstream.write, up.write_all(self.out)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) if retry_stale => {
                    fresh_only = true;
                    continue;
                }
                Ok(Err(_)) => {
                    metrics.upstream_error(UpstreamErrorCause::ConnectionClosed);
                    return Err(Failure::Answer(502));
                }
                Err(_) => {
                    metrics.upstream_error(UpstreamErrorCause::WriteTimeout);
                    return Err(Failure::Answer(504));
                }
            }
            if !whole {
                self.send_body_rest(req, buffered, &mut up).await?;
            }
            self.upbuf.clear();
            match self.read_response_head(req, &mut up).await {
                Ok(resp) => break (up, addr, resp),
                Err(ReadHead::Closed) if retry_stale => {
                    fresh_only = true;
                    continue;
                }
                Err(ReadHead::Closed) => {
                    metrics.upstream_error(UpstreamErrorCause::ConnectionClosed);
                    return Err(Failure::Answer(502));
                }
                Err(ReadHead::TimedOut) => {
                    metrics.upstream_error(UpstreamErrorCause::ReadTimeout);
                    return Err(Failure::Answer(504));
                }
                Err(ReadHead::Invalid) => {
                    metrics.upstream_error(UpstreamErrorCause::Other);
                    return Err(Failure::Answer(502));
                }
                Err(ReadHead::Downstream) => return Err(Failure::Close),
            }
        };

        // The final response head is in `out`, its first body bytes in
        // `upbuf` after `resp.head_len`. From here on a failure can only
        // cut the downstream connection.
        let Response {
            head_len,
            status,
            body,
            reusable,
            close,
        } = resp;
        let read_timeout = config.upstream.read;
        let mut complete = false;
        match body {
            Framing::Empty => {
                self.upbuf.drain(..head_len);
                self.write_down_out().await?;
                complete = true;
            }
            Framing::Length(n) => {
                let avail = (self.upbuf.len() - head_len) as u64;
                let first = avail.min(n) as usize;
                self.out
                    .extend_from_slice(&self.upbuf[head_len..head_len + first]);
                self.upbuf.drain(..head_len + first);
                self.write_down_out().await?;
                let mut left = n - first as u64;
                while left > 0 {
                    self.upbuf.clear();
                    self.upbuf.reserve(IO_CHUNK);
                    let got = read_timed(&mut up, self.upbuf, read_timeout).await?;
                    let take = (got as u64).min(left) as usize;
                    left -= take as u64;
                    self.down
                        .write_all(&self.upbuf[..take])
                        .await
                        .map_err(|_| Failure::Close)?;
                    self.upbuf.drain(..take);
                }
                self.down.flush().await.map_err(|_| Failure::Close)?;
                complete = true;
            }
            Framing::Chunked => {
                let mut tracker = BodyTracker::new(Framing::Chunked);
                self.upbuf.drain(..head_len);
                loop {
                    let used = tracker.feed(self.upbuf).map_err(|_| Failure::Close)?;
                    self.out.extend_from_slice(&self.upbuf[..used]);
                    self.upbuf.drain(..used);
                    self.write_down_out().await?;
                    self.out.clear();
                    if tracker.is_done() {
                        complete = true;
                        break;
                    }
                    self.upbuf.reserve(IO_CHUNK);
                    read_timed(&mut up, self.upbuf, read_timeout).await?;
                }
            }
            Framing::UntilClose => {
                self.out.extend_from_slice(&self.upbuf[head_len..]);
                self.upbuf.clear();
                self.write_down_out().await?;
                loop {
                    self.upbuf.clear();
                    self.upbuf.reserve(IO_CHUNK);
                    match tokio::time::timeout(read_timeout, up.read_buf(self.upbuf)).await {
                        Ok(Ok(0)) => break,
                        Ok(Ok(n)) => self
                            .down
                            .write_all(&self.upbuf[..n])
                            .await
                            .map_err(|_| Failure::Close)?,
                        _ => return Err(Failure::Close),
                    }
                }
                self.down.flush().await.map_err(|_| Failure::Close)?;
            }
        }
        // Bytes after the response mean the upstream and we disagree on
        // framing: that connection is not reused.
        if complete && reusable && self.upbuf.is_empty() {
            pool.put(addr, up);
        }
        Ok((status, !close))
    }

    async fn write_down_out(&mut self) -> Result<(), Failure> {
        self.down
            .write_all(self.out)
            .await
            .map_err(|_| Failure::Close)?;
        self.down.flush().await.map_err(|_| Failure::Close)
    }

    /// Streams the part of a request body that was not read with its head.
    async fn send_body_rest(
        &mut self,
        req: &Request,
        buffered: usize,
        up: &mut TcpStream,
    ) -> Result<(), Failure> {
        let config = &self.c.shared.config;
        let mut left = req.body_len - buffered as u64;
        while left > 0 {
            if self.inbuf.capacity() - self.inbuf.len() < 4096 {
                self.inbuf.reserve(IO_CHUNK);
            }
            match tokio::time::timeout(config.limits.keepalive_idle, self.down.read_buf(self.inbuf))
                .await
            {
                Ok(Ok(n)) if n > 0 => {}
                _ => return Err(Failure::Close),
            }
            let take = (self.inbuf.len() as u64).min(left) as usize;
            match tokio::time::timeout(config.upstream.write, up.write_all(&self.inbuf[..take]))
                .await
            {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    self.c
                        .shared
                        .metrics
                        .upstream_error(UpstreamErrorCause::ConnectionClosed);
                    return Err(Failure::Answer(502));
                }
                Err(_) => {
                    self.c
                        .shared
                        .metrics
                        .upstream_error(UpstreamErrorCause::WriteTimeout);
                    return Err(Failure::Answer(504));
                }
            }
            self.inbuf.drain(..take);
            left -= take as u64;
        }
        Ok(())
    }

    /// Reads until a final response head is complete, relaying 1xx heads.
    async fn read_response_head(
        &mut self,
        req: &Request,
        up: &mut TcpStream,
    ) -> Result<Response, ReadHead> {
        let c = self.c;
        let read_timeout = c.shared.config.upstream.read;
        let mut got_any = false;
        loop {
            if !self.upbuf.is_empty() {
                match analyze_response(self.upbuf, req, c, self.out) {
                    Ok(Some(resp)) if (100..200).contains(&resp.status) => {
                        self.upbuf.drain(..resp.head_len);
                        self.down
                            .write_all(self.out)
                            .await
                            .map_err(|_| ReadHead::Downstream)?;
                        self.down.flush().await.map_err(|_| ReadHead::Downstream)?;
                        continue;
                    }
                    Ok(Some(resp)) => return Ok(resp),
                    Ok(None) => {}
                    Err(()) => return Err(ReadHead::Invalid),
                }
            }
            if self.upbuf.capacity() - self.upbuf.len() < 4096 {
                self.upbuf.reserve(16 * 1024);
            }
            match tokio::time::timeout(read_timeout, up.read_buf(self.upbuf)).await {
                Ok(Ok(0)) | Ok(Err(_)) if !got_any => return Err(ReadHead::Closed),
                Ok(Ok(0)) | Ok(Err(_)) => return Err(ReadHead::Invalid),
                Ok(Ok(_)) => got_any = true,
                Err(_) => return Err(ReadHead::TimedOut),
            }
        }
    }
}

enum ReadHead {
    /// Closed before any byte: a stale pooled connection, or a crash.
    Closed,
    TimedOut,
    Invalid,
    Downstream,
}

/// One read from the upstream into `buf` while relaying a body; the end of
/// stream or a timeout here cuts the response.
async fn read_timed(
    up: &mut TcpStream,
    buf: &mut Vec<u8>,
    limit: Duration,
) -> Result<usize, Failure> {
    match tokio::time::timeout(limit, up.read_buf(buf)).await {
        Ok(Ok(n)) if n > 0 => Ok(n),
        _ => Err(Failure::Close),
    }
}
