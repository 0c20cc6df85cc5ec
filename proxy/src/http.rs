//! The Pingora application: routing, header policy, errors and accounting.
//!
//! Hooks used, in request order, and why each:
//! - `new_ctx`: start the latency clock.
//! - `request_filter`: header-count/size limit (431) for requests after the
//!   first on a keep-alive connection (the first is checked before Pingora
//!   sees it, see `conn.rs`), request id + tracing span, the route lookup in
//!   the current snapshot, and the 404 page; for a Gateway API rule its
//!   redirect, the backend chosen by weight (500 when there is none) and
//!   its rewrite worked out while the matched prefix is at hand. It is the
//!   first hook that can answer on its own (`Ok(true)`).
//! - `upstream_peer`: picks the address (round-robin; retries move on to
//!   the next address) from the backend the lookup pinned in the context,
//!   so a table swap between lookup and connect cannot change the backend
//!   a request goes to; a rule's timeouts bound the attempt.
//! - `upstream_request_filter`: hop-by-hop stripping and the `X-Forwarded-*`
//!   and request id headers, on the copy that goes upstream, then a rule's
//!   `URLRewrite` and `RequestHeaderModifier`s in its order.
//! - `upstream_response_filter` / `response_filter`: hop-by-hop stripping of
//!   the upstream response; request id on the downstream response, then a
//!   rule's `ResponseHeaderModifier`s.
//! - `fail_to_connect` / `error_while_proxy`: the retry policy and the
//!   upstream-error counters (each failed attempt counts once).
//! - `fail_to_proxy`: maps the final error to 502/504/4xx with a short page.
//! - `logging`: per-host status counters, latency histogram, a trace event.
//! - `suppress_error_log`: Pingora logs every failed request at `error`;
//!   refused and timed-out upstreams are expected operational events that
//!   our own counters and trace events already report.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, header};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::{Error, ErrorSource, ErrorType, RetryType};

use tuna_routing::Match;
use tuna_routing::action::Filter;

use crate::client::Scheme;
use crate::gateway::{self, RequestLine};
use crate::metrics::{HostStats, UpstreamErrorCause};
use crate::pages::error_page;
use crate::routes::{CompiledBackend, GatewayRule, Table};
use crate::shared::Shared;

pub(crate) use tuna_routing::RequestView;

/// A Pingora request head, as a lookup reads it.
pub(crate) struct PingoraRequest<'a>(pub(crate) &'a RequestHeader);

impl RequestView for PingoraRequest<'_> {
    fn method(&self) -> &str {
        self.0.method.as_str()
    }
    fn header(&self, name_lower: &str) -> Option<&str> {
        self.0.headers.get(name_lower)?.to_str().ok()
    }
}

/// The one route lookup of both request paths (this file's and the fast
/// path's), so that what a lookup may read is decided in one place.
pub(crate) fn route_lookup<'t>(
    table: &'t Table,
    host: &str,
    path_and_query: &str,
    request: &impl RequestView,
) -> Option<Match<'t, Arc<CompiledBackend>>> {
    table.lookup_request(host, path_and_query, request)
}

/// What a connection that the proxy did not route itself is bound to,
/// carried to the hooks by the downstream stream itself: Pingora gives
/// hooks no per-connection context, but every session's digest holds the
/// stream's `ProxyDigest`, whose `user_data` is free for the stream's
/// owner on a downstream connection (Pingora sets it only on upstream
/// connections made through a CONNECT proxy). See `conn::tunnel_stream`.
pub(crate) struct StreamScope {
    /// The one host the stream may serve ([`crate::ConnInfo::host`], or
    /// the host of a CONNECT).
    pub(crate) host: Option<Arc<str>>,
    /// A port of a Gateway's own address: its requests are routed by the
    /// port's listeners ([`crate::ProxyCore::set_port_routes`]), any host.
    pub(crate) port: Option<std::net::SocketAddr>,
    /// On an HTTPS port of a Gateway's address: the SNI its handshake
    /// named (empty: none). A request whose `Host` selects another listener
    /// than the SNI did is answered 421: the certificate presented was not
    /// that listener's.
    pub(crate) tls_name: Option<Arc<str>>,
    /// For an intercepted CONNECT: where every request goes, whatever the
    /// route table says, as long as the grant holds (checked again when due).
    pub(crate) pinned: Option<Arc<dyn PinnedGrant>>,
}

