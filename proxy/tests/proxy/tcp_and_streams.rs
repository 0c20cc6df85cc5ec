//! TCP listeners at runtime, tunnel TCP services, and `serve_stream` with
//! an in-memory duplex stream (as a tunnel would hand over).

use crate::common;

use std::net::SocketAddr;

use common::*;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tuna_proxy::{ConnInfo, PathType, ProxyConfig, ProxyCore, Scheme, TcpLimits, TcpUpstream};

/// Reads everything until EOF, then answers `got <n> bytes` and closes:
/// only works if the proxy passes the client's half-close on.
async fn count_until_eof_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                tcp.read_to_end(&mut buf).await.unwrap();
                let reply = format!("got {} bytes", buf.len());
                tcp.write_all(reply.as_bytes()).await.unwrap();
                tcp.shutdown().await.unwrap();
            });
        }
    });
    addr
}

async fn half_close_exchange<S>(mut stream: S, payload: &[u8]) -> String
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    stream.write_all(payload).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn tcp_listener_added_and_removed_at_runtime_with_half_close() {
    let backend = count_until_eof_backend().await;
    let core = ProxyCore::new(ProxyConfig::default());
    let upstream = TcpUpstream::new(vec![backend]);
    let bound = core
        .add_tcp_listener(
            "127.0.0.1:0".parse().unwrap(),
            upstream.clone(),
            TcpLimits::default(),
        )
        .await
        .unwrap();
    assert_eq!(core.tcp_listeners(), vec![bound]);

    let payload = vec![42u8; 300_000];
    let tcp = TcpStream::connect(bound).await.unwrap();
    assert_eq!(half_close_exchange(tcp, &payload).await, "got 300000 bytes");

    // A connection open across the removal keeps working.
    let mut open = TcpStream::connect(bound).await.unwrap();
    open.write_all(b"early").await.unwrap();
    // (Accepted and spliced, not merely queued in the kernel backlog, which
    // closing a listener resets.)
    while !core
        .render_metrics()
        .contains("tuna_proxy_tcp_connections_active 1")
    {
        tokio::task::yield_now().await;
    }
    core.remove_tcp_listener(bound).await.unwrap();
    assert!(
        TcpStream::connect(bound).await.is_err(),
        "port closed after removal"
    );
    assert_eq!(half_close_exchange(open, b" late").await, "got 10 bytes");

    // Re-adding on the same port works at once.
    let again = core
        .add_tcp_listener(bound, upstream, TcpLimits::default())
        .await
        .unwrap();
    assert_eq!(again, bound);
    let tcp = TcpStream::connect(bound).await.unwrap();
    assert_eq!(half_close_exchange(tcp, b"abc").await, "got 3 bytes");
    assert!(
        core.render_metrics()
            .contains("tuna_proxy_tcp_bytes_to_upstream_total 300013")
    );
}

#[tokio::test]
async fn tcp_connection_limit_closes_extra_connections() {
    let backend = count_until_eof_backend().await;
    let core = ProxyCore::new(ProxyConfig::default());
    let limits = TcpLimits {
        max_connections: 1,
        ..TcpLimits::default()
    };
    let bound = core
        .add_tcp_listener(
            "127.0.0.1:0".parse().unwrap(),
            TcpUpstream::new(vec![backend]),
            limits,
        )
        .await
        .unwrap();
    let mut first = TcpStream::connect(bound).await.unwrap();
    first.write_all(b"x").await.unwrap();
    // Wait until the first connection is spliced (it holds the slot).
    while !core
        .render_metrics()
        .contains("tuna_proxy_tcp_connections_active 1")
    {
        tokio::task::yield_now().await;
    }
    let mut second = TcpStream::connect(bound).await.unwrap();
    let mut buf = [0u8; 16];
    let n = second.read(&mut buf).await.unwrap_or(0);
    assert_eq!(n, 0, "the second connection is closed without data");
    assert_eq!(half_close_exchange(first, b"y").await, "got 2 bytes");
    assert!(
        core.render_metrics()
            .contains("tuna_proxy_tcp_connections_rejected_total 1")
    );
}

