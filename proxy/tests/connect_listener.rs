//! The CONNECT listener end to end on real sockets and real TLS: a rustls
//! HTTPS backend with its own CA stands in for an API server, reqwest (a
//! real proxy client: CONNECT with Basic credentials, then TLS to the
//! target) and raw sockets are the clients. `TableAuthorizer` is the test's
//! implementation of the authorizer trait (in the operator, Kubernetes
//! reviews decide): a fixed table of who may go where.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, mpsc};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tuna_proxy::{
    Authority, CaPem, ConnectAuthorizer, ConnectConfig, ConnectGrant, ConnectLimits,
    ConnectRefusal, ConnectRequest, Credential, InterceptCa, ProxyConfig, ProxyCore,
    UpstreamTarget,
};

/// A CA and a server certificate for 127.0.0.1 signed by it.
struct TargetPki {
    ca_pem: String,
    ca_der: Vec<u8>,
    acceptor: tokio_rustls::TlsAcceptor,
}

fn target_pki() -> TargetPki {
    init();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "target CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    TargetPki {
        ca_pem: ca.pem(),
        ca_der: ca.der().to_vec(),
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    }
}

type WatchFeed = Arc<Mutex<Option<mpsc::Receiver<String>>>>;

/// An HTTPS backend: `/watch` streams the lines the test feeds, anything else
/// echoes the request (path and headers).
async fn api_backend(pki: &TargetPki, feed: WatchFeed) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = pki.acceptor.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let feed = feed.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let sni = tls.get_ref().1.server_name().map(str::to_owned);
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let feed = feed.clone();
                    let sni = sni.clone();
                    async move {
                        if req.uri().path() == "/watch" {
                            let rx = feed.lock().await.take().expect("one watch");
                            let stream = futures::stream::unfold(rx, |mut rx| async move {
                                let line = rx.recv().await?;
                                Some((Ok::<_, Infallible>(Frame::data(Bytes::from(line))), rx))
                            });
                            return Ok::<_, Infallible>(Response::new(BodyExt::boxed(
                                StreamBody::new(stream),
                            )));
                        }
                        let mut body = format!("path: {}\nsni: {sni:?}\n", req.uri());
                        for (k, v) in req.headers() {
                            body.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or("?")));
                        }
                        Ok(Response::new(BodyExt::boxed(Full::new(Bytes::from(body)))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

/// An HTTPS WebSocket echo backend (what exec and port-forward upgrade to).
async fn websocket_backend(pki: &TargetPki) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = pki.acceptor.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut ws) = tokio_tungstenite::accept_async(tls).await else {
                    return;
                };
                while let Some(Ok(msg)) = ws.next().await {
                    if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// The test's authorizer: user `team/conn` with password `good` may reach
/// the targets of the table; `stranger` is known but may not; every other
/// password is invalid.
struct TableAuthorizer {
    targets: HashMap<Authority, Arc<UpstreamTarget>>,
}

#[async_trait::async_trait]
impl ConnectAuthorizer for TableAuthorizer {
    async fn authorize(&self, request: ConnectRequest) -> Result<ConnectGrant, ConnectRefusal> {
        let creds = &request.credentials;
        match (creds.username.as_str(), creds.password.expose()) {
            ("team/conn", "good") => {}
            (_, "stranger") => {
                return Err(ConnectRefusal::Forbidden(
                    "system:serviceaccount:other:default may not use team/conn".into(),
                ));
            }
            _ => return Err(ConnectRefusal::Unauthenticated("invalid token".into())),
        }
        let target = self.targets.get(&request.authority).ok_or_else(|| {
            ConnectRefusal::Forbidden(format!("team/conn does not lead to {}", request.authority))
        })?;
        Ok(ConnectGrant {
            target: target.clone(),
            authorization: Credential::new("Bearer real-token"),
            label: "team/conn".into(),
        })
    }
}

fn authority(addr: SocketAddr) -> Authority {
    Authority {
        host: addr.ip().to_string(),
        port: addr.port(),
    }
}

struct Env {
    core: ProxyCore,
    proxy: SocketAddr,
    ca: CaPem,
    api: SocketAddr,
    ws: SocketAddr,
    feed: mpsc::Sender<String>,
}

async fn env(limits: ConnectLimits, upstream_ca: Option<Vec<u8>>) -> Env {
    let pki = target_pki();
    let (tx, rx) = mpsc::channel(8);
    let api = api_backend(&pki, Arc::new(Mutex::new(Some(rx)))).await;
    let ws = websocket_backend(&pki).await;
    let ca_der = upstream_ca.unwrap_or(pki.ca_der.clone());
    let mut targets = HashMap::new();
    for addr in [api, ws] {
        let target =
            UpstreamTarget::new(vec![addr], "127.0.0.1", Some(vec![ca_der.clone()])).unwrap();
        targets.insert(authority(addr), Arc::new(target));
    }
    let ca = InterceptCa::generate("connector proxy CA").unwrap();
    let core = ProxyCore::new(ProxyConfig::default());
    let proxy = core
        .add_connect_listener(
            "127.0.0.1:0".parse().unwrap(),
            ConnectConfig {
                authorizer: Arc::new(TableAuthorizer { targets }),
                ca: Arc::new(InterceptCa::from_pem(&ca).unwrap()),
                limits,
            },
        )
        .await
        .unwrap();
    let _ = pki.ca_pem;
    Env {
        core,
        proxy,
        ca,
        api,
        ws,
        feed: tx,
    }
}

/// A reqwest client that goes through the proxy as `user:password` and
/// trusts only the proxy's CA.
fn client_via(env: &Env, user: &str, password: &str) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(env.ca.cert_pem.as_bytes()).unwrap();
    reqwest::Client::builder()
        .tls_certs_only([ca])
        .proxy(
            reqwest::Proxy::https(format!("http://{}", env.proxy))
                .unwrap()
                .basic_auth(user, password),
        )
        .build()
        .unwrap()
}

/// Sends a raw CONNECT and returns the response head.
/// A CONNECT to `target` with a good password, then TLS over it trusting only
/// the proxy CA, for the CONNECT IP (its IP SAN), offering `alpn`.
async fn tls_through_proxy(
    env: &Env,
    target: SocketAddr,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let (head, tcp) = raw_connect(
        env.proxy,
        &format!(
            "CONNECT {target} HTTP/1.1\r\nProxy-Authorization: Basic {}\r\n\r\n",
            basic("team/conn:good")
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_slice(env.ca.cert_pem.as_bytes()).unwrap())
        .unwrap();
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS with a certificate of the proxy CA for its IP SAN")
}

async fn raw_connect(proxy: SocketAddr, head: &str) -> (String, TcpStream) {
    let mut tcp = TcpStream::connect(proxy).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match tcp.read(&mut byte).await.unwrap() {
            0 => break,
            _ => buf.push(byte[0]),
        }
    }
    (String::from_utf8(buf).unwrap(), tcp)
}

fn basic(user_pass: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(user_pass)
}

#[tokio::test]
async fn requests_reach_the_target_with_the_grants_credentials() {
    let env = env(ConnectLimits::default(), None).await;
    let client = client_via(&env, "team/conn", "good");
    let body = client
        .get(format!("https://{}/api/v1/pods?limit=500", env.api))
        .bearer_auth("fake-token")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let echo = parse_echo(&body);
    assert_eq!(echo["path"], ["/api/v1/pods?limit=500"], "{body}");
    assert_eq!(echo["authorization"], ["Bearer real-token"], "{body}");
    assert!(!echo.contains_key("proxy-authorization"), "{body}");
    assert_eq!(echo["host"], [env.api.to_string()], "{body}");
    // Upstream TLS goes to an IP: no SNI, the IP SAN is checked.
    assert_eq!(echo["sni"], ["None"], "{body}");
    // Keep-alive: a second request on the same tunnel.
    let again = client
        .get(format!("https://{}/version", env.api))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(
        metric(
            &env.core,
            "tuna_proxy_connect_requests_total{outcome=\"granted\"}"
        ),
        1
    );
}

/// 407 with `Proxy-Authenticate` without, with malformed and with invalid
/// credentials; 403 for a known caller that may not, and for another
/// target; 405 for anything but CONNECT.
#[tokio::test]
async fn refusals_carry_the_status_a_proxy_client_expects() {
    let env = env(ConnectLimits::default(), None).await;
    let target = env.api.to_string();
    let cases = [
        (
            format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"),
            "407",
        ),
        (
            format!("CONNECT {target} HTTP/1.1\r\nProxy-Authorization: Bearer good\r\n\r\n"),
            "407",
        ),
        (
            format!(
                "CONNECT {target} HTTP/1.1\r\nProxy-Authorization: Basic {}\r\n\r\n",
                basic("team/conn:wrong")
            ),
            "407",
        ),
        (
            format!(
                "CONNECT {target} HTTP/1.1\r\nProxy-Authorization: Basic {}\r\n\r\n",
                basic("team/conn:stranger")
            ),
            "403",
        ),
        (
            format!(
                "CONNECT 127.0.0.1:1 HTTP/1.1\r\nProxy-Authorization: Basic {}\r\n\r\n",
                basic("team/conn:good")
            ),
            "403",
        ),
        (
            format!("GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n\r\n"),
            "405",
        ),
        ("CONNECT nohost HTTP/1.1\r\n\r\n".to_owned(), "400"),
    ];
    for (request, status) in cases {
        let (head, _) = raw_connect(env.proxy, &request).await;
        assert!(
            head.starts_with(&format!("HTTP/1.1 {status} ")),
            "{request:?} → {head}"
        );
        if status == "407" {
            assert!(
                head.to_ascii_lowercase()
                    .contains("proxy-authenticate: basic realm=\"tuna-connectors\""),
                "{head}"
            );
        }
    }
    // reqwest (like Go) turns the refusal into an error saying what it is.
    let err = client_via(&env, "team/conn", "wrong")
        .get(format!("https://{}/", env.api))
        .send()
        .await
        .unwrap_err();
    assert!(format!("{err:?}").contains("ProxyAuthRequired"), "{err:?}");
}

/// The certificate the client sees is the proxy CA's, for the CONNECT IP;
/// the target's own CA is not trusted by the client at all.
#[tokio::test]
async fn tls_is_intercepted_with_a_certificate_of_the_proxy_ca() {
    let env = env(ConnectLimits::default(), None).await;
    let tls = tls_through_proxy(&env, env.api, &[b"h2", b"http/1.1"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));

    // A request naming another host on this tunnel is not forwarded.
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = sender
        .send_request(
            Request::get("/")
                .header("host", "other.example.com")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 421);
}

/// A watch streams: each line arrives before the next is sent.
#[tokio::test]
async fn watches_stream_through() {
    let env = env(ConnectLimits::default(), None).await;
    let client = client_via(&env, "team/conn", "good");
    let resp = client
        .get(format!("https://{}/watch", env.api))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    for i in 0..3 {
        let line = format!("{{\"type\":\"ADDED\",\"n\":{i}}}\n");
        env.feed.send(line.clone()).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), body.next())
            .await
            .expect("the line arrives while the response is open")
            .unwrap()
            .unwrap();
        assert_eq!(got, line.as_bytes());
    }
}

