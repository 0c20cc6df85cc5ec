//! The CONNECT listener end to end on real sockets and real TLS: a rustls
//! HTTPS backend with its own CA stands in for an API server, reqwest (a
//! real proxy client: CONNECT with Basic credentials, then TLS to the
//! target) and raw sockets are the clients. `TableAuthorizer` is the test's
//! implementation of the authorizer trait (in the operator, Kubernetes
//! reviews decide): a fixed table of who may go where.

use crate::common;

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
            (_, "busy") => {
                return Err(ConnectRefusal::TooManyRequests {
                    message: "too many reviews; try again".into(),
                    retry_after: Duration::from_millis(1500),
                });
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
            valid_until: std::time::Instant::now() + Duration::from_secs(3600),
        })
    }
}

/// A test authorizer whose answer the test flips: the table's answer, valid
/// for `valid_for`, until `revoked` is set; then a refusal.
struct FlippingAuthorizer {
    table: TableAuthorizer,
    valid_for: Duration,
    revoked: std::sync::atomic::AtomicBool,
    /// Told of every re-check (a permit is kept if no one waits yet).
    rechecked: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl ConnectAuthorizer for FlippingAuthorizer {
    async fn authorize(&self, request: ConnectRequest) -> Result<ConnectGrant, ConnectRefusal> {
        if self.revoked.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ConnectRefusal::Forbidden("team/conn was revoked".into()));
        }
        let mut grant = self.table.authorize(request).await?;
        grant.valid_until = std::time::Instant::now() + self.valid_for;
        Ok(grant)
    }

    async fn reauthorize(&self, request: ConnectRequest) -> Result<ConnectGrant, ConnectRefusal> {
        let answer = self.authorize(request).await;
        self.rechecked.notify_one();
        answer
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
    env_with(limits, upstream_ca, |targets| {
        Arc::new(TableAuthorizer { targets })
    })
    .await
}

async fn env_with(
    limits: ConnectLimits,
    upstream_ca: Option<Vec<u8>>,
    authorizer: impl FnOnce(HashMap<Authority, Arc<UpstreamTarget>>) -> Arc<dyn ConnectAuthorizer>,
) -> Env {
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
                authorizer: authorizer(targets),
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
        (
            format!(
                "CONNECT {target} HTTP/1.1\r\nProxy-Authorization: Basic {}\r\n\r\n",
                basic("team/conn:busy")
            ),
            "429",
        ),
    ];
    for (request, status) in cases {
        let (head, _) = raw_connect(env.proxy, &request).await;
        assert!(
            head.starts_with(&format!("HTTP/1.1 {status} ")),
            "{request:?} → {head}"
        );
        if status == "429" {
            assert!(
                head.to_ascii_lowercase().contains("retry-after: 2\r\n"),
                "whole seconds, rounded up: {head}"
            );
        }
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
        max_unauthenticated: 1,
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
            "tuna_proxy_connect_requests_total{outcome=\"unauthenticated_over_limit\"}"
        ),
        1
    );
}

/// A TCP connection to `proxy` from the loopback address `from` (Linux
/// routes all of 127.0.0.0/8 to lo): another client, as the proxy sees it.
async fn connect_from(from: std::net::Ipv4Addr, proxy: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    socket.connect(proxy).await.unwrap()
}

