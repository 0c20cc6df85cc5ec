//! A TCP port stays with its owner: two tenants of one account (tokens with
//! different `k8s.tuna.am/namespace` owner labels) over the real control
//! plane and edge. team-b serves its endpoint `pg`; team-a names the same
//! port by number and by alias and is refused, while every public connection
//! keeps reaching team-b's backend; a renewed team-b token takes the port over
//! as before.

use std::collections::BTreeMap;

use crate::data_edge_control::{full_access_key, open_plane, start};
use crate::data_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tuna_agent::client::{ClientOptions, TunaClient};
use tuna_agent::{AgentHandle, TunnelStatus};
use tuna_edge::EdgeHandle;
use tuna_protocol::api::{Bindings, CreateTcpEndpoint, CreateToken, Secret};
use tuna_protocol::mux::MuxStream;
use tuna_protocol::wire::{Binding, ErrorCode, StreamMeta};

/// Owner labels as the operator's agent writes them (src/agent/state.rs).
fn labels(namespace: &str, name: &str, agent: &str) -> BTreeMap<String, String> {
    [
        ("k8s.tuna.am/cluster", "c1"),
        ("k8s.tuna.am/namespace", namespace),
        ("k8s.tuna.am/kind", "Tunnel"),
        ("k8s.tuna.am/name", name),
        ("k8s.tuna.am/agent", agent),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

async fn mint(api: &TunaClient, labels: BTreeMap<String, String>, endpoint: &str) -> String {
    api.create_token(&CreateToken {
        labels,
        bindings: Bindings {
            hosts: Vec::new(),
            tcp_endpoints: vec![endpoint.to_owned()],
            addresses: Vec::new(),
        },
        ..Default::default()
    })
    .await
    .unwrap()
    .token
    .expose()
    .to_owned()
}

/// A backend that answers every TCP connection with `banner` and closes.
fn banner(banner: &'static str) -> impl Fn(MuxStream, StreamMeta) + Send + Sync + 'static {
    move |mut stream: MuxStream, _meta: StreamMeta| {
        tokio::spawn(async move {
            let _ = stream.write_all(banner.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// Opens `n` connections to the public port, one after another, and
/// returns each one's banner.
async fn banners(port: u16, n: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut back = Vec::new();
        tokio::time::timeout(HANG_GUARD, tcp.read_to_end(&mut back))
            .await
            .expect("the public connection hung")
            .unwrap();
        out.push(String::from_utf8(back).unwrap());
    }
    out
}

async fn attach(
    cert: &TestCert,
    edge: &EdgeHandle,
    token: &str,
    binding: Binding,
    who: &'static str,
) -> (AgentHandle, TunnelStatus) {
    let agent = start_tunnel(cert, edge, token, vec![binding], banner(who)).await;
    let status = wait_tunnel(&agent, &tunnel_id(token), |s| {
        matches!(
            s,
            TunnelStatus::Serving { .. } | TunnelStatus::Refused(_) | TunnelStatus::Closed(_)
        )
    })
    .await;
    (agent, status)
}

fn assert_refused_as_other_owner(status: &TunnelStatus, variant: &str) {
    match status {
        TunnelStatus::Refused(r) => {
            assert_eq!(r.code, ErrorCode::BindingNotAllowed, "{variant}: {r:?}");
            assert!(r.message.contains("another owner"), "{variant}: {r:?}");
        }
        other => panic!("{variant}: team-a's tunnel was not refused: {other:?}"),
    }
}

#[tokio::test]
async fn another_owner_cannot_take_a_live_tcp_port_by_number_or_alias() {
    init();
    let cert = TestCert::new();
    let dir = tempfile::tempdir().unwrap();
    let (tcp, port) = endpoint_listener();
    let key = full_access_key(dir.path());
    let plane = open_plane(dir.path(), port);
    let edge = start(&cert, &plane, "127.0.0.1:0".parse().unwrap(), &tcp).await;
    let api = TunaClient::new(ClientOptions::new(
        format!("http://{}", edge.api_addr.unwrap()),
        Secret::new(key),
    ))
    .unwrap();
    let endpoint = api
        .create_tcp_endpoint(&CreateTcpEndpoint {
            alias: "pg".into(),
            port: None,
        })
        .await
        .unwrap();
    assert_eq!(endpoint.port, port);

    // team-b serves its endpoint by alias.
    let team_b = mint(&api, labels("team-b", "db", "agent-1"), "pg").await;
    let (b_agent, status) = attach(&cert, &edge, &team_b, Binding::tcp("pg"), "team-b").await;
    assert!(matches!(status, TunnelStatus::Serving { .. }), "{status:?}");
    assert_eq!(banners(port, 20).await, vec!["team-b"; 20]);

    // team-a, same account: the port by number, then the alias itself.
    let by_number = mint(&api, labels("team-a", "grab", "agent-1"), &port.to_string()).await;
    let (_a1, status) = attach(
        &cert,
        &edge,
        &by_number,
        Binding::tcp(port.to_string()),
        "team-a",
    )
    .await;
    assert_refused_as_other_owner(&status, "by number");
    let by_alias = mint(&api, labels("team-a", "grab", "agent-1"), "pg").await;
    let (_a2, status) = attach(&cert, &edge, &by_alias, Binding::tcp("pg"), "team-a").await;
    assert_refused_as_other_owner(&status, "by alias");

    // Every connection still reaches team-b, whose tunnel was never displaced.
    assert_eq!(banners(port, 20).await, vec!["team-b"; 20]);
    let b_status = b_agent
        .tunnel_status(&tunnel_id(&team_b))
        .unwrap()
        .borrow()
        .clone();
    assert!(
        matches!(b_status, TunnelStatus::Serving { .. }),
        "{b_status:?}"
    );

    // Same owner, new token (a renewal, a restarted agent): takes over as before.
    let renewed = mint(&api, labels("team-b", "db", "agent-2"), "pg").await;
    let (_b2, status) = attach(&cert, &edge, &renewed, Binding::tcp("pg"), "team-b2").await;
    assert!(matches!(status, TunnelStatus::Serving { .. }), "{status:?}");
    let old = wait_tunnel(&b_agent, &tunnel_id(&team_b), |s| {
        matches!(s, TunnelStatus::Closed(_))
    })
    .await;
    assert!(
        matches!(&old, TunnelStatus::Closed(r) if r.code == ErrorCode::BindingTakenOver),
        "{old:?}"
    );
    assert_eq!(banners(port, 20).await, vec!["team-b2"; 20]);
}

#[tokio::test]
async fn a_port_number_is_refused_while_another_owner_holds_its_alias() {
    init();
    let cert = TestCert::new();
    let dir = tempfile::tempdir().unwrap();
    let (tcp, port) = endpoint_listener();
    let key = full_access_key(dir.path());
    let plane = open_plane(dir.path(), port);
    let edge = start(&cert, &plane, "127.0.0.1:0".parse().unwrap(), &tcp).await;
    let api = TunaClient::new(ClientOptions::new(
        format!("http://{}", edge.api_addr.unwrap()),
        Secret::new(key),
    ))
    .unwrap();
    api.create_tcp_endpoint(&CreateTcpEndpoint {
        alias: "pg".into(),
        port: None,
    })
    .await
    .unwrap();
    // team-b's token names the alias; its tunnel is not connected (yet).
    mint(&api, labels("team-b", "db", "agent-1"), "pg").await;

    let by_number = mint(&api, labels("team-a", "grab", "agent-1"), &port.to_string()).await;
    let (_a, status) = attach(
        &cert,
        &edge,
        &by_number,
        Binding::tcp(port.to_string()),
        "team-a",
    )
    .await;
    assert_refused_as_other_owner(&status, "by number, owner offline");

    // The same owner may name its own endpoint by number.
    let own = mint(&api, labels("team-b", "db2", "agent-1"), &port.to_string()).await;
    let (_b, status) = attach(&cert, &edge, &own, Binding::tcp(port.to_string()), "team-b").await;
    assert!(matches!(status, TunnelStatus::Serving { .. }), "{status:?}");
    assert_eq!(banners(port, 20).await, vec!["team-b"; 20]);
}
