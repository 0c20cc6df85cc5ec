//! The proxy core: a Pingora-based reverse proxy that Ingress routes,
//! Tunnels and TCPEndpoints all register into.
//!
//! # Two HTTP paths, one policy
//!
//! Every HTTP connection starts on a small HTTP/1.1 fast path (`h1`):
//! plain requests to HTTP/1.1 backends — by far the common case — are
//! parsed once with the HTTP/1 codec the edge shares (`tuna-http1`) and
//! relayed with their framing tracked but their bodies never decoded, over
//! its own keep-alive upstream pool. What the codec refuses (ambiguous
//! framing, a bad or second `Host`, ...) is answered 400/431 here, whichever
//! path would have served it. A request the fast path does not serve (h2c,
//! WebSocket/`Upgrade`, `Expect`, chunked uploads, HTTP/1.0, absolute-form
//! targets, h2c or TLS backends, Gateway API rules) hands the connection,
//! with the bytes
//! already read, to Pingora for the rest of its life. Both paths apply the
//! same header policy, limits, errors, retries and metrics
//! (`tuna_proxy_http_fast_path_requests_total` and
//! `tuna_proxy_http_pingora_handoffs_total` say which served what). Why:
//! Pingora 0.9's per-request HTTP/1 machinery cost 2.7× nginx's CPU per
//! keep-alive request in `benches/proxy.sh`; the fast path costs 0.9×.
//!
//! # Contract
//!
//! - **Embedding.** [`ProxyCore::new`] needs only a running tokio runtime
//!   (ours); Pingora's `Server`/`run_forever` is not used. Connections enter
//!   from a plain listener ([`ProxyCore::listen`]) or from any async stream
//!   ([`ProxyCore::serve_stream`], for connections that arrive through a
//!   tunnel: no loopback hop). Pingora gets its connections through
//!   `pingora::proxy::http_proxy` + `ServerApp::process_new`, the stream
//!   wrapped as a Pingora `VirtualSocket` whose digest reports the public
//!   client address.
//! - **Registration (the plugin seam).** [`ProxyCore::set_host_routes`],
//!   [`ProxyCore::remove_host`], [`ProxyCore::add_tcp_listener`],
//!   [`ProxyCore::remove_tcp_listener`], [`ProxyCore::set_tcp_service`],
//!   [`ProxyCore::remove_tcp_service`], [`ProxyCore::serve_tcp_stream`]. The
//!   core knows nothing about Kubernetes; callers pass resolved socket
//!   addresses (the proxy never does DNS).
//! - **Atomic snapshots.** A change compiles its host once (its backends and
//!   its path trie; the issues it returns come from that build), then the
//!   immutable route table is assembled from every host's compiled routes
//!   off the request path and swapped in with `ArcSwap`; requests read it
//!   without a lock. An assembly compiles nothing but visits every host, so
//!   concurrent async changes share one
//!   (`tuna_proxy_route_table_builds_total` counts them): one per change
//!   would make publishing N hosts quadratic. A request keeps the backend it was routed to even if
//!   the table changes before it connects; open connections are never
//!   disturbed by a swap.
//! - **HTTP behaviour.** Host (normalised as in `tuna-routing`) + path
//!   routing with Ingress semantics (and Gateway API rules, below); unknown
//!   host or path → 404 page naming
//!   the host; on a tunnel stream, a host other than [`ConnInfo::host`] →
//!   421; upstream refused/unreachable → 502; upstream timeout → 504;
//!   only connect failures of idempotent requests are retried (on the next
//!   address), plus Pingora's retry of a dead pooled connection. The public
//!   `Host` reaches the backend unchanged; `X-Forwarded-Host`,
//!   `X-Forwarded-Proto` (from [`ConnInfo::scheme`]) and `X-Forwarded-For`
//!   (appended for trusted connections, replaced otherwise) are set, and
//!   `Forwarded`/`X-Real-IP` are kept only from trusted connections;
//!   hop-by-hop headers are stripped; a request id header is added (a
//!   trusted hop's is kept) and carried by a tracing span per request.
//!   WebSocket/Upgrade, streamed bodies of any size, HTTP/1.1 and h2c from
//!   clients, upstream HTTP/1.1, h2c ([`UpstreamProtocol::H2c`], for gRPC)
//!   and HTTPS.
//! - **Gateway API rules** ([`HttpBackend::gateway`], a [`GatewayRule`]):
//!   see the section below.
//! - **Limits.** Request headers: size and field count → 431; the first
//!   request of a connection must arrive whole within the header timeout,
//!   later ones within the keep-alive idle time for their first byte and
//!   the header timeout from there → 408 ([`DownstreamLimits`]).
//! - **TCP.** Listeners and tunnel-fed services splice bytes both ways with
//!   half-close, under a per-endpoint connection limit; an upstream that
//!   refuses at once is tried again for a moment ([`TcpLimits`]'s
//!   `connect_retry`, 3 s) before the client's connection is closed.
//! - **CONNECT listeners** ([`ProxyCore::add_connect_listener`], module
//!   [`connect`]): a forward proxy for `CONNECT host:port` whose callers a
//!   [`ConnectAuthorizer`] (implemented outside the core) admits; the TLS
//!   inside is intercepted with certificates of the listener's
//!   [`InterceptCa`], and each request then takes the HTTP path above,
//!   pinned to the grant's upstream with the grant's `Authorization`.
//! - **Shutdown.** [`ProxyCore::shutdown`] stops accepting, lets open
//!   connections finish for [`ProxyConfig::shutdown_grace`] (25 s by
//!   default), then cuts the rest.
//! - **Observability.** [`ProxyCore::serve_admin`]: `/healthz`, `/readyz`,
//!   `/metrics` (Prometheus text).
//!
//! # Gateway API rules
//!
//! A route whose backend is [`HttpBackend::gateway`] is an `HTTPRoute`
//! rule (Gateway API v1.6.1); its own `addrs` are not used and may be
//! empty. Per request, in this order:
//!
//! - **`RequestRedirect`** answers at once with the filter's status (302 by
//!   default) and a `Location` built from the request: the filter's scheme,
//!   host and path where it sets them (`ReplaceFullPath`, or
//!   `ReplacePrefixMatch` of the route's `PathPrefix`), else the request's,
//!   the query kept. Its port is the filter's; else, when the filter sets a
//!   scheme, that scheme's well-known port; else the port the client
//!   connected to (its `Host`'s, or its scheme's well-known one, standing in
//!   for the Gateway listener's). A port that is the well-known one of the
//!   `Location`'s scheme is left out. No backend is involved.
//! - **Backend choice**: smooth weighted round-robin over
//!   [`GatewayRule::backends`] (weights 1:3 give `B A B B`, so any 4·n
//!   requests split exactly n : 3n; weight 0 is never chosen; weights whose
//!   reduced sum exceeds 1024 are scaled to it), one atomic increment per
//!   request. A rule with no backend of positive weight, or a draw of one
//!   without addresses (a backend that did not resolve), is answered
//!   **500** with the short error page, as the specification asks. Within a
//!   backend, addresses are used round-robin and connect failures retried
//!   as for any route.
//! - **`URLRewrite`** changes the forwarded path (`ReplaceFullPath`, or
//!   `ReplacePrefixMatch`: the route's `PathPrefix` is replaced element-wise,
//!   `/foo` → `/bar` makes `/foo/baz` `/bar/baz` and `/foo` `/bar`, → `/`
//!   makes `/foo/baz` `/baz`; the query is kept) and `Host`.
//!   `X-Forwarded-Host` still names the public host.
//! - **`RequestHeaderModifier`** on the forwarded request and
//!   **`ResponseHeaderModifier`** on the response to the client: `set`
//!   replaces every value, `add` appends one, `remove` drops them all, names
//!   case-insensitive. They run after the proxy's own header policy, in the
//!   rule's order, so a rule may override `X-Forwarded-*` or the request id.
//! - **Timeouts**: `backend_request` bounds each attempt's reads from the
//!   backend; `request`, counted from the request's start, bounds what is
//!   left of the exchange at each attempt (connect, reads and writes), so a
//!   backend that has not answered when it elapses gives **504**. It is
//!   enforced per read, not as one deadline: a backend trickling its head
//!   byte by byte can outlast it, and a response whose head came in time
//!   is streamed on under the same per-read bound.
//!
//! The fast path serves no Gateway rule (it hands their connections to
//! Pingora), so filters, weights and timeouts apply to every request.
//!
//! ```
//! use std::time::Duration;
//! use tuna_proxy::{GatewayRule, HttpBackend, UpstreamProtocol, WeightedTarget};
//! use tuna_routing::action::{Filter, HeaderModifier, Timeouts};
//!
//! let canary = |addr: &str, weight| WeightedTarget {
//!     addrs: vec![addr.parse().unwrap()],
//!     protocol: UpstreamProtocol::Http1,
//!     weight,
//! };
//! let backend = HttpBackend::gateway(GatewayRule {
//!     backends: vec![canary("10.0.0.7:8080", 9), canary("10.0.0.8:8080", 1)],
//!     filters: vec![Filter::RequestHeaderModifier(HeaderModifier {
//!         set: vec![("x-canary".into(), "maybe".into())],
//!         ..Default::default()
//!     })],
//!     timeouts: Timeouts { request: Some(Duration::from_secs(10)), backend_request: None },
//! });
//! assert!(backend.addrs.is_empty());
//! ```
//!
//! # Pingora hooks used
//!
//! `request_filter` (limits for keep-alive requests, request id and span,
//! route lookup, the 404 page; for a Gateway rule its redirect, backend
//! choice by weight and 500), `upstream_peer` (round-robin over the
//! backend pinned at lookup; retries move to the next address; a rule's
//! timeouts), `upstream_request_filter` (hop-by-hop, `X-Forwarded-*`,
//! request id, a rule's rewrite and request header edits),
//! `upstream_response_filter`/`response_filter` (hop-by-hop, request id,
//! a rule's response header edits),
//! `fail_to_connect`/`error_while_proxy` (retry policy, error counters),
//! `fail_to_proxy` (502/504 pages), `logging` (metrics), and
//! `suppress_error_log`. Request heads are read and checked by the fast
//! path before Pingora sees them (Pingora's own limits are fixed and its
//! header timer restarts on every read).
//!
//! # Entry points
//!
//! [`ProxyCore::listen`] / [`ProxyCore::listen_on`] (a pre-bound listener,
//! e.g. one `SO_REUSEPORT` socket per current-thread runtime),
//! [`ProxyCore::serve_stream`] for tunnel streams, and
//! [`ProxyCore::serve_admin`]. Binaries should install a modern global
//! allocator (mimalloc or jemalloc): with glibc's, chunk consolidation on
//! Pingora's per-request buffers costs ~15 % of the proxy's CPU.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo() -> Result<(), tuna_proxy::Error> {
//! use tuna_proxy::*;
//! let core = ProxyCore::new(ProxyConfig::default());
//! let issues = core.set_host_routes("shop.example.com", vec![HttpRoute {
//!     host: "shop.example.com".into(),
//!     path: "/".into(),
//!     path_type: PathType::Prefix,
//!     backend: HttpBackend::http1(["10.0.0.7:8080".parse().unwrap()]),
//!     origin: Origin::default(),
//!     tie_break: TieBreak::default(),
//!     matcher: tuna_routing::Matcher::Ingress,
//! }])?;
//! assert!(issues.is_empty());
//! let addr = core.listen("127.0.0.1:0".parse().unwrap()).await?;
//! # let _ = addr; Ok(()) }
//! ```