/// The grant behind a pinned stream, asked again before every request
/// ([`crate::connect`]'s grant of an open CONNECT implements it).
#[async_trait]
pub(crate) trait PinnedGrant: Send + Sync {
    /// Where this request goes, or why it may not (the grant was revoked
    /// while the connection was open).
    async fn for_request(&self) -> Result<Arc<Pinned>, PinnedRefusal>;
}

/// Why a pinned stream's request is refused: the status and the one-line
/// message it is answered with.
pub(crate) struct PinnedRefusal {
    pub(crate) status: u16,
    pub(crate) message: String,
}

/// The upstream of an intercepted CONNECT ([`crate::connect`]) and the
/// credentials its requests carry there.
pub(crate) struct Pinned {
    pub(crate) backend: Arc<CompiledBackend>,
    /// Replaces the client's `Authorization` (marked sensitive).
    pub(crate) authorization: HeaderValue,
    /// Who and what, for traces.
    pub(crate) label: Arc<str>,
}

fn stream_scope(session: &Session) -> Option<&StreamScope> {
    let user_data = session
        .digest()?
        .proxy_digest
        .as_ref()?
        .user_data
        .as_ref()?;
    user_data.downcast_ref::<StreamScope>()
}

fn stream_host(session: &Session) -> Option<&str> {
    stream_scope(session)?.host.as_deref()
}

/// One Pingora application per (scheme, trusted) pair: the pair is a
/// property of the connection, and Pingora gives hooks no per-connection
/// context, so the application itself carries it.
pub(crate) struct Router {
    pub(crate) shared: Arc<Shared>,
    pub(crate) scheme: Scheme,
    /// Whether connections handed to this application come from a trusted
    /// hop (always for tunnel streams marked so; for the listener, only
    /// peers in `trusted_peers` go to the trusted application).
    pub(crate) trusted: bool,
}

/// Per-request state.
pub struct RequestCtx {
    start: Instant,
    backend: Option<Arc<CompiledBackend>>,
    rr_start: usize,
    attempt: usize,
    request_id: Option<HeaderValue>,
    client_ip: Option<IpAddr>,
    public_host: Option<HeaderValue>,
    span: tracing::Span,
    answered_locally: Option<u16>,
    /// The `Authorization` of a pinned (CONNECT) stream's upstream requests.
    authorization: Option<HeaderValue>,
    /// The Gateway API rule the request matched: its filters and timeouts.
    rule: Option<Arc<GatewayRule>>,
    /// A `URLRewrite`'s `Host` and path (with the query), worked out at
    /// lookup, where the matched prefix is known.
    rewrite_host: Option<String>,
    rewrite_path: Option<String>,
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Removes hop-by-hop headers: the codec's list ([`tuna_http1::HOP_BY_HOP`];
/// `Transfer-Encoding` is Pingora's to frame), plus every header named in
/// `Connection` except the framing fields and `Host`, which no hop may
/// drop. An upgrade keeps `Connection: upgrade` and `Upgrade`, the
/// two headers that make it one; `TE: trailers` is kept because gRPC
/// requires it end to end.
fn strip_hop_by_hop(headers: &http::HeaderMap, keep_upgrade: bool) -> Vec<HeaderName> {
    let mut named = Vec::new();
    for v in headers.get_all(header::CONNECTION) {
        if let Ok(v) = v.to_str() {
            for token in v.split(',') {
                let token = token.trim();
                if token.eq_ignore_ascii_case("upgrade") && keep_upgrade {
                    continue;
                }
                if ["host", "content-length", "transfer-encoding"]
                    .iter()
                    .any(|n| token.eq_ignore_ascii_case(n))
                {
                    continue;
                }
                if let Ok(name) = HeaderName::from_bytes(token.as_bytes()) {
                    named.push(name);
                }
            }
        }
    }
    let te_trailers = headers
        .get(header::TE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        });
    let mut removed: Vec<HeaderName> = Vec::new();
    for name in tuna_http1::HOP_BY_HOP {
        if name == "transfer-encoding" || (keep_upgrade && name == "upgrade") {
            continue;
        }
        if headers.contains_key(name) {
            removed.push(HeaderName::from_static(name));
        }
    }
    for name in named {
        if headers.contains_key(&name) {
            removed.push(name);
        }
    }
    removed.retain(|n| !(n == header::TE && te_trailers));
    removed
}

