//! The whole public path: raw client → the real edge (`tuna-edge`) →
//! agent session (TLS, h2 mux) → this proxy core → hyper backends, glued
//! the way the operator glues them (one proxy core for every tunnel, each
//! stream's `ConnInfo::host` taken from its metadata).
//!
//! - the review's two reproductions (a host the edge did not route; a
//!   client-chosen `X-Forwarded-For`);
//! - a differential property: requests from a grammar of valid and hostile
//!   pieces either reach the backend exactly as a reference model of the
//!   policy says, or are refused by the edge — never something in between.

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use proptest::prelude::*;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tuna_agent::{Agent, AgentConfig, AgentHandle, Trust};
use tuna_edge::{EdgeConfig, EdgeHandle, EdgeServer, MemoryAuthority};
use tuna_protocol::mux::MuxStream;
use tuna_protocol::wire::{Binding, StreamKind, StreamMeta, TunnelToken};
use tuna_proxy::{ConnInfo, PathType, ProxyConfig, ProxyCore, Scheme};

const PUBLIC: &str = "pub.tuna.test";
const HIDDEN: &str = "hidden.tuna.test";

/// A backend that answers with what it received: method, target, every
/// header as `name: value` in order, a blank line, then the body bytes.
async fn capture_backend(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| async move {
                    let mut text = format!("backend: {name}\n{} {}\n", req.method(), req.uri());
                    for (k, v) in req.headers() {
                        text.push_str(&format!("{k}: {}\n", String::from_utf8_lossy(v.as_bytes())));
                    }
                    text.push('\n');
                    let body = req.into_body().collect().await.map(|b| b.to_bytes());
                    let mut out = text.into_bytes();
                    out.extend_from_slice(&body.unwrap_or_default());
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(out))))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

struct Path {
    edge: EdgeHandle,
    _agents: Vec<AgentHandle>,
    _core: ProxyCore,
}

/// The edge, one agent per host, and one proxy core behind both agents
/// with a route for each host — the operator's shape.
async fn path() -> Path {
    init();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_pem = ck.cert.pem();
    let cert_der: CertificateDer<'static> = ck.cert.der().clone();
    let key = PrivateKeyDer::try_from(ck.signing_key.serialize_der()).unwrap();
    let tls = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert_der], key)
        .unwrap(),
    );
    let authority = MemoryAuthority::new();
    let hosts = [PUBLIC, HIDDEN];
    for (i, host) in hosts.iter().enumerate() {
        authority.add_token(
            &format!("tok-{i}"),
            &TunnelToken::new(format!("t{i}")),
            &format!("acct-{i}"),
            SystemTime::now() + Duration::from_secs(3600),
            vec![Binding::http(*host)],
        );
    }
    let mut config = EdgeConfig::new("127.0.0.1:0".parse().unwrap(), tls);
    config.http_addr = Some("127.0.0.1:0".parse().unwrap());
    let edge = EdgeServer::start(config, Arc::new(authority), None)
        .await
        .unwrap();

    let core = ProxyCore::new(ProxyConfig::default());
    for (host, backend) in [(PUBLIC, "public"), (HIDDEN, "hidden")] {
        let addr = capture_backend(backend).await;
        core.set_host_routes(host, vec![route(host, "/", PathType::Prefix, &[addr])])
            .unwrap();
    }
    let mut agents = Vec::new();
    for (i, host) in hosts.iter().enumerate() {
        let mut config = AgentConfig::new(
            format!("127.0.0.1:{}", edge.agent_addr.port()),
            Trust::CaPem(cert_pem.clone().into_bytes()),
        );
        config.server_name = Some("localhost".into());
        let proxy = core.clone();
        let agent = Agent::start(config, move |stream: MuxStream, meta: StreamMeta| {
            let proxy = proxy.clone();
            tokio::spawn(async move {
                if let StreamKind::Http { host, .. } = meta.kind {
                    let info = ConnInfo {
                        client_addr: meta.client_addr,
                        local_addr: None,
                        scheme: Scheme::Http,
                        trusted: true,
                        host: Some(host),
                    };
                    proxy.serve_stream(stream, info).await;
                }
            });
        })
        .unwrap();
        let id = format!("t{i}");
        agent
            .attach(
                id.clone(),
                TunnelToken::new(id.clone()),
                vec![Binding::http(*host)],
            )
            .await
            .unwrap();
        agent.serving(&id).await.unwrap();
        agents.push(agent);
    }
    Path {
        edge,
        _agents: agents,
        _core: core,
    }
}

