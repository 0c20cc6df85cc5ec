//! Standalone mode against a remote edge (`--edge-api/--edge-agent/--api-key-file`):
//! the self-hosted edge of `tuna-edge` (control plane + data plane) runs in
//! this test; the standalone process reserves the Domain and TCP endpoint through
//! the REST API, mints one token per tunnel, and serves through the edge.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tuna_agent::client::{ClientOptions, TunaClient};
use tuna_edge::control::{ControlConfig, ControlPlane, DEFAULT_ACCOUNT};
use tuna_edge::{EdgeConfig, EdgeServer};
use tuna_operator::standalone::{RemoteEdge, Standalone, StandaloneConfig};
use tuna_protocol::api::Scope;

const WAIT: Duration = Duration::from_secs(15);

async fn http_backend(body: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(response.as_bytes()).await;
            });
        }
    });
    addr
}

async fn echo_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_through_a_remote_edge_and_cleans_up_tokens() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (web, echo) = (http_backend("hello from web").await, echo_backend().await);

    // The remote edge: control plane with its REST API (plain text on loopback) and data plane.
    let edge_dir = tempfile::tempdir().unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut control_config = ControlConfig::new(edge_dir.path(), "tuna.test", "tuna.test");
    control_config.tcp_port_range = tcp..=tcp;
    let control = ControlPlane::open(control_config).unwrap();
    let (_, key) = control
        .create_key(
            DEFAULT_ACCOUNT,
            Some("standalone".into()),
            vec![Scope::Full],
        )
        .unwrap();
    let identity =
        tuna_edge::tls::self_signed_identity(edge_dir.path(), &["tuna.test".into()]).unwrap();
    let ca_file = identity.ca_file.clone().unwrap();
    let mut edge_config = EdgeConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        tuna_edge::tls::server_config(&identity, &[]).unwrap(),
    );
    edge_config.http_addr = Some("127.0.0.1:0".parse().unwrap());
    edge_config.api_addr = Some("127.0.0.1:0".parse().unwrap());
    edge_config.tcp_bind_ip = "127.0.0.1".parse().unwrap();
    edge_config.tcp_ports = tcp..=tcp;
    let router = control.router();
    let edge = EdgeServer::start(edge_config, Arc::new(control), Some(router))
        .await
        .unwrap();
    let api_url = format!("http://{}", edge.api_addr.unwrap());

    // The standalone process with manifests naming hosts under the edge's base domain.
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("m");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(
        manifests.join("all.yaml"),
        format!(
            r#"apiVersion: v1
kind: Service
metadata: {{name: web}}
spec: {{type: ExternalName, externalName: 127.0.0.1, ports: [{{port: {web}}}]}}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Domain
metadata: {{name: shop}}
spec: {{subdomain: shop}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: shop}}
spec:
  ingressClassName: tuna
  rules:
  - host: shop.tuna.test
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: {web}}}}}}}}}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: TCPEndpoint
metadata: {{name: echo}}
spec: {{alias: echo}}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Tunnel
metadata: {{name: echo}}
spec: {{protocol: tcp, portOrAlias: echo, upstream: {{url: "tcp://127.0.0.1:{echo}"}}}}
"#,
            web = web.port(),
            echo = echo.port()
        ),
    )
    .unwrap();
    let mut config = StandaloneConfig::new(vec![manifests], dir.path().join("state"));
    config.base_domain = "tuna.test".into();
    config.remote = Some(RemoteEdge {
        api_url: api_url.clone(),
        agent_addr: edge.agent_addr.to_string(),
        api_key: key.clone(),
        ca_file: Some(ca_file),
    });
    let standalone = tokio::time::timeout(WAIT, Standalone::start(config.clone()))
        .await
        .expect("start in time")
        .unwrap();
    let report = standalone.report().await;
    assert!(!report.contains("Skipped"), "{report}");

    // HTTP through the remote edge's public listener.
    let client = reqwest::Client::builder()
        .resolve("shop.tuna.test", edge.http_addr.unwrap())
        .build()
        .unwrap();
    let url = format!("http://shop.tuna.test:{}/", edge.http_addr.unwrap().port());
    let body = client.get(&url).send().await.unwrap().text().await.unwrap();
    assert_eq!(body, "hello from web");

    // TCP through the endpoint the edge allocated.
    let addr = standalone
        .tcp_address("default/echo")
        .await
        .expect("tcp address");
    assert_eq!(addr.port(), tcp);
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"ping").await.unwrap();
    let mut got = [0u8; 4];
    tokio::time::timeout(WAIT, conn.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got, b"ping");

    // The edge holds the reservations and one labelled token per tunnel.
    let api = TunaClient::new(ClientOptions::new(api_url, key)).unwrap();
    let domains: Vec<String> = api
        .list_domains()
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert_eq!(domains, ["shop.tuna.test"]);
    let tokens = api.list_tokens("").await.unwrap();
    assert_eq!(
        tokens.iter().filter(|t| !t.expired).count(),
        2,
        "{tokens:?}"
    );
    assert!(
        tokens
            .iter()
            .all(|t| t.info.labels.contains_key("tuna.am/owner")),
        "{tokens:?}"
    );

    // Removing the Domain and its Ingress from the files closes that tunnel,
    // revokes its token and releases the domain (reclaimPolicy Delete, not adopted).
    let mut generation = standalone.generation();
    let before = *generation.borrow_and_update();
    let file = dir.path().join("m/all.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let kept: Vec<&str> = text
        .split("---\n")
        .filter(|doc| !doc.contains("kind: Domain") && !doc.contains("kind: Ingress"))
        .collect();
    std::fs::write(&file, kept.join("---\n")).unwrap();
    tokio::time::timeout(WAIT, generation.wait_for(|g| *g > before))
        .await
        .expect("change applied")
        .unwrap();
    assert!(
        api.list_domains().await.unwrap().is_empty(),
        "the domain was released"
    );
    let live = api
        .list_tokens("")
        .await
        .unwrap()
        .into_iter()
        .filter(|t| !t.expired)
        .count();
    assert_eq!(live, 1, "only the tcp tunnel's token is left");

    // A crash leaves the token behind; the next start of the same instance
    // (same data dir) revokes it before minting new ones.
    drop(standalone);
    let orphans = api
        .list_tokens("")
        .await
        .unwrap()
        .into_iter()
        .filter(|t| !t.expired)
        .count();
    assert_eq!(orphans, 1, "a dropped (crashed) process revokes nothing");
    let standalone = tokio::time::timeout(WAIT, Standalone::start(config.clone()))
        .await
        .expect("restart in time")
        .unwrap();
    let live: Vec<_> = api
        .list_tokens("")
        .await
        .unwrap()
        .into_iter()
        .filter(|t| !t.expired)
        .collect();
    assert_eq!(
        live.len(),
        1,
        "the orphan was revoked and one new token minted: {live:?}"
    );

    // Shutdown revokes the rest.
    standalone.shutdown().await;
    let live: Vec<_> = api
        .list_tokens("")
        .await
        .unwrap()
        .into_iter()
        .filter(|t| !t.expired)
        .collect();
    assert!(live.is_empty(), "tokens left after shutdown: {live:?}");
    edge.shutdown().await;
}
