//! Graceful shutdown: in-flight requests finish, new connections are
//! refused, stragglers are cut after the grace period.

use crate::common;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use reqwest::header::HOST;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tuna_proxy::{PathType, ProxyConfig};

/// Answers only when the test releases it; reports when a request arrived.
async fn gated_backend() -> (
    std::net::SocketAddr,
    oneshot::Receiver<()>,
    oneshot::Sender<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (arrived_tx, arrived_rx) = oneshot::channel();
    let (release_tx, release_rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let arrived = std::sync::Mutex::new(Some(arrived_tx));
        let release = std::sync::Arc::new(tokio::sync::Mutex::new(Some(release_rx)));
        let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
            if let Some(tx) = arrived.lock().unwrap().take() {
                let _ = tx.send(());
            }
            let release = release.clone();
            async move {
                if let Some(rx) = release.lock().await.take() {
                    let _ = rx.await;
                }
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
            }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(tcp), svc)
            .await;
    });
    (addr, arrived_rx, release_tx)
}

#[tokio::test]
async fn in_flight_requests_finish_and_new_connections_are_refused() {
    let (backend, arrived, release) = gated_backend().await;
    let (core, addr) = proxy(ProxyConfig::default()).await;
    core.set_host_routes(
        "slow.example.com",
        vec![route("slow.example.com", "/", PathType::Prefix, &[backend])],
    )
    .unwrap();
    let in_flight = tokio::spawn(async move {
        client()
            .get(format!("http://{addr}/"))
            .header(HOST, "slow.example.com")
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    arrived.await.unwrap();
    let shutting_down = {
        let core = core.clone();
        tokio::spawn(async move { core.shutdown().await })
    };
    // The listener closes before the drain ends.
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        tokio::task::yield_now().await;
    }
    release.send(()).unwrap();
    assert_eq!(in_flight.await.unwrap(), "done");
    assert!(
        shutting_down.await.unwrap(),
        "drained within the grace period"
    );
}

#[tokio::test]
async fn stragglers_are_cut_after_the_grace_period() {
    let (backend, arrived, _release) = gated_backend().await;
    let config = ProxyConfig {
        shutdown_grace: Duration::from_millis(200),
        ..ProxyConfig::default()
    };
    let (core, addr) = proxy(config).await;
    core.set_host_routes(
        "slow.example.com",
        vec![route("slow.example.com", "/", PathType::Prefix, &[backend])],
    )
    .unwrap();
    let in_flight = tokio::spawn(async move {
        client()
            .get(format!("http://{addr}/"))
            .header(HOST, "slow.example.com")
            .send()
            .await
    });
    arrived.await.unwrap();
    assert!(!core.shutdown().await, "not drained: cut");
    assert!(in_flight.await.unwrap().is_err(), "the cut request fails");
}
