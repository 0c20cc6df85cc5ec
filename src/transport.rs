//! The glue between the tunnel agent and the proxy core: public connections
//! arriving as tunnel streams go straight into the proxy (no loopback hop),
//! and the [`Transport`] the publisher attaches tunnels to.

use std::collections::HashMap;
use std::sync::Mutex;

use futures::future::BoxFuture;
use tokio::sync::watch;
use tuna_proxy::{ConnInfo, ProxyCore, Scheme};
use tuna_tunnel::agent::{Agent, AgentConfig, AgentHandle, AgentStatus};
use tuna_tunnel::mux::MuxStream;
use tuna_tunnel::wire::{Binding, StreamKind, StreamMeta, TunnelToken};

use crate::publisher::{Transport, TransportState};

fn to_proxy_scheme(s: tuna_tunnel::wire::Scheme) -> Scheme {
    match s {
        tuna_tunnel::wire::Scheme::Http => Scheme::Http,
        tuna_tunnel::wire::Scheme::Https => Scheme::Https,
    }
}

/// Hands one tunnel stream to the proxy core: HTTP streams to the router, TCP
/// streams to the TCP service registered under the endpoint's name.
pub fn serve_stream(proxy: &ProxyCore, stream: MuxStream, meta: StreamMeta) {
    let proxy = proxy.clone();
    tokio::spawn(async move {
        match meta.kind {
            StreamKind::Http { scheme, .. } => {
                let info = ConnInfo {
                    client_addr: meta.client_addr,
                    local_addr: None,
                    scheme: to_proxy_scheme(scheme),
                    trusted: true,
                };
                proxy.serve_stream(stream, info).await;
            }
            StreamKind::Tcp { endpoint, .. } => {
                let info = ConnInfo {
                    client_addr: meta.client_addr,
                    local_addr: None,
                    scheme: Scheme::Http,
                    trusted: true,
                };
                if let Err(e) = proxy.serve_tcp_stream(&endpoint, stream, info).await {
                    tracing::debug!(%endpoint, error = %e, "tcp stream ended");
                }
            }
        }
    });
}

/// A [`Transport`] of one agent session per tunnel (tunnel protocol v1).
pub struct SessionPerTunnel {
    template: AgentConfig,
    proxy: ProxyCore,
    agents: Mutex<HashMap<String, (AgentHandle, tokio::task::JoinHandle<()>)>>,
}

impl SessionPerTunnel {
    /// `template` gives the edge address, trust and agent name; its token and
    /// bindings are replaced per tunnel.
    pub fn new(template: AgentConfig, proxy: ProxyCore) -> Self {
        Self {
            template,
            proxy,
            agents: Mutex::new(HashMap::new()),
        }
    }
}

fn transport_state(status: &AgentStatus) -> TransportState {
    match status {
        AgentStatus::Connecting { .. } => TransportState::Pending,
        AgentStatus::Connected { session_id } => TransportState::Serving {
            session_id: session_id.clone(),
            bound: Vec::new(),
        },
        AgentStatus::Rejected(r) => TransportState::Refused(r.clone()),
        AgentStatus::Disconnected { reason } => TransportState::Disconnected {
            reason: reason.clone(),
        },
        AgentStatus::Stopped => TransportState::Disconnected {
            reason: "agent stopped".into(),
        },
    }
}

impl Transport for SessionPerTunnel {
    fn attach<'a>(
        &'a self,
        id: &'a str,
        token: TunnelToken,
        bindings: Vec<Binding>,
    ) -> BoxFuture<'a, Result<watch::Receiver<TransportState>, String>> {
        Box::pin(async move {
            let mut config = self.template.clone();
            config.token = token;
            config.bindings = bindings;
            let proxy = self.proxy.clone();
            let agent = Agent::start(config, move |stream: MuxStream, meta: StreamMeta| {
                serve_stream(&proxy, stream, meta)
            })
            .map_err(|e| format!("starting an agent: {e}"))?;
            let mut status = agent.status();
            let (tx, rx) = watch::channel(transport_state(&status.borrow()));
            let forward = tokio::spawn(async move {
                while status.changed().await.is_ok() {
                    let state = transport_state(&status.borrow_and_update());
                    tx.send_replace(state);
                }
            });
            let old = self
                .agents
                .lock()
                .expect("agents lock")
                .insert(id.to_owned(), (agent, forward));
            if let Some((agent, forward)) = old {
                forward.abort();
                agent.shutdown().await;
            }
            Ok(rx)
        })
    }

    fn set_token<'a>(
        &'a self,
        _id: &'a str,
        _token: TunnelToken,
    ) -> BoxFuture<'a, Result<(), String>> {
        // A v1 session keeps the token it authenticated with; the old token
        // stays valid until revoked, so the publisher re-attaches instead.
        Box::pin(async { Err("protocol v1 cannot replace a live session's token".to_owned()) })
    }

    fn detach<'a>(&'a self, id: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let old = self.agents.lock().expect("agents lock").remove(id);
            if let Some((agent, forward)) = old {
                forward.abort();
                agent.shutdown().await;
            }
        })
    }
}