/// Whether an HTTP/1 client wants its connection kept after this request
/// (RFC 9112 §9.3); h2 requests always share their connection.
fn client_keeps_alive(req: &RequestHeader) -> bool {
    let tokens = || {
        req.headers
            .get_all(header::CONNECTION)
            .into_iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
    };
    match req.version {
        http::Version::HTTP_10 | http::Version::HTTP_09 => {
            tokens().any(|t| t.eq_ignore_ascii_case("keep-alive"))
        }
        http::Version::HTTP_11 => !tokens().any(|t| t.eq_ignore_ascii_case("close")),
        _ => true,
    }
}

fn error_cause(e: &Error) -> UpstreamErrorCause {
    match e.etype() {
        ErrorType::ConnectRefused | ErrorType::ConnectNoRoute => UpstreamErrorCause::ConnectRefused,
        ErrorType::ConnectTimedout | ErrorType::TLSHandshakeTimedout => {
            UpstreamErrorCause::ConnectTimeout
        }
        ErrorType::ReadTimedout => UpstreamErrorCause::ReadTimeout,
        ErrorType::WriteTimedout => UpstreamErrorCause::WriteTimeout,
        ErrorType::TLSHandshakeFailure | ErrorType::InvalidCert | ErrorType::HandshakeError => {
            UpstreamErrorCause::Tls
        }
        ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::WriteError => {
            UpstreamErrorCause::ConnectionClosed
        }
        _ => UpstreamErrorCause::Other,
    }
}

/// The status a failed request is answered with.
fn status_for(e: &Error) -> u16 {
    match (e.etype(), e.esource()) {
        (ErrorType::HTTPStatus(code), _) => *code,
        (
            ErrorType::ConnectTimedout
            | ErrorType::TLSHandshakeTimedout
            | ErrorType::ReadTimedout
            | ErrorType::WriteTimedout,
            ErrorSource::Upstream,
        ) => 504,
        (_, ErrorSource::Upstream) => 502,
        (ErrorType::ReadTimedout, ErrorSource::Downstream) => 408,
        (
            ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed,
            ErrorSource::Downstream,
        ) => 0,
        (_, ErrorSource::Downstream) => 400,
        _ => 502,
    }
}

/// A rule's timeouts on one attempt's peer: `backend_request` bounds its
/// reads, and what is left of `request` (counted from the request's start)
/// bounds its connect, reads and writes; none left → 504.
fn apply_timeouts(
    peer: &mut HttpPeer,
    timeouts: &tuna_routing::action::Timeouts,
    start: Instant,
) -> pingora::Result<()> {
    let o = &mut peer.options;
    if let Some(limit) = timeouts.backend_request {
        o.read_timeout = Some(o.read_timeout.map_or(limit, |t| t.min(limit)));
    }
    if let Some(limit) = timeouts.request {
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(Error::explain(
                ErrorType::HTTPStatus(504),
                "the route's request timeout elapsed",
            ));
        }
        let cap = |t: &mut Option<std::time::Duration>| *t = Some(t.map_or(left, |t| t.min(left)));
        cap(&mut o.connection_timeout);
        cap(&mut o.total_connection_timeout);
        cap(&mut o.read_timeout);
        cap(&mut o.write_timeout);
    }
    Ok(())
}

/// The path the router matched (canonical: unreserved escapes decoded, `//`
/// and dot segments resolved, `%2F` kept) with the query as sent. Rewrites
/// and redirects work on it: a `ReplacePrefixMatch` of `/api` must replace
/// the prefix of `/%61pi/x` and `//api/x` too, which matched as `/api/x`.
/// Borrows when the path is canonical already.
fn canonical_path_and_query(raw: &str) -> std::borrow::Cow<'_, str> {
    use std::borrow::Cow;
    match tuna_routing::normalize_path(raw) {
        Some(Cow::Owned(mut path)) => {
            if let Some((_, query)) = raw.split_once('?') {
                path.push('?');
                path.push_str(query);
            }
            Cow::Owned(path)
        }
        Some(Cow::Borrowed(_)) | None => Cow::Borrowed(raw),
    }
}