/// Whether the proxy closed `tcp` (EOF or reset) within `within`.
async fn closed_within(tcp: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(within, tcp.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// Sockets that never authenticate hold places of their own budget, at
/// most `max_unauthenticated_per_ip` per address: one address's idle
/// sockets do not keep another client out, and granted connections do not
/// count against strangers (nor strangers against them).
#[tokio::test]
async fn idle_strangers_do_not_lock_out_a_client_with_credentials() {
    let limits = ConnectLimits {
        max_connections: 2,
        max_unauthenticated: 4,
        max_unauthenticated_per_ip: 2,
        ..ConnectLimits::default()
    };
    let env = env(limits, None).await;
    let attacker = std::net::Ipv4Addr::new(127, 0, 0, 2);
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(connect_from(attacker, env.proxy).await);
    }
    // Over the address's cap: closed at once (long before the 10 s
    // handshake timeout).
    let mut third = connect_from(attacker, env.proxy).await;
    assert!(closed_within(&mut third, Duration::from_secs(5)).await);
    // A client from another address with credentials gets through, twice
    // (two granted connections, while the strangers hold theirs).
    let first = client_via(&env, "team/conn", "good");
    let second = client_via(&env, "team/conn", "good");
    for client in [&first, &second] {
        let resp = client
            .get(format!("https://{}/version", env.api))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    // The strangers' sockets are still open: they were not evicted for it.
    for tcp in &mut idle {
        assert!(!closed_within(tcp, Duration::from_millis(50)).await);
    }
    // The granted budget (2) is full: a third grant is answered 503.
    let (head, _) = raw_connect(
        env.proxy,
        &format!(
            "CONNECT {} HTTP/1.1\r\nProxy-Authorization: Basic {}\r\n\r\n",
            env.api,
            basic("team/conn:good")
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    assert_eq!(
        metric(
            &env.core,
            "tuna_proxy_connect_requests_total{outcome=\"unauthenticated_over_limit\"}"
        ),
        1
    );
}

/// TLS through a CONNECT as `team/conn:good`, then an HTTP/1.1 connection
/// on it: requests go one after another on the SAME connection.
async fn http1_through_proxy(
    env: &Env,
    target: SocketAddr,
) -> (
    hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let tls = tls_through_proxy(env, target, &[b"http/1.1"]).await;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, conn)
}

fn get(target: SocketAddr, path: &str) -> Request<Full<Bytes>> {
    Request::get(path)
        .header("host", target.to_string())
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// Revocation reaches open connections: once the authorizer's answer flips,
/// the next request on a kept-alive connection is refused with the
/// refusal's status and the connection is closed; a watch under way is cut
/// at the next re-check, without any request.
#[tokio::test]
async fn an_open_connection_is_closed_once_a_re_check_refuses_it_with_a_test_authorizer() {
    let authorizer = Arc::new(std::sync::OnceLock::<Arc<FlippingAuthorizer>>::new());
    let slot = authorizer.clone();
    let env = env_with(ConnectLimits::default(), None, move |targets| {
        let a = Arc::new(FlippingAuthorizer {
            table: TableAuthorizer { targets },
            valid_for: Duration::from_millis(300),
            revoked: std::sync::atomic::AtomicBool::new(false),
            rechecked: tokio::sync::Notify::new(),
        });
        let _ = slot.set(a.clone());
        a
    })
    .await;
    let authorizer = authorizer.get().unwrap().clone();

    // A kept-alive connection, used, then left idle past its re-check: the
    // grant is renewed and the next request still goes through.
    let (mut sender, conn) = http1_through_proxy(&env, env.api).await;
    let resp = sender.send_request(get(env.api, "/version")).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
    let renewed =
        tokio::time::timeout(Duration::from_secs(10), authorizer.rechecked.notified()).await;
    assert!(renewed.is_ok(), "an idle connection is re-checked when due");
    sender
        .ready()
        .await
        .expect("still open after a granted re-check");
    let resp = sender.send_request(get(env.api, "/version")).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();

    // A watch on a second connection.
    let (mut watcher, watch_conn) = http1_through_proxy(&env, env.api).await;
    let resp = watcher.send_request(get(env.api, "/watch")).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut watch = resp.into_body();
    env.feed
        .send("{\"type\":\"ADDED\"}\n".into())
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), watch.frame())
        .await
        .expect("the first event")
        .unwrap()
        .unwrap();
    assert!(first.is_data());

    authorizer
        .revoked
        .store(true, std::sync::atomic::Ordering::SeqCst);

    // The watch ends without any request: the re-check at its deadline
    // closes the connection.
    let cut = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match watch.frame().await {
                Some(Ok(f)) if f.is_data() => continue,
                _ => return,
            }
        }
    })
    .await;
    assert!(cut.is_ok(), "a watch under way is cut once revoked");
    tokio::time::timeout(Duration::from_secs(10), watch_conn)
        .await
        .expect("the watch's connection is closed")
        .unwrap();

    // The kept-alive connection: a request is refused with the refusal's
    // status, or finds the connection closed by its own re-check (whichever
    // comes first: both end it).
    let refused = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if sender.ready().await.is_err() {
                return None;
            }
            match sender.send_request(get(env.api, "/version")).await {
                Ok(resp) if resp.status() == 200 => {
                    resp.into_body().collect().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(resp) => {
                    let status = resp.status();
                    let body = resp.into_body().collect().await.unwrap().to_bytes();
                    return Some((status, String::from_utf8_lossy(&body).into_owned()));
                }
                Err(_) => return None,
            }
        }
    })
    .await
    .expect("refused or closed within the bound");
    if let Some((status, body)) = refused {
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("team/conn was revoked"), "{body}");
    }
    tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("the kept-alive connection is closed")
        .unwrap();
    assert!(
        metric(
            &env.core,
            "tuna_proxy_connect_requests_total{outcome=\"revoked\"}"
        ) >= 2
    );
}
