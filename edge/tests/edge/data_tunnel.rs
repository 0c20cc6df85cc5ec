//! Data plane end to end: public client → edge → agent → backend, over real
//! TLS and real sockets on 127.0.0.1.

use crate::data_support;

use std::sync::Arc;

use data_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tuna_agent::{AgentStatus, TunnelStatus};
use tuna_edge::{EdgeServer, MemoryAuthority};
use tuna_protocol::wire::{Binding, BoundTarget, ErrorCode};

const HOST: &str = "app.tuna.test";

fn authority_with(token: &str, allowed: Vec<Binding>) -> MemoryAuthority {
    let authority = MemoryAuthority::new();
    authority.add_token(
        "tok-1",
        &tuna_protocol::wire::TunnelToken::new(token),
        "acct",
        far_future(),
        allowed,
    );
    authority
}

#[tokio::test]
async fn http_request_reaches_the_backend_with_its_metadata() {
    init();
    let cert = TestCert::new();
    let authority = authority_with("t1", vec![Binding::http(HOST)]);
    let edge = start_edge(&cert, &authority).await;
    let agent = start_agent(&cert, &edge, "t1", vec![Binding::http(HOST)]).await;
    agent.connected().await.unwrap();
    let client = http_client(&cert, &edge, &[HOST, "nobody.tuna.test"]);

    for round in 0..3 {
        let resp = client
            .post(http_url(&edge, HOST, "/hello?x=1"))
            .body(vec![7u8; 1000])
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "round {round}");
        let text = resp.text().await.unwrap();
        assert!(
            text.starts_with("host=app.tuna.test scheme=http client_ip=127.0.0.1"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "host_header=app.tuna.test:{}",
                edge.http_addr.unwrap().port()
            )),
            "{text}"
        );
        assert!(text.ends_with("path=/hello body=1000 tunnel=t1"), "{text}");
    }

    let resp = client
        .get(http_url(&edge, "nobody.tuna.test", "/"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert!(
        resp.text()
            .await
            .unwrap()
            .contains("No tunnel serves nobody.tuna.test")
    );
}

#[tokio::test]
async fn https_with_h2_is_routed_by_host() {
    init();
    let cert = TestCert::new();
    let authority = authority_with("t1", vec![Binding::http(HOST)]);
    let edge = start_edge(&cert, &authority).await;
    let agent = start_agent(&cert, &edge, "t1", vec![Binding::http(HOST)]).await;
    agent.connected().await.unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(cert.cert_pem.as_bytes()).unwrap())
        .resolve(HOST, edge.https_addr.unwrap())
        .no_proxy()
        .build()
        .unwrap();
    let requests = (0..20).map(|i| client.get(https_url(&edge, HOST, &format!("/r{i}"))).send());
    for (i, resp) in futures::future::join_all(requests)
        .await
        .into_iter()
        .enumerate()
    {
        let resp = resp.unwrap();
        assert_eq!(resp.version(), reqwest::Version::HTTP_2);
        let text = resp.text().await.unwrap();
        assert!(
            text.starts_with("host=app.tuna.test scheme=https"),
            "{text}"
        );
        assert!(text.contains(&format!("path=/r{i} ")), "{text}");
    }
}

