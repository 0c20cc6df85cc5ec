//! Benchmark of the connector proxy: `kubectl`-shaped GETs through it
//! against the same GETs straight to the API server, in one run. Run by
//! `benches/connector.sh` (release build); figures in `benches/README.md`.
//!
//! ```text
//! connector_bench [--seconds 5] [--connections 16] [--fresh-connections 4]
//! ```
//!
//! In one process, on loopback:
//! - the **API server** is a rustls HTTPS server with its own CA answering
//!   every GET with a canned `meta.k8s.io/v1` Table of 20 pods (7.4 KB), as
//!   `kubectl get pods` receives it — a fixed answer, so that what differs
//!   between the two paths is the proxy alone;
//! - the **proxy** is the connectors role's: the proxy core's CONNECT
//!   listener with the real `KubeAuthorizer` (TokenReview against a real
//!   control plane as the operator's cluster — `scripts/test-cluster.sh`,
//!   Kubernetes `TUNA_TEST_K8S` or 1.37 —, cached as in production) and a
//!   target published as the reconciler publishes it;
//! - the **client** is reqwest (HTTP/1.1, like kubectl through a proxy),
//!   sending kubectl's headers (`Accept` for a Table, `User-Agent`,
//!   `Kubectl-Command`, `Authorization: Bearer fake-token` — replaced by the
//!   proxy — or the real token when direct).
//!
//! Three scenarios, each direct then through the proxy:
//! 1. one keep-alive connection, requests back to back: the added latency;
//! 2. `--connections` keep-alive connections: requests per second;
//! 3. `--fresh-connections` clients opening a connection per request (each
//!    `kubectl` command does): CONNECT, TokenReview (cached), two TLS
//!    handshakes (client–proxy; the proxy's upstream connections are pooled).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use tokio::net::TcpListener;

#[path = "support/test_cluster.rs"]
mod test_cluster;
use test_cluster::TestCluster;
use tuna_operator::connectors::authorizer::KubeAuthorizer;
use tuna_operator::connectors::targets::{ProxyTarget, ProxyTargets};
use tuna_proxy::{
    Authority, ConnectConfig, ConnectLimits, Credential, InterceptCa, ProxyConfig, ProxyCore,
    UpstreamTarget,
};

// The allocator of the tuna-operator binary (the proxy's, in production).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ACCEPT: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
const AUDIENCE: &str = "connectors.alauda.io";

struct Args {
    seconds: u64,
    connections: usize,
    fresh: usize,
}

fn args() -> Args {
    let mut out = Args {
        seconds: 5,
        connections: 16,
        fresh: 4,
    };
    let mut a = std::env::args().skip(1);
    while let Some(flag) = a.next() {
        let value: u64 = a
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{flag} needs a number"));
        match flag.as_str() {
            "--seconds" => out.seconds = value,
            "--connections" => out.connections = value as usize,
            "--fresh-connections" => out.fresh = value as usize,
            "--bench" => {}
            other => panic!("unknown flag {other}"),
        }
    }
    out
}

/// A Table of 20 pods, as `kubectl get pods` is answered.
fn pods_table() -> Bytes {
    let rows: Vec<serde_json::Value> = (0..20)
        .map(|i| {
            serde_json::json!({
                "cells": [format!("web-7d4f9-{i:05}"), "1/1", "Running", 0, "3d"],
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                    "metadata": {"name": format!("web-7d4f9-{i:05}"), "namespace": "default",
                        "uid": format!("8f1c2a5e-0000-4000-8000-{i:012}"), "resourceVersion": "123456",
                        "creationTimestamp": "2026-11-28T10:00:00Z",
                        "labels": {"app": "web", "pod-template-hash": "7d4f9"}}}
            })
        })
        .collect();
    let table = serde_json::json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": "123456"},
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "priority": 0},
            {"name": "Ready", "type": "string", "priority": 0},
            {"name": "Status", "type": "string", "priority": 0},
            {"name": "Restarts", "type": "string", "priority": 0},
            {"name": "Age", "type": "string", "priority": 0}
        ],
        "rows": rows
    });
    Bytes::from(serde_json::to_vec(&table).unwrap())
}