mod accept;
mod admin;
mod client;
mod config;
mod conn;
pub mod connect;
mod error;
mod gateway;
mod h1;
mod http;
mod inner;
mod listener_tls;
mod metrics;
mod pages;
mod pool;
mod routes;
mod shared;
mod tcp;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use pingora::apps::{HttpServerOptions, ServerApp};
use pingora::server::configuration::ServerConf;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use client::{ConnInfo, Scheme};
pub use config::{DownstreamLimits, ProxyConfig, UpstreamTimeouts};
pub use connect::{
    Authority, CaPem, ConnectAuthorizer, ConnectConfig, ConnectGrant, ConnectLimits,
    ConnectRefusal, ConnectRequest, Credential, InterceptCa, MIN_RECHECK, ProxyCredentials,
    UpstreamTarget,
};
pub use error::{Error, Result};
pub use gateway::{DEFAULT_REQUEST_ID_HEADER, protected_header};
pub use listener_tls::ServerCertificate;
pub use routes::{
    GatewayRule, HttpBackend, HttpRoute, ListenerRoutes, TlsUpstream, UpstreamProtocol,
    WeightedTarget,
};
pub use tcp::{TcpLimits, TcpTarget, TcpUpstream};
pub use tuna_routing::{BuildIssue, Origin, PathType, TieBreak};