#[tokio::test]
async fn websocket_style_upgrades_pass_through() {
    init();
    let cert = TestCert::new();
    let authority = authority_with("t1", vec![Binding::http(HOST)]);
    let edge = start_edge(&cert, &authority).await;
    let agent = start_agent(&cert, &edge, "t1", vec![Binding::http(HOST)]).await;
    agent.connected().await.unwrap();

    let mut tcp = TcpStream::connect(edge.http_addr.unwrap()).await.unwrap();
    tcp.write_all(
        b"GET /ws HTTP/1.1\r\nHost: app.tuna.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        tcp.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    for msg in [&b"ping"[..], b"frames pass as raw bytes"] {
        tcp.write_all(msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        tcp.read_exact(&mut back).await.unwrap();
        assert_eq!(back, msg);
    }
}

#[tokio::test]
async fn tcp_endpoint_echoes_and_carries_a_window_and_more() {
    init();
    let cert = TestCert::new();
    let (listener, port) = endpoint_listener();
    let authority = authority_with("t1", vec![Binding::tcp("db")]);
    authority.add_tcp_alias("db", port);
    let edge = start_edge_with(&cert, &authority, &[listener]).await;
    let agent = start_agent(&cert, &edge, "t1", vec![Binding::tcp("db")]).await;
    agent.connected().await.unwrap();

    let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tcp.write_all(b"hello through the tunnel").await.unwrap();
    let mut back = [0u8; 24];
    tcp.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"hello through the tunnel");

    // More than one flow-control window (8 MiB per stream) up and echoed back
    // down, checked byte for byte; the timed 256 MiB transfer is a benchmark
    // (benches/transfer.sh), not a test.
    const TOTAL: usize = 20 * 1024 * 1024;
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut r, mut w) = tcp.into_split();
    let writer = tokio::spawn(async move {
        let chunk: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
        let mut sent = 0;
        while sent < TOTAL {
            w.write_all(&chunk).await.unwrap();
            sent += chunk.len();
        }
        w.shutdown().await.unwrap();
    });
    // Two periods of the pattern: any window of up to one period is a slice
    // of it, so each read is checked with one memcmp.
    let period: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    let twice = [period.as_slice(), period.as_slice()].concat();
    let mut received = 0usize;
    let mut buf = vec![0u8; 65536];
    loop {
        let n = r.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        let offset = received % 65536;
        assert!(
            buf[..n] == twice[offset..offset + n],
            "corrupt bytes near offset {received}"
        );
        received += n;
    }
    writer.await.unwrap();
    assert_eq!(received, TOTAL);
}

#[tokio::test]
async fn two_hundred_concurrent_streams() {
    init();
    let cert = TestCert::new();
    let (listener, port) = endpoint_listener();
    let authority = authority_with(
        "t1",
        vec![Binding::tcp(port.to_string()), Binding::http(HOST)],
    );
    let edge = start_edge_with(&cert, &authority, &[listener]).await;
    let agent = start_agent(
        &cert,
        &edge,
        "t1",
        vec![Binding::tcp(port.to_string()), Binding::http(HOST)],
    )
    .await;
    agent.connected().await.unwrap();

    let tcp_clients = (0..200u32).map(|i| async move {
        let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let payload: Vec<u8> = (0..64 * 1024u32).map(|j| ((i + j) % 256) as u8).collect();
        let (mut r, mut w) = tcp.split();
        let (_, back) = tokio::join!(async { w.write_all(&payload).await.unwrap() }, async {
            let mut back = vec![0u8; payload.len()];
            r.read_exact(&mut back).await.unwrap();
            back
        });
        assert_eq!(back, payload, "stream {i}");
    });
    futures::future::join_all(tcp_clients).await;

    let client = http_client(&cert, &edge, &[HOST]);
    let http_clients = (0..200).map(|i| {
        let client = client.clone();
        let url = http_url(&edge, HOST, &format!("/bytes/{}", 1000 + i));
        async move {
            let body = client.get(url).send().await.unwrap().bytes().await.unwrap();
            assert_eq!(body.len(), 1000 + i);
        }
    });
    futures::future::join_all(http_clients).await;
}

