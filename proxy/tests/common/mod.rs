//! Real backends and helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tuna_proxy::{HttpBackend, HttpRoute, Origin, PathType, ProxyConfig, ProxyCore, TieBreak};

pub fn init() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A backend that answers every request with a text body listing its
/// name, the request path and every request header (`name: value` lines).
/// Serves HTTP/1.1 and h2c.
pub async fn echo_backend(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| async move {
                    let mut body = format!("backend: {name}\npath: {}\n", req.uri());
                    body.push_str(&format!("version: {:?}\n", req.version()));
                    for (k, v) in req.headers() {
                        body.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or("?")));
                    }
                    // Drain the request body so keep-alive works.
                    let _ = req.into_body().collect().await;
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header("x-backend", name)
                            .header("keep-alive", "timeout=5")
                            .body(Full::new(Bytes::from(body)))
                            .unwrap(),
                    )
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

/// Parses an echo body into `header -> values` (lower-case names, plus the
/// pseudo entries `backend` and `path`).
pub fn parse_echo(body: &str) -> BTreeMap<String, Vec<String>> {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in body.lines() {
        if let Some((k, v)) = line.split_once(": ") {
            map.entry(k.to_ascii_lowercase())
                .or_default()
                .push(v.to_owned());
        }
    }
    map
}

pub fn route(host: &str, path: &str, path_type: PathType, addrs: &[SocketAddr]) -> HttpRoute {
    HttpRoute {
        host: host.into(),
        path: path.into(),
        path_type,
        backend: HttpBackend::http1(addrs.iter().copied()),
        origin: Origin {
            namespace: "test".into(),
            name: path.into(),
            rule: 0,
            path: 0,
        },
        tie_break: TieBreak::default(),
        matcher: tuna_routing::Matcher::Ingress,
    }
}

/// A proxy core listening on 127.0.0.1:0.
pub async fn proxy(config: ProxyConfig) -> (ProxyCore, SocketAddr) {
    let core = ProxyCore::new(config);
    let addr = core.listen("127.0.0.1:0".parse().unwrap()).await.unwrap();
    (core, addr)
}

pub fn client() -> reqwest::Client {
    init();
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// An address that refuses connections: a socket bound but never listening
/// (connects get a reset). Keep the socket for as long as the address must
/// stay refusing; a bound-then-released port could be taken by anyone.
pub fn refusing_addr() -> (SocketAddr, tokio::net::TcpSocket) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    (socket.local_addr().unwrap(), socket)
}

/// The value of an unlabelled series in `/metrics` (0 if absent).
pub fn metric(core: &ProxyCore, name: &str) -> i64 {
    core.render_metrics()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}
