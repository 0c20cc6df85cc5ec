//! 502, 504 and the retry policy, against real sockets.

use crate::common;

use std::time::Duration;

use common::*;
use reqwest::header::HOST;
use tokio::net::TcpListener;
use tuna_proxy::{PathType, ProxyConfig};

#[tokio::test]
async fn refused_upstream_is_502_and_counted() {
    let (dead, _refusing) = refusing_addr();
    let (core, addr) = proxy(ProxyConfig::default()).await;
    core.set_host_routes(
        "shop.example.com",
        vec![route("shop.example.com", "/", PathType::Prefix, &[dead])],
    )
    .unwrap();
    let resp = client()
        .get(format!("http://{addr}/"))
        .header(HOST, "shop.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    assert!(resp.text().await.unwrap().contains("Bad Gateway"));
    let metrics = core.render_metrics();
    assert!(
        metrics.contains("tuna_proxy_upstream_errors_total{cause=\"connect_refused\"} ")
            && !metrics.contains("tuna_proxy_upstream_errors_total{cause=\"connect_refused\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("host=\"shop.example.com\",class=\"5xx\"} 1"),
        "{metrics}"
    );
}

/// A backend that accepts connections, reads, and never answers.
async fn silent_backend() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    addr
}

#[tokio::test]
async fn silent_upstream_is_504() {
    let silent = silent_backend().await;
    let mut config = ProxyConfig::default();
    config.upstream.read = Duration::from_millis(300);
    let (core, addr) = proxy(config).await;
    core.set_host_routes(
        "shop.example.com",
        vec![route("shop.example.com", "/", PathType::Prefix, &[silent])],
    )
    .unwrap();
    let resp = client()
        .get(format!("http://{addr}/"))
        .header(HOST, "shop.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 504);
    assert!(
        core.render_metrics()
            .contains("tuna_proxy_upstream_errors_total{cause=\"read_timeout\"} 1")
    );
}

#[tokio::test]
async fn connect_timeout_is_504() {
    // A listener that never accepts, with its backlog filled: Linux drops
    // further SYNs, so connecting hangs until the connect timeout.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let full = socket.listen(1).unwrap();
    let target = full.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        if let Ok(Ok(c)) = tokio::time::timeout(Duration::from_millis(200), s.connect(target)).await
        {
            fillers.push(c);
        }
    }
    let mut config = ProxyConfig::default();
    config.upstream.connect = Duration::from_millis(300);
    let (core, addr) = proxy(config).await;
    core.set_host_routes(
        "shop.example.com",
        vec![route("shop.example.com", "/", PathType::Prefix, &[target])],
    )
    .unwrap();
    let resp = client()
        .post(format!("http://{addr}/"))
        .header(HOST, "shop.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 504);
    assert!(
        core.render_metrics()
            .contains("tuna_proxy_upstream_errors_total{cause=\"connect_timeout\"} 1")
    );
    drop((full, fillers));
}

#[tokio::test]
async fn idempotent_requests_retry_connect_failures_on_the_next_address() {
    let web = echo_backend("web").await;
    let (dead, _refusing) = refusing_addr();
    let (core, addr) = proxy(ProxyConfig::default()).await;
    core.set_host_routes(
        "shop.example.com",
        vec![route(
            "shop.example.com",
            "/",
            PathType::Prefix,
            &[dead, web],
        )],
    )
    .unwrap();
    let client = client();
    // Round-robin starts alternately on the dead address: every GET still
    // succeeds, retried on the live one.
    for _ in 0..6 {
        let resp = client
            .get(format!("http://{addr}/"))
            .header(HOST, "shop.example.com")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    // A POST is never retried: those that start on the dead address fail.
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let resp = client
            .post(format!("http://{addr}/"))
            .header(HOST, "shop.example.com")
            .body("x")
            .send()
            .await
            .unwrap();
        statuses.push(resp.status().as_u16());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 502).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        3,
        "{statuses:?}"
    );
}