use crate::http::Router;
use crate::inner::{Inner, TcpListenerHandle};
use crate::routes::Registry;
use crate::shared::Shared;
use crate::tcp::TcpEndpoint;

/// A cheap, cloneable handle to one proxy core. All clones share the same
/// configuration, pools and counters.
#[derive(Clone)]
pub struct ProxyCore {
    inner: Arc<Inner>,
}

impl ProxyCore {
    /// Creates a proxy core with an empty route table. Must be called inside
    /// a tokio runtime only when listeners are started; creation itself does
    /// no I/O.
    pub fn new(config: ProxyConfig) -> Self {
        let shared = Arc::new(Shared::new(config));
        let config = &shared.config;
        let mut conf = ServerConf {
            max_retries: config.max_connect_attempts.max(1),
            upstream_keepalive_pool_size: config.upstream_pool_size,
            ..ServerConf::default()
        };
        conf.threads = 1;
        let conf = Arc::new(conf);
        let make = |scheme, trusted| {
            let mut app = pingora::proxy::http_proxy(
                &conf,
                Router {
                    shared: shared.clone(),
                    scheme,
                    trusted,
                },
            );
            let mut options = HttpServerOptions::default();
            options.h2c = true;
            app.server_options = Some(options);
            let mut h2 = pingora::protocols::http::v2::server::H2Options::new();
            h2.max_header_list_size(config.limits.max_header_bytes as u32);
            app.h2_options = Some(h2);
            Arc::new(app)
        };
        let apps = [
            make(Scheme::Http, false),
            make(Scheme::Http, true),
            make(Scheme::Https, false),
            make(Scheme::Https, true),
        ];
        let (shutdown_tx, _) = watch::channel(false);
        Self {
            inner: Arc::new(Inner {
                shared,
                apps,
                registry: Mutex::new(Registry::default()),
                tcp_listeners: Mutex::new(HashMap::new()),
                connect_listeners: Mutex::new(HashMap::new()),
                tcp_services: ArcSwap::from_pointee(HashMap::new()),
                tcp_services_write: Mutex::new(()),
                shutdown_tx,
                stopping: CancellationToken::new(),
                cut: CancellationToken::new(),
                admin_stop: CancellationToken::new(),
                tracker: TaskTracker::new(),
                ready: AtomicBool::new(true),
            }),
        }
    }