#[tokio::test]
async fn tcp_service_serves_duplex_streams() {
    let backend = count_until_eof_backend().await;
    let core = ProxyCore::new(ProxyConfig::default());
    core.set_tcp_service("db", TcpUpstream::new(vec![backend]), TcpLimits::default())
        .unwrap();
    let info = ConnInfo {
        client_addr: "198.51.100.7:40000".parse().unwrap(),
        local_addr: None,
        scheme: Scheme::Http,
        trusted: true,
        host: None,
    };
    let (client, server) = tokio::io::duplex(64 * 1024);
    let serving = {
        let core = core.clone();
        let info = info.clone();
        tokio::spawn(async move { core.serve_tcp_stream("db", server, info).await })
    };
    assert_eq!(
        half_close_exchange(client, &[1u8; 100_000]).await,
        "got 100000 bytes"
    );
    serving.await.unwrap().unwrap();

    let (_client, server) = tokio::io::duplex(1024);
    assert!(matches!(
        core.serve_tcp_stream("nope", server, info.clone()).await,
        Err(tuna_proxy::Error::NoSuchTcpService(_))
    ));
    assert!(core.remove_tcp_service("db"));
    let (_client, server) = tokio::io::duplex(1024);
    assert!(core.serve_tcp_stream("db", server, info).await.is_err());
}

#[tokio::test]
async fn serve_stream_takes_a_duplex_http_connection() {
    let web = echo_backend("web").await;
    let core = ProxyCore::new(ProxyConfig::default());
    core.set_host_routes(
        "shop.example.com",
        vec![route("shop.example.com", "/", PathType::Prefix, &[web])],
    )
    .unwrap();

    for (trusted, expected_xff, expected_id) in [
        (true, "203.0.113.1, 198.51.100.7", Some("edge-id-1")),
        (false, "198.51.100.7", None),
    ] {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let info = ConnInfo {
            client_addr: "198.51.100.7:40000".parse().unwrap(),
            local_addr: Some("192.0.2.1:443".parse().unwrap()),
            scheme: Scheme::Https,
            trusted,
            host: None,
        };
        let serving = {
            let core = core.clone();
            tokio::spawn(async move { core.serve_stream(server_io, info).await })
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client_io))
            .await
            .unwrap();
        tokio::spawn(conn);
        // Two requests on the one stream: keep-alive works over tunnels too.
        for _ in 0..2 {
            let req = http::Request::builder()
                .uri("/tunnelled")
                .header("host", "shop.example.com")
                .header("x-forwarded-for", "203.0.113.1")
                .header("x-request-id", "edge-id-1")
                .body(Empty::<bytes::Bytes>::new())
                .unwrap();
            let resp = sender.send_request(req).await.unwrap();
            assert_eq!(resp.status(), 200);
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            let echo = parse_echo(std::str::from_utf8(&body).unwrap());
            assert_eq!(echo["x-forwarded-proto"], vec!["https"]);
            assert_eq!(echo["x-forwarded-for"], vec![expected_xff]);
            let id = &echo["x-request-id"][0];
            match expected_id {
                Some(e) => assert_eq!(id, e),
                None => assert_ne!(id, "edge-id-1"),
            }
        }
        drop(sender);
        serving.await.unwrap();
    }
}

