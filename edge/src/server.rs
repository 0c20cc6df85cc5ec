//! The edge composition: agent acceptor, public HTTP/HTTPS listeners, TCP
//! endpoint listeners (opened on demand by the registry) and, optionally,
//! the control plane's REST API router.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tuna_protocol::wire::{ALPN, DEFAULT_HEARTBEAT, Scheme};

use crate::authority::SessionAuthority;
use crate::budget::{EdgeLimits, PreAuthBudget, PreAuthSlot};
use crate::error::{Error, Result};
#[cfg(feature = "postgres")]
use crate::fleet::FleetConfig;
use crate::public::{self, ConnectionLimiter, IpCidr, PublicLimits, PublicPolicy};
use crate::registry::Registry;
use crate::session::{Admission, AgentContext, serve_agent};
use crate::tasks::{TaskGuard, TaskSet, task_set};
use crate::{hyper_path, relay};

/// Where the edge listens and with which TLS material.
///
/// TLS configurations are taken as built `rustls::ServerConfig`s (e.g. from
/// `crate::tls`); the edge sets their ALPN itself.
#[derive(Clone)]
pub struct EdgeConfig {
    /// Agent listener (TLS, ALPN `tuna-tunnel/1`).
    pub agent_addr: SocketAddr,
    /// TLS of the agent listener.
    pub agent_tls: Arc<rustls::ServerConfig>,
    /// Public plain-HTTP listener.
    pub http_addr: Option<SocketAddr>,
    /// Public HTTPS listener (HTTP/1.1 and h2 via ALPN); needs `public_tls`.
    pub https_addr: Option<SocketAddr>,
    /// Certificate for public HTTPS (e.g. a wildcard for the base domain).
    pub public_tls: Option<Arc<rustls::ServerConfig>>,
    /// REST API listener; served only when a router is given to `start`.
    pub api_addr: Option<SocketAddr>,
    /// TLS of the API listener; `None` means plain text, allowed only on loopback.
    pub api_tls: Option<Arc<rustls::ServerConfig>>,
    /// Address TCP endpoint listeners bind to.
    pub tcp_bind_ip: IpAddr,
    /// Ports TCP endpoints may use.
    pub tcp_ports: RangeInclusive<u16>,
    /// Listeners of TCP endpoint ports opened by the caller (socket
    /// activation, tests that bind port 0): served whenever a tunnel binds
    /// their port, never bound or closed by the edge.
    pub tcp_listeners: Vec<Arc<std::net::TcpListener>>,
    /// Heartbeat interval announced to agents.
    pub heartbeat: Duration,
    /// Bounds on agent connections, sessions, tunnels and API connections.
    pub limits: EdgeLimits,
    /// Peers that speak for earlier hops (a load balancer in front of the
    /// edge). On every listener (agent, API, public, TCP endpoints) a
    /// connection of theirs that starts with a PROXY protocol v2 header is
    /// counted, budgeted and logged as the client the header names. On the
    /// public listeners, their `X-Forwarded-For`, `Forwarded`, `X-Real-IP`
    /// and request id are kept, and they are exempt from the per-client
    /// connection limit. Empty by default: every public client's claims are
    /// removed, and no header is read.
    pub trusted_proxies: Vec<IpCidr>,
    /// Connection caps and timeouts of the public listeners.
    pub public_limits: PublicLimits,
    /// Makes the edge a replica of a fleet that serves any tunnel attached
    /// to any replica ([`crate::fleet`]); `None`: a single edge. Only with
    /// the `postgres` feature: a fleet shares its state in PostgreSQL.
    #[cfg(feature = "postgres")]
    pub fleet: Option<FleetConfig>,
}

impl EdgeConfig {
    /// A config with only the agent listener; add public listeners as needed.
    pub fn new(agent_addr: SocketAddr, agent_tls: Arc<rustls::ServerConfig>) -> Self {
        Self {
            agent_addr,
            agent_tls,
            http_addr: None,
            https_addr: None,
            public_tls: None,
            api_addr: None,
            api_tls: None,
            tcp_bind_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            tcp_ports: 20000..=29999,
            tcp_listeners: Vec::new(),
            heartbeat: DEFAULT_HEARTBEAT,
            limits: EdgeLimits::default(),
            trusted_proxies: Vec::new(),
            public_limits: PublicLimits::default(),
            #[cfg(feature = "postgres")]
            fleet: None,
        }
    }
}

