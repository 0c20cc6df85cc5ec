//! 1 GiB request and response bodies stream through the proxy with bounded
//! memory: the process's peak resident set (VmHWM) grows by far less than
//! the body size.

mod common;

use std::convert::Infallible;

use bytes::Bytes;
use common::*;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use reqwest::header::HOST;
use tokio::net::TcpListener;
use tuna_proxy::{PathType, ProxyConfig};

const GIB: u64 = 1 << 30;
const CHUNK: usize = 256 * 1024;
/// Far below 1 GiB, far above what a streaming proxy needs.
const MAX_GROWTH: u64 = 200 << 20;

fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

fn chunks(total: u64) -> impl futures::Stream<Item = Bytes> + Send + 'static {
    let chunk = Bytes::from(vec![0x5au8; CHUNK]);
    futures::stream::iter(0..total / CHUNK as u64).map(move |_| chunk.clone())
}

/// POST: counts the request body and answers the count. GET: streams
/// 1 GiB.
async fn bulk_backend() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    if req.method() == http::Method::POST {
                        let mut body = req.into_body();
                        let mut n = 0u64;
                        while let Some(frame) = body.frame().await {
                            if let Ok(data) = frame.unwrap().into_data() {
                                n += data.len() as u64;
                            }
                        }
                        let body = Full::new(Bytes::from(n.to_string()));
                        Ok::<_, Infallible>(Response::new(BodyExt::boxed(body)))
                    } else {
                        let stream = chunks(GIB).map(|b| Ok::<_, Infallible>(Frame::data(b)));
                        Ok(Response::new(BodyExt::boxed(StreamBody::new(stream))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_each_way_with_bounded_memory() {
    let backend = bulk_backend().await;
    let (core, addr) = proxy(ProxyConfig::default()).await;
    core.set_host_routes(
        "bulk.example.com",
        vec![route("bulk.example.com", "/", PathType::Prefix, &[backend])],
    )
    .unwrap();
    let client = client();
    let before = peak_rss();

    // Upload: chunked request body of 1 GiB.
    let body = reqwest::Body::wrap_stream(chunks(GIB).map(Ok::<_, Infallible>));
    let resp = client
        .post(format!("http://{addr}/up"))
        .header(HOST, "bulk.example.com")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), GIB.to_string());

    // Download: 1 GiB response body.
    let resp = client
        .get(format!("http://{addr}/down"))
        .header(HOST, "bulk.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut received = 0u64;
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        received += chunk.unwrap().len() as u64;
    }
    assert_eq!(received, GIB);

    let growth = peak_rss().saturating_sub(before);
    assert!(
        growth < MAX_GROWTH,
        "peak RSS grew by {} MiB moving 2 GiB",
        growth >> 20
    );
}