/// Connections the API server stand-in accepted.
static ACCEPTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The API server stand-in: HTTPS with its own CA; returns its CA (DER, PEM).
async fn api_server(body: Bytes) -> (SocketAddr, Vec<u8>, String) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            ACCEPTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let body = body.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |_req| {
                    let body = body.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            hyper::Response::builder()
                                .header("content-type", "application/json")
                                .header("audit-id", "2b1f2c3d-0000-4000-8000-000000000000")
                                .header("cache-control", "no-cache, private")
                                .header("x-kubernetes-pf-flowschema-uid", "0")
                                .body(http_body_util::Full::new(body))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    (addr, ca.der().to_vec(), ca.pem())
}

#[derive(Clone)]
struct Route {
    client: reqwest::Client,
    url: String,
    token: &'static str,
}

fn client(ca_pem: &str, proxy: Option<(SocketAddr, &str)>, keep_alive: bool) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap()])
        .http1_only()
        .user_agent("kubectl/v1.32.4 (linux/amd64) kubernetes/59526cd");
    b = match proxy {
        Some((addr, password)) => b.proxy(
            reqwest::Proxy::https(format!("http://{addr}"))
                .unwrap()
                .basic_auth("demo/conn", password),
        ),
        None => b.no_proxy(),
    };
    if !keep_alive {
        b = b.pool_max_idle_per_host(0);
    }
    b.build().unwrap()
}

async fn get(route: &Route) {
    let resp = route
        .client
        .get(&route.url)
        .header("accept", ACCEPT)
        .header("kubectl-command", "kubectl get")
        .header("kubectl-session", "6c1d7a4e-5c2b-4f7a-9d0e-3b8a1f2e4c5d")
        .bearer_auth(route.token)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    let body = resp.bytes().await.expect("body");
    assert!(body.len() > 4096, "the Table arrives whole");
}

struct Figures {
    requests: usize,
    seconds: f64,
    latencies: Vec<Duration>,
    /// Connections the API server accepted during the run.
    connections: usize,
}

impl Figures {
    fn rate(&self) -> f64 {
        self.requests as f64 / self.seconds
    }
    fn percentile(&self, p: f64) -> Duration {
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i]
    }
}

