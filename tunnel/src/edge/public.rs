//! Public listeners: HTTP and HTTPS (HTTP/1.1 and h2 via ALPN), routed by
//! `Host` to the session that serves it.
//!
//! HTTP/1.1 connections go through a byte relay ([`relay`]) that parses
//! only what routing and framing need and forwards the bytes as they are;
//! h2 clients and what the relay does not handle get a full hyper server
//! ([`serve_hyper`]).
//!
//! Each public connection gets its own data streams, one per host it talks
//! to (so a stream's [`StreamMeta`] names one client and one host, and the
//! agent's proxy core can set `X-Forwarded-*` from it). The edge speaks
//! HTTP/1.1 on the stream; keep-alive requests reuse it. WebSocket (and any
//! HTTP/1.1 `Upgrade`) requests get a stream of their own that turns into a
//! raw pipe after `101`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use super::registry::{Registry, Session};
use super::relay;
use crate::wire::{Scheme, StreamKind, StreamMeta};

type Body = BoxBody<Bytes, hyper::Error>;

/// Time a public HTTP/1.1 client has to send a request head.
pub(crate) const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Idle HTTP/1.1 streams one public connection keeps for reuse.
pub(crate) const MAX_IDLE_PER_CONNECTION: usize = 4;

/// One accepted public connection.
struct PublicConnection {
    client_addr: SocketAddr,
    scheme: Scheme,
    registry: Arc<Registry>,
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    host: String,
    session: Arc<Session>,
    sender: http1::SendRequest<Incoming>,
}

/// Serves one public connection (plain or TLS-terminated) until it closes
/// or the edge shuts down. HTTP/1.1 goes through the byte relay
/// ([`relay`]), which hands anything it does not relay (upgrades, HTTP/1.0,
/// h2 with prior knowledge, ...) to [`serve_hyper`]; a TLS connection that
/// negotiated h2 goes to [`serve_hyper`] at once.
pub(crate) async fn serve_connection<IO>(
    io: IO,
    client_addr: SocketAddr,
    scheme: Scheme,
    alpn_h2: bool,
    registry: Arc<Registry>,
    cancel: CancellationToken,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    if alpn_h2 {
        serve_hyper(io, client_addr, scheme, registry, cancel).await;
    } else {
        relay::serve(io, client_addr, scheme, registry, cancel).await;
    }
}