/// A running edge. Dropping it stops every listener and session (without
/// waiting); [`EdgeHandle::shutdown`] also waits until sockets are closed.
pub struct EdgeHandle {
    /// Bound agent listener address.
    pub agent_addr: SocketAddr,
    /// Bound public HTTP address.
    pub http_addr: Option<SocketAddr>,
    /// Bound public HTTPS address.
    pub https_addr: Option<SocketAddr>,
    /// Bound REST API address.
    pub api_addr: Option<SocketAddr>,
    /// Bound peer listener of a fleet replica.
    pub peer_addr: Option<SocketAddr>,
    sessions: tokio::sync::watch::Receiver<usize>,
    tasks: Option<TaskSet>,
}

impl EdgeHandle {
    /// A watch of the number of open agent sessions.
    pub fn sessions(&self) -> tokio::sync::watch::Receiver<usize> {
        self.sessions.clone()
    }

    /// Stops the edge: sessions get `GoAway(shutting_down)`, listeners close;
    /// returns when every task has ended (ports are free again).
    pub async fn shutdown(mut self) {
        if let Some(tasks) = self.tasks.take() {
            tasks.shutdown().await;
        }
    }
}

impl Drop for EdgeHandle {
    fn drop(&mut self) {
        if let Some(tasks) = &self.tasks {
            tasks.cancel.cancel();
        }
    }
}

/// Entry point of the edge.
pub struct EdgeServer;

