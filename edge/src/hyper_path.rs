//! The hyper path: a full HTTP server (HTTP/1.1 and h2) for what the byte
//! relay does not serve — public h2 connections, upgrades (WebSocket),
//! HTTP/1.0, absolute-form targets. Every request is parsed, held to the
//! edge's rules ([`crate::public`]), routed by its authority and re-sent on
//! an HTTP/1.1 client over a tunnel stream opened for that host.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::client::conn::http1;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tuna_protocol::wire::{StreamKind, StreamMeta};

use crate::budget::PreAuthSlot;
use crate::page::{Body, Page};
use crate::public::{MAX_IDLE_PER_CONNECTION, Peer};
use crate::registry::{Registry, Session};

/// One accepted public connection.
struct PublicConnection {
    peer: Peer,
    registry: Arc<Registry>,
    idle: Mutex<Vec<Idle>>,
    activity: Arc<Activity>,
}

struct Idle {
    host: String,
    session: Arc<Session>,
    sender: http1::SendRequest<Incoming>,
}

/// Serves a public connection with hyper until it closes, has been idle
/// for [`crate::public::PublicLimits::idle`], or the edge shuts down.
pub(crate) async fn serve<IO>(
    io: IO,
    peer: Peer,
    registry: Arc<Registry>,
    cancel: CancellationToken,
    pre_auth: Option<PreAuthSlot>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Given up with the first complete request head (hyper calls the
    // service then).
    let pre_auth = Arc::new(Mutex::new(pre_auth));
    let activity = Arc::new(Activity::default());
    let conn = Arc::new(PublicConnection {
        peer,
        registry,
        idle: Mutex::new(Vec::new()),
        activity: Arc::clone(&activity),
    });
    let service = hyper::service::service_fn(move |req| {
        pre_auth.lock().unwrap_or_else(|p| p.into_inner()).take();
        let conn = Arc::clone(&conn);
        async move {
            let busy = conn.activity.start();
            let resp = conn.handle(req).await;
            Ok::<_, Infallible>(resp.map(|body| Tracked { body, _busy: busy }.boxed()))
        }
    });
    let limits = peer.limits;
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // Slow-header clients (slowloris) are cut off after `header_read`.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.h2_max_streams)
        .max_header_list_size(tuna_http1::MAX_HEAD as u32)
        // Dead peers: a PING unanswered within 20 s closes the connection.
        .keep_alive_interval(Some(std::time::Duration::from_secs(20)))
        .keep_alive_timeout(std::time::Duration::from_secs(20));
    let serving = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(serving);
    let mut closing = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = serving.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(client = %peer.client_addr, error = %e, "public connection ended with an error");
                }
                return;
            }
            // No request in flight for `idle`: GOAWAY (h2) or close (h1),
            // letting whatever is still on the wire finish.
            _ = activity.idle_for(limits.idle), if !closing => {
                closing = true;
                serving.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Requests in flight on one connection and when the last one ended.
struct Activity {
    state: Mutex<(usize, Instant)>,
    changed: Notify,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            state: Mutex::new((0, Instant::now())),
            changed: Notify::new(),
        }
    }
}

/// A request in flight: from its head until its response body is done.
struct Busy(Arc<Activity>);

impl Activity {
    fn start(self: &Arc<Self>) -> Busy {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).0 += 1;
        self.changed.notify_waiters();
        Busy(Arc::clone(self))
    }

    /// Returns once no request has been in flight for `limit`.
    async fn idle_for(&self, limit: std::time::Duration) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (busy, since) = *self.state.lock().unwrap_or_else(|p| p.into_inner());
            if busy > 0 {
                changed.await;
                continue;
            }
            let left = limit.saturating_sub(since.elapsed());
            if left.is_zero() {
                return;
            }
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep(left) => {}
            }
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        {
            let mut state = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
            state.0 -= 1;
            state.1 = Instant::now();
        }
        self.0.changed.notify_waiters();
    }
}