/// An upstream that starts listening a moment after the client connected (a
/// new Service whose rules kube-proxy is still programming, a pod being
/// replaced) costs the client a delay, not its connection: refused connects
/// are tried again within `connect_retry`. With no retry the client's
/// connection is closed, as before.
#[tokio::test]
async fn an_upstream_that_listens_a_moment_later_is_waited_for() {
    // A port nothing listens on yet.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let backend: SocketAddr = ([127, 0, 0, 1], port).into();
    let core = ProxyCore::new(ProxyConfig::default());
    let listen = |limits: TcpLimits| {
        let core = &core;
        async move {
            core.add_tcp_listener(
                "127.0.0.1:0".parse().unwrap(),
                TcpUpstream::new(vec![backend]),
                limits,
            )
            .await
            .unwrap()
        }
    };
    let no_retry = listen(TcpLimits {
        connect_retry: std::time::Duration::ZERO,
        ..TcpLimits::default()
    })
    .await;
    let mut closed = TcpStream::connect(no_retry).await.unwrap();
    let mut buf = [0u8; 16];
    let n = closed.read(&mut buf).await.unwrap_or(0);
    assert_eq!(n, 0, "without a retry the connection is closed at once");

    let bound = listen(TcpLimits::default()).await;
    let client = tokio::spawn(async move {
        let tcp = TcpStream::connect(bound).await.unwrap();
        half_close_exchange(tcp, b"early bytes").await
    });
    // The proxy has been refused at least once before the backend listens.
    while !core
        .render_metrics()
        .contains("tuna_proxy_tcp_connections_total 2")
    {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let listener = TcpListener::bind(backend).await.unwrap();
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        tcp.read_to_end(&mut got).await.unwrap();
        tcp.write_all(format!("got {} bytes", got.len()).as_bytes())
            .await
            .unwrap();
        tcp.shutdown().await.unwrap();
    });
    assert_eq!(client.await.unwrap(), "got 11 bytes");
}

/// A backend that names itself and closes.
async fn named_backend(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = tcp.write_all(name.as_bytes()).await;
                let _ = tcp.shutdown().await;
            });
        }
    });
    addr
}

/// Weighted backends (a TCPRoute's): connections are split by weight,
/// exactly over each cycle of the smooth weighted round-robin; weight 0
/// never gets one; the share of a backend that does not resolve is closed
/// without data. (`TCPRouteWeightedRouting` of the Gateway API suite asks
/// 70/30 within 3 % over 500 connections.)
#[tokio::test]
async fn weighted_tcp_backends_split_connections_by_weight() {
    use tuna_proxy::TcpTarget;
    let v1 = named_backend("v1").await;
    let v2 = named_backend("v2").await;
    let never = named_backend("never").await;
    let core = ProxyCore::new(ProxyConfig::default());
    let upstream = TcpUpstream {
        addrs: Vec::new(),
        weighted: vec![
            TcpTarget {
                addrs: vec![v1],
                weight: 70,
            },
            TcpTarget {
                addrs: vec![v2],
                weight: 30,
            },
            TcpTarget {
                addrs: vec![never],
                weight: 0,
            },
        ],
    };
    let bound = core
        .add_tcp_listener(
            "127.0.0.1:0".parse().unwrap(),
            upstream,
            TcpLimits::default(),
        )
        .await
        .unwrap();
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for _ in 0..100 {
        let mut tcp = TcpStream::connect(bound).await.unwrap();
        let mut name = String::new();
        tcp.read_to_string(&mut name).await.unwrap();
        *seen.entry(name).or_default() += 1;
    }
    assert_eq!(
        seen,
        [("v1".to_owned(), 70), ("v2".to_owned(), 30)].into(),
        "{seen:?}"
    );

    // Half the weight on a backend that does not resolve: half the
    // connections are closed at once, the others served.
    let core = ProxyCore::new(ProxyConfig::default());
    let upstream = TcpUpstream {
        addrs: Vec::new(),
        weighted: vec![
            TcpTarget {
                addrs: Vec::new(),
                weight: 1,
            },
            TcpTarget {
                addrs: vec![v1],
                weight: 1,
            },
        ],
    };
    let bound = core
        .add_tcp_listener(
            "127.0.0.1:0".parse().unwrap(),
            upstream,
            TcpLimits::default(),
        )
        .await
        .unwrap();
    let mut answers = Vec::new();
    for _ in 0..4 {
        let mut tcp = TcpStream::connect(bound).await.unwrap();
        let mut name = String::new();
        let _ = tcp.read_to_string(&mut name).await;
        answers.push(name);
    }
    answers.sort();
    assert_eq!(answers, ["", "", "v1", "v1"]);
    // Nothing usable at all is refused when registered.
    let none = TcpUpstream {
        addrs: Vec::new(),
        weighted: vec![TcpTarget {
            addrs: vec![v1],
            weight: 0,
        }],
    };
    assert!(
        core.add_tcp_listener("127.0.0.1:0".parse().unwrap(), none, TcpLimits::default())
            .await
            .is_err()
    );
}