impl EdgeServer {
    /// Binds every configured listener, then serves in background tasks.
    /// Fails if a listener cannot be bound or the configuration is unsafe
    /// (plain-text API on a non-loopback address, HTTPS without a certificate).
    pub async fn start(
        config: EdgeConfig,
        authority: Arc<dyn SessionAuthority>,
        api_router: Option<axum::Router>,
    ) -> Result<EdgeHandle> {
        if config.https_addr.is_some() && config.public_tls.is_none() {
            return Err(Error::Config(
                "a public HTTPS listener needs a certificate (public_tls)".into(),
            ));
        }
        if let (Some(addr), None, Some(_)) = (config.api_addr, &config.api_tls, &api_router)
            && !addr.ip().is_loopback()
        {
            return Err(Error::Config(format!(
                "refusing a plain-text API listener on {addr}: plain text is for loopback tests only; give TLS material"
            )));
        }
        let (guard, set) = task_set();
        let registry = Registry::new(
            config.tcp_bind_ip,
            config.tcp_ports.clone(),
            &config.tcp_listeners,
            crate::registry::TcpAdmission::new(&config.limits, &config.trusted_proxies),
            guard.clone(),
        )?;

        let limits = &config.limits;
        #[cfg(not(feature = "postgres"))]
        let peer_addr = None;
        #[cfg(feature = "postgres")]
        let peer_addr = match config.fleet.clone() {
            Some(fleet) => {
                let budget = PreAuthBudget::new(
                    limits.max_pending_peer_connections,
                    limits.max_pending_peer_connections_per_ip,
                );
                Some(
                    crate::fleet::start(fleet, Arc::clone(&registry), guard.clone(), budget)
                        .await?,
                )
            }
            None => None,
        };
        // Each public listener has its own budget: a flood of one cannot
        // refuse the other's clients.
        let public_budget = || {
            PreAuthBudget::new(
                limits.max_pending_public_connections,
                limits.max_pending_public_connections_per_ip,
            )
        };
        let agent_listener = bind(config.agent_addr, "agent").await?;
        let agent_addr = agent_listener.local_addr()?;
        let mut agent_tls = (*config.agent_tls).clone();
        agent_tls.alpn_protocols = vec![ALPN.to_vec()];
        let ctx = Arc::new(AgentContext {
            authority,
            registry: Arc::clone(&registry),
            tls: TlsAcceptor::from(Arc::new(agent_tls)),
            heartbeat: config.heartbeat,
            admission: Admission::new(config.limits.clone()),
            tasks: guard.clone(),
        });
        spawn_accept_loop(
            agent_listener,
            guard.clone(),
            &config.trusted_proxies,
            move |tcp, peer| {
                tokio::spawn(serve_agent(tcp, peer, Arc::clone(&ctx)));
            },
        );

        let policy = Arc::new(PublicPolicy {
            limits: config.public_limits,
            trusted_proxies: config.trusted_proxies.clone(),
        });
        let http_addr = match config.http_addr {
            Some(addr) => {
                let listener = bind(addr, "public HTTP").await?;
                let local = listener.local_addr()?;
                let registry = Arc::clone(&registry);
                let g = guard.clone();
                let policy = Arc::clone(&policy);
                let limiter = ConnectionLimiter::new(Arc::clone(&policy));
                let budget = public_budget();
                spawn_accept_loop(
                    listener,
                    guard.clone(),
                    &config.trusted_proxies,
                    move |tcp, peer| {
                        let Some((pre_auth, admitted)) =
                            admit_public(&budget, &limiter, peer, "public HTTP")
                        else {
                            return;
                        };
                        let _ = tcp.set_nodelay(true);
                        let registry = Arc::clone(&registry);
                        let policy = Arc::clone(&policy);
                        let g = g.clone();
                        tokio::spawn(async move {
                            let _g = g.clone();
                            let _admitted = admitted;
                            serve_public(
                                tcp,
                                peer,
                                Scheme::Http,
                                false,
                                registry,
                                policy,
                                g.cancel.clone(),
                                pre_auth,
                            )
                            .await;
                        });
                    },
                );
                Some(local)
            }
            None => None,
        };

        let https_addr = match (config.https_addr, &config.public_tls) {
            (Some(addr), Some(tls)) => {
                let listener = bind(addr, "public HTTPS").await?;
                let local = listener.local_addr()?;
                let mut tls = (**tls).clone();
                tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
                let acceptor = TlsAcceptor::from(Arc::new(tls));
                let registry = Arc::clone(&registry);
                let g = guard.clone();
                let policy = Arc::clone(&policy);
                let limiter = ConnectionLimiter::new(Arc::clone(&policy));
                let budget = public_budget();
                spawn_accept_loop(
                    listener,
                    guard.clone(),
                    &config.trusted_proxies,
                    move |tcp, peer| {
                        let Some((pre_auth, admitted)) =
                            admit_public(&budget, &limiter, peer, "public HTTPS")
                        else {
                            return;
                        };
                        let _ = tcp.set_nodelay(true);
                        let registry = Arc::clone(&registry);
                        let policy = Arc::clone(&policy);
                        let acceptor = acceptor.clone();
                        let g = g.clone();
                        tokio::spawn(async move {
                            let _g = g.clone();
                            let _admitted = admitted;
                            let handshake = tokio::time::timeout(
                                tuna_protocol::wire::HANDSHAKE_TIMEOUT,
                                acceptor.accept(tcp),
                            );
                            let tls = tokio::select! {
                                _ = g.cancel.cancelled() => return,
                                r = handshake => match r {
                                    Ok(Ok(tls)) => tls,
                                    _ => return,
                                },
                            };
                            let alpn_h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                            serve_public(
                                tls,
                                peer,
                                Scheme::Https,
                                alpn_h2,
                                registry,
                                policy,
                                g.cancel.clone(),
                                pre_auth,
                            )
                            .await;
                        });
                    },
                );
                Some(local)
            }
            _ => None,
        };

        let api_addr = match (config.api_addr, api_router) {
            (Some(addr), Some(router)) => {
                let listener = bind(addr, "REST API").await?;
                let local = listener.local_addr()?;
                let tls = config.api_tls.as_ref().map(|tls| {
                    let mut tls = (**tls).clone();
                    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
                    TlsAcceptor::from(Arc::new(tls))
                });
                let g = guard.clone();
                let header_timeout = config.limits.api_header_timeout;
                let budget = PreAuthBudget::new(
                    config.limits.max_pending_api_connections,
                    config.limits.max_pending_api_connections_per_ip,
                );
                spawn_accept_loop(
                    listener,
                    guard.clone(),
                    &config.trusted_proxies,
                    move |tcp, peer| {
                        let Some(pre_auth) = budget.try_acquire(peer.ip()) else {
                            tracing::debug!(%peer, "REST API: too many unauthenticated connections; closing");
                            return;
                        };
                        let router = router.clone();
                        let tls = tls.clone();
                        let g = g.clone();
                        tokio::spawn(async move {
                            let _g = g.clone();
                            serve_api(tcp, peer, router, tls, g, header_timeout, pre_auth).await;
                        });
                    },
                );
                Some(local)
            }
            _ => None,
        };
        drop(guard);
        let sessions = registry.sessions.subscribe();
        drop(registry);
        Ok(EdgeHandle {
            sessions,
            agent_addr,
            http_addr,
            https_addr,
            api_addr,
            peer_addr,
            tasks: Some(set),
        })
    }
}

async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| {
        Error::Config(format!(
            "cannot listen on {addr} for the {what} listener: {e}"
        ))
    })
}

