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

/// A TCP forwarder to the database that can be cut: the stand-in for a
/// network partition between a replica and its store. Cut, it drops every
/// connection it carries and every new one.
struct Forwarder {
    port: u16,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Forwarder {
    async fn start(to: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, watch) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if *watch.borrow() {
                    continue;
                }
                let mut watch = watch.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(("127.0.0.1", to)).await else {
                        return;
                    };
                    tokio::select! {
                        _ = watch.wait_for(|cut| *cut) => {}
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                    }
                });
            }
        });
        Self { port, cut }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

/// Item 4 of issue 21, with a TCP forwarder standing in for the partition:
/// a replica whose store is out of reach for longer than the revocation
/// bound refuses new agent sessions (`unavailable`, retried by the agent)
/// instead of judging them on a stale copy, while its open tunnels keep
/// serving; once the store is back it accepts them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_the_store_by_a_cut_forwarder_refuses_new_sessions() {
    use tuna_tunnel::agent::AgentStatus;
    init();
    let cert = TestCert::new();
    let (tcp, tcp_port) = endpoint_listener();
    let server = blocking(pg_support::PgServer::start).await;
    let url = server.create_database();
    let forwarder = Forwarder::start(server.port()).await;
    let via = url.replace(
        &format!(":{}/", server.port()),
        &format!(":{}/", forwarder.port),
    );
    assert_ne!(via, url);
    let dir = tempfile::tempdir().unwrap();
    let replica = {
        let mut config = ControlConfig::new(dir.path(), "tuna.test", "127.0.0.1");
        config.store = Some(via.parse().unwrap());
        config.tcp_port_range = tcp_port..=tcp_port;
        blocking(move || ControlPlane::open(config).unwrap()).await
    };
    let owner = Caller {
        key_id: "test".into(),
        account: "default".into(),
        scopes: vec![Scope::Full],
    };
    let mint = |alias: &'static str| {
        let (plane, owner) = (replica.clone(), owner.clone());
        blocking(move || {
            plane
                .create_tcp_endpoint(
                    &owner,
                    &CreateTcpEndpoint {
                        alias: alias.into(),
                        port: None,
                    },
                )
                .ok();
            let request = CreateToken {
                bindings: Bindings {
                    hosts: Vec::new(),
                    tcp_endpoints: vec![alias.into()],
                },
                ..Default::default()
            };
            plane.create_token(&owner, &request).unwrap()
        })
    };
    let open = mint("db").await;
    let later = {
        let (plane, owner) = (replica.clone(), owner.clone());
        blocking(move || {
            let request = CreateToken {
                bindings: Bindings {
                    hosts: vec![],
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
    let edge = EdgeServer::start(config, Arc::new(replica.clone()), None)
        .await
        .unwrap();
    let agent = start_agent(&cert, &edge, open.token.expose(), vec![Binding::tcp("db")]).await;
    agent
        .serving(&tunnel_id(open.token.expose()))
        .await
        .unwrap();

    forwarder.set_cut(true);
    let cut_at = std::time::Instant::now();
    // Once the copy is older than the bound, a new session is refused as
    // unavailable (and retried by the agent with its backoff).
    while replica.store_staleness() <= std::time::Duration::from_secs(1) {
        assert!(
            cut_at.elapsed() < std::time::Duration::from_secs(30),
            "the copy stays fresh with the store cut off"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let second = start_agent(&cert, &edge, later.token.expose(), vec![Binding::tcp("db")]).await;
    let refused = wait_status(
        &second,
        |s| matches!(s, AgentStatus::Rejected(r) if r.code == ErrorCode::Unavailable),
    )
    .await;
    eprintln!(
        "cut off from the store: new sessions refused {:?} after the cut: {refused:?}",
        cut_at.elapsed()
    );
    // The open tunnel keeps serving meanwhile.
    let mut stream = TcpStream::connect(("127.0.0.1", tcp_port)).await.unwrap();
    stream.write_all(b"still serving").await.unwrap();
    let mut back = [0u8; 13];
    stream.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"still serving");

    forwarder.set_cut(false);
    let healed = std::time::Instant::now();
    second
        .serving(&tunnel_id(later.token.expose()))
        .await
        .unwrap();
    eprintln!(
        "store reachable again: the refused session was accepted {:?} later",
        healed.elapsed()
    );
    edge.shutdown().await;
}