/// Serves a public connection with a full HTTP server (hyper, HTTP/1.1 and
/// h2): every request is parsed, routed by host and re-sent on an HTTP/1.1
/// client over the tunnel stream.
pub(crate) async fn serve_hyper<IO>(
    io: IO,
    client_addr: SocketAddr,
    scheme: Scheme,
    registry: Arc<Registry>,
    cancel: CancellationToken,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = Arc::new(PublicConnection {
        client_addr,
        scheme,
        registry,
        idle: Mutex::new(Vec::new()),
    });
    let service = hyper::service::service_fn(move |req| {
        let conn = Arc::clone(&conn);
        async move { Ok::<_, Infallible>(conn.handle(req).await) }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // Slow-header clients (slowloris) are cut off after HEADER_READ_TIMEOUT.
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let serving = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::select! {
        _ = cancel.cancelled() => {}
        r = serving => {
            if let Err(e) = r {
                tracing::debug!(%client_addr, error = %e, "public connection ended with an error");
            }
        }
    }
}

impl PublicConnection {
    async fn handle(&self, mut req: Request<Incoming>) -> Response<Body> {
        let Some(host) = request_host(&req) else {
            return Page::no_host().response();
        };
        let Some(session) = self.registry.session_for_host(&host) else {
            return Page::not_routed(&self.registry, &host).response();
        };
        let upgrade = is_upgrade(&req);
        to_origin_form(&mut req, &host);
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
        let mut resp = match sender.send_request(req).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(%host, error = %e, "request through the tunnel failed");
                return Page::bad_gateway(&host).response();
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
            client_addr: self.client_addr,
            kind: StreamKind::Http {
                host: host.to_owned(),
                scheme: self.scheme,
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

/// The request's host, lower case, without port: from the URI (h2,
/// absolute-form) or the `Host` header.
fn request_host<B>(req: &Request<B>) -> Option<String> {
    let raw = match req.uri().authority() {
        Some(a) => a.host().to_owned(),
        None => {
            let value = req.headers().get(header::HOST)?.to_str().ok()?;
            let authority: http::uri::Authority = value.parse().ok()?;
            authority.host().to_owned()
        }
    };
    let host = raw.trim_end_matches('.').to_ascii_lowercase();
    (!host.is_empty()).then_some(host)
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

/// HTTP/1.1 on the stream wants origin-form and a `Host` header, whatever
/// the client spoke.
fn to_origin_form<B>(req: &mut Request<B>, host_only: &str) {
    let authority = req.uri().authority().map(|a| a.as_str().to_owned());
    if !req.headers().contains_key(header::HOST) {
        let value = authority.unwrap_or_else(|| host_only.to_owned());
        if let Ok(v) = HeaderValue::from_str(&value) {
            req.headers_mut().insert(header::HOST, v);
        }
    }
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

/// Connection-scoped headers (RFC 9110 §7.6.1) describe one hop; they must
/// not cross the tunnel.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
}

/// A small self-explanatory HTML page the edge answers with itself.
pub(crate) struct Page {
    status: StatusCode,
    title: &'static str,
    text: String,
    retry_after: Option<&'static str>,
}

impl Page {
    fn new(status: StatusCode, title: &'static str, text: String) -> Self {
        Self {
            status,
            title,
            text,
            retry_after: None,
        }
    }

    pub(crate) fn no_host() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "Bad request",
            "The request names no host.".into(),
        )
    }

    pub(crate) fn bad_request(reason: &str) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "Bad request",
            format!("The request cannot be forwarded: {reason}."),
        )
    }

    pub(crate) fn head_too_large() -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "Request header fields too large",
            "The request head is too large.".into(),
        )
    }

    /// 503 for a host whose tunnel is gone (it may come back), else 404.
    pub(crate) fn not_routed(registry: &Registry, host: &str) -> Self {
        if registry.host_went_offline(host) {
            return Self {
                retry_after: Some("5"),
                ..Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Tunnel offline",
                    format!(
                        "The tunnel serving {host} is not connected right now. Try again shortly."
                    ),
                )
            };
        }
        Self::new(
            StatusCode::NOT_FOUND,
            "No tunnel for this host",
            format!("No tunnel serves {host} on this edge."),
        )
    }

    pub(crate) fn bad_gateway(host: &str) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "Tunnel unreachable",
            format!("The tunnel agent serving {host} did not answer."),
        )
    }

    fn html(&self) -> String {
        format!(
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{code} {title}</title></head>\
             <body><h1>{code} {title}</h1><p>{text}</p><hr><p>tuna edge</p></body></html>\n",
            code = self.status.as_u16(),
            title = escape(self.title),
            text = escape(&self.text),
        )
    }

    /// The page for the hyper path.
    pub(crate) fn response(&self) -> Response<Body> {
        let mut resp = Response::new(
            Full::new(Bytes::from(self.html()))
                .map_err(|never| match never {})
                .boxed(),
        );
        *resp.status_mut() = self.status;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static(secs));
        }
        resp
    }

    /// The page as HTTP/1.1 bytes, for the relay; `close` announces that
    /// the connection ends after it; without `body` (the answer to HEAD)
    /// only the head goes out.
    pub(crate) fn to_http1(&self, close: bool, body: bool) -> Vec<u8> {
        let html = self.html();
        let mut out = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: text/html; charset=utf-8\r\ncache-control: no-store\r\ncontent-length: {}\r\n",
            self.status.as_u16(),
            self.status.canonical_reason().unwrap_or(""),
            html.len()
        );
        if let Some(secs) = self.retry_after {
            out.push_str(&format!("retry-after: {secs}\r\n"));
        }
        if close {
            out.push_str("connection: close\r\n");
        }
        out.push_str("\r\n");
        if body {
            out.push_str(&html);
        }
        out.into_bytes()
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