/// An upgrade (WebSocket, as exec and port-forward use) is spliced both ways.
#[tokio::test]
async fn upgrades_pass_both_ways() {
    let env = env(ConnectLimits::default(), None).await;
    let tls = tls_through_proxy(&env, env.ws, &[]).await;
    let request = format!("wss://{}/api/v1/namespaces/default/pods/p/exec", env.ws)
        .into_client_request()
        .unwrap();
    let (mut ws, response) = tokio_tungstenite::client_async(request, tls).await.unwrap();
    assert_eq!(response.status(), 101);
    for i in 0..10 {
        let text = format!("stdin {i}");
        ws.send(Message::text(text.clone())).await.unwrap();
        assert_eq!(ws.next().await.unwrap().unwrap(), Message::text(text));
    }
    let big = vec![3u8; 256 * 1024];
    ws.send(Message::binary(big.clone())).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::binary(big));
}

/// A target whose certificate does not chain to the grant's CA is not
/// trusted: 502, and the request never reaches it.
#[tokio::test]
async fn the_targets_certificate_is_verified_against_the_grants_ca() {
    let other = target_pki();
    let env = env(ConnectLimits::default(), Some(other.ca_der.clone())).await;
    let resp = client_via(&env, "team/conn", "good")
        .get(format!("https://{}/api", env.api))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    assert!(metric(&env.core, "tuna_proxy_upstream_errors_total{cause=\"tls\"}") >= 1);
}

/// Connections over the limit are closed at once; a client that sends
/// nothing is closed after the handshake timeout.
#[tokio::test]
async fn connections_and_handshakes_are_bounded() {
    let limits = ConnectLimits {
        max_connections: 1,
        handshake_timeout: Duration::from_millis(500),
        ..ConnectLimits::default()
    };
    let env = env(limits, None).await;
    let mut idle = TcpStream::connect(env.proxy).await.unwrap();
    let started = std::time::Instant::now();
    // The second connection is over the limit while the first is open.
    let mut second = TcpStream::connect(env.proxy).await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), second.read(&mut buf))
        .await
        .expect("closed at once")
        .unwrap_or(0);
    assert_eq!(n, 0);
    let n = tokio::time::timeout(Duration::from_secs(10), idle.read(&mut buf))
        .await
        .expect("closed after the handshake timeout")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(started.elapsed() >= Duration::from_millis(450));
    assert_eq!(
        metric(
            &env.core,
            "tuna_proxy_connect_requests_total{outcome=\"over_limit\"}"
        ),
        1
    );
}
