//! Attacks on the edge's session and control plane, each reproduced against
//! a real edge on 127.0.0.1 (issue 12: items 3 and 6). A hostile agent here is
//! a hand-written one that speaks the wire protocol and then misbehaves.

use crate::data_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use data_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tuna_agent::TunnelStatus;
use tuna_edge::{EdgeConfig, EdgeHandle, EdgeLimits, EdgeServer, MemoryAuthority};
use tuna_protocol::wire::{ALPN, Attach, Binding, ErrorCode, Frame, Preamble, TunnelToken};

const HOST: &str = "app.tuna.test";

fn authority() -> MemoryAuthority {
    let authority = MemoryAuthority::new();
    authority.add_token(
        "tok-1",
        &TunnelToken::new("t1"),
        "acct",
        far_future(),
        vec![Binding::http(HOST)],
    );
    authority
}

async fn edge_with(cert: &TestCert, authority: &MemoryAuthority, limits: EdgeLimits) -> EdgeHandle {
    let mut config: EdgeConfig = edge_config(cert, "127.0.0.1:0".parse().unwrap());
    config.limits = limits;
    EdgeServer::start(config, Arc::new(authority.clone()), None)
        .await
        .unwrap()
}

fn quick_limits() -> EdgeLimits {
    EdgeLimits {
        control_write_timeout: Duration::from_millis(500),
        open_stream_timeout: Duration::from_millis(500),
        ..EdgeLimits::default()
    }
}