/// A `URLRewrite` on the upstream request: the path (query kept) and the
/// `Host` (and the target's authority, when it carries one).
fn rewrite_upstream(upstream: &mut RequestHeader, ctx: &RequestCtx) -> pingora::Result<()> {
    if ctx.rewrite_path.is_none() && ctx.rewrite_host.is_none() {
        return Ok(());
    }
    let uri = &upstream.uri;
    let path = ctx
        .rewrite_path
        .as_deref()
        .or_else(|| uri.path_and_query().map(|p| p.as_str()))
        .unwrap_or("/");
    let mut parts = http::uri::Builder::new();
    if let (Some(scheme), Some(authority)) = (uri.scheme(), uri.authority()) {
        let authority = ctx.rewrite_host.as_deref().unwrap_or(authority.as_str());
        parts = parts.scheme(scheme.clone()).authority(authority);
    }
    let uri = parts.path_and_query(path).build().map_err(|e| {
        Error::because(ErrorType::InternalError, "rewritten target is not valid", e)
    })?;
    upstream.set_uri(uri);
    if let Some(host) = &ctx.rewrite_host {
        upstream.insert_header(header::HOST, host.as_str())?;
    }
    Ok(())
}

impl Router {
    /// For a request that matched a Gateway API rule: what its filters make
    /// of it (the rewrite kept in `ctx`), and the redirect that answers it
    /// instead, if one does (status and `Location`).
    fn prepare_gateway(
        &self,
        ctx: &mut RequestCtx,
        m: &Match<'_, Arc<CompiledBackend>>,
        line: &RequestLine<'_>,
    ) -> Option<(u16, String)> {
        let compiled = m.backend.gateway.as_ref()?;
        // The host's counters, until (and unless) a target is chosen.
        ctx.backend = Some(m.backend.clone());
        ctx.rule = Some(compiled.rule.clone());
        for filter in &compiled.rule.filters {
            match filter {
                Filter::RequestRedirect(r) => {
                    let status = match r.status_code {
                        301 | 302 | 303 | 307 | 308 => r.status_code,
                        _ => 302,
                    };
                    return Some((status, gateway::redirect_location(r, line)));
                }
                Filter::UrlRewrite(r) => {
                    let (host, path) =
                        gateway::rewrite(r, line.path_and_query, line.matched_prefix);
                    ctx.rewrite_host = host.or(ctx.rewrite_host.take());
                    ctx.rewrite_path = path.or(ctx.rewrite_path.take());
                }
                Filter::RequestHeaderModifier(_) | Filter::ResponseHeaderModifier(_) => {}
            }
        }
        None
    }

    /// Answers a Gateway API request's redirect, or picks its backend by
    /// weight (500 when the rule has none to give).
    async fn serve_gateway(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        redirect: Option<(u16, String)>,
    ) -> pingora::Result<bool> {
        if let Some((status, location)) = redirect {
            return match HeaderValue::from_str(&location) {
                Ok(location) => {
                    self.answer_with(session, ctx, status, String::new(), Some(location))
                        .await
                }
                Err(_) => {
                    tracing::debug!(parent: &ctx.span, %location, "redirect is not a valid Location");
                    self.answer(session, ctx, 500, error_page(500).to_owned())
                        .await
                }
            };
        }
        let target = ctx
            .backend
            .as_ref()
            .and_then(|b| b.gateway.as_ref())
            .and_then(|g| g.pick())
            .cloned();
        let Some(target) = target else {
            tracing::debug!(parent: &ctx.span, "no backend for the rule");
            return self
                .answer(session, ctx, 500, error_page(500).to_owned())
                .await;
        };
        ctx.rr_start = target.start_index();
        ctx.backend = Some(target);
        Ok(false)
    }

