//! A port of a Gateway's own address (`ProxyCore::set_port_routes`,
//! `serve_port_stream`): its streams are routed by the port's listeners,
//! any `Host`, and never by the hosts of the shared table, which in turn
//! never sees the port's routes. Raw HTTP/1.1 on duplex tunnel streams,
//! real echo backends.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tuna_proxy::{
    ConnInfo, GatewayRule, HttpBackend, HttpRoute, ListenerRoutes, PathType, ProxyConfig,
    ProxyCore, Scheme, UpstreamProtocol, WeightedTarget,
};
use tuna_routing::{GatewayMatch, Matcher};

use crate::common;
use common::*;

const PORT: &str = "127.0.100.50:80";

/// A Gateway route (as the plan emits for an address: no `host`, the
/// hostname it serves through in its match) to one backend.
fn through(hostname: Option<&str>, path: &str, backend: SocketAddr) -> HttpRoute {
    let mut r = route("", path, PathType::Prefix, &[]);
    r.backend = HttpBackend::gateway(GatewayRule {
        backends: vec![WeightedTarget {
            addrs: vec![backend],
            protocol: UpstreamProtocol::Http1,
            weight: 1,
        }],
        ..GatewayRule::default()
    });
    r.matcher = Matcher::Gateway(Arc::new(GatewayMatch {
        hostname: hostname.map(str::to_owned),
        ..GatewayMatch::default()
    }));
    r
}

async fn exchange(core: &ProxyCore, at: SocketAddr, request: &str, on_port: bool) -> String {
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let info = ConnInfo {
        client_addr: "198.51.100.7:40000".parse().unwrap(),
        local_addr: None,
        scheme: Scheme::Http,
        trusted: true,
        host: None,
    };
    let core2 = core.clone();
    let serving = tokio::spawn(async move {
        if on_port {
            core2.serve_port_stream(server, info, at).await
        } else {
            core2.serve_stream(server, info).await
        }
    });
    client.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.read_to_end(&mut out),
    )
    .await
    .expect("the proxy closes after a Connection: close exchange")
    .unwrap();
    serving.await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

fn get(host: Option<&str>, path: &str) -> String {
    match host {
        Some(h) => format!("GET {path} HTTP/1.1\r\nHost: {h}\r\nConnection: close\r\n\r\n"),
        // HTTP/1.0 may leave `Host` out.
        None => format!("GET {path} HTTP/1.0\r\nAccept: */*\r\n\r\n"),
    }
}

/// (status, backend) of an answer.
fn seen(resp: &str) -> (String, Option<String>) {
    let status = resp.split(' ').nth(1).unwrap_or("").to_owned();
    let backend = resp
        .lines()
        .find_map(|l| l.strip_prefix("backend: "))
        .map(str::to_owned);
    (status, backend)
}

#[tokio::test]
async fn a_gateway_port_routes_any_host_by_its_listeners_and_nothing_else() {
    let shared = echo_backend("shared").await;
    let wild = echo_backend("wild").await;
    let exact = echo_backend("exact").await;
    let any = echo_backend("any").await;
    let core = ProxyCore::new(ProxyConfig::default());
    core.set_host_routes(
        "shop.example.com",
        vec![route("shop.example.com", "/", PathType::Prefix, &[shared])],
    )
    .unwrap();
    let at: SocketAddr = PORT.parse().unwrap();
    let issues = core
        .set_port_routes(
            at,
            vec![
                ListenerRoutes {
                    hostname: Some("*.example.com".into()),
                    routes: vec![
                        through(Some("*.example.com"), "/", wild),
                        through(Some("a.example.com"), "/exact", exact),
                    ],
                },
                ListenerRoutes {
                    hostname: None,
                    routes: vec![through(None, "/", any)],
                },
            ],
        )
        .unwrap();
    assert!(issues.is_empty(), "{issues:?}");
    assert!(core.has_port_routes(at));

    let on_port = |host, path| {
        let core = core.clone();
        async move { seen(&exchange(&core, at, &get(host, path), true).await) }
    };
    let ok = |b: &str| ("200".to_owned(), Some(b.to_owned()));
    assert_eq!(
        on_port(Some("a.example.com"), "/exact/x").await,
        ok("exact")
    );
    assert_eq!(on_port(Some("a.example.com"), "/other").await, ok("wild"));
    // A wildcard spans labels on a Gateway's port.
    assert_eq!(on_port(Some("x.y.example.com:80"), "/").await, ok("wild"));
    // The shared table's host is just a host here: the port's listeners
    // serve it, not the shared route.
    assert_eq!(on_port(Some("shop.example.com"), "/").await, ok("wild"));
    assert_eq!(on_port(Some("example.org"), "/").await, ok("any"));
    assert_eq!(on_port(Some("127.0.100.50"), "/").await, ok("any"));
    assert_eq!(on_port(None, "/").await, ok("any"));

    // The shared streams never see the port's routes.
    let shared_stream = |host| {
        let core = core.clone();
        async move { seen(&exchange(&core, at, &get(Some(host), "/"), false).await) }
    };
    assert_eq!(shared_stream("shop.example.com").await, ok("shared"));
    assert_eq!(shared_stream("a.example.com").await.0, "404");
    // Another port of the same address has no table: nothing is served.
    let other: SocketAddr = "127.0.100.50:8080".parse().unwrap();
    let resp = exchange(&core, other, &get(Some("a.example.com"), "/"), true).await;
    assert_eq!(seen(&resp).0, "404");

    let metrics = core.render_metrics();
    assert!(
        metrics.contains("host=\"address/127.0.100.50:80\""),
        "{metrics}"
    );

    assert!(core.remove_port_routes(at));
    assert!(!core.has_port_routes(at));
    assert_eq!(on_port(Some("a.example.com"), "/").await.0, "404");
    assert_eq!(shared_stream("shop.example.com").await, ok("shared"));
}