async fn tls_to_agent_listener(
    cert: &TestCert,
    edge: &EdgeHandle,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert_der.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![ALPN.to_vec()];
    let tcp = TcpStream::connect(edge.agent_addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap()
}

/// A hostile agent: a valid hello, then an h2 server configured by `h2`
/// that accepts streams and never reads or answers anything on them. It
/// can write frames on the control stream (`control`).
struct HostileAgent {
    control: tokio::sync::mpsc::UnboundedSender<Frame>,
    /// Bytes the edge wrote on the control stream (read, never released:
    /// the window stays used).
    received: tokio::sync::watch::Receiver<usize>,
    _task: tokio::task::JoinHandle<()>,
}

async fn hostile_agent(
    cert: &TestCert,
    edge: &EdgeHandle,
    token: &str,
    h2: h2::server::Builder,
) -> HostileAgent {
    let mut tls = tls_to_agent_listener(cert, edge).await;
    tls.write_all(&Preamble { version: 2 }.encode())
        .await
        .unwrap();
    Frame::Hello {
        agent: "hostile".into(),
        tunnels: vec![Attach {
            tunnel: "web".into(),
            seq: 1,
            token: TunnelToken::new(token),
            bindings: vec![Binding::http(HOST)],
        }],
    }
    .write_to(&mut tls)
    .await
    .unwrap();
    let frame = Frame::read_from(&mut tls).await.unwrap();
    assert!(matches!(frame, Frame::Welcome { .. }), "{frame:?}");
    let (control, mut frames) = tokio::sync::mpsc::unbounded_channel::<Frame>();
    let (received_tx, received) = tokio::sync::watch::channel(0usize);
    let task = tokio::spawn(async move {
        let Ok(mut conn) = h2.handshake::<_, bytes::Bytes>(tls).await else {
            return;
        };
        let mut held = Vec::new();
        let mut control = None;
        // Frames to send once the control stream is there.
        let mut pending = Vec::new();
        loop {
            tokio::select! {
                next = conn.accept() => {
                    let Some(Ok((request, mut respond))) = next else { return };
                    // Answer the stream's head, then hold it without reading.
                    let response = http::Response::builder().status(200).body(()).unwrap();
                    let send = respond.send_response(response, false).unwrap();
                    if control.is_none() {
                        control = Some(send);
                        let received = received_tx.clone();
                        tokio::spawn(async move {
                            let mut body = request.into_body();
                            while let Some(Ok(data)) = body.data().await {
                                received.send_modify(|n| *n += data.len());
                            }
                        });
                    } else {
                        held.push((request, send));
                    }
                }
                Some(frame) = frames.recv() => {
                    pending.push(frame);
                }
            }
            if let Some(send) = control.as_mut() {
                for frame in pending.drain(..) {
                    send.send_data(frame.encode().unwrap(), false).unwrap();
                }
            }
        }
    });
    HostileAgent {
        control,
        received,
        _task: task,
    }
}

/// Waits (bounded) until a public GET of `host` answers `status`; `Err`
/// with the last answer if it does not within `within`.
async fn until_status(
    cert: &TestCert,
    edge: &EdgeHandle,
    host: &str,
    status: u16,
    within: Duration,
) -> Result<(), String> {
    let client = reqwest::Client::builder()
        .resolve(host, edge.http_addr.unwrap())
        .timeout(Duration::from_secs(2))
        .no_proxy()
        .build()
        .unwrap();
    let _ = cert;
    let deadline = Instant::now() + within;
    loop {
        let last = match client.get(http_url(edge, host, "/")).send().await {
            Ok(resp) if resp.status().as_u16() == status => return Ok(()),
            Ok(resp) => resp.status().to_string(),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "{host} answered {last}, not {status}, for {within:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_agent_that_withholds_window_cannot_outlive_revocation() {
    init();
    let cert = TestCert::new();
    let authority = authority();
    let edge = edge_with(&cert, &authority, quick_limits()).await;
    let agent = hostile_agent(&cert, &edge, "t1", h2::server::Builder::new()).await;
    let mut sessions = edge.sessions();
    tokio::time::timeout(HANG_GUARD, sessions.wait_for(|n| *n == 1))
        .await
        .unwrap()
        .unwrap();
    // It never reads its control stream, so the edge can write 64 KiB there
    // (h2's default window); an update with 600 foreign hosts makes the
    // answer larger than that.
    let add = (0..600)
        .map(|i| Binding::http(format!("foreign-{i}.example.com")))
        .collect();
    agent
        .control
        .send(Frame::UpdateBindings {
            tunnel: "web".into(),
            seq: 2,
            add,
            remove: Vec::new(),
        })
        .unwrap();
    // The edge is stuck once it has filled the window.
    let mut received = agent.received.clone();
    tokio::time::timeout(HANG_GUARD, received.wait_for(|n| *n >= 60_000))
        .await
        .expect("the edge never filled the control window")
        .unwrap();

    authority.revoke("tok-1");
    // The revocation must bite at once, whatever the control stream does.
    until_status(&cert, &edge, HOST, 503, Duration::from_secs(2))
        .await
        .expect("the revoked tunnel still routes");
    // And the stalled session does not linger past the control write deadline.
    tokio::time::timeout(Duration::from_secs(5), sessions.wait_for(|n| *n == 0))
        .await
        .expect("the stalled session outlived its control write deadline")
        .unwrap();
}

#[tokio::test]
async fn a_lagged_revocation_broadcast_is_caught_up() {
    init();
    let cert = TestCert::new();
    let authority = authority();
    let edge = start_edge(&cert, &authority).await;
    let agent = start_agent(&cert, &edge, "t1", vec![Binding::http(HOST)]).await;
    agent.serving("t1").await.unwrap();

    // The target revocation, then more than the broadcast channel holds
    // (a mass orphan clean-up), all before the session task runs again.
    authority.revoke("tok-1");
    for i in 0..1100 {
        authority.revoke(&format!("orphan-{i}"));
    }
    let status = wait_tunnel(&agent, "t1", |s| matches!(s, TunnelStatus::Closed(_))).await;
    assert!(
        matches!(&status, TunnelStatus::Closed(r) if r.code == ErrorCode::TokenRevoked),
        "{status:?}"
    );
}

#[tokio::test]
async fn a_revocation_nobody_announced_is_found_by_the_periodic_check() {
    init();
    let cert = TestCert::new();
    let authority = authority();
    let mut config = edge_config(&cert, "127.0.0.1:0".parse().unwrap());
    config.heartbeat = Duration::from_millis(200);
    let edge = EdgeServer::start(config, Arc::new(authority.clone()), None)
        .await
        .unwrap();
    let agent = start_agent(&cert, &edge, "t1", vec![Binding::http(HOST)]).await;
    agent.serving("t1").await.unwrap();
    authority.revoke_silently("tok-1");
    let status = wait_tunnel(&agent, "t1", |s| matches!(s, TunnelStatus::Closed(_))).await;
    assert!(
        matches!(&status, TunnelStatus::Closed(r) if r.code == ErrorCode::TokenRevoked),
        "{status:?}"
    );
}

#[tokio::test]
async fn a_token_that_expires_unannounced_closes_its_tunnel() {
    init();
    let cert = TestCert::new();
    let authority = MemoryAuthority::new();
    authority.add_token(
        "tok-short",
        &TunnelToken::new("t-short"),
        "acct",
        std::time::SystemTime::now() + Duration::from_millis(1500),
        vec![Binding::http(HOST)],
    );
    let mut config = edge_config(&cert, "127.0.0.1:0".parse().unwrap());
    config.heartbeat = Duration::from_millis(200);
    let edge = EdgeServer::start(config, Arc::new(authority.clone()), None)
        .await
        .unwrap();
    let agent = start_agent(&cert, &edge, "t-short", vec![Binding::http(HOST)]).await;
    agent.serving("t-short").await.unwrap();
    let status = wait_tunnel(&agent, "t-short", |s| matches!(s, TunnelStatus::Closed(_))).await;
    assert!(
        matches!(&status, TunnelStatus::Closed(r) if r.code == ErrorCode::TokenExpired),
        "{status:?}"
    );
}

#[tokio::test]
async fn opening_a_stream_to_an_agent_without_capacity_is_bounded() {
    init();
    let cert = TestCert::new();
    let authority = authority();
    let edge = edge_with(&cert, &authority, quick_limits()).await;
    // One concurrent stream: the control stream takes it; no data stream fits.
    let mut h2 = h2::server::Builder::new();
    h2.max_concurrent_streams(1);
    let _agent = hostile_agent(&cert, &edge, "t1", h2).await;
    let mut sessions = edge.sessions();
    tokio::time::timeout(HANG_GUARD, sessions.wait_for(|n| *n == 1))
        .await
        .unwrap()
        .unwrap();
    until_status(&cert, &edge, HOST, 502, Duration::from_secs(3))
        .await
        .expect("a stream that cannot open must fail the request");
}

#[tokio::test]
async fn unauthenticated_connections_are_capped_per_address() {
    init();
    let cert = TestCert::new();
    let authority = authority();
    let limits = EdgeLimits {
        max_pending_handshakes_per_ip: 2,
        ..EdgeLimits::default()
    };
    let edge = edge_with(&cert, &authority, limits).await;
    // Two silent connections hold the address's two pre-authentication slots.
    let _silent: Vec<TcpStream> =
        futures::future::join_all((0..2).map(|_| TcpStream::connect(edge.agent_addr)))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    // Let the edge take them (they are accepted in order).
    let mut probe = TcpStream::connect(edge.agent_addr).await.unwrap();
    let mut buf = [0u8; 1];
    let started = Instant::now();
    let read = tokio::time::timeout(Duration::from_secs(3), probe.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "a third unauthenticated connection was held ({read:?})"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn failed_tunnel_authentication_is_rate_limited_per_address() {
    init();
    let cert = TestCert::new();
    let authority = authority();
    let limits = EdgeLimits {
        auth_failures: tuna_edge::control::RateLimit {
            burst: 3,
            per_second: 0.1,
        },
        ..EdgeLimits::default()
    };
    let edge = edge_with(&cert, &authority, limits).await;
    let mut codes = Vec::new();
    for i in 0..5 {
        let mut tls = tls_to_agent_listener(&cert, &edge).await;
        tls.write_all(&Preamble { version: 2 }.encode())
            .await
            .unwrap();
        Frame::Hello {
            agent: "guesser".into(),
            tunnels: vec![Attach {
                tunnel: "x".into(),
                seq: 1,
                token: TunnelToken::new(format!("guess-{i}")),
                bindings: Vec::new(),
            }],
        }
        .write_to(&mut tls)
        .await
        .unwrap();
        loop {
            match Frame::read_from(&mut tls).await.unwrap() {
                Frame::Reject(r) => {
                    codes.push(r.code);
                    break;
                }
                Frame::Refused { .. } => {}
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(
        codes,
        [
            ErrorCode::BadToken,
            ErrorCode::BadToken,
            ErrorCode::BadToken,
            ErrorCode::RateLimited,
            ErrorCode::RateLimited
        ]
    );
    // A valid token from the same address is judged and served all the
    // same (issue 40, item 2: the budget is for failures, not the address).
    let agent = start_agent(&cert, &edge, "t1", vec![Binding::http(HOST)]).await;
    tokio::time::timeout(HANG_GUARD, agent.serving("t1"))
        .await
        .expect("the valid token was not served")
        .unwrap();
}

#[tokio::test]
async fn tunnel_and_session_quotas_refuse_with_quota_exceeded() {
    init();
    let cert = TestCert::new();
    let authority = MemoryAuthority::new();
    for (token, account) in [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b")] {
        authority.add_token(
            token,
            &TunnelToken::new(token),
            account,
            far_future(),
            Vec::new(),
        );
    }
    let limits = EdgeLimits {
        max_tunnels_per_token: 2,
        max_tunnels_per_account: 3,
        max_sessions_per_account: 1,
        ..EdgeLimits::default()
    };
    let edge = edge_with(&cert, &authority, limits).await;
    let agent = tuna_agent::Agent::start(agent_config(&cert, &edge), backend_handler).unwrap();
    let attach = |id: &'static str, token: &'static str| {
        agent.attach(id, TunnelToken::new(token), Vec::new())
    };
    attach("x1", "a1").await.unwrap();
    attach("x2", "a1").await.unwrap();
    attach("x3", "a1").await.unwrap();
    agent.serving("x1").await.unwrap();
    agent.serving("x2").await.unwrap();
    let refused = |s: &TunnelStatus| matches!(s, TunnelStatus::Refused(r) if r.code == ErrorCode::QuotaExceeded);
    let status = wait_tunnel(&agent, "x3", |s| !matches!(s, TunnelStatus::Pending)).await;
    assert!(refused(&status), "a third tunnel on one token: {status:?}");

    // The account's third tunnel fits, its fourth does not.
    attach("y1", "a2").await.unwrap();
    agent.serving("y1").await.unwrap();
    attach("y2", "a3").await.unwrap();
    let status = wait_tunnel(&agent, "y2", |s| !matches!(s, TunnelStatus::Pending)).await;
    assert!(
        refused(&status),
        "a fourth tunnel of the account: {status:?}"
    );

    // Another connection for account a: over its session quota. Account b
    // is not affected.
    let second = tuna_agent::Agent::start(agent_config(&cert, &edge), backend_handler).unwrap();
    second
        .attach("z", TunnelToken::new("a2"), Vec::new())
        .await
        .unwrap();
    let status = wait_tunnel(&second, "z", |s| !matches!(s, TunnelStatus::Pending)).await;
    assert!(
        refused(&status),
        "a second session of the account: {status:?}"
    );
    second
        .attach("b", TunnelToken::new("b1"), Vec::new())
        .await
        .unwrap();
    second.serving("b").await.unwrap();

    // Detaching gives the quota back.
    agent.detach("x1").await.unwrap();
    agent.set_token("x3", TunnelToken::new("a1")).await.unwrap();
    agent.serving("x3").await.unwrap();
}

/// Issue 40, item 3: a TCP endpoint connection on which nothing moves is
/// closed after the first-byte timeout; one that carried bytes, after the
/// idle timeout once they stop; and a client over the per-source cap is
/// closed at accept while its held connections stay.
#[tokio::test]
async fn tcp_endpoint_connections_are_capped_and_idle_ones_closed() {
    init();
    let cert = TestCert::new();
    let (listener, port) = endpoint_listener();
    let authority = MemoryAuthority::new();
    authority.add_token(
        "tok-1",
        &TunnelToken::new("t1"),
        "acct",
        far_future(),
        vec![Binding::tcp("db")],
    );
    authority.add_tcp_alias("db", port);
    let mut config: EdgeConfig = edge_config(&cert, "127.0.0.1:0".parse().unwrap());
    config.tcp_listeners = vec![listener];
    config.limits = EdgeLimits {
        max_tcp_connections_per_ip: 2,
        tcp_first_byte_timeout: Duration::from_secs(2),
        tcp_idle_timeout: Duration::from_secs(3),
        ..EdgeLimits::default()
    };
    let edge = EdgeServer::start(config, Arc::new(authority.clone()), None)
        .await
        .unwrap();
    let agent = start_agent(&cert, &edge, "t1", vec![Binding::tcp("db")]).await;
    agent.connected().await.unwrap();

    // Silent from the start: closed by the first-byte timeout.
    let mut silent = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    // Echoed once, then silent: closed by the idle timeout.
    let mut chatty = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    chatty.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    chatty.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping");
    // A third from the same address while two are held: closed at accept.
    let mut third = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(HANG_GUARD, third.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "over the per-source cap: {read:?}"
    );
    for (what, conn) in [("silent", &mut silent), ("idle", &mut chatty)] {
        let read = tokio::time::timeout(HANG_GUARD, conn.read(&mut byte)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "the {what} connection: {read:?}"
        );
    }
    // Their slots are free again.
    let mut again = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    again.write_all(b"pong").await.unwrap();
    again.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"pong");
    edge.shutdown().await;
}
