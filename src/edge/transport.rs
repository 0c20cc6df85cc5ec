//! The glue between the tunnel agent and the proxy core: public connections
//! arriving as tunnel streams go straight into the proxy (no loopback hop).

use tuna_protocol::mux::MuxStream;
use tuna_protocol::wire::{StreamKind, StreamMeta};
use tuna_proxy::{ConnInfo, ProxyCore, Scheme};

fn to_proxy_scheme(s: tuna_protocol::wire::Scheme) -> Scheme {
    match s {
        tuna_protocol::wire::Scheme::Http => Scheme::Http,
        tuna_protocol::wire::Scheme::Https => Scheme::Https,
    }
}

/// The proxy's TCP service of one port of a held address (a Gateway's):
/// `address/<ip:port>`, a name no TCP endpoint alias or port can have.
pub fn address_service(at: std::net::SocketAddr) -> String {
    format!("address/{at}")
}

/// Hands one tunnel stream to the proxy core: HTTP streams to the router, TCP
/// streams to the TCP service registered under the endpoint's name.
pub fn serve_stream(proxy: &ProxyCore, stream: MuxStream, meta: StreamMeta) {
    let proxy = proxy.clone();
    tokio::spawn(async move {
        match meta.kind {
            StreamKind::Http { scheme, host } => {
                // The stream was opened for this host: the proxy serves no
                // other on it (421), whatever the request's Host says.
                let info = ConnInfo {
                    client_addr: meta.client_addr,
                    local_addr: None,
                    scheme: to_proxy_scheme(scheme),
                    trusted: true,
                    host: Some(host),
                };
                proxy.serve_stream(stream, info).await;
            }
            StreamKind::Tcp { endpoint, .. } => {
                let info = ConnInfo {
                    client_addr: meta.client_addr,
                    local_addr: None,
                    scheme: Scheme::Http,
                    trusted: true,
                    host: None,
                };
                if let Err(e) = proxy.serve_tcp_stream(&endpoint, stream, info).await {
                    tracing::debug!(%endpoint, error = %e, "tcp stream ended");
                }
            }
            StreamKind::Address { address } => {
                // A Gateway's address: an HTTP listener's port to the
                // proxy, routed by its listeners; a TCP listener's bytes
                // to its upstream.
                let info = ConnInfo {
                    client_addr: meta.client_addr,
                    local_addr: Some(address),
                    scheme: Scheme::Http,
                    trusted: true,
                    host: None,
                };
                if proxy.has_port_routes(address) {
                    proxy.serve_port_stream(stream, info, address).await;
                    return;
                }
                let service = address_service(address);
                if let Err(e) = proxy.serve_tcp_stream(&service, stream, info).await {
                    tracing::debug!(%address, error = %e, "address stream ended");
                }
            }
        }
    });
}