    fn is_valid_request_id(v: &HeaderValue) -> bool {
        let b = v.as_bytes();
        !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_graphic())
    }

    async fn answer(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        status: u16,
        body: String,
    ) -> pingora::Result<bool> {
        self.answer_with(session, ctx, status, body, None).await
    }

    /// [`Self::answer`], with a `Location` (a redirect).
    async fn answer_with(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        status: u16,
        body: String,
        location: Option<HeaderValue>,
    ) -> pingora::Result<bool> {
        let mut resp = ResponseHeader::build(status, Some(5))?;
        if let Some(location) = location {
            resp.insert_header(header::LOCATION, location)?;
        }
        resp.insert_header(header::CONTENT_TYPE, "text/plain; charset=utf-8")?;
        resp.insert_header(header::CONTENT_LENGTH, body.len())?;
        if let Some(id) = &ctx.request_id {
            resp.insert_header(self.shared.config.request_id_header.clone(), id.clone())?;
        }
        let head_only = session.req_header().method == http::Method::HEAD;
        session
            .write_response_header(Box::new(resp), head_only)
            .await?;
        if !head_only {
            session
                .write_response_body(Some(Bytes::from(body)), true)
                .await?;
        }
        ctx.answered_locally = Some(status);
        Ok(true)
    }
}