/// A public listener's admission of a connection from `peer`: a slot of its
/// pre-authentication budget and a place under its connection caps, or
/// `None` (logged at debug) when either is full.
fn admit_public(
    budget: &PreAuthBudget,
    limiter: &Arc<ConnectionLimiter>,
    peer: SocketAddr,
    listener: &'static str,
) -> Option<(PreAuthSlot, public::Admitted)> {
    let Some(pre_auth) = budget.try_acquire(peer.ip()) else {
        tracing::debug!(%peer, listener, "too many connections without a request; closing");
        return None;
    };
    let Some(admitted) = limiter.admit(peer.ip()) else {
        tracing::debug!(%peer, listener, "connection limit reached");
        return None;
    };
    Some((pre_auth, admitted))
}

/// Accepts on `listener` until cancelled, handing each connection to
/// `on_accept` with its client's address: the peer's, or for a peer of
/// `trusted` the one its PROXY v2 header names ([`crate::proxy_header`]).
fn spawn_accept_loop<F>(
    listener: TcpListener,
    guard: TaskGuard,
    trusted: &[crate::public::IpCidr],
    on_accept: F,
) where
    F: Fn(tokio::net::TcpStream, SocketAddr) + Send + Sync + 'static,
{
    let trusted: Arc<[crate::public::IpCidr]> = Arc::from(trusted.to_vec());
    let on_accept = Arc::new(on_accept);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = guard.cancel.cancelled() => return,
                a = listener.accept() => a,
            };
            match accepted {
                Ok((mut tcp, peer)) if crate::proxy_header::is_trusted(&trusted, peer) => {
                    let on_accept = Arc::clone(&on_accept);
                    tokio::spawn(async move {
                        match crate::proxy_header::client_of(&mut tcp, peer).await {
                            Ok(client) => on_accept(tcp, client),
                            Err(e) => {
                                tracing::debug!(%peer, error = %e, "closing a trusted proxy's connection")
                            }
                        }
                    });
                }
                Ok((tcp, peer)) => on_accept(tcp, peer),
                Err(e) => {
                    // EMFILE and friends: back off a little instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
}

async fn serve_api(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    router: axum::Router,
    tls: Option<TlsAcceptor>,
    guard: TaskGuard,
    header_timeout: Duration,
    pre_auth: PreAuthSlot,
) {
    use crate::control::serve::{serve_connection_pre_auth, serve_tls_connection_pre_auth};
    let evicted = pre_auth.evicted();
    let pre_auth = Some(pre_auth);
    let serving = async move {
        match tls {
            Some(acceptor) => {
                serve_tls_connection_pre_auth(tcp, peer, acceptor, router, header_timeout, pre_auth)
                    .await
            }
            None => {
                serve_connection_pre_auth(tcp, false, peer, router, header_timeout, pre_auth).await
            }
        }
    };
    tokio::select! {
        _ = guard.cancel.cancelled() => {}
        _ = evicted.cancelled() => {
            tracing::debug!(%peer, "unauthenticated REST API connection gave way to a newcomer");
        }
        _ = serving => {}
    }
}

/// Serves one public connection (plain or TLS-terminated) until it closes
/// or the edge shuts down. HTTP/1.1 goes through the byte relay, which
/// hands anything it does not relay (upgrades, HTTP/1.0, absolute-form
/// targets, h2 with prior knowledge, ...) to the hyper path; a TLS
/// connection that negotiated h2 goes to the hyper path at once. `pre_auth`
/// is held until the first complete request head.
#[allow(clippy::too_many_arguments)]
async fn serve_public<IO>(
    io: IO,
    client_addr: SocketAddr,
    scheme: Scheme,
    alpn_h2: bool,
    registry: Arc<Registry>,
    policy: Arc<PublicPolicy>,
    cancel: CancellationToken,
    pre_auth: PreAuthSlot,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = public::Peer {
        client_addr,
        scheme,
        trusted: policy.is_trusted(client_addr.ip()),
        limits: policy.limits,
    };
    // Until the first request head, a full budget may take the slot back
    // for a newcomer; after it the slot is released and never evicted.
    let evicted = pre_auth.evicted();
    let serving = async move {
        if alpn_h2 {
            hyper_path::serve(io, peer, registry, cancel, Some(pre_auth)).await;
        } else {
            relay::serve(io, peer, registry, cancel, Some(pre_auth)).await;
        }
    };
    tokio::select! {
        () = serving => {}
        _ = evicted.cancelled() => {
            tracing::debug!(%client_addr, "public connection without a request gave way to a newcomer");
        }
    }
}