/// `workers` loops of GETs for `seconds`; each worker has its own client
/// (its own connection when keep-alive).
async fn run(routes: Vec<Route>, seconds: u64) -> Figures {
    let accepted = || ACCEPTED.load(std::sync::atomic::Ordering::Relaxed);
    let accepted_before = accepted();
    // Warm-up: connections, the proxy's upstream pool, the review cache.
    for r in &routes {
        get(r).await;
    }
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let tasks: Vec<_> = routes
        .into_iter()
        .map(|route| {
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    get(&route).await;
                    latencies.push(t.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    let seconds = started.elapsed().as_secs_f64();
    latencies.sort();
    Figures {
        requests: latencies.len(),
        seconds,
        latencies,
        connections: accepted() - accepted_before,
    }
}

fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

fn report(name: &str, direct: &Figures, proxied: &Figures) {
    println!(
        "| {name} | {:.0} | {:.0} | {:.2}× | {} / {} | {} / {} | +{} / +{} | {} / {} |",
        direct.rate(),
        proxied.rate(),
        direct.rate() / proxied.rate(),
        micros(direct.percentile(0.5)),
        micros(direct.percentile(0.99)),
        micros(proxied.percentile(0.5)),
        micros(proxied.percentile(0.99)),
        micros(
            proxied
                .percentile(0.5)
                .saturating_sub(direct.percentile(0.5))
        ),
        micros(
            proxied
                .percentile(0.99)
                .saturating_sub(direct.percentile(0.99))
        ),
        direct.connections,
        proxied.connections,
    );
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = args();
    let body = pods_table();
    let (api, api_ca_der, api_ca_pem) = api_server(body.clone()).await;

    // The operator's cluster: a ServiceAccount token for the proxy's audience.
    let operator_dir = tempfile::tempdir().unwrap();
    let version = std::env::var("TUNA_TEST_K8S").unwrap_or_else(|_| "1.37".into());
    // Declared after its directory: dropped (stopped) before the directory goes.
    let operator = TestCluster::start(&version, operator_dir.path());
    let admin = operator.client().await;
    let namespace: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "demo"}})).unwrap();
    Api::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "bench"}})).unwrap();
    Api::<ServiceAccount>::namespaced(admin.clone(), "demo")
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let issued = Api::<ServiceAccount>::namespaced(admin.clone(), "demo")
        .create_token_request(
            "bench",
            &PostParams::default(),
            &TokenRequest {
                spec: TokenRequestSpec {
                    audiences: vec![AUDIENCE.into()],
                    expiration_seconds: Some(3600),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let sa_token: &'static str = Box::leak(issued.status.unwrap().token.into_boxed_str());

    // The proxy, with the target the reconciler would publish.
    let targets = Arc::new(ProxyTargets::default());
    targets.set(
        "demo",
        "conn",
        Ok(ProxyTarget {
            uid: "bench".into(),
            authorities: vec![Authority {
                host: "127.0.0.1".into(),
                port: api.port(),
            }],
            upstream: Arc::new(
                UpstreamTarget::new(vec![api], "127.0.0.1", Some(vec![api_ca_der])).unwrap(),
            ),
            authorization: Credential::new("Bearer the-real-token"),
        }),
    );
    let ca = InterceptCa::generate("bench proxy CA").unwrap();
    let core = ProxyCore::new(ProxyConfig::default());
    let proxy = core
        .add_connect_listener(
            "127.0.0.1:0".parse().unwrap(),
            ConnectConfig {
                authorizer: Arc::new(KubeAuthorizer::new(admin, targets, AUDIENCE.into())),
                ca: Arc::new(InterceptCa::from_pem(&ca).unwrap()),
                limits: ConnectLimits::default(),
            },
        )
        .await
        .unwrap();

    let url = format!("https://{api}/api/v1/namespaces/default/pods?limit=500");
    let direct = |keep_alive| Route {
        client: client(&api_ca_pem, None, keep_alive),
        url: url.clone(),
        token: "the-real-token",
    };
    let proxied = |keep_alive| Route {
        client: client(&ca.cert_pem, Some((proxy, sa_token)), keep_alive),
        url: url.clone(),
        token: "fake-token",
    };
    println!(
        "== connector proxy vs direct, {} s per run, {} cores, load {}, response {} bytes",
        args.seconds,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        body.len()
    );
    println!(
        "| scenario | direct req/s | proxied req/s | direct / proxied | direct p50 / p99 | proxied p50 / p99 | added p50 / p99 | API server connections direct / proxied |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let one_direct = run(vec![direct(true)], args.seconds).await;
    let one_proxied = run(vec![proxied(true)], args.seconds).await;
    report("1 keep-alive connection", &one_direct, &one_proxied);
    let many_direct = run(
        (0..args.connections).map(|_| direct(true)).collect(),
        args.seconds,
    )
    .await;
    let many_proxied = run(
        (0..args.connections).map(|_| proxied(true)).collect(),
        args.seconds,
    )
    .await;
    report(
        &format!("{} keep-alive connections", args.connections),
        &many_direct,
        &many_proxied,
    );
    let fresh_direct = run(
        (0..args.fresh).map(|_| direct(false)).collect(),
        args.seconds,
    )
    .await;
    let fresh_proxied = run(
        (0..args.fresh).map(|_| proxied(false)).collect(),
        args.seconds,
    )
    .await;
    report(
        &format!("{} clients, a new connection per request", args.fresh),
        &fresh_direct,
        &fresh_proxied,
    );
    let metrics = core.render_metrics();
    let granted = metrics
        .lines()
        .find(|l| l.starts_with("tuna_proxy_connect_requests_total{outcome=\"granted\"}"))
        .unwrap_or("");
    println!("proxy: {granted}");
}