    /// The configuration this core was created with.
    pub fn config(&self) -> &ProxyConfig {
        &self.inner.shared.config
    }

    // ----- HTTP routes --------------------------------------------------

    /// Sets (or replaces) every route of `host` and swaps the new table in.
    /// Each route names `host` (compared in canonical form), else nothing
    /// changes and this fails. Returns the rules of this host that are not
    /// routed (invalid path, conflict lost) — the others are live when this
    /// returns. An empty `routes` removes the host.
    ///
    /// Only this host compiles, and the new table shares every other host
    /// with the live one: a change costs O(log n) in the number of hosts,
    /// so thousands of callers at once (a reconciler with 10 000 Tunnels)
    /// stay linear in total.
    pub fn set_host_routes(&self, host: &str, routes: Vec<HttpRoute>) -> Result<Vec<BuildIssue>> {
        if routes.is_empty() {
            self.remove_host(host)?;
            return Ok(Vec::new());
        }
        let mut registry = lock(&self.inner.registry);
        let issues = registry.set_host(host, routes, &self.inner.shared.config)?;
        self.publish(&registry);
        Ok(issues)
    }

    /// Makes the registry's table live. Called with the registry locked, so
    /// that a snapshot never replaces a newer one.
    fn publish(&self, registry: &Registry) {
        self.inner
            .shared
            .metrics
            .route_table_builds
            .fetch_add(1, Ordering::Relaxed);
        self.inner
            .shared
            .snapshot
            .store(Arc::new(registry.snapshot()));
    }

