//! Held addresses (a Gateway's, issue 41) on the data plane: every
//! connection to one port of an address goes raw to the one tunnel bound to
//! it, two addresses share a port number without sharing connections, a live
//! address stays with its owner, and the listener closes with its tunnel.
//! Real sockets on 127.0.100.0/24 (all of 127/8 is the loopback device's).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::data_support::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tuna_agent::TunnelStatus;
use tuna_edge::MemoryAuthority;
use tuna_protocol::wire::{Binding, BoundTarget, ErrorCode, TunnelToken};

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 100, last])
}

/// A port free on `address` a moment ago (nothing else on this machine
/// listens in 127.0.100.0/24).
fn free_port(address: IpAddr) -> u16 {
    std::net::TcpListener::bind((address, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Connects to `at`, reads the backend's first line (which address the
/// stream said it came from), then checks that bytes are echoed.
async fn first_line(at: SocketAddr) -> String {
    let tcp = tokio::time::timeout(HANG_GUARD, TcpStream::connect(at))
        .await
        .unwrap()
        .unwrap();
    let mut tcp = BufReader::new(tcp);
    let mut line = String::new();
    tokio::time::timeout(HANG_GUARD, tcp.read_line(&mut line))
        .await
        .expect("no line from the backend")
        .unwrap();
    tcp.get_mut().write_all(b"ping\n").await.unwrap();
    let mut echo = String::new();
    tokio::time::timeout(HANG_GUARD, tcp.read_line(&mut echo))
        .await
        .expect("no echo")
        .unwrap();
    assert_eq!(echo, "ping\n");
    line
}

fn authority() -> MemoryAuthority {
    MemoryAuthority::new()
}

fn token(authority: &MemoryAuthority, id: &str, account: &str, allowed: Vec<Binding>) -> String {
    let token = format!("tok-{id}");
    authority.add_token(
        id,
        &TunnelToken::new(&token),
        account,
        far_future(),
        allowed,
    );
    token
}

#[tokio::test]
async fn each_address_reaches_its_own_tunnel_on_the_same_port() {
    init();
    let cert = TestCert::new();
    let (a, b) = (ip(1), ip(2));
    let port = free_port(a);
    let authority = authority();
    let ta = token(&authority, "a", "acct-a", vec![Binding::address(a, port)]);
    let tb = token(&authority, "b", "acct-b", vec![Binding::address(b, port)]);
    let edge = start_edge(&cert, &authority).await;
    let agent_a = start_agent(&cert, &edge, &ta, vec![Binding::address(a, port)]).await;
    let agent_b = start_agent(&cert, &edge, &tb, vec![Binding::address(b, port)]).await;
    for (agent, token, address) in [(&agent_a, &ta, a), (&agent_b, &tb, b)] {
        match wait_tunnel(agent, &tunnel_id(token), |s| {
            !matches!(s, TunnelStatus::Pending)
        })
        .await
        {
            TunnelStatus::Serving { bound, .. } => {
                let targets: Vec<_> = bound.into_iter().map(|b| b.bound).collect();
                assert_eq!(targets, vec![Some(BoundTarget::Address { address, port })]);
            }
            other => panic!("{address}: {other:?}"),
        }
    }
    for _ in 0..3 {
        assert_eq!(
            first_line(SocketAddr::new(a, port)).await,
            format!("address={a}:{port} client_ip=127.0.0.1\n")
        );
        assert_eq!(
            first_line(SocketAddr::new(b, port)).await,
            format!("address={b}:{port} client_ip=127.0.0.1\n")
        );
    }
}

#[tokio::test]
async fn an_address_not_granted_is_refused_and_opens_nothing() {
    init();
    let cert = TestCert::new();
    let granted = ip(3);
    let port = free_port(granted);
    let authority = authority();
    let t = token(
        &authority,
        "c",
        "acct",
        vec![Binding::address(granted, port)],
    );
    let edge = start_edge(&cert, &authority).await;
    let other = ip(4);
    let agent = start_agent(&cert, &edge, &t, vec![Binding::address(other, port)]).await;
    let status = wait_tunnel(&agent, &tunnel_id(&t), |s| {
        !matches!(s, TunnelStatus::Pending)
    })
    .await;
    match status {
        TunnelStatus::Refused(r) => assert_eq!(r.code, ErrorCode::BindingNotAllowed, "{r:?}"),
        other => panic!("not refused: {other:?}"),
    }
    let refused = TcpStream::connect((other, port)).await;
    assert!(refused.is_err(), "something listens on {other}:{port}");
}

#[tokio::test]
async fn a_live_address_stays_with_its_owner_and_closes_with_its_tunnel() {
    init();
    let cert = TestCert::new();
    let address = ip(5);
    let port = free_port(address);
    let at = SocketAddr::new(address, port);
    let authority = authority();
    let owner = token(
        &authority,
        "o",
        "acct-o",
        vec![Binding::address(address, port)],
    );
    let thief = token(
        &authority,
        "t",
        "acct-t",
        vec![Binding::address(address, port)],
    );
    let edge = start_edge(&cert, &authority).await;
    let agent = start_agent(&cert, &edge, &owner, vec![Binding::address(address, port)]).await;
    let serving = wait_tunnel(&agent, &tunnel_id(&owner), |s| {
        !matches!(s, TunnelStatus::Pending)
    })
    .await;
    assert!(
        matches!(serving, TunnelStatus::Serving { .. }),
        "{serving:?}"
    );

    let other = start_agent(&cert, &edge, &thief, vec![Binding::address(address, port)]).await;
    match wait_tunnel(&other, &tunnel_id(&thief), |s| {
        !matches!(s, TunnelStatus::Pending)
    })
    .await
    {
        TunnelStatus::Refused(r) => {
            assert_eq!(r.code, ErrorCode::BindingNotAllowed, "{r:?}");
            assert!(r.message.contains("another owner"), "{r:?}");
        }
        other => panic!("another account took a live address: {other:?}"),
    }
    assert!(first_line(at).await.starts_with(&format!("address={at} ")));

    // The owner's tunnel goes: the listener closes with it.
    drop(agent);
    closes(at).await;
}

/// Waits until nothing accepts on `at` any more.
async fn closes(at: SocketAddr) {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while TcpStream::connect(at).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{at} still accepts after its tunnel closed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_address_given_back_closes_every_tunnel_on_it_and_its_listeners() {
    init();
    let cert = TestCert::new();
    let address = ip(6);
    let (p1, p2) = (free_port(address), free_port(address));
    let kept = ip(7);
    let p3 = free_port(kept);
    let authority = authority();
    let bindings = [
        Binding::address(address, p1),
        Binding::address(address, p2),
        Binding::address(kept, p3),
    ];
    let gone = token(&authority, "g", "acct", bindings[..2].to_vec());
    let stays = token(&authority, "s", "acct", bindings[2..].to_vec());
    let edge = start_edge(&cert, &authority).await;
    let agent = start_agent(&cert, &edge, &gone, bindings[..2].to_vec()).await;
    agent
        .attach(
            tunnel_id(&stays),
            TunnelToken::new(&stays),
            bindings[2..].to_vec(),
        )
        .await
        .unwrap();
    for t in [&gone, &stays] {
        let s = wait_tunnel(&agent, &tunnel_id(t), |s| {
            !matches!(s, TunnelStatus::Pending)
        })
        .await;
        assert!(matches!(s, TunnelStatus::Serving { .. }), "{s:?}");
    }
    assert!(
        first_line(SocketAddr::new(address, p2))
            .await
            .starts_with("address=")
    );

    authority.release_address(address);
    match wait_tunnel(&agent, &tunnel_id(&gone), |s| {
        matches!(s, TunnelStatus::Closed(_))
    })
    .await
    {
        TunnelStatus::Closed(r) => {
            assert_eq!(r.code, ErrorCode::BindingReleased, "{r:?}");
            // Told at once, by the release itself (not found out later by
            // the periodic re-check of the grants).
            assert!(
                r.message
                    .contains(&format!("the address {address} was given back")),
                "{r:?}"
            );
        }
        other => unreachable!("{other:?}"),
    }
    closes(SocketAddr::new(address, p1)).await;
    closes(SocketAddr::new(address, p2)).await;
    // The other address, on another tunnel of the same session, serves on.
    assert_eq!(
        first_line(SocketAddr::new(kept, p3)).await,
        format!("address={kept}:{p3} client_ip=127.0.0.1\n")
    );
}