/// A response body that keeps its request counted as in flight.
struct Tracked {
    body: Body,
    _busy: Busy,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl PublicConnection {
    async fn handle(&self, mut req: Request<Incoming>) -> Response<Body> {
        let host = match route_host(&mut req) {
            Ok(host) => host,
            Err(page) => return page.response(),
        };
        let grace = self.peer.limits.reconnect_grace;
        let Some(session) = self.registry.route_for_host_within(&host, grace).await else {
            return Page::not_routed(&self.registry, &host).response();
        };
        if !self.peer.trusted {
            strip_forwarding(req.headers_mut());
        }
        let upgrade = is_upgrade(&req);
        to_origin_form(&mut req);
        if !upgrade {
            strip_hop_by_hop(req.headers_mut());
        }
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let sender = if upgrade {
            None
        } else {
            self.take_idle(&host, &session)
        };
        let mut sender = match sender {
            Some(s) => s,
            None => match self.connect(&host, &session, upgrade).await {
                Some(s) => s,
                None => return Page::bad_gateway(&host).response(),
            },
        };
        let limit = self.peer.limits.response;
        let mut resp = match tokio::time::timeout(limit, sender.send_request(req)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::debug!(%host, error = %e, "request through the tunnel failed");
                return Page::bad_gateway(&host).response();
            }
            Err(_) => {
                tracing::debug!(%host, "no response through the tunnel in time");
                return Page::gateway_timeout(&host).response();
            }
        };
        if let Some(client_upgrade) = client_upgrade {
            if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
                let agent_upgrade = hyper::upgrade::on(&mut resp);
                let closed = session.closed.clone();
                tokio::spawn(async move {
                    let (Ok(client), Ok(agent)) = tokio::join!(client_upgrade, agent_upgrade)
                    else {
                        return;
                    };
                    let mut client = TokioIo::new(client);
                    let mut agent = TokioIo::new(agent);
                    tokio::select! {
                        _ = closed.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut client, &mut agent) => {}
                    }
                });
            }
        } else {
            strip_hop_by_hop(resp.headers_mut());
            self.put_idle(host, session, sender);
        }
        resp.map(|b| b.boxed())
    }

    fn take_idle(
        &self,
        host: &str,
        session: &Arc<Session>,
    ) -> Option<http1::SendRequest<Incoming>> {
        let mut idle = self.idle.lock().expect("idle list poisoned");
        idle.retain(|i| !i.sender.is_closed() && !i.session.closed.is_cancelled());
        let pos = idle.iter().position(|i| {
            i.host == host && Arc::ptr_eq(&i.session, session) && i.sender.is_ready()
        })?;
        Some(idle.swap_remove(pos).sender)
    }

    fn put_idle(&self, host: String, session: Arc<Session>, sender: http1::SendRequest<Incoming>) {
        let mut idle = self.idle.lock().expect("idle list poisoned");
        if idle.len() < MAX_IDLE_PER_CONNECTION {
            idle.push(Idle {
                host,
                session,
                sender,
            });
        }
    }

    async fn connect(
        &self,
        host: &str,
        session: &Arc<Session>,
        upgrade: bool,
    ) -> Option<http1::SendRequest<Incoming>> {
        let meta = StreamMeta {
            client_addr: self.peer.client_addr,
            kind: StreamKind::Http {
                host: host.to_owned(),
                scheme: self.peer.scheme,
            },
            tunnel: session.tunnel.clone(),
        };
        let stream = match session.open(&meta).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(host, error = %e, "could not open a stream to the agent");
                return None;
            }
        };
        let (sender, conn) = match http1::Builder::new().handshake(TokioIo::new(stream)).await {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(host, error = %e, "HTTP/1.1 handshake over the tunnel failed");
                return None;
            }
        };
        let closed = session.closed.clone();
        tokio::spawn(async move {
            let r = if upgrade {
                tokio::select! { _ = closed.cancelled() => Ok(()), r = conn.with_upgrades() => r }
            } else {
                tokio::select! { _ = closed.cancelled() => Ok(()), r = conn => r }
            };
            if let Err(e) = r {
                tracing::debug!(error = %e, "tunnel HTTP/1.1 connection ended with an error");
            }
        });
        Some(sender)
    }
}

/// The host a request is routed by, lower case, without port — and its
/// `Host` made to say the same. The target's authority (h2 `:authority`,
/// HTTP/1.1 absolute form) wins and replaces `Host` (RFC 9112 §3.2.2);
/// without one, `Host` is the host. Either must pass the codec's host rule
/// (no userinfo, no other characters), else 400.
fn route_host<B>(req: &mut Request<B>) -> Result<String, Page> {
    let bad = || Page::bad_request("the host is not a valid host name");
    if let Some(value) = req.headers().get(header::HOST)
        && tuna_http1::parse_host(value.as_bytes()).is_none()
    {
        return Err(bad());
    }
    if req.headers().get_all(header::HOST).iter().count() > 1 {
        return Err(Page::bad_request("more than one Host header"));
    }
    let name = match req.uri().authority() {
        Some(authority) => {
            let parsed = tuna_http1::parse_host(authority.as_str().as_bytes()).ok_or_else(bad)?;
            let value = HeaderValue::from_str(parsed.value).map_err(|_| bad())?;
            let name = parsed.name.to_ascii_lowercase();
            req.headers_mut().insert(header::HOST, value);
            name
        }
        None => {
            let value = req.headers().get(header::HOST).ok_or_else(Page::no_host)?;
            let parsed = tuna_http1::parse_host(value.as_bytes()).ok_or_else(bad)?;
            parsed.name.to_ascii_lowercase()
        }
    };
    Ok(name)
}

fn is_upgrade<B>(req: &Request<B>) -> bool {
    req.version() <= http::Version::HTTP_11
        && req.headers().contains_key(header::UPGRADE)
        && req
            .headers()
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

/// HTTP/1.1 on the stream wants origin-form (`Host` is already set).
fn to_origin_form<B>(req: &mut Request<B>) {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    if let Ok(uri) = Uri::builder().path_and_query(path).build() {
        *req.uri_mut() = uri;
    }
    *req.version_mut() = http::Version::HTTP_11;
}

/// The fields through which a client could speak for earlier hops
/// ([`tuna_http1::FORWARDING`]).
fn strip_forwarding(headers: &mut HeaderMap) {
    for name in tuna_http1::FORWARDING {
        headers.remove(name);
    }
}

/// Connection-scoped headers ([`tuna_http1::HOP_BY_HOP`], and what
/// `Connection` names) describe one hop; they must not cross the tunnel.
/// hyper frames each message itself, so `Transfer-Encoding` goes too; the
/// framing fields and `Host` are never dropped because `Connection` says so.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| tuna_http1::tokens(v.as_bytes()))
        .filter(|t| {
            !["host", "content-length", "transfer-encoding"]
                .iter()
                .any(|n| t.eq_ignore_ascii_case(n.as_bytes()))
        })
        .filter_map(|t| HeaderName::from_bytes(t).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in tuna_http1::HOP_BY_HOP {
        headers.remove(name);
    }
}