    /// Removes every route of `host`; its requests get 404 from now on.
    /// Returns whether the host had routes.
    pub fn remove_host(&self, host: &str) -> Result<bool> {
        let mut registry = lock(&self.inner.registry);
        let removed = registry.remove_host(host)?;
        if removed {
            self.publish(&registry);
        }
        Ok(removed)
    }

    /// Sets (or replaces) the HTTP listeners of one port of a Gateway's
    /// own address and swaps the new table in: requests of streams served
    /// by [`Self::serve_port_stream`] for `at` are routed by these
    /// listeners alone, whatever their `Host` (see
    /// [`tuna_routing::PortTable`]). Returns the rules that are not routed
    /// (invalid path, conflict lost). An empty `listeners` removes the port.
    pub fn set_port_routes(
        &self,
        at: SocketAddr,
        listeners: Vec<ListenerRoutes>,
    ) -> Result<Vec<BuildIssue>> {
        let mut registry = lock(&self.inner.registry);
        let issues = registry.set_port(at, listeners, &self.inner.shared.config)?;
        self.publish(&registry);
        Ok(issues)
    }

    /// Removes the HTTP listeners of a port of a Gateway's address; its
    /// requests get 404 from now on. Returns whether it had any.
    pub fn remove_port_routes(&self, at: SocketAddr) -> bool {
        let mut registry = lock(&self.inner.registry);
        let removed = registry.remove_port(at);
        if removed {
            self.publish(&registry);
        }
        removed
    }

    /// Whether `at` (a port of a Gateway's address) has HTTP listeners.
    pub fn has_port_routes(&self, at: SocketAddr) -> bool {
        self.inner.shared.snapshot.load().ports.contains_key(&at)
    }

    /// The hosts that currently have routes (canonical form).
    pub fn hosts(&self) -> Vec<String> {
        let snapshot = self.inner.shared.snapshot.load();
        snapshot.hosts.iter().map(|(h, _)| h.to_string()).collect()
    }

    // ----- HTTP entry points ---------------------------------------------

