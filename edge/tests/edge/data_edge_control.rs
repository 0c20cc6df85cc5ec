//! The data plane over the real control plane: reservations and a tunnel
//! token made through the REST API, an agent using that token, and an edge
//! restarted from the same data dir.

use crate::data_support;

use std::sync::Arc;

use data_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tuna_agent::client::{ClientOptions, TunaClient};
use tuna_agent::{AgentStatus, TunnelStatus};
use tuna_edge::control::cli::{CreateKeyArgs, DataDirArgs, KeysArgs, KeysCommand};
use tuna_edge::control::{ControlConfig, ControlPlane};
use tuna_edge::{EdgeConfig, EdgeHandle, EdgeServer};
use tuna_protocol::api::{Bindings, CreateDomain, CreateTcpEndpoint, CreateToken, Secret};
use tuna_protocol::wire::{Binding, ErrorCode};

pub(crate) fn full_access_key(dir: &std::path::Path) -> String {
    let args = KeysArgs {
        command: KeysCommand::Create(CreateKeyArgs {
            data_dir: DataDirArgs {
                data_dir: Some(dir.to_owned()),
                store: None,
                store_insecure_tls: false,
            },
            scopes: Vec::new(),
            full_access: true,
            name: Some("test".into()),
            account: "default".into(),
        }),
    };
    let (mut out, mut note) = (Vec::new(), Vec::new());
    tuna_edge::control::cli::run(&args, &mut out, &mut note).unwrap();
    String::from_utf8(out).unwrap().trim().to_owned()
}

pub(crate) fn open_plane(dir: &std::path::Path, tcp_port: u16) -> ControlPlane {
    let mut config = ControlConfig::new(dir, "tuna.test", "127.0.0.1");
    config.tcp_port_range = tcp_port..=tcp_port;
    ControlPlane::open(config).unwrap()
}

pub(crate) async fn start(
    cert: &TestCert,
    plane: &ControlPlane,
    agent_addr: std::net::SocketAddr,
    tcp: &Arc<std::net::TcpListener>,
) -> EdgeHandle {
    let tcp_port = tcp.local_addr().unwrap().port();
    let mut config: EdgeConfig = edge_config(cert, agent_addr);
    config.tcp_ports = tcp_port..=tcp_port;
    // The test holds the endpoint's socket across the restart: no port race.
    config.tcp_listeners = vec![Arc::clone(tcp)];
    config.api_addr = Some("127.0.0.1:0".parse().unwrap());
    EdgeServer::start(config, Arc::new(plane.clone()), Some(plane.router()))
        .await
        .unwrap()
}

async fn assert_traffic(cert: &TestCert, edge: &EdgeHandle, tcp_port: u16, path: &str) {
    let client = http_client(cert, edge, &["app.tuna.test"]);
    let text = client
        .get(http_url(edge, "app.tuna.test", path))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.starts_with("host=app.tuna.test") && text.contains(&format!("path={path} ")),
        "{text}"
    );
    let mut tcp = TcpStream::connect(("127.0.0.1", tcp_port)).await.unwrap();
    tcp.write_all(b"over the reserved endpoint").await.unwrap();
    let mut back = [0u8; 26];
    tcp.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"over the reserved endpoint");
}

