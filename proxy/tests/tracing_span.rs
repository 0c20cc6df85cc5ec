//! Every request gets a tracing span carrying its request id.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::*;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tuna_proxy::{ConnInfo, PathType, ProxyConfig, ProxyCore, Scheme};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn request_span_carries_the_request_id() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("tuna_proxy=debug")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // The test runtime is single-threaded, so a thread-local default
    // subscriber sees every span of the proxy.
    let _guard = tracing::subscriber::set_default(subscriber);

    let web = echo_backend("web").await;
    let core = ProxyCore::new(ProxyConfig::default());
    core.set_host_routes(
        "shop.example.com",
        vec![route("shop.example.com", "/", PathType::Prefix, &[web])],
    )
    .unwrap();
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let info = ConnInfo {
        client_addr: "198.51.100.7:40000".parse().unwrap(),
        local_addr: None,
        scheme: Scheme::Https,
        trusted: true,
        host: None,
    };
    let serving = {
        let core = core.clone();
        tokio::spawn(async move { core.serve_stream(server_io, info).await })
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client_io))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri("/traced")
        .header("host", "shop.example.com")
        .header("x-request-id", "edge-trace-42")
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
    drop(sender);
    serving.await.unwrap();

    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let done = log
        .lines()
        .find(|l| l.contains("request done"))
        .unwrap_or_else(|| panic!("no request event in:\n{log}"));
    assert!(done.contains("id=edge-trace-42"), "{done}");
    assert!(done.contains("host=shop.example.com"), "{done}");
    assert!(done.contains("status=200"), "{done}");
}
