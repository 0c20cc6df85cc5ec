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
use tuna_edge::control::{Caller, ControlConfig, ControlPlane};
use tuna_edge::{EdgeConfig, EdgeHandle, EdgeServer};
use tuna_protocol::api::{Bindings, CreateDomain, CreateToken, Scope};
use tuna_protocol::wire::{ALPN, Attach, Binding, ErrorCode, Frame, Preamble, TunnelToken};

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
            addresses: Vec::new(),
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

    // 31 spend the budget of 30; a few more while it refills (one a
    // second) on a loaded machine.
    let mut statuses = Vec::new();
    for i in 0..60 {
        let resp = client
            .get(format!("{api}/v1/domains"))
            .bearer_auth(fake_key(i))
            .send()
            .await
            .unwrap();
        statuses.push(resp.status().as_u16());
        if statuses.len() >= 31 && statuses.contains(&429) {
            break;
        }
    }
    assert_eq!(statuses[0], 401);
    assert!(
        statuses.contains(&429),
        "the bad key's budget is spent: {statuses:?}"
    );
    // The bad hellos at once: one at a time, on a loaded machine each can
    // take as long as the budget's refill (one a second), and the budget is
    // then never spent.
    let first = format!("tunat_{:016x}_{:064x}", 0, 7);
    let first = match hello_from(&cert, edge.agent_addr, shared, &first).await {
        Frame::Reject(r) => r.code,
        other => panic!("a bad token was welcomed: {other:?}"),
    };
    assert_eq!(first, ErrorCode::BadToken);
    // In rounds of 15 at once (the listener takes 16 unauthenticated
    // connections per source), until the budget answers.
    let mut codes: Vec<ErrorCode> = Vec::new();
    for round in 0..8u64 {
        codes.extend(
            futures::future::join_all((1..16).map(|i| {
                let (cert, agent) = (&cert, edge.agent_addr);
                async move {
                    let i = round * 16 + i;
                    let token = format!("tunat_{i:016x}_{:064x}", i + 7);
                    match hello_from(cert, agent, shared, &token).await {
                        Frame::Reject(r) => r.code,
                        other => panic!("a bad token was welcomed: {other:?}"),
                    }
                }
            }))
            .await,
        );
        if codes.contains(&ErrorCode::RateLimited) {
            break;
        }
    }
    assert!(
        codes.contains(&ErrorCode::RateLimited),
        "the bad tokens' budget is spent: {codes:?}"
    );

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

/// A TCP load balancer on `at` that speaks PROXY protocol v2: each
/// connection to it is forwarded to `to` from `at`'s address, prefixed with
/// a header naming the client's address. Its port.
async fn proxy_v2_forwarder(at: IpAddr, to: SocketAddr) -> u16 {
    use ppp::v2::{Builder, Command, Protocol, Version};
    let listener = tokio::net::TcpListener::bind((at, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut client, client_addr)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let Ok(mut server) = connect_from(at, to).await else {
                    return;
                };
                let header = Builder::with_addresses(
                    Version::Two | Command::Proxy,
                    Protocol::Stream,
                    (client_addr, to),
                )
                .build()
                .unwrap();
                if server.write_all(&header).await.is_err() {
                    return;
                }
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    port
}

/// Issue 40, item 2: behind a load balancer of `--trusted-proxy` that
/// sends PROXY protocol v2, every listener's budget counts the clients the
/// headers name, not the load balancer: a client that spent its failed-auth
/// budget (REST API and agent listener) and holds its 16 pre-auth API slots
/// leaves another client behind the same load balancer unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_load_balancer_s_proxy_header_names_the_client_to_every_budget() {
    init();
    let cert = TestCert::new();
    let plane = plane().await;
    let lb: IpAddr = "127.0.0.9".parse().unwrap();
    let edge = edge(&cert, &plane.plane, |c| {
        c.trusted_proxies = vec!["127.0.0.9/32".parse().unwrap()];
    })
    .await;
    let (bad, good): (IpAddr, IpAddr) =
        ("127.0.0.5".parse().unwrap(), "127.0.0.6".parse().unwrap());
    let api_lb = SocketAddr::new(lb, proxy_v2_forwarder(lb, edge.api_addr.unwrap()).await);
    let agent_lb = SocketAddr::new(lb, proxy_v2_forwarder(lb, edge.agent_addr).await);
    let api = format!("http://{api_lb}");

    // The REST API's failed-auth budget.
    let from_bad = api_client(bad);
    let mut statuses = Vec::new();
    for i in 0..31 {
        let resp = from_bad
            .get(format!("{api}/v1/domains"))
            .bearer_auth(fake_key(i))
            .send()
            .await
            .unwrap();
        statuses.push(resp.status().as_u16());
    }
    assert_eq!(statuses[0], 401, "{statuses:?}");
    assert_eq!(statuses[30], 429, "{statuses:?}");
    let from_good = api_client(good);
    let resp = from_good
        .get(format!("{api}/v1/domains"))
        .bearer_auth(fake_key(99))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        401,
        "another client behind the load balancer has its own budget"
    );

    // The agent listener's.
    let mut codes = Vec::new();
    for i in 0..31 {
        let token = format!("tunat_{i:016x}_{:064x}", i + 7);
        match hello_from(&cert, agent_lb, bad, &token).await {
            Frame::Reject(r) => codes.push(r.code),
            other => panic!("a bad token was welcomed: {other:?}"),
        }
    }
    assert_eq!(codes[30], ErrorCode::RateLimited, "{codes:?}");
    match hello_from(&cert, agent_lb, good, "tunat_00000000000000ff_00").await {
        Frame::Reject(r) => assert_eq!(r.code, ErrorCode::BadToken, "{r:?}"),
        other => panic!("{other:?}"),
    }
    match hello_from(&cert, agent_lb, good, &plane.token).await {
        Frame::Welcome { .. } => {}
        other => panic!("{other:?}"),
    }

    // The API's pre-auth slots: 16 idle connections of one client fill
    // its share only.
    let mut idle = Vec::new();
    for _ in 0..16 {
        let mut held = connect_from(bad, api_lb).await.unwrap();
        held.write_all(b"GET /v1/domains HTTP/1.1\r\n")
            .await
            .unwrap();
        idle.push(held);
    }
    // The edge has read their headers and holds their slots once a 17th
    // from the same client is closed at accept.
    let deadline = std::time::Instant::now() + HANG_GUARD;
    loop {
        let mut probe = connect_from(bad, api_lb).await.unwrap();
        probe
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::io::AsyncReadExt::read(&mut probe, &mut buf),
        )
        .await;
        if matches!(read, Ok(Ok(0)) | Ok(Err(_))) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the 17th connection of one client was served"
        );
    }
    let resp = from_good
        .get(format!("{api}/v1/domains"))
        .bearer_auth(&plane.key)
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        200,
        "another client behind the load balancer gets a slot"
    );
    drop(idle);
    edge.shutdown().await;
}

