//! HTTPS upstreams (a Tunnel whose `upstream.url` is `https://…`): real
//! rustls server with a self-signed certificate.

use crate::common;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use reqwest::header::HOST;
use tokio::net::TcpListener;
use tuna_proxy::{HttpBackend, PathType, ProxyConfig, TlsUpstream, UpstreamProtocol};

async fn tls_backend() -> std::net::SocketAddr {
    init();
    let cert = rcgen::generate_simple_self_signed(vec!["backend.internal".to_owned()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let sni = tls.get_ref().1.server_name().unwrap_or("-").to_owned();
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let sni = sni.clone();
                    async move {
                        let body = format!("tls backend sni={sni} version={:?}", req.version());
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn https_upstream_with_and_without_verification() {
    let backend = tls_backend().await;
    let (core, addr) = proxy(ProxyConfig::default()).await;
    let tls_route = |host_path: &str, verify: bool, h2: bool| {
        let mut r = route(
            "secure.example.com",
            host_path,
            PathType::Prefix,
            &[backend],
        );
        r.backend = HttpBackend {
            addrs: vec![backend],
            protocol: UpstreamProtocol::Tls(TlsUpstream {
                sni: "backend.internal".into(),
                verify,
                h2,
            }),
            gateway: None,
        };
        r
    };
    core.set_host_routes(
        "secure.example.com",
        vec![
            tls_route("/", false, false),
            tls_route("/h2", false, true),
            tls_route("/verified", true, false),
        ],
    )
    .unwrap();
    let client = client();
    let get = |path: &'static str| {
        let client = client.clone();
        async move {
            let resp = client
                .get(format!("http://{addr}{path}"))
                .header(HOST, "secure.example.com")
                .send()
                .await
                .unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap())
        }
    };
    let (status, body) = get("/").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, "tls backend sni=backend.internal version=HTTP/1.1");
    let (status, body) = get("/h2").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, "tls backend sni=backend.internal version=HTTP/2.0");
    // A self-signed certificate fails verification against the system
    // roots: the upstream is unusable, 502.
    assert_eq!(get("/verified").await.0, 502);
}
