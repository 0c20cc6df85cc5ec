//! A source address shared by an attacker and legitimate clients (a
//! cluster's egress NAT, a carrier-grade NAT, a load balancer in front):
//! the failed-authentication budget of that source must not lock out valid
//! keys and tokens (issue 40, item 2). Loopback source addresses stand in
//! for the clients.

use crate::data_support;
use crate::edge_store_flood::{client_tls, connect_from};

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use data_support::*;
use tokio::io::AsyncWriteExt;
use tuna_tunnel::api::{Bindings, CreateDomain, CreateToken, Scope};
use tuna_tunnel::control::{Caller, ControlConfig, ControlPlane};
use tuna_tunnel::edge::{EdgeConfig, EdgeHandle, EdgeServer};
use tuna_tunnel::wire::{ALPN, Attach, Binding, ErrorCode, Frame, Preamble, TunnelToken};

/// The shared source.
const SHARED: &str = "127.0.0.5";

pub(crate) struct Plane {
    _dir: tempfile::TempDir,
    pub plane: ControlPlane,
    pub token: String,
    pub key: String,
}

pub(crate) async fn plane() -> Plane {
    let dir = tempfile::tempdir().unwrap();
    let config = ControlConfig::new(dir.path(), "tuna.test", "127.0.0.1");
    let plane = ControlPlane::open(config).unwrap();
    let owner = Caller {
        key_id: "test".into(),
        account: "default".into(),
        scopes: vec![Scope::Full],
    };
    let request = CreateDomain {
        subdomain: Some("app".into()),
        domain: None,
    };
    plane.create_domain(&owner, &request).unwrap();
    let request = CreateToken {
        bindings: Bindings {
            hosts: vec!["app.tuna.test".into()],
            tcp_endpoints: Vec::new(),
        },
        ..Default::default()
    };
    let token = plane.create_token(&owner, &request).unwrap();
    let (_, key) = plane
        .create_key("default", None, vec![Scope::Full])
        .unwrap();
    Plane {
        _dir: dir,
        plane,
        token: token.token.expose().to_owned(),
        key: key.expose().to_owned(),
    }
}

pub(crate) async fn edge(
    cert: &TestCert,
    plane: &ControlPlane,
    configure: impl FnOnce(&mut EdgeConfig),
) -> EdgeHandle {
    let mut config: EdgeConfig = edge_config(cert, "127.0.0.1:0".parse().unwrap());
    config.api_addr = Some("127.0.0.1:0".parse().unwrap());
    configure(&mut config);
    EdgeServer::start(config, Arc::new(plane.clone()), Some(plane.router()))
        .await
        .unwrap()
}

/// A plain-HTTP API client whose connections come from `from`.
pub(crate) fn api_client(from: IpAddr) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .local_address(from)
        .build()
        .unwrap()
}

/// A key of the right shape that the edge does not know.
pub(crate) fn fake_key(i: u64) -> String {
    format!("tunak_{i:016x}_{:064x}", i + 1)
}

/// A hello attaching one tunnel with `token` from `from`; the edge's first
/// answer (`Welcome` or `Reject`).
pub(crate) async fn hello_from(
    cert: &TestCert,
    agent: SocketAddr,
    from: IpAddr,
    token: &str,
) -> Frame {
    let tcp = connect_from(from, agent).await.unwrap();
    let mut tls = client_tls(cert, ALPN)
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(&Preamble { version: 2 }.encode())
        .await
        .unwrap();
    Frame::Hello {
        agent: "shared-source".into(),
        tunnels: vec![Attach {
            tunnel: "web".into(),
            seq: 1,
            token: TunnelToken::new(token),
            bindings: vec![Binding::http("app.tuna.test")],
        }],
    }
    .write_to(&mut tls)
    .await
    .unwrap();
    loop {
        match Frame::read_from(&mut tls).await.unwrap() {
            Frame::Refused { .. } => {}
            other => return other,
        }
    }
}

/// Issue 40, item 2: 31 bad requests from 127.0.0.5, then one a second
/// throughout, while an operator's key and an agent's token are used from
/// 127.0.0.5 too. The bad requests are refused (`429` once the budget is
/// spent); the key is served (a listing, a token minted) and the token's
/// hello is welcomed. Before: `429` and `rate_limited` for them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_spent_by_bad_credentials_still_serves_valid_ones() {
    init();
    let cert = TestCert::new();
    let plane = plane().await;
    let edge = edge(&cert, &plane.plane, |_| {}).await;
    let shared: IpAddr = SHARED.parse().unwrap();
    let api = format!("http://{}", edge.api_addr.unwrap());
    let client = api_client(shared);

    let mut statuses = Vec::new();
    for i in 0..31 {
        let resp = client
            .get(format!("{api}/v1/domains"))
            .bearer_auth(fake_key(i))
            .send()
            .await
            .unwrap();
        statuses.push(resp.status().as_u16());
    }
    assert_eq!(statuses[0], 401);
    assert_eq!(
        statuses[30], 429,
        "the bad key's budget is spent: {statuses:?}"
    );
    let mut codes = Vec::new();
    for i in 0..31 {
        let token = format!("tunat_{i:016x}_{:064x}", i + 7);
        match hello_from(&cert, edge.agent_addr, shared, &token).await {
            Frame::Reject(r) => codes.push(r.code),
            other => panic!("a bad token was welcomed: {other:?}"),
        }
    }
    assert_eq!(codes[0], ErrorCode::BadToken);
    assert_eq!(codes[30], ErrorCode::RateLimited, "{codes:?}");

    // Then one bad request a second, throughout.
    let background = {
        let (client, api) = (client.clone(), api.clone());
        tokio::spawn(async move {
            for i in 100.. {
                let _ = client
                    .get(format!("{api}/v1/domains"))
                    .bearer_auth(fake_key(i))
                    .send()
                    .await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    for _ in 0..3 {
        let resp = client
            .get(format!("{api}/v1/domains"))
            .bearer_auth(&plane.key)
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            200,
            "the operator's listing from the shared source"
        );
        let resp = client
            .post(format!("{api}/v1/tokens"))
            .bearer_auth(&plane.key)
            .json(&serde_json::json!({"bindings": {"hosts": ["app.tuna.test"]}}))
            .send()
            .await
            .unwrap();
        assert!(
            resp.status().is_success(),
            "the operator's token mint from the shared source: {}",
            resp.status()
        );
        match hello_from(&cert, edge.agent_addr, shared, &plane.token).await {
            Frame::Welcome { .. } => {}
            other => panic!("the agent's valid token from the shared source: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    // The bad ones are still refused (the background's one a second keeps
    // the budget spent: of three at once, one at most finds a token).
    let mut last = Vec::new();
    for i in 0..3 {
        let resp = client
            .get(format!("{api}/v1/domains"))
            .bearer_auth(fake_key(7777 + i))
            .send()
            .await
            .unwrap();
        last.push(resp.status().as_u16());
    }
    assert!(last.contains(&429), "{last:?}");
    background.abort();
    edge.shutdown().await;
}
