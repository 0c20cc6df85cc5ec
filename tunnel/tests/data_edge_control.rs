//! The data plane over the real control plane: reservations and a tunnel
//! token made through the REST API, an agent using that token, and an edge
//! restarted from the same data dir.

mod data_support;

use std::sync::Arc;

use data_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tuna_tunnel::agent::{AgentStatus, TunnelStatus};
use tuna_tunnel::api::{
    Bindings, ClientOptions, CreateDomain, CreateTcpEndpoint, CreateToken, Secret, TunaClient,
};
use tuna_tunnel::control::cli::{CreateKeyArgs, DataDirArgs, KeysArgs, KeysCommand};
use tuna_tunnel::control::{ControlConfig, ControlPlane};
use tuna_tunnel::edge::{EdgeConfig, EdgeHandle, EdgeServer};
use tuna_tunnel::wire::{Binding, ErrorCode};

fn full_access_key(dir: &std::path::Path) -> String {
    let args = KeysArgs {
        command: KeysCommand::Create(CreateKeyArgs {
            data_dir: DataDirArgs {
                data_dir: dir.to_owned(),
            },
            scopes: Vec::new(),
            full_access: true,
            name: Some("test".into()),
            account: "default".into(),
        }),
    };
    let (mut out, mut note) = (Vec::new(), Vec::new());
    tuna_tunnel::control::cli::run(&args, &mut out, &mut note).unwrap();
    String::from_utf8(out).unwrap().trim().to_owned()
}

fn open_plane(dir: &std::path::Path, tcp_port: u16) -> ControlPlane {
    let mut config = ControlConfig::new(dir, "tuna.test", "127.0.0.1");
    config.tcp_port_range = tcp_port..=tcp_port;
    ControlPlane::open(config).unwrap()
}

async fn start(
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