/// Sends one request (which asks for `Connection: close`) to the edge and
/// reads everything until the close.
async fn send_raw(edge: &EdgeHandle, request: &[u8]) -> Vec<u8> {
    let mut tcp = TcpStream::connect(edge.http_addr.unwrap()).await.unwrap();
    tcp.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut out))
        .await
        .expect("the exchange ends")
        .ok();
    out
}

async fn send(edge: &EdgeHandle, request: &[u8]) -> String {
    String::from_utf8_lossy(&send_raw(edge, request).await).into_owned()
}

/// Splits a whole response into its head (text) and its decoded body.
fn response_parts(resp: &[u8]) -> (String, Vec<u8>) {
    let end = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&resp[..end]).to_ascii_lowercase();
    let mut rest = &resp[end + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return (head, rest.to_vec());
    }
    let mut body = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap(), 16).unwrap();
        rest = &rest[line_end + 2..];
        if size == 0 {
            return (head, body);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

fn status(resp: &str) -> u16 {
    resp.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0)
}

#[tokio::test]
async fn the_reviews_reproductions_are_refused_or_neutralised() {
    let p = path().await;
    // 1. An absolute-form target for the public host with the hidden
    //    host's Host: the public backend answers, and sees its own host.
    let resp = send(
        &p.edge,
        b"GET http://pub.tuna.test/ HTTP/1.1\r\nHost: hidden.tuna.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(!resp.contains("backend: hidden"), "{resp}");
    assert_eq!(status(&resp), 200, "{resp}");
    assert!(resp.contains("backend: public"), "{resp}");
    assert!(resp.contains("\nhost: pub.tuna.test\n"), "{resp}");

    // 2. A client's X-Forwarded-For never reaches the backend.
    let resp = send(
        &p.edge,
        b"GET / HTTP/1.1\r\nHost: pub.tuna.test\r\nX-Forwarded-For: 6.6.6.6\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&resp), 200, "{resp}");
    assert!(resp.contains("\nx-forwarded-for: 127.0.0.1\n"), "{resp}");
    assert!(!resp.contains("6.6.6.6"), "{resp}");
}

/// A request from the grammar, and what the reference policy expects.
#[derive(Clone)]
struct Case {
    method: &'static str,
    path: String,
    /// End-to-end fields, as they must reach the backend.
    fields: Vec<(String, String)>,
    body: Vec<u8>,
    chunked: Option<Vec<usize>>,
    spoiler: Spoiler,
}

/// One extra piece that changes the verdict, or what reaches the backend.
#[derive(Debug, Clone, Copy)]
enum Spoiler {
    None,
    /// Dropped on the way (hop-by-hop or a client's forwarding claim).
    Dropped(&'static str),
    /// The edge refuses the request.
    Refused(&'static str),
    /// A head line ended by a bare LF: accepted, forwarded normalised.
    BareLf,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("fields", &self.fields)
            .field("body_len", &self.body.len())
            .field("chunked", &self.chunked)
            .field("spoiler", &self.spoiler)
            .finish()
    }
}

fn spoiler() -> impl Strategy<Value = Spoiler> {
    prop_oneof![
        3 => Just(Spoiler::None),
        1 => Just(Spoiler::BareLf),
        2 => proptest::sample::select(vec![
            "Connection: x-gone\r\nX-Gone: 1\r\n",
            "Keep-Alive: timeout=5\r\n",
            "Proxy-Authorization: Basic Zm9vOmJhcg==\r\n",
            "Upgrade: h2c\r\n",
            "X-Forwarded-For: 6.6.6.6\r\n",
            "Forwarded: for=6.6.6.6\r\n",
            "X-Real-IP: 6.6.6.6\r\n",
            "X-Request-Id: forged\r\n",
        ])
        .prop_map(Spoiler::Dropped),
        3 => proptest::sample::select(vec![
            "Host: hidden.tuna.test\r\n",
            "Content-Length: 0\r\nContent-Length: 0\r\n",
            "Content-Length: 1, 1\r\n",
            "Transfer-Encoding: gzip, chunked\r\n",
            "Connection: content-length\r\n",
            "Connection: host\r\n",
            "X-Folded: a\r\n b\r\n",
            "X-Space : a\r\n",
            "X-Nul: a\0b\r\n",
        ])
        .prop_map(Spoiler::Refused),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        proptest::sample::select(vec!["GET", "POST", "PUT", "DELETE"]),
        "/[a-z0-9/]{0,12}(\\?[a-z=&]{0,8})?",
        proptest::collection::vec(("x-[a-z]{1,8}", "[!-~]([ -~]{0,20}[!-~])?"), 0..5),
        proptest::collection::vec(any::<u8>(), 0..3000),
        proptest::option::of(proptest::collection::vec(1usize..700, 1..5)),
        spoiler(),
    )
        .prop_map(|(method, path, fields, body, chunked, spoiler)| Case {
            method,
            path,
            fields,
            body,
            chunked,
            spoiler,
        })
}

impl Case {
    fn bytes(&self) -> Vec<u8> {
        let mut head = format!(
            "{} {} HTTP/1.1\r\nHost: {PUBLIC}\r\n",
            self.method, self.path
        );
        for (k, v) in &self.fields {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        match self.spoiler {
            Spoiler::Dropped(s) | Spoiler::Refused(s) => head.push_str(s),
            Spoiler::BareLf => head.push_str("X-Bare: lf\n"),
            Spoiler::None => {}
        }
        let mut out;
        match &self.chunked {
            None => {
                head.push_str(&format!(
                    "Content-Length: {}\r\nConnection: close\r\n\r\n",
                    self.body.len()
                ));
                out = head.into_bytes();
                out.extend_from_slice(&self.body);
            }
            Some(sizes) => {
                head.push_str("Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
                out = head.into_bytes();
                let mut rest = &self.body[..];
                for size in sizes.iter().cycle() {
                    if rest.is_empty() {
                        break;
                    }
                    let n = (*size).min(rest.len());
                    out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                    out.extend_from_slice(&rest[..n]);
                    out.extend_from_slice(b"\r\n");
                    rest = &rest[n..];
                }
                out.extend_from_slice(b"0\r\n\r\n");
            }
        }
        out
    }

    /// The end-to-end fields the backend must see, sorted.
    fn expected_fields(&self) -> Vec<(String, String)> {
        let mut fields: Vec<(String, String)> = self
            .fields
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .collect();
        if let Spoiler::BareLf = self.spoiler {
            fields.push(("x-bare".into(), "lf".into()));
        }
        fields.sort();
        fields
    }
}

/// Fields the path itself sets or that describe framing.
const SET_BY_THE_PATH: [&str; 7] = [
    "host",
    "content-length",
    "transfer-encoding",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-request-id",
];

#[test]
fn every_request_arrives_exactly_as_the_policy_says_or_is_refused_at_the_edge() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let p = rt.block_on(path());
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 96,
        ..ProptestConfig::default()
    });
    runner
        .run(&case(), |case| {
            let raw = rt.block_on(send_raw(&p.edge, &case.bytes()));
            let text = String::from_utf8_lossy(&raw).into_owned();
            let st = status(&text);
            if let Spoiler::Refused(what) = case.spoiler {
                // Refused by the first hop, with its own page.
                prop_assert_eq!(st, 400, "{:?} was not refused: {}", what, text);
                prop_assert!(
                    text.contains("tuna edge"),
                    "refused past the edge: {}",
                    text
                );
                return Ok(());
            }
            prop_assert_eq!(st, 200, "{:?}: {}", case, text);
            let (_head, body) = response_parts(&raw);
            let split = body.windows(2).position(|w| w == b"\n\n").unwrap();
            let seen = String::from_utf8_lossy(&body[..split]).into_owned();
            let seen_body = &body[split + 2..];
            let mut lines = seen.lines();
            prop_assert_eq!(lines.next(), Some("backend: public"));
            let request_line = format!("{} {}", case.method, case.path);
            prop_assert_eq!(lines.next(), Some(request_line.as_str()));
            let mut got: Vec<(String, String)> = Vec::new();
            let mut host = None;
            let mut xff = None;
            for line in lines {
                let (k, v) = line.split_once(": ").unwrap_or((line, ""));
                match k {
                    "host" => host = Some(v.to_owned()),
                    "x-forwarded-for" => xff = Some(v.to_owned()),
                    _ if SET_BY_THE_PATH.contains(&k) => {}
                    _ => got.push((k.to_owned(), v.to_owned())),
                }
            }
            got.sort();
            prop_assert_eq!(host.as_deref(), Some(PUBLIC));
            prop_assert_eq!(xff.as_deref(), Some("127.0.0.1"));
            prop_assert_eq!(got, case.expected_fields());
            prop_assert_eq!(seen_body, &case.body[..]);
            Ok(())
        })
        .unwrap();
}