#[async_trait]
impl ProxyHttp for Router {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            start: Instant::now(),
            backend: None,
            rr_start: 0,
            attempt: 0,
            request_id: None,
            client_ip: None,
            public_host: None,
            span: tracing::Span::none(),
            answered_locally: None,
            authorization: None,
            rule: None,
            rewrite_host: None,
            rewrite_path: None,
        }
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<bool> {
        let config = &self.shared.config;
        // Keep-alive only when the client asked for it (HTTP/1.1 without
        // `close`, HTTP/1.0 with `keep-alive`): an HTTP/1.0 client waits
        // for the close that ends its response.
        if client_keeps_alive(session.req_header()) {
            session.set_keepalive(Some(config.limits.keepalive_idle.as_secs().max(1)));
        } else {
            session.set_keepalive(None);
        }
        let req = session.req_header();

        // Request id: a trusted hop's id is kept so one id follows the
        // request across hops; anyone else's is replaced.
        let incoming = req
            .headers
            .get(&config.request_id_header)
            .filter(|v| self.trusted && Self::is_valid_request_id(v))
            .cloned();
        let id = incoming.unwrap_or_else(|| self.shared.next_request_id());
        ctx.request_id = Some(id.clone());
        ctx.client_ip = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());

        let req = session.req_header();
        // h2 carries the host in :authority, h1 absolute-form in the target;
        // either wins over `Host` (RFC 9112 §3.2.2), and the upstream gets
        // it as its `Host` (upstream_request_filter). Every host is held to
        // the codec's rules, and a tunnel stream serves its one host only.
        let host_value = match req.uri.authority() {
            Some(a) => HeaderValue::from_str(a.as_str()).ok(),
            None => req.headers.get(header::HOST).cloned(),
        };
        let host_header_ok = req
            .headers
            .get(header::HOST)
            .is_none_or(|v| tuna_http1::parse_host(v.as_bytes()).is_some());
        let parsed = host_value
            .as_ref()
            .map(|v| tuna_http1::parse_host(v.as_bytes()));
        let refusal = match (parsed, stream_host(session)) {
            _ if !host_header_ok => Some(400),
            (Some(None), _) => Some(400),
            (Some(Some(h)), Some(bound)) if !h.is(bound) => Some(421),
            (None, Some(_)) => Some(421),
            _ => None,
        };
        let host = parsed.flatten().map_or("", |h| h.name);
        let path = req.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        ctx.span = tracing::info_span!(
            "request",
            id = %String::from_utf8_lossy(id.as_bytes()),
            method = %req.method,
            host = %host,
        );

        // Limits for every request after the first of a connection (the
        // first was checked before Pingora parsed it).
        let count = req.headers.len();
        let bytes: usize = req
            .headers
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len() + 4)
            .sum();
        if count > config.limits.max_header_count || bytes > config.limits.max_header_bytes {
            self.shared.metrics.header_rejections.fetch_add(1, Relaxed);
            session.set_keepalive(None);
            return self
                .answer(session, ctx, 431, error_page(431).to_owned())
                .await;
        }

        if let Some(status) = refusal {
            self.shared.metrics.header_rejections.fetch_add(1, Relaxed);
            session.set_keepalive(None);
            return self
                .answer(session, ctx, status, error_page(status).to_owned())
                .await;
        }

        if let Some(live) = stream_scope(session).and_then(|s| s.pinned.clone()) {
            let pinned = match live.for_request().await {
                Ok(pinned) => pinned,
                Err(refusal) => {
                    // Revoked while the connection was open: this request
                    // is told why, and the connection ends with it.
                    session.set_keepalive(None);
                    let mut body = refusal.message;
                    body.push('\n');
                    return self.answer(session, ctx, refusal.status, body).await;
                }
            };
            tracing::debug!(parent: &ctx.span, grant = %pinned.label, "pinned upstream");
            ctx.rr_start = pinned.backend.start_index();
            ctx.backend = Some(pinned.backend.clone());
            ctx.authorization = Some(pinned.authorization.clone());
            ctx.public_host = host_value;
            return Ok(false);
        }

        let snapshot = self.shared.snapshot.load();
        let scope = stream_scope(session);
        let found = match scope.and_then(|s| s.port) {
            // A port of a Gateway's address: its listeners, or nothing.
            Some(at) => {
                let port = snapshot.ports.get(&at);
                if let (Some(port), Some(sni)) = (port, scope.and_then(|s| s.tls_name.as_deref()))
                    && !port.table.same_listener(sni, host)
                {
                    tracing::debug!(parent: &ctx.span, %sni, "the Host is another listener's than the SNI's");
                    return self
                        .answer(session, ctx, 421, error_page(421).to_owned())
                        .await;
                }
                port.and_then(|port| port.table.lookup_request(host, path, &PingoraRequest(req)))
            }
            None => route_lookup(&snapshot.table, host, path, &PingoraRequest(req)),
        };
        let Some(m) = found else {
            let shown_host = if host.is_empty() { "(none)" } else { host };
            let body = format!(
                "404 Not Found: no route for host {shown_host} and path {}\n",
                path.split('?').next().unwrap_or(path)
            );
            tracing::debug!(parent: &ctx.span, "no route");
            return self.answer(session, ctx, 404, body).await;
        };
        if m.backend.gateway.is_some() {
            let public_port = host_value
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .and_then(gateway::host_port);
            let canonical = canonical_path_and_query(path);
            let line = RequestLine {
                scheme: self.scheme,
                host,
                port: public_port,
                path_and_query: &canonical,
                matched_prefix: &m.spec.path,
            };
            let redirect = self.prepare_gateway(ctx, &m, &line);
            ctx.public_host = host_value;
            return self.serve_gateway(session, ctx, redirect).await;
        }
        ctx.rr_start = m.backend.start_index();
        ctx.backend = Some(m.backend.clone());
        ctx.public_host = host_value;
        Ok(false)
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<Box<HttpPeer>> {
        let backend = ctx
            .backend
            .as_ref()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no backend selected"))?;
        let mut peer = Box::new(backend.peer(ctx.rr_start, ctx.attempt).clone());
        ctx.attempt += 1;
        if let Some(rule) = &ctx.rule {
            apply_timeouts(&mut peer, &rule.timeouts, ctx.start)?;
        }
        if session.is_upgrade_req() {
            // An upgraded connection (WebSocket) may idle between messages
            // for as long as both ends like; the read timeout is for
            // request/response exchanges.
            peer.options.read_timeout = None;
        }
        Ok(peer)
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        let upgrade = session.is_upgrade_req();
        for name in strip_hop_by_hop(&upstream.headers, upgrade) {
            upstream.remove_header(&name);
        }
        if upgrade {
            upstream.insert_header(header::CONNECTION, "upgrade")?;
        }

        if !self.trusted {
            // Only a trusted hop speaks for earlier ones.
            upstream.remove_header("forwarded");
            upstream.remove_header("x-real-ip");
        }
        if session.req_header().uri.authority().is_some()
            && let Some(host) = &ctx.public_host
        {
            upstream.insert_header(header::HOST, host.clone())?;
        }
        if let Some(ip) = ctx.client_ip {
            let ip = ip.to_string();
            let existing = upstream
                .headers
                .get(&X_FORWARDED_FOR)
                .and_then(|v| v.to_str().ok())
                .filter(|_| self.trusted)
                .map(|v| format!("{v}, {ip}"));
            upstream.insert_header(X_FORWARDED_FOR, existing.unwrap_or(ip))?;
        } else if !self.trusted {
            upstream.remove_header(&X_FORWARDED_FOR);
        }
        if let Some(host) = &ctx.public_host {
            upstream.insert_header(X_FORWARDED_HOST, host.clone())?;
        }
        upstream.insert_header(X_FORWARDED_PROTO, self.scheme.as_str())?;
        if let Some(id) = &ctx.request_id {
            upstream.insert_header(self.shared.config.request_id_header.clone(), id.clone())?;
        }
        if let Some(authorization) = &ctx.authorization {
            // The client's own (a kubeconfig's `fake-token`) never leaves.
            upstream.insert_header(header::AUTHORIZATION, authorization.clone())?;
        }
        // A rule's filters have the last word over the proxy's own headers.
        if let Some(rule) = &ctx.rule {
            for filter in &rule.filters {
                match filter {
                    Filter::RequestHeaderModifier(m) => {
                        gateway::edit_headers(m, upstream, &self.shared.config.request_id_header)
                    }
                    Filter::UrlRewrite(_) => rewrite_upstream(upstream, ctx)?,
                    Filter::ResponseHeaderModifier(_) | Filter::RequestRedirect(_) => {}
                }
            }
        }
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        _ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        let upgrade = upstream_response.status == http::StatusCode::SWITCHING_PROTOCOLS;
        for name in strip_hop_by_hop(&upstream_response.headers, upgrade) {
            // Pingora frames the downstream response itself; TE/Trailer
            // have no meaning in responses beyond this hop either.
            upstream_response.remove_header(&name);
        }
        if upgrade {
            upstream_response.insert_header(header::CONNECTION, "upgrade")?;
        }
        if upstream_response
            .headers
            .contains_key(header::TRANSFER_ENCODING)
        {
            // The coding frames the body (RFC 9112 §6.3); a length beside it
            // must not reach the client, who might believe it instead.
            upstream_response.remove_header(&header::CONTENT_LENGTH);
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        if let Some(id) = &ctx.request_id {
            upstream_response
                .insert_header(self.shared.config.request_id_header.clone(), id.clone())?;
        }
        if let Some(rule) = &ctx.rule {
            for filter in &rule.filters {
                if let Filter::ResponseHeaderModifier(m) = filter {
                    gateway::edit_headers(
                        m,
                        upstream_response,
                        &self.shared.config.request_id_header,
                    );
                }
            }
        }
        Ok(())
    }

    fn fail_to_connect(
        &self,
        session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        self.shared.metrics.upstream_error(error_cause(&e));
        // Nothing of the request was sent: retrying is safe for idempotent
        // methods, on the next address.
        let attempts = self
            .shared
            .config
            .max_connect_attempts
            .min(ctx.backend.as_ref().map_or(1, |b| b.addr_count().max(2)));
        let retry = session.req_header().method.is_idempotent() && ctx.attempt < attempts;
        e.set_retry(retry);
        e
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        _ctx: &mut RequestCtx,
        client_reused: bool,
    ) -> Box<Error> {
        self.shared.metrics.upstream_error(error_cause(&e));
        let mut e = e.more_context(format!("peer: {peer}"));
        // Only a pooled connection that the upstream had already closed is
        // retried (Pingora marks those `ReusedOnly`): the upstream never
        // processed the request. Anything else may have had effects.
        if !session.req_header().method.is_idempotent() || session.as_ref().retry_buffer_truncated()
        {
            e.set_retry(false);
        } else if matches!(e.retry, RetryType::ReusedOnly) {
            e.retry.decide_reuse(client_reused);
        } else {
            e.set_retry(false);
        }
        e
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        _ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let code = status_for(e);
        if code > 0 {
            let body = Bytes::from_static(error_page(code).as_bytes());
            if let Err(err) = session.respond_error_with_body(code, body).await {
                tracing::debug!("cannot send error response: {err}");
            }
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &RequestCtx, e: &Error) -> bool {
        matches!(e.esource(), ErrorSource::Upstream | ErrorSource::Downstream)
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        let status = ctx
            .answered_locally
            .or_else(|| session.response_written().map(|r| r.status.as_u16()))
            .unwrap_or_else(|| e.map_or(0, status_for));
        let metrics = &self.shared.metrics;
        let stats: &HostStats = ctx.backend.as_ref().map_or(&metrics.unrouted, |b| &b.stats);
        if status > 0 {
            stats.record(status);
        }
        let elapsed = ctx.start.elapsed();
        metrics.observe_latency(elapsed);
        tracing::debug!(
            parent: &ctx.span,
            status,
            micros = elapsed.as_micros() as u64,
            error = e.map(|e| e.to_string()),
            "request done"
        );
    }
}