/// Issue 40, item 4, scaled to the test machine: 16 sources (127.0.0.10–25)
/// each hold 16 TLS h2 connections to the REST API that answer pings and
/// send nothing (the API's whole pre-auth total, 256), reconnecting
/// whenever one is closed, for 8 s. A 17th source's client with a valid key
/// is served every time it comes (a source holding the most gives up its
/// oldest slot); and an unauthenticated h2 connection is closed after the
/// header timeout (3 s here) instead of being kept while it answers pings.
/// Before: the 17th source's connections were closed at accept for as long
/// as the holders stayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_holding_the_api_s_pre_auth_total_do_not_keep_a_newcomer_out() {
    use crate::edge_store_flood::h2_connect;
    use std::time::Instant;
    init();
    let cert = TestCert::new();
    let plane = plane().await;
    let edge = edge(&cert, &plane.plane, |c| {
        c.api_tls = Some(cert.server_config());
        c.limits.api_header_timeout = Duration::from_secs(3);
    })
    .await;
    let api = edge.api_addr.unwrap();
    let connector = client_tls(&cert, b"h2");

    // One unauthenticated h2 connection alone: closed after the timeout.
    {
        let tcp = connect_from("127.0.0.40".parse().unwrap(), api)
            .await
            .unwrap();
        let tls = connector
            .connect("localhost".try_into().unwrap(), tcp)
            .await
            .unwrap();
        let (_send, connection) = h2::client::handshake(tls).await.unwrap();
        let ended = tokio::time::timeout(HANG_GUARD, connection).await;
        assert!(ended.is_ok(), "an h2 connection without a request was kept");
    }

    let until = Instant::now() + Duration::from_secs(8);
    let mut holders = Vec::new();
    for source in 10..26u8 {
        for _ in 0..16 {
            let connector = connector.clone();
            let from = IpAddr::from([127, 0, 0, source]);
            holders.push(tokio::spawn(async move {
                let mut connections = 0u32;
                while Instant::now() < until {
                    let Some(send) = h2_connect(&connector, from, api).await else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    connections += 1;
                    // Held until the edge closes it (eviction, timeout).
                    let mut send = send;
                    loop {
                        match tokio::time::timeout_at(
                            until.into(),
                            futures::future::poll_fn(|cx| send.poll_ready(cx)),
                        )
                        .await
                        {
                            Ok(Ok(())) => tokio::time::sleep(Duration::from_millis(100)).await,
                            _ => break,
                        }
                        if Instant::now() >= until {
                            break;
                        }
                    }
                }
                connections
            }));
        }
    }
    // Let the holders fill the total first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let newcomer: IpAddr = "127.0.0.30".parse().unwrap();
    let mut served = 0;
    while Instant::now() + Duration::from_secs(1) < until {
        let status = tokio::time::timeout(HANG_GUARD, async {
            let mut send = h2_connect(&connector, newcomer, api).await?;
            send = send.ready().await.ok()?;
            let request = http::Request::get("https://localhost/v1/account")
                .header("authorization", format!("Bearer {}", plane.key))
                .body(())
                .unwrap();
            let (response, _) = send.send_request(request, true).ok()?;
            Some(response.await.ok()?.status().as_u16())
        })
        .await
        .ok()
        .flatten();
        assert_eq!(
            status,
            Some(200),
            "the newcomer's key holder while 16 sources hold the total"
        );
        served += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut reconnects = 0;
    for holder in holders {
        reconnects += holder.await.unwrap();
    }
    eprintln!(
        "the newcomer was served {served} times; the 256 holders made {reconnects} connections in 8 s"
    );
    assert!(served > 0);
    edge.shutdown().await;
}
