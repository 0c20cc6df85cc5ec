//! Protocol version 2: one agent connection carries many tunnels, each
//! authorised by its own token. Real TLS, real sockets on 127.0.0.1.

use crate::data_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use data_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tuna_agent::{Agent, AgentStatus, TunnelStatus};
use tuna_edge::{EdgeServer, MemoryAuthority};
use tuna_protocol::mux::{self, MuxStream};
use tuna_protocol::wire::{
    ALPN, Binding, BindingOutcome, BoundTarget, ErrorCode, Frame, Preamble, StreamKind, StreamMeta,
    TunnelToken,
};

fn host(i: usize) -> String {
    format!("h{i}.tuna.test")
}

/// An authority with one token per tunnel: `tok-i` / `t-i` for host `h<i>`.
fn authority(n: usize) -> MemoryAuthority {
    let authority = MemoryAuthority::new();
    for i in 0..n {
        authority.add_token(
            &format!("tok-{i}"),
            &TunnelToken::new(format!("t-{i}")),
            "acct",
            far_future(),
            vec![Binding::http(host(i))],
        );
    }
    authority
}

async fn get(client: &reqwest::Client, edge: &tuna_edge::EdgeHandle, h: &str) -> (u16, String) {
    let resp = client.get(http_url(edge, h, "/")).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

#[tokio::test]
async fn one_connection_carries_many_tunnels_across_an_edge_restart() {
    init();
    let cert = TestCert::new();
    // More tunnels than one hello carries: the rest travel as attach frames.
    const N: usize = 40;
    let authority = authority(N);
    let edge = start_edge(&cert, &authority).await;
    let agent_addr = edge.agent_addr;
    let agent = Agent::start(agent_config(&cert, &edge), backend_handler).unwrap();
    for i in 0..N {
        agent
            .attach(
                format!("web-{i}"),
                TunnelToken::new(format!("t-{i}")),
                vec![Binding::http(host(i))],
            )
            .await
            .unwrap();
    }
    let mut session = None;
    for i in 0..N {
        agent.serving(&format!("web-{i}")).await.unwrap();
        let status = agent
            .tunnel_status(&format!("web-{i}"))
            .unwrap()
            .borrow()
            .clone();
        let TunnelStatus::Serving { session_id, bound } = status else {
            panic!("web-{i} not serving: {status:?}")
        };
        assert_eq!(bound[0].bound, Some(BoundTarget::Http { host: host(i) }));
        assert_eq!(session.get_or_insert(session_id.clone()), &session_id);
    }
    assert_eq!(*edge.sessions().borrow(), 1, "one session for every tunnel");
    let hosts: Vec<String> = (0..N).map(host).collect();
    let names: Vec<&str> = hosts.iter().map(String::as_str).collect();
    let client = http_client(&cert, &edge, &names);
    for i in [0, 17, N - 1] {
        let (status, text) = get(&client, &edge, &host(i)).await;
        assert_eq!(status, 200);
        assert!(text.ends_with(&format!("tunnel=web-{i}")), "{text}");
    }

    // Restart the edge: the agent reconnects and re-attaches every tunnel.
    edge.shutdown().await;
    let edge = EdgeServer::start(
        edge_config(&cert, agent_addr),
        Arc::new(authority.clone()),
        None,
    )
    .await
    .unwrap();
    let first = session.unwrap();
    wait_status(
        &agent,
        |s| matches!(s, AgentStatus::Connected { session_id } if *session_id != first),
    )
    .await;
    for i in 0..N {
        wait_tunnel(
            &agent,
            &format!("web-{i}"),
            |s| matches!(s, TunnelStatus::Serving { session_id, .. } if *session_id != first),
        )
        .await;
    }
    let client = http_client(&cert, &edge, &names);
    let (status, text) = get(&client, &edge, &host(N - 1)).await;
    assert_eq!(status, 200);
    assert!(text.ends_with(&format!("tunnel=web-{}", N - 1)), "{text}");
    assert_eq!(*edge.sessions().borrow(), 1);
}

#[tokio::test]
async fn revoking_one_token_closes_only_its_tunnel() {
    init();
    let cert = TestCert::new();
    let authority = authority(3);
    let edge = start_edge(&cert, &authority).await;
    let agent = Agent::start(agent_config(&cert, &edge), backend_handler).unwrap();
    for i in 0..3 {
        agent
            .attach(
                format!("web-{i}"),
                TunnelToken::new(format!("t-{i}")),
                vec![Binding::http(host(i))],
            )
            .await
            .unwrap();
    }
    for i in 0..3 {
        agent.serving(&format!("web-{i}")).await.unwrap();
    }
    let session = agent.session_id().unwrap();

    authority.revoke("tok-1");
    let status = wait_tunnel(&agent, "web-1", |s| matches!(s, TunnelStatus::Closed(_))).await;
    assert!(
        matches!(&status, TunnelStatus::Closed(r) if r.code == ErrorCode::TokenRevoked),
        "{status:?}"
    );
    let client = http_client(&cert, &edge, &[&host(0), &host(1), &host(2)]);
    assert_eq!(get(&client, &edge, &host(1)).await.0, 503);
    for i in [0, 2] {
        assert_eq!(
            get(&client, &edge, &host(i)).await.0,
            200,
            "h{i} still served"
        );
        assert!(matches!(
            &*agent.tunnel_status(&format!("web-{i}")).unwrap().borrow(),
            TunnelStatus::Serving { session_id, .. } if *session_id == session
        ));
    }
    assert_eq!(agent.session_id(), Some(session), "the session survives");
}

#[tokio::test]
async fn a_binding_is_judged_against_the_token_of_the_tunnel_that_claims_it() {
    init();
    let cert = TestCert::new();
    let authority = authority(2);
    let edge = start_edge(&cert, &authority).await;
    let agent = Agent::start(agent_config(&cert, &edge), backend_handler).unwrap();
    agent
        .attach("a", TunnelToken::new("t-0"), vec![Binding::http(host(0))])
        .await
        .unwrap();
    agent
        .attach("b", TunnelToken::new("t-1"), vec![Binding::http(host(1))])
        .await
        .unwrap();
    agent.serving("a").await.unwrap();
    agent.serving("b").await.unwrap();

    // Tunnel a asks for b's host: b's token allows it, a's does not.
    agent
        .set_bindings("a", vec![Binding::http(host(0)), Binding::http(host(1))])
        .await
        .unwrap();
    let status = wait_tunnel(
        &agent,
        "a",
        |s| matches!(s, TunnelStatus::Serving { bound, .. } if bound.len() == 2),
    )
    .await;
    let TunnelStatus::Serving { bound, .. } = status else {
        unreachable!()
    };
    let stolen = bound
        .iter()
        .find(|o| o.binding == Binding::http(host(1)))
        .unwrap();
    assert_eq!(
        stolen.error.as_ref().map(|e| e.code),
        Some(ErrorCode::BindingNotAllowed),
        "{stolen:?}"
    );
    // And a new tunnel with a's token cannot attach with b's host either.
    agent
        .attach("c", TunnelToken::new("t-0"), vec![Binding::http(host(1))])
        .await
        .unwrap();
    let status = wait_tunnel(&agent, "c", |s| matches!(s, TunnelStatus::Refused(_))).await;
    assert!(
        matches!(&status, TunnelStatus::Refused(r) if r.code == ErrorCode::BindingNotAllowed),
        "{status:?}"
    );
    let client = http_client(&cert, &edge, &[&host(1)]);
    let (status, text) = get(&client, &edge, &host(1)).await;
    assert_eq!(status, 200);
    assert!(text.ends_with("tunnel=b"), "still b's: {text}");
}

#[tokio::test]
async fn a_new_token_replaces_the_old_one_for_its_tunnel_only() {
    init();
    let cert = TestCert::new();
    let authority = authority(2);
    // The new token also allows x0, which the old one does not.
    authority.add_token(
        "tok-0-renewed",
        &TunnelToken::new("t-0-renewed"),
        "acct",
        far_future(),
        vec![Binding::http(host(0)), Binding::http("x0.tuna.test")],
    );
    let edge = start_edge(&cert, &authority).await;
    let agent = Agent::start(agent_config(&cert, &edge), backend_handler).unwrap();
    agent
        .attach("a", TunnelToken::new("t-0"), vec![Binding::http(host(0))])
        .await
        .unwrap();
    agent
        .attach("b", TunnelToken::new("t-1"), vec![Binding::http(host(1))])
        .await
        .unwrap();
    agent.serving("a").await.unwrap();
    agent.serving("b").await.unwrap();
    let session = agent.session_id().unwrap();

    agent
        .set_token("a", TunnelToken::new("t-0-renewed"))
        .await
        .unwrap();
    // Judged against the new token, which the edge holds once x0 binds.
    agent
        .set_bindings(
            "a",
            vec![Binding::http(host(0)), Binding::http("x0.tuna.test")],
        )
        .await
        .unwrap();
    let status = wait_tunnel(
        &agent,
        "a",
        |s| matches!(s, TunnelStatus::Serving { bound, .. } if bound.len() == 2),
    )
    .await;
    let TunnelStatus::Serving { bound, .. } = status else {
        unreachable!()
    };
    assert!(bound.iter().all(|o| o.error.is_none()), "{bound:?}");
    // Revoking the old token no longer touches tunnel a; b's revocation,
    // broadcast after it, marks when the edge has seen both.
    authority.revoke("tok-0");
    authority.revoke("tok-1");
    wait_tunnel(&agent, "b", |s| matches!(s, TunnelStatus::Closed(_))).await;
    assert!(
        matches!(
            &*agent.tunnel_status("a").unwrap().borrow(),
            TunnelStatus::Serving { .. }
        ),
        "tunnel a serves on its new token"
    );
    let client = http_client(&cert, &edge, &[&host(0)]);
    assert_eq!(get(&client, &edge, &host(0)).await.0, 200);

    authority.revoke("tok-0-renewed");
    wait_tunnel(&agent, "a", |s| matches!(s, TunnelStatus::Closed(_))).await;
    assert_eq!(agent.session_id(), Some(session));
}

#[tokio::test]
async fn a_tunnel_that_loses_its_host_to_a_newer_tunnel_is_told() {
    init();
    let cert = TestCert::new();
    let authority = authority(1);
    let edge = start_edge(&cert, &authority).await;
    let old = start_agent(&cert, &edge, "t-0", vec![Binding::http(host(0))]).await;
    old.serving("t-0").await.unwrap();
    let old_session = old.session_id().unwrap();

    let newer = start_agent(&cert, &edge, "t-0", vec![Binding::http(host(0))]).await;
    newer.serving("t-0").await.unwrap();
    let status = wait_tunnel(&old, "t-0", |s| matches!(s, TunnelStatus::Closed(_))).await;
    assert!(
        matches!(&status, TunnelStatus::Closed(r) if r.code == ErrorCode::BindingTakenOver),
        "{status:?}"
    );
    // The displaced session has no tunnel left: the edge ends it after the
    // grace; meanwhile the old agent does not fight back.
    assert_eq!(old.session_id(), Some(old_session));
    let client = http_client(&cert, &edge, &[&host(0)]);
    assert_eq!(get(&client, &edge, &host(0)).await.0, 200);
}

#[tokio::test]
async fn a_session_without_tunnels_is_closed_after_the_grace_and_the_agent_idles() {
    init();
    let cert = TestCert::new();
    let authority = authority(1);
    let mut config = edge_config(&cert, "127.0.0.1:0".parse().unwrap());
    config.heartbeat = Duration::from_millis(100);
    config.limits.empty_session_grace = Duration::from_millis(300);
    let edge = EdgeServer::start(config, Arc::new(authority.clone()), None)
        .await
        .unwrap();
    let agent = start_agent(&cert, &edge, "t-0", vec![Binding::http(host(0))]).await;
    agent.serving("t-0").await.unwrap();
    let mut sessions = edge.sessions();
    assert_eq!(*sessions.borrow(), 1);

    agent.detach("t-0").await.unwrap();
    assert!(agent.tunnel_status("t-0").is_none());
    tokio::time::timeout(HANG_GUARD, sessions.wait_for(|n| *n == 0))
        .await
        .unwrap()
        .unwrap();
    wait_status(&agent, |s| matches!(s, AgentStatus::Idle)).await;

    // Attaching again connects again.
    agent
        .attach("t-0", TunnelToken::new("t-0"), vec![Binding::http(host(0))])
        .await
        .unwrap();
    agent.serving("t-0").await.unwrap();
    assert_eq!(*sessions.borrow(), 1);
}

#[tokio::test]
async fn a_bad_tunnel_in_the_hello_does_not_stop_the_good_ones() {
    init();
    let cert = TestCert::new();
    let authority = authority(1);
    let edge = start_edge(&cert, &authority).await;
    let agent = Agent::start(agent_config(&cert, &edge), backend_handler).unwrap();
    agent
        .attach(
            "bad",
            TunnelToken::new("nope"),
            vec![Binding::http(host(0))],
        )
        .await
        .unwrap();
    agent
        .attach(
            "good",
            TunnelToken::new("t-0"),
            vec![Binding::http(host(0))],
        )
        .await
        .unwrap();
    agent.serving("good").await.unwrap();
    let status = wait_tunnel(&agent, "bad", |s| matches!(s, TunnelStatus::Refused(_))).await;
    assert!(
        matches!(&status, TunnelStatus::Refused(r) if r.code == ErrorCode::BadToken),
        "{status:?}"
    );
}

#[tokio::test]
async fn detaching_a_tunnel_ends_its_open_connections() {
    init();
    let cert = TestCert::new();
    let (listener, port) = endpoint_listener();
    let authority = MemoryAuthority::new();
    authority.add_tcp_alias("db", port);
    authority.add_token(
        "tok-db",
        &TunnelToken::new("t-db"),
        "acct",
        far_future(),
        vec![Binding::tcp("db")],
    );
    let edge = start_edge_with(&cert, &authority, &[listener]).await;
    let agent = start_agent(&cert, &edge, "t-db", vec![Binding::tcp("db")]).await;
    agent.serving("t-db").await.unwrap();

    let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tcp.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    tcp.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");

    agent.detach("t-db").await.unwrap();
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(HANG_GUARD, tcp.read_to_end(&mut rest)).await;
    assert!(ended.is_ok(), "the public connection outlived its tunnel");
}

/// A hand-written edge: TLS, hello, welcome, h2 client, then whatever the
/// test makes it say.
struct FakeEdge {
    sender: h2::client::SendRequest<bytes::Bytes>,
    control: MuxStream,
    hello: Vec<tuna_protocol::wire::Attach>,
    _driver: tokio::task::JoinHandle<()>,
}

async fn fake_edge(listener: &TcpListener, cert: &TestCert) -> FakeEdge {
    let mut tls = (*cert.server_config()).clone();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let (tcp, _) = listener.accept().await.unwrap();
    let mut tls = acceptor.accept(tcp).await.unwrap();
    let mut preamble = [0u8; Preamble::LEN];
    tls.read_exact(&mut preamble).await.unwrap();
    let Frame::Hello { tunnels, .. } = Frame::read_from(&mut tls).await.unwrap() else {
        panic!("no hello")
    };
    Frame::Welcome {
        session_id: "ses_fake".into(),
        heartbeat_ms: 10_000,
    }
    .write_to(&mut tls)
    .await
    .unwrap();
    let (sender, connection) = mux::client_builder()
        .handshake(mux::Coalesced::new(tls))
        .await
        .unwrap();
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let control = mux::open_control(&sender).await.unwrap();
    FakeEdge {
        sender,
        control,
        hello: tunnels,
        _driver: driver,
    }
}

#[tokio::test]
async fn the_agent_serves_on_a_stream_only_what_its_tunnel_declared() {
    init();
    let cert = TestCert::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = tuna_agent::AgentConfig::new(
        listener.local_addr().unwrap().to_string(),
        tuna_agent::Trust::CaPem(cert.cert_pem.clone().into_bytes()),
    );
    config.server_name = Some("localhost".into());
    let handled = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&handled);
    let (tx, mut metas) = tokio::sync::mpsc::unbounded_channel();
    let agent = Agent::start(config, move |_stream: MuxStream, meta: StreamMeta| {
        seen.fetch_add(1, Ordering::SeqCst);
        let _ = tx.send(meta);
    })
    .unwrap();
    agent
        .attach(
            "a",
            TunnelToken::new("ta"),
            vec![Binding::http("a.example")],
        )
        .await
        .unwrap();
    agent
        .attach(
            "b",
            TunnelToken::new("tb"),
            vec![Binding::http("b.example")],
        )
        .await
        .unwrap();
    let mut edge = fake_edge(&listener, &cert).await;
    assert_eq!(edge.hello.len(), 2);
    for attach in edge.hello.clone() {
        Frame::Attached {
            bound: attach
                .bindings
                .iter()
                .map(|b| BindingOutcome {
                    binding: b.clone(),
                    bound: None,
                    error: None,
                })
                .collect(),
            tunnel: attach.tunnel,
            seq: attach.seq,
        }
        .write_to(&mut edge.control)
        .await
        .unwrap();
    }
    agent.serving("a").await.unwrap();

    let meta = |tunnel: &str, host: &str| StreamMeta {
        client_addr: "192.0.2.1:1234".parse().unwrap(),
        kind: StreamKind::Http {
            host: host.into(),
            scheme: tuna_protocol::wire::Scheme::Http,
        },
        tunnel: tunnel.into(),
    };
    // b's host on a's stream, an unknown tunnel: refused by the agent.
    for (tunnel, h) in [("a", "b.example"), ("zzz", "a.example")] {
        let mut stream = mux::open_stream(&edge.sender, &meta(tunnel, h), mux::Gate::new())
            .await
            .unwrap();
        let mut buf = [0u8; 1];
        let refused = stream.read(&mut buf).await;
        assert!(refused.is_err(), "{tunnel}/{h} was accepted");
    }
    // The right pairing is served.
    let mut stream = mux::open_stream(&edge.sender, &meta("b", "b.example"), mux::Gate::new())
        .await
        .unwrap();
    stream.write_all(b"x").await.unwrap();
    let got = tokio::time::timeout(HANG_GUARD, metas.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.tunnel, "b");
    assert_eq!(
        handled.load(Ordering::SeqCst),
        1,
        "only the matching stream was handled"
    );
}

#[tokio::test]
async fn a_version_1_agent_is_told_both_versions() {
    init();
    let cert = TestCert::new();
    let authority = authority(1);
    let edge = start_edge(&cert, &authority).await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert_der.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"tuna-tunnel/1".to_vec()];
    let tcp = TcpStream::connect(edge.agent_addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(&Preamble { version: 1 }.encode())
        .await
        .unwrap();
    let Frame::Reject(reason) = Frame::read_from(&mut tls).await.unwrap() else {
        panic!("expected reject")
    };
    assert_eq!(reason.code, ErrorCode::VersionMismatch);
    assert!(
        reason.message.contains("version 2") && reason.message.contains("version 1"),
        "{}",
        reason.message
    );
}