#[tokio::test]
async fn binding_changes_travel_live_without_reconnecting() {
    init();
    let cert = TestCert::new();
    let other = "other.tuna.test";
    let authority = authority_with("t1", vec![Binding::http(HOST), Binding::http(other)]);
    let edge = start_edge(&cert, &authority).await;
    let agent = start_agent(&cert, &edge, "t1", vec![Binding::http(HOST)]).await;
    let session = agent.connected().await.unwrap();
    let client = http_client(&cert, &edge, &[HOST, other]);
    assert_eq!(
        client
            .get(http_url(&edge, other, "/"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );

    agent
        .set_bindings("t1", vec![Binding::http(HOST), Binding::http(other)])
        .await
        .unwrap();
    let status = wait_tunnel(
        &agent,
        "t1",
        |s| matches!(s, TunnelStatus::Serving { bound, .. } if bound.len() == 2),
    )
    .await;
    let TunnelStatus::Serving { bound, .. } = status else {
        unreachable!()
    };
    assert!(
        bound
            .iter()
            .any(|o| o.bound == Some(BoundTarget::Http { host: other.into() })),
        "{bound:?}"
    );
    let text = client
        .get(http_url(&edge, other, "/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.starts_with("host=other.tuna.test"), "{text}");

    agent
        .set_bindings("t1", vec![Binding::http(other)])
        .await
        .unwrap();
    wait_tunnel(
        &agent,
        "t1",
        |s| matches!(s, TunnelStatus::Serving { bound, .. } if bound.len() == 1),
    )
    .await;
    // The removal travelled before the outcome list shrank; the edge unrouted it.
    let resp = client.get(http_url(&edge, HOST, "/")).send().await.unwrap();
    assert_eq!(resp.status(), 503, "a host whose tunnel left answers 503");
    assert_eq!(resp.headers()["retry-after"], "5");

    assert_eq!(
        agent.session_id(),
        Some(session),
        "the same session carried every change"
    );
    assert_eq!(
        agent
            .bindings("t1")
            .unwrap()
            .into_iter()
            .collect::<Vec<_>>(),
        vec![Binding::http(other)]
    );
}

#[tokio::test]
async fn a_restarted_edge_is_rejoined_and_traffic_resumes() {
    init();
    let cert = TestCert::new();
    let authority = authority_with("t1", vec![Binding::http(HOST)]);
    let edge = start_edge(&cert, &authority).await;
    let agent_addr = edge.agent_addr;
    let agent = start_agent(&cert, &edge, "t1", vec![Binding::http(HOST)]).await;
    let first = agent.connected().await.unwrap();
    let client = http_client(&cert, &edge, &[HOST]);
    assert_eq!(
        client
            .get(http_url(&edge, HOST, "/"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    edge.shutdown().await;
    let status = wait_status(&agent, |s| {
        !matches!(
            s,
            AgentStatus::Connected { .. } | AgentStatus::Connecting { .. }
        )
    })
    .await;
    assert!(
        matches!(status, AgentStatus::Disconnected { .. }),
        "an edge shutdown is not a rejection: {status:?}"
    );

    let edge = EdgeServer::start(
        edge_config(&cert, agent_addr),
        Arc::new(authority.clone()),
        None,
    )
    .await
    .unwrap();
    let status = wait_status(
        &agent,
        |s| matches!(s, AgentStatus::Connected { session_id } if *session_id != first),
    )
    .await;
    assert!(matches!(status, AgentStatus::Connected { .. }));
    let client = http_client(&cert, &edge, &[HOST]);
    let text = client
        .get(http_url(&edge, HOST, "/again"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("path=/again"), "{text}");
}

#[tokio::test]
async fn revoking_the_token_closes_its_tunnel_and_it_stays_closed() {
    init();
    let cert = TestCert::new();
    let authority = authority_with("t1", vec![Binding::http(HOST)]);
    let edge = start_edge(&cert, &authority).await;
    let agent = start_agent(&cert, &edge, "t1", vec![Binding::http(HOST)]).await;
    agent.connected().await.unwrap();

    authority.revoke("tok-1");
    // The edge acts on the revocation event (no polling); the agent learns why.
    let status = wait_tunnel(&agent, "t1", |s| matches!(s, TunnelStatus::Closed(_))).await;
    let TunnelStatus::Closed(reason) = status else {
        unreachable!()
    };
    assert_eq!(
        reason.code,
        ErrorCode::TokenRevoked,
        "closed with {reason:?}"
    );
    let client = http_client(&cert, &edge, &[HOST]);
    assert_eq!(
        client
            .get(http_url(&edge, HOST, "/"))
            .send()
            .await
            .unwrap()
            .status(),
        503
    );
    // A closed tunnel waits for the caller; the token is gone, so a retry
    // with it is refused.
    agent
        .set_token("t1", tuna_protocol::wire::TunnelToken::new("t1"))
        .await
        .unwrap();
    let status = wait_tunnel(&agent, "t1", |s| matches!(s, TunnelStatus::Refused(_))).await;
    assert!(
        matches!(&status, TunnelStatus::Refused(r) if r.code == ErrorCode::BadToken),
        "{status:?}"
    );
}

#[tokio::test]
async fn expired_and_unknown_tokens_are_refused() {
    init();
    let cert = TestCert::new();
    let authority = MemoryAuthority::new();
    let past = std::time::SystemTime::now() - std::time::Duration::from_secs(1);
    authority.add_token(
        "old",
        &tuna_protocol::wire::TunnelToken::new("t-old"),
        "acct",
        past,
        vec![Binding::http(HOST)],
    );
    let edge = start_edge(&cert, &authority).await;

    for (token, code) in [
        ("t-old", ErrorCode::TokenExpired),
        ("nope", ErrorCode::BadToken),
    ] {
        let agent = start_agent(&cert, &edge, token, vec![Binding::http(HOST)]).await;
        let status = wait_tunnel(&agent, token, |s| matches!(s, TunnelStatus::Refused(_))).await;
        assert!(
            matches!(&status, TunnelStatus::Refused(r) if r.code == code),
            "{token}: {status:?}"
        );
        // Its only tunnel refused, the agent does not keep dialling.
        wait_status(&agent, |s| matches!(s, AgentStatus::Idle)).await;
    }
}

#[tokio::test]
async fn foreign_bindings_are_refused_at_attach_and_live() {
    init();
    let cert = TestCert::new();
    let authority = authority_with("t1", vec![Binding::http(HOST)]);
    let edge = start_edge(&cert, &authority).await;

    let agent = start_agent(&cert, &edge, "t1", vec![Binding::http("victim.tuna.test")]).await;
    let status = wait_tunnel(&agent, "t1", |s| matches!(s, TunnelStatus::Refused(_))).await;
    assert!(
        matches!(&status, TunnelStatus::Refused(r) if r.code == ErrorCode::BindingNotAllowed),
        "{status:?}"
    );
    drop(agent);

    let agent = start_agent(&cert, &edge, "t1", vec![Binding::http(HOST)]).await;
    let session = agent.connected().await.unwrap();
    agent
        .set_bindings(
            "t1",
            vec![
                Binding::http(HOST),
                Binding::http("victim.tuna.test"),
                Binding::tcp("1"),
            ],
        )
        .await
        .unwrap();
    let status = wait_tunnel(
        &agent,
        "t1",
        |s| matches!(s, TunnelStatus::Serving { bound, .. } if bound.len() == 3),
    )
    .await;
    let TunnelStatus::Serving { bound, .. } = status else {
        unreachable!()
    };
    for foreign in [Binding::http("victim.tuna.test"), Binding::tcp("1")] {
        let outcome = bound.iter().find(|o| o.binding == foreign).unwrap();
        assert_eq!(
            outcome.error.as_ref().map(|e| e.code),
            Some(ErrorCode::BindingNotAllowed),
            "{outcome:?}"
        );
    }
    assert_eq!(
        agent.session_id(),
        Some(session),
        "a refused binding does not end the session"
    );
    let client = http_client(&cert, &edge, &["victim.tuna.test", HOST]);
    assert_eq!(
        client
            .get(http_url(&edge, "victim.tuna.test", "/"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    assert_eq!(
        client
            .get(http_url(&edge, HOST, "/"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn a_gone_agent_turns_its_host_into_503() {
    init();
    let cert = TestCert::new();
    let authority = authority_with("t1", vec![Binding::http(HOST)]);
    let edge = start_edge(&cert, &authority).await;
    let agent = start_agent(&cert, &edge, "t1", vec![Binding::http(HOST)]).await;
    agent.connected().await.unwrap();
    let client = http_client(&cert, &edge, &[HOST]);
    assert_eq!(
        client
            .get(http_url(&edge, HOST, "/"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let mut sessions = edge.sessions();
    assert_eq!(*sessions.borrow(), 1);
    agent.shutdown().await;
    // The edge notices the closed connection and unroutes the host.
    tokio::time::timeout(HANG_GUARD, sessions.wait_for(|n| *n == 0))
        .await
        .unwrap()
        .unwrap();
    let status = client
        .get(http_url(&edge, HOST, "/"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 503, "a host whose agent left answers 503");
}

/// An agent restarting (as on `helm upgrade`): a request that arrives while
/// its host's tunnel is away waits for the tunnel to come back, within
/// `reconnect_grace`, and is served; when none comes back it is answered
/// 503 at the end of the grace. Before the grace existed, the first request
/// was answered 503 at once.
#[tokio::test]
async fn a_request_waits_for_a_restarting_agent_within_the_grace() {
    init();
    let cert = TestCert::new();
    let authority = authority_with("t1", vec![Binding::http(HOST)]);
    let mut config = edge_config(&cert, "127.0.0.1:0".parse().unwrap());
    config.public_limits.reconnect_grace = std::time::Duration::from_secs(8);
    let edge = EdgeServer::start(config, Arc::new(authority.clone()), None)
        .await
        .unwrap();
    let agent = start_agent(&cert, &edge, "t1", vec![Binding::http(HOST)]).await;
    agent.connected().await.unwrap();
    let client = http_client(&cert, &edge, &[HOST]);
    let get = || client.get(http_url(&edge, HOST, "/")).send();
    assert_eq!(get().await.unwrap().status(), 200);
    let mut sessions = edge.sessions();
    agent.shutdown().await;
    tokio::time::timeout(HANG_GUARD, sessions.wait_for(|n| *n == 0))
        .await
        .unwrap()
        .unwrap();
    // A request while no tunnel serves the host: no answer yet...
    let mut raw = TcpStream::connect(edge.http_addr.unwrap()).await.unwrap();
    raw.write_all(
        format!("GET / HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut first = [0u8; 1];
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(300), raw.read(&mut first))
            .await
            .is_err(),
        "the request waits for the tunnel instead of being answered at once"
    );
    // ... until an agent attaches the host again: then it is served.
    let agent = start_agent(&cert, &edge, "t1", vec![Binding::http(HOST)]).await;
    agent.connected().await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(HANG_GUARD, raw.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // No agent comes back: answered 503 once the grace is over.
    agent.shutdown().await;
    tokio::time::timeout(HANG_GUARD, sessions.wait_for(|n| *n == 0))
        .await
        .unwrap()
        .unwrap();
    let status = tokio::time::timeout(HANG_GUARD, get())
        .await
        .unwrap()
        .unwrap()
        .status();
    assert_eq!(status, 503, "no tunnel came back within the grace");
}

/// A raw TLS connection to the agent listener, speaking the wire protocol by hand.
async fn raw_agent_connection(
    cert: &TestCert,
    edge: &tuna_edge::EdgeHandle,
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
    config.alpn_protocols = vec![tuna_protocol::wire::ALPN.to_vec()];
    let tcp = TcpStream::connect(edge.agent_addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_version_mismatch_is_answered_legibly() {
    use tuna_protocol::wire::{Frame, Preamble};
    init();
    let cert = TestCert::new();
    let authority = authority_with("t1", vec![Binding::http(HOST)]);
    let edge = start_edge(&cert, &authority).await;
    let mut tls = raw_agent_connection(&cert, &edge).await;
    tls.write_all(&Preamble { version: 99 }.encode())
        .await
        .unwrap();
    let frame = Frame::read_from(&mut tls).await.unwrap();
    let Frame::Reject(reason) = frame else {
        panic!("expected reject, got {frame:?}")
    };
    assert_eq!(reason.code, ErrorCode::VersionMismatch);
    assert!(
        reason.message.contains("version 2") && reason.message.contains("99"),
        "{}",
        reason.message
    );
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest).await;
    assert!(rest.is_empty(), "the edge closes after the rejection");
}

#[tokio::test]
async fn a_silent_or_foreign_client_is_dropped() {
    init();
    let cert = TestCert::new();
    let authority = authority_with("t1", vec![Binding::http(HOST)]);
    let edge = start_edge(&cert, &authority).await;

    let mut foreign = raw_agent_connection(&cert, &edge).await;
    foreign.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut rest = Vec::new();
    let _ = foreign.read_to_end(&mut rest).await;
    assert!(
        rest.is_empty(),
        "no answer to bytes without the TUNA preamble"
    );

    // Says nothing: the handshake timeout closes it.
    let mut silent = raw_agent_connection(&cert, &edge).await;
    let read = tokio::time::timeout(HANG_GUARD, silent.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the edge never closed a silent connection");
    assert!(rest.is_empty());
}

#[tokio::test]
async fn streams_can_be_taken_from_a_channel_with_their_metadata() {
    use tuna_agent::Agent;
    use tuna_protocol::wire::StreamKind;
    init();
    let cert = TestCert::new();
    let (listener, port) = endpoint_listener();
    let authority = authority_with("t1", vec![Binding::tcp("db")]);
    authority.add_tcp_alias("db", port);
    let edge = start_edge_with(&cert, &authority, &[listener]).await;
    let (agent, mut streams) = Agent::start_with_channel(agent_config(&cert, &edge), 16).unwrap();
    agent
        .attach(
            "db-tunnel",
            tuna_protocol::wire::TunnelToken::new("t1"),
            vec![Binding::tcp("db")],
        )
        .await
        .unwrap();
    agent.connected().await.unwrap();

    let mut client = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let client_addr = client.local_addr().unwrap();
    let (mut stream, meta) = tokio::time::timeout(HANG_GUARD, streams.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        meta.client_addr, client_addr,
        "the stream names the public client"
    );
    assert_eq!(
        meta.kind,
        StreamKind::Tcp {
            endpoint: "db".into(),
            port
        }
    );
    assert_eq!(meta.tunnel, "db-tunnel", "the stream names its tunnel");
    client.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    stream.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    stream.write_all(b"pong").await.unwrap();
    stream.shutdown().await.unwrap();
    let mut back = Vec::new();
    client.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"pong", "half-close travels as end of stream");
}
