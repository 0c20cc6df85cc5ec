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
pub(crate) fn through(hostname: Option<&str>, path: &str, backend: SocketAddr) -> HttpRoute {
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

/// A public client's tunnel stream, as the edge opens it (plain HTTP,
/// trusted, no host pinned).
pub(crate) fn tunnel_client() -> ConnInfo {
    ConnInfo {
        client_addr: "198.51.100.7:40000".parse().unwrap(),
        local_addr: None,
        scheme: Scheme::Http,
        trusted: true,
        host: None,
    }
}

async fn exchange(core: &ProxyCore, at: SocketAddr, request: &str, on_port: bool) -> String {
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let info = tunnel_client();
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
                    certificate: None,
                },
                ListenerRoutes {
                    hostname: None,
                    routes: vec![through(None, "/", any)],
                    certificate: None,
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

/// HTTPRouteTimeoutRequest through a Gateway's port: a rule's timeout that
/// elapses is answered 504 on the tunnel stream too, not a closed
/// connection (the suite's first run on an address saw EOF).
#[tokio::test]
async fn a_rule_timeout_on_a_gateway_port_answers_504() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    let core = ProxyCore::new(ProxyConfig::default());
    let at: SocketAddr = "127.0.100.50:81".parse().unwrap();
    let mut timed = through(None, "/", silent);
    if let Some(rule) = &timed.backend.gateway {
        let mut rule = (**rule).clone();
        rule.timeouts.request = Some(std::time::Duration::from_millis(300));
        timed.backend = HttpBackend::gateway(rule);
    }
    let fast = echo_backend("fast").await;
    core.set_port_routes(
        at,
        vec![ListenerRoutes {
            hostname: None,
            routes: vec![timed, through(None, "/fast", fast)],
            certificate: None,
        }],
    )
    .unwrap();
    // A keep-alive connection (as Go's client reuses one): a request
    // served, then one whose timeout elapses.
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let info = tunnel_client();
    let core2 = core.clone();
    tokio::spawn(async move { core2.serve_port_stream(server, info, at).await });
    client
        .write_all(b"GET /fast HTTP/1.1\r\nHost: any.example\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = client.read(&mut buf).await.unwrap();
    let first = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    client
        .write_all(b"GET /slow HTTP/1.1\r\nHost: any.example\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.read_to_end(&mut rest),
    )
    .await;
    let rest = String::from_utf8_lossy(&rest).into_owned();
    assert!(rest.contains("HTTP/1.1 504"), "{rest:?}");
    let resp = exchange(&core, at, &get(Some("any.example"), "/slow"), true).await;
    assert_eq!(seen(&resp).0, "504", "{resp}");
    // Without Connection: close, as Go's client sends it.
    let resp = exchange(
        &core,
        at,
        "GET /slow HTTP/1.1\r\nHost: any.example\r\nUser-Agent: Go-http-client/1.1\r\nAccept-Encoding: gzip\r\n\r\n",
        true,
    )
    .await;
    assert_eq!(seen(&resp).0, "504", "{resp}");
}

/// A stream that records whether it was shut down (a tunnel stream dropped
/// unfinished is reset, and the edge may then lose what was written).
struct Watched<S> {
    inner: S,
    shut: Arc<std::sync::atomic::AtomicBool>,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.shut.store(true, std::sync::atomic::Ordering::SeqCst);
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A connection that Pingora ends on an error path (a rule's timeout,
/// answered 504) is shut down, not dropped unfinished: through the edge, a
/// reset stream lost the 504 (`HTTPRouteTimeoutRequest`,
/// `HTTPRouteTimeoutBackendRequest` of the suite's first run on an address
/// saw EOF).
#[tokio::test]
async fn a_stream_ended_on_an_error_path_is_shut_down() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    let core = ProxyCore::new(ProxyConfig::default());
    let at: SocketAddr = "127.0.100.50:82".parse().unwrap();
    let mut timed = through(None, "/", silent);
    let mut rule = (**timed.backend.gateway.as_ref().unwrap()).clone();
    rule.timeouts.request = Some(std::time::Duration::from_millis(200));
    timed.backend = HttpBackend::gateway(rule);
    core.set_port_routes(
        at,
        vec![ListenerRoutes {
            hostname: None,
            routes: vec![timed],
            certificate: None,
        }],
    )
    .unwrap();
    let shut = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let server = Watched {
        inner: server,
        shut: Arc::clone(&shut),
    };
    let info = tunnel_client();
    let core2 = core.clone();
    tokio::spawn(async move { core2.serve_port_stream(server, info, at).await });
    client
        .write_all(b"GET /slow HTTP/1.1\r\nHost: any.example\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        client.read_to_end(&mut answer),
    )
    .await
    .expect("the connection ends")
    .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 504"), "{answer}");
    tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while !shut.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the stream was dropped without a shutdown");
}