#[tokio::test]
async fn reservations_and_tokens_from_the_api_open_tunnels_across_an_edge_restart() {
    init();
    let cert = TestCert::new();
    let dir = tempfile::tempdir().unwrap();
    let (tcp, tcp_port) = endpoint_listener();
    let key = full_access_key(dir.path());

    let plane = open_plane(dir.path(), tcp_port);
    let edge = start(&cert, &plane, "127.0.0.1:0".parse().unwrap(), &tcp).await;
    let api = TunaClient::new(ClientOptions::new(
        format!("http://{}", edge.api_addr.unwrap()),
        Secret::new(key.clone()),
    ))
    .unwrap();
    let domain = api
        .create_domain(&CreateDomain {
            subdomain: Some("app".into()),
            domain: None,
        })
        .await
        .unwrap();
    let endpoint = api
        .create_tcp_endpoint(&CreateTcpEndpoint {
            alias: "db".into(),
            port: None,
        })
        .await
        .unwrap();
    assert_eq!(endpoint.port, tcp_port);
    let created = api
        .create_token(&CreateToken {
            bindings: Bindings {
                hosts: vec![domain.name.clone()],
                tcp_endpoints: vec!["db".into()],
                addresses: Vec::new(),
            },
            ..Default::default()
        })
        .await
        .unwrap();

    let bindings = vec![Binding::http("app.tuna.test"), Binding::tcp("db")];
    let agent = start_agent(&cert, &edge, created.token.expose(), bindings).await;
    let first = agent.connected().await.unwrap();
    assert_traffic(&cert, &edge, tcp_port, "/before").await;

    // Kill the edge, reopen the same data dir, listen on the same agent address.
    let agent_addr = edge.agent_addr;
    edge.shutdown().await;
    drop(plane);
    let plane = open_plane(dir.path(), tcp_port);
    let edge = start(&cert, &plane, agent_addr, &tcp).await;
    wait_status(
        &agent,
        |s| matches!(s, AgentStatus::Connected { session_id } if *session_id != first),
    )
    .await;
    assert_traffic(&cert, &edge, tcp_port, "/after").await;

    // Reservations and tokens survived; revoking through the API closes the session.
    let api = TunaClient::new(ClientOptions::new(
        format!("http://{}", edge.api_addr.unwrap()),
        Secret::new(key),
    ))
    .unwrap();
    assert_eq!(api.get_tcp_endpoint("db").await.unwrap().port, tcp_port);
    api.revoke_token(&created.id).await.unwrap();
    let tunnel = tunnel_id(created.token.expose());
    let status = wait_tunnel(&agent, &tunnel, |s| matches!(s, TunnelStatus::Closed(_))).await;
    assert!(
        matches!(&status, TunnelStatus::Closed(r) if r.code == ErrorCode::TokenRevoked),
        "{status:?}"
    );
    let resp = http_client(&cert, &edge, &["app.tuna.test"])
        .get(http_url(&edge, "app.tuna.test", "/"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
}

/// An edge over a fresh control plane holding `app.tuna.test` and TCP
/// endpoint `db`, with an agent attached by a token minted by a
/// `tunnels:connect` key; returns what the tests need.
struct Published {
    _dir: tempfile::TempDir,
    cert: TestCert,
    _plane: ControlPlane,
    edge: EdgeHandle,
    admin: TunaClient,
    minter_id: String,
    tcp_port: u16,
    agent: tuna_agent::AgentHandle,
    tunnel: String,
}

async fn publish() -> Published {
    init();
    let cert = TestCert::new();
    let dir = tempfile::tempdir().unwrap();
    let (tcp, tcp_port) = endpoint_listener();
    let key = full_access_key(dir.path());
    let plane = open_plane(dir.path(), tcp_port);
    let edge = start(&cert, &plane, "127.0.0.1:0".parse().unwrap(), &tcp).await;
    let admin = TunaClient::new(ClientOptions::new(
        format!("http://{}", edge.api_addr.unwrap()),
        Secret::new(key),
    ))
    .unwrap();
    admin
        .create_domain(&CreateDomain {
            subdomain: Some("app".into()),
            domain: None,
        })
        .await
        .unwrap();
    admin
        .create_tcp_endpoint(&CreateTcpEndpoint {
            alias: "db".into(),
            port: None,
        })
        .await
        .unwrap();
    let minter = admin
        .create_key(&tuna_protocol::api::CreateApiKey {
            name: None,
            scopes: vec![tuna_protocol::api::Scope::TunnelsConnect],
        })
        .await
        .unwrap();
    let minting = TunaClient::new(ClientOptions::new(
        format!("http://{}", edge.api_addr.unwrap()),
        minter.key.clone(),
    ))
    .unwrap();
    let created = minting
        .create_token(&CreateToken {
            bindings: Bindings {
                hosts: vec!["app.tuna.test".into()],
                tcp_endpoints: vec!["db".into()],
                addresses: Vec::new(),
            },
            ..Default::default()
        })
        .await
        .unwrap();
    let bindings = vec![Binding::http("app.tuna.test"), Binding::tcp("db")];
    let agent = start_agent(&cert, &edge, created.token.expose(), bindings).await;
    let tunnel = tunnel_id(created.token.expose());
    agent.serving(&tunnel).await.unwrap();
    assert_traffic(&cert, &edge, tcp_port, "/up").await;
    Published {
        _dir: dir,
        cert,
        _plane: plane,
        edge,
        admin,
        minter_id: minter.info.id,
        tcp_port,
        agent,
        tunnel,
    }
}

/// The tunnel is closed with `code` within a second (the contract's bound
/// for revocations; the edge's periodic re-check would take 10 s).
async fn closed_with(p: &Published, code: ErrorCode) {
    let mut rx = p.agent.tunnel_status(&p.tunnel).unwrap();
    let status = tokio::time::timeout(
        std::time::Duration::from_millis(1500),
        rx.wait_for(|s| matches!(s, TunnelStatus::Closed(_))),
    )
    .await
    .expect("the tunnel was not closed within the second")
    .unwrap()
    .clone();
    assert!(
        matches!(&status, TunnelStatus::Closed(r) if r.code == code),
        "{status:?}"
    );
}

/// The public TCP port no longer reaches the agent: the connection is
/// closed without an echo.
async fn tcp_not_forwarded(port: u16) {
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let _ = tcp.write_all(b"anyone there?").await;
    let mut back = Vec::new();
    let read = tokio::time::timeout(HANG_GUARD, tcp.read_to_end(&mut back)).await;
    assert!(
        matches!(read, Ok(Ok(_)) | Ok(Err(_))) && back.is_empty(),
        "the released port still forwards: {read:?} {back:?}"
    );
}

#[tokio::test]
async fn deleting_a_domain_unbinds_it_at_once() {
    let p = publish().await;
    p.admin.delete_domain("app.tuna.test").await.unwrap();
    closed_with(&p, ErrorCode::BindingReleased).await;
    let resp = http_client(&p.cert, &p.edge, &["app.tuna.test"])
        .get(http_url(&p.edge, "app.tuna.test", "/"))
        .send()
        .await
        .unwrap();
    assert_ne!(
        resp.status(),
        200,
        "the released host still reaches the agent"
    );
    tcp_not_forwarded(p.tcp_port).await;
}

#[tokio::test]
async fn deleting_a_tcp_endpoint_unbinds_its_port_at_once() {
    let p = publish().await;
    p.admin.delete_tcp_endpoint("db").await.unwrap();
    closed_with(&p, ErrorCode::BindingReleased).await;
    tcp_not_forwarded(p.tcp_port).await;
}

#[tokio::test]
async fn revoking_the_minting_key_closes_the_tunnels_of_its_tokens() {
    let p = publish().await;
    p.admin.revoke_key(&p.minter_id).await.unwrap();
    closed_with(&p, ErrorCode::TokenRevoked).await;
    tcp_not_forwarded(p.tcp_port).await;
}