    /// Binds a plain-HTTP listener (HTTP/1.1 and h2c) and serves it until
    /// shutdown. Returns the bound address (use port 0 in tests).
    /// Connections from [`ProxyConfig::trusted_peers`] count as trusted.
    pub async fn listen(&self, addr: SocketAddr) -> Result<SocketAddr> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        self.listen_on(listener)
    }

    /// Serves an already bound listener, like [`Self::listen`]. Its accept
    /// loop and connections run on the runtime this is called from, so a
    /// process can run one current-thread runtime per core, each with its
    /// own `SO_REUSEPORT` listener (as nginx runs one worker per core).
    pub fn listen_on(&self, listener: TcpListener) -> Result<SocketAddr> {
        if *self.inner.shutdown_tx.borrow() {
            return Err(Error::ShuttingDown);
        }
        let bound = listener.local_addr()?;
        let inner = self.inner.clone();
        self.inner
            .tracker
            .spawn(accept_http(listener, bound, inner));
        Ok(bound)
    }

    /// Serves one connection that arrived by other means (a tunnel stream)
    /// until it closes: the stream goes straight into Pingora. Spawn it;
    /// it returns when the connection is done or cut at shutdown.
    pub async fn serve_stream<S>(&self, stream: S, info: ConnInfo)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let host: Option<Arc<str>> = info.host.as_deref().map(Into::into);
        let scope = host.clone().map(|host| http::StreamScope {
            host: Some(host),
            port: None,
            tls_name: None,
            pinned: None,
        });
        self.track(self.serve_scoped(stream, info, host, false, scope))
            .await
    }

    /// Serves one connection to port `at` of a Gateway's own address (a
    /// tunnel stream) until it closes: its requests are routed by the
    /// port's listeners ([`Self::set_port_routes`]) whatever their `Host`,
    /// and never by the hosts of [`Self::set_host_routes`]. When the port's
    /// listeners are HTTPS, the stream is the client's TLS: it is
    /// terminated here with the certificate of the listener its SNI
    /// selects, and its requests are `https`. `info.host` is ignored.
    /// Spawn it.
    pub async fn serve_port_stream<S>(&self, stream: S, mut info: ConnInfo, at: SocketAddr)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        info.local_addr = Some(at);
        // The fast path does not know the port's table: with `pinned`, it
        // checks each request head and hands the connection to Pingora.
        let mut scope = http::StreamScope {
            host: None,
            port: Some(at),
            tls_name: None,
            pinned: None,
        };
        let tls = self
            .inner
            .shared
            .snapshot
            .load()
            .ports
            .get(&at)
            .and_then(|p| p.tls.clone());
        let Some(tls) = tls else {
            return self
                .track(self.serve_scoped(stream, info, None, true, Some(scope)))
                .await;
        };
        let this = self.clone();
        self.track(async move {
            let handshake = tokio_rustls::TlsAcceptor::from(tls).accept(stream);
            match tokio::time::timeout(listener_tls::HANDSHAKE_TIMEOUT, handshake).await {
                Ok(Ok(stream)) => {
                    info.scheme = Scheme::Https;
                    let sni = stream.get_ref().1.server_name().unwrap_or("");
                    scope.tls_name = Some(sni.into());
                    this.serve_scoped(stream, info, None, true, Some(scope))
                        .await;
                }
                Ok(Err(e)) => {
                    this.count_handshake_failure();
                    tracing::debug!(%at, error = %e, "TLS handshake failed");
                }
                Err(_) => {
                    this.count_handshake_failure();
                    tracing::debug!(%at, "TLS handshake timed out");
                }
            }
        })
        .await
    }

    fn count_handshake_failure(&self) {
        self.inner
            .shared
            .metrics
            .tls_handshake_failures
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// One tunnel stream into the fast path, then Pingora, scoped to a
    /// host (a stream opened for it) or a port (a Gateway's address).
    async fn serve_scoped<S>(
        &self,
        stream: S,
        info: ConnInfo,
        host: Option<Arc<str>>,
        pinned: bool,
        scope: Option<http::StreamScope>,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        if *self.inner.shutdown_tx.borrow() {
            return;
        }
        let app = self.inner.app(info.scheme, info.trusted);
        let ConnInfo {
            client_addr: client,
            local_addr: local,
            scheme,
            trusted,
            ..
        } = info;
        conn::serve_connection(
            stream,
            client.ip(),
            scheme,
            trusted,
            host,
            pinned,
            false,
            move |s| conn::tunnel_stream(s, client, local, scope),
            app,
            self.inner.shared.clone(),
            self.inner.shutdown_tx.subscribe(),
            self.inner.stopping.clone(),
        )
        .await
    }

    /// Runs a connection's future as one of the core's: shutdown waits for
    /// it, and cuts it when the grace period is over.
    async fn track(&self, fut: impl std::future::Future<Output = ()>) {
        let cut = self.inner.cut.clone();
        self.inner
            .tracker
            .track_future(async move {
                tokio::select! {
                    _ = fut => {}
                    _ = cut.cancelled() => {}
                }
            })
            .await
    }

    // ----- TCP listeners -------------------------------------------------

    /// Binds a TCP listener that splices every connection to `upstream`.
    /// Returns the bound address. Takes effect immediately.
    pub async fn add_tcp_listener(
        &self,
        bind: SocketAddr,
        upstream: TcpUpstream,
        limits: TcpLimits,
    ) -> Result<SocketAddr> {
        if *self.inner.shutdown_tx.borrow() {
            return Err(Error::ShuttingDown);
        }
        if bind.port() != 0 && lock(&self.inner.tcp_listeners).contains_key(&bind) {
            return Err(Error::ListenerExists(bind));
        }
        let endpoint = Arc::new(TcpEndpoint::new(upstream, limits, &bind.to_string())?);
        let listener = TcpListener::bind(bind)
            .await
            .map_err(|source| Error::Bind { addr: bind, source })?;
        let bound = listener.local_addr()?;
        let stop = CancellationToken::new();
        let task = tokio::spawn(accept_tcp(
            listener,
            endpoint,
            self.inner.clone(),
            stop.clone(),
        ));
        let mut listeners = lock(&self.inner.tcp_listeners);
        if listeners.contains_key(&bound) {
            stop.cancel();
            return Err(Error::ListenerExists(bound));
        }
        listeners.insert(bound, TcpListenerHandle { stop, task });
        Ok(bound)
    }

    /// Closes the TCP listener bound at `bound` (the address returned by
    /// [`Self::add_tcp_listener`]). The port is free when this returns;
    /// connections already open are left to finish.
    pub async fn remove_tcp_listener(&self, bound: SocketAddr) -> Result<()> {
        let handle = lock(&self.inner.tcp_listeners)
            .remove(&bound)
            .ok_or(Error::NoSuchListener(bound))?;
        handle.stop.cancel();
        let _ = handle.task.await;
        Ok(())
    }

    /// Addresses of the TCP listeners currently open.
    pub fn tcp_listeners(&self) -> Vec<SocketAddr> {
        lock(&self.inner.tcp_listeners).keys().copied().collect()
    }

    // ----- TCP services fed by a tunnel --------------------------------

    /// Registers (or replaces) the upstream of the tunnel TCP endpoint
    /// `key`. Connections already open keep their upstream.
    pub fn set_tcp_service(
        &self,
        key: &str,
        upstream: TcpUpstream,
        limits: TcpLimits,
    ) -> Result<()> {
        let endpoint = Arc::new(TcpEndpoint::new(upstream, limits, key)?);
        let _w = lock(&self.inner.tcp_services_write);
        let mut map = HashMap::clone(&self.inner.tcp_services.load());
        map.insert(key.to_owned(), endpoint);
        self.inner.tcp_services.store(Arc::new(map));
        Ok(())
    }

    /// Unregisters a tunnel TCP endpoint; returns whether it existed. Open
    /// connections are left to finish.
    pub fn remove_tcp_service(&self, key: &str) -> bool {
        let _w = lock(&self.inner.tcp_services_write);
        let mut map = HashMap::clone(&self.inner.tcp_services.load());
        let existed = map.remove(key).is_some();
        self.inner.tcp_services.store(Arc::new(map));
        existed
    }

    /// Splices one tunnel stream to the upstream registered as `key`, until
    /// both directions are closed. Fails at once for an unknown key, a full
    /// connection limit or an unreachable upstream (the stream is dropped,
    /// i.e. closed).
    pub async fn serve_tcp_stream<S>(&self, key: &str, stream: S, info: ConnInfo) -> Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        if *self.inner.shutdown_tx.borrow() {
            return Err(Error::ShuttingDown);
        }
        let endpoint = self
            .inner
            .tcp_services
            .load()
            .get(key)
            .cloned()
            .ok_or_else(|| Error::NoSuchTcpService(key.to_owned()))?;
        let metrics = &self.inner.shared.metrics;
        let permit = endpoint.admit(metrics)?;
        tracing::debug!(key, client = %info.client_addr, "tcp stream");
        let cut = self.inner.cut.clone();
        self.inner
            .tracker
            .track_future(async {
                tokio::select! {
                    res = endpoint.splice(stream, metrics, permit) => res,
                    _ = cut.cancelled() => Err(Error::ShuttingDown),
                }
            })
            .await
    }

    // ----- CONNECT listeners (the connector family) ----------------------

    /// Binds a CONNECT listener (see [`connect`]) and serves it until it is
    /// removed or the core shuts down. Returns the bound address.
    pub async fn add_connect_listener(
        &self,
        bind: SocketAddr,
        config: ConnectConfig,
    ) -> Result<SocketAddr> {
        if *self.inner.shutdown_tx.borrow() {
            return Err(Error::ShuttingDown);
        }
        let listener = TcpListener::bind(bind)
            .await
            .map_err(|source| Error::Bind { addr: bind, source })?;
        let bound = listener.local_addr()?;
        let stop = CancellationToken::new();
        let task = tokio::spawn(connect::accept_connect(
            listener,
            Arc::new(config),
            self.inner.clone(),
            stop.clone(),
        ));
        let mut listeners = lock(&self.inner.connect_listeners);
        if listeners.contains_key(&bound) {
            stop.cancel();
            return Err(Error::ListenerExists(bound));
        }
        listeners.insert(bound, TcpListenerHandle { stop, task });
        Ok(bound)
    }

    /// Closes the CONNECT listener at `bound`; its open connections finish.
    pub async fn remove_connect_listener(&self, bound: SocketAddr) -> Result<()> {
        let handle = lock(&self.inner.connect_listeners)
            .remove(&bound)
            .ok_or(Error::NoSuchListener(bound))?;
        handle.stop.cancel();
        let _ = handle.task.await;
        Ok(())
    }

    // ----- admin and lifecycle -----------------------------------------

    /// Binds the admin listener (`/healthz`, `/readyz`, `/metrics`).
    /// It keeps answering while the proxy drains (`/readyz` says 503).
    pub async fn serve_admin(&self, addr: SocketAddr) -> Result<SocketAddr> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        let bound = listener.local_addr()?;
        tokio::spawn(admin::serve(
            listener,
            self.inner.clone(),
            self.inner.admin_stop.clone(),
        ));
        Ok(bound)
    }

    /// Sets what `/readyz` reports (true by default); e.g. false until the
    /// first configuration is loaded.
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Relaxed);
    }

    /// The Prometheus text that `/metrics` serves.
    pub fn render_metrics(&self) -> String {
        let snapshot = self.inner.shared.snapshot.load();
        // A port of a Gateway's address counts as the host `address/ip:port`.
        let mut hosts = snapshot.hosts.clone();
        for (at, port) in &snapshot.ports {
            hosts.insert(format!("address/{at}").into(), port.stats.clone());
        }
        self.inner.shared.metrics.render(&hosts)
    }

    /// Graceful shutdown: stop accepting, ask keep-alive and h2 clients to
    /// go (no keep-alive, GOAWAY), wait for open connections and streams
    /// for up to [`ProxyConfig::shutdown_grace`], then cut what is left.
    /// Returns whether everything finished within the grace period.
    pub async fn shutdown(&self) -> bool {
        let inner = &self.inner;
        let _ = inner.shutdown_tx.send(true);
        inner.stopping.cancel();
        for listener in lock(&inner.tcp_listeners).values() {
            listener.stop.cancel();
        }
        for listener in lock(&inner.connect_listeners).values() {
            listener.stop.cancel();
        }
        for app in &inner.apps {
            app.cleanup().await;
        }
        inner.tracker.close();
        let clean = tokio::time::timeout(inner.shared.config.shutdown_grace, inner.tracker.wait())
            .await
            .is_ok();
        if !clean {
            inner.cut.cancel();
            inner.tracker.wait().await;
        }
        inner.admin_stop.cancel();
        clean
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Registration calls never panic while holding these locks in a way
    // that leaves the data inconsistent (every write is a whole-value
    // replacement), so a poisoned lock's data is still good.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `bound` is the listener's address: when it names one IP, it is every
/// accepted connection's local address, and a `getsockname` per
/// connection is saved.
async fn accept_http(listener: TcpListener, bound: SocketAddr, inner: Arc<Inner>) {
    let fixed_local = (!bound.ip().is_unspecified()).then_some(bound);
    let stopped = inner.stopping.cancelled();
    accept::accept_until(listener, stopped, "accept failed", |tcp, peer| {
        let _ = tcp.set_nodelay(true);
        let trusted = inner.shared.config.trusted_peers.contains(&peer.ip());
        let local = match fixed_local {
            Some(local) => local,
            None => tcp.local_addr().unwrap_or(peer),
        };
        let serving = conn::serve_connection(
            tcp,
            peer.ip(),
            Scheme::Http,
            trusted,
            None,
            false,
            true,
            move |tcp| conn::tcp_stream(tcp, peer, local),
            inner.app(Scheme::Http, trusted),
            inner.shared.clone(),
            inner.shutdown_tx.subscribe(),
            inner.stopping.clone(),
        );
        accept::spawn_connection(&inner, serving);
    })
    .await;
}

async fn accept_tcp(
    listener: TcpListener,
    endpoint: Arc<TcpEndpoint>,
    inner: Arc<Inner>,
    stop: CancellationToken,
) {
    let stopped = stop.cancelled();
    accept::accept_until(listener, stopped, "tcp accept failed", |tcp, peer| {
        let Ok(permit) = endpoint.admit(&inner.shared.metrics) else {
            tracing::debug!(%peer, "tcp connection limit reached");
            drop(tcp);
            return;
        };
        let _ = tcp.set_nodelay(true);
        let endpoint = endpoint.clone();
        let shared = inner.shared.clone();
        accept::spawn_connection(&inner, async move {
            if let Err(e) = endpoint.splice(tcp, &shared.metrics, permit).await {
                tracing::debug!(%peer, "tcp connection ended: {e}");
            }
        });
    })
    .await;
}
