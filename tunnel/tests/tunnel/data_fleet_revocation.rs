//! A revocation made on one replica closes a live tunnel on another: two
//! control planes on one real PostgreSQL store (started by the test), an
//! edge and an agent on replica B with traffic flowing, the token revoked
//! through replica A. The tunnel closes within the contract's bound, by the
//! same path a local revocation takes (the control plane's revocation
//! channel, fed by the store's change feed).

use crate::data_support;
use crate::pg_support;

use std::sync::Arc;

use data_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tuna_tunnel::agent::TunnelStatus;
use tuna_tunnel::api::{Bindings, CreateDomain, CreateTcpEndpoint, CreateToken, Scope};
use tuna_tunnel::control::{Caller, ControlConfig, ControlPlane};
use tuna_tunnel::edge::{EdgeConfig, EdgeServer};
use tuna_tunnel::wire::{Binding, ErrorCode};

/// Runs a blocking control-plane call (a PostgreSQL commit) off the runtime.
async fn blocking<T: Send + 'static>(op: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(op).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_revoked_on_replica_a_closes_its_tunnel_on_replica_b() {
    init();
    let cert = TestCert::new();
    let (tcp, tcp_port) = endpoint_listener();
    let server = blocking(pg_support::PgServer::start).await;
    let url = server.create_database();
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let open = |dir: &std::path::Path| {
        let mut config = ControlConfig::new(dir, "tuna.test", "127.0.0.1");
        config.store = Some(url.parse().unwrap());
        config.tcp_port_range = tcp_port..=tcp_port;
        move || ControlPlane::open(config).unwrap()
    };
    let replica_a = blocking(open(dirs.0.path())).await;
    let replica_b = blocking(open(dirs.1.path())).await;

    // Reservations and the token made through B, whose edge serves them.
    let owner = Caller {
        key_id: "test".into(),
        account: "default".into(),
        scopes: vec![Scope::Full],
    };
    let token = {
        let (plane, owner) = (replica_b.clone(), owner.clone());
        blocking(move || {
            let app = CreateDomain {
                subdomain: Some("app".into()),
                domain: None,
            };
            plane.create_domain(&owner, &app).unwrap();
            let db = CreateTcpEndpoint {
                alias: "db".into(),
                port: None,
            };
            plane.create_tcp_endpoint(&owner, &db).unwrap();
            let request = CreateToken {
                bindings: Bindings {
                    hosts: vec!["app.tuna.test".into()],
                    tcp_endpoints: vec!["db".into()],
                },
                ..Default::default()
            };
            plane.create_token(&owner, &request).unwrap()
        })
        .await
    };
    let mut config: EdgeConfig = edge_config(&cert, "127.0.0.1:0".parse().unwrap());
    config.tcp_ports = tcp_port..=tcp_port;
    config.tcp_listeners = vec![Arc::clone(&tcp)];
    let edge = EdgeServer::start(config, Arc::new(replica_b.clone()), None)
        .await
        .unwrap();
    let bindings = vec![Binding::http("app.tuna.test"), Binding::tcp("db")];
    let agent = start_agent(&cert, &edge, token.token.expose(), bindings).await;
    let tunnel = tunnel_id(token.token.expose());
    agent.serving(&tunnel).await.unwrap();
    let mut stream = TcpStream::connect(("127.0.0.1", tcp_port)).await.unwrap();
    stream.write_all(b"through replica B").await.unwrap();
    let mut back = [0u8; 17];
    stream.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"through replica B");

    // Revoked through A, which has no edge at all.
    let mut status = agent.tunnel_status(&tunnel).unwrap();
    let revoked_at = std::time::Instant::now();
    {
        let (plane, owner, id) = (replica_a.clone(), owner.clone(), token.id.clone());
        blocking(move || plane.revoke_token(&owner, &id).unwrap()).await;
    }
    let closed = tokio::time::timeout(
        std::time::Duration::from_millis(1500),
        status.wait_for(|s| matches!(s, TunnelStatus::Closed(_))),
    )
    .await
    .expect("the tunnel on replica B was not closed within the second")
    .unwrap()
    .clone();
    eprintln!(
        "the tunnel on replica B closed {:?} after the revocation on A",
        revoked_at.elapsed()
    );
    assert!(
        matches!(&closed, TunnelStatus::Closed(r) if r.code == ErrorCode::TokenRevoked),
        "{closed:?}"
    );
    let resp = http_client(&cert, &edge, &["app.tuna.test"])
        .get(http_url(&edge, "app.tuna.test", "/"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    edge.shutdown().await;
}
