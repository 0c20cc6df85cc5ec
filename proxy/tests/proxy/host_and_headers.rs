//! What a request may claim: the host a tunnel stream serves, the
//! client-address and request-id fields, and framing no hop may forward.
//! Raw HTTP/1.1 bytes on real sockets and duplex tunnel streams, hyper and
//! scripted backends; each case on the fast path and on the Pingora path.

use crate::common;

use std::net::SocketAddr;

use common::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tuna_proxy::{ConnInfo, PathType, ProxyConfig, ProxyCore, Scheme};

/// Sends `request` (which asks for `Connection: close`) and reads the whole
/// answer until the proxy closes.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut io: S, request: &str) -> String {
    io.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), io.read_to_end(&mut out))
        .await
        .expect("the proxy closes after a Connection: close exchange");
    String::from_utf8_lossy(&out).into_owned()
}

fn status(resp: &str) -> &str {
    resp.split(' ').nth(1).unwrap_or("")
}

/// A core with `pub.example` and `hidden.example` on two echo backends.
async fn two_tenants() -> ProxyCore {
    let public = echo_backend("public").await;
    let hidden = echo_backend("hidden").await;
    let core = ProxyCore::new(ProxyConfig::default());
    core.set_host_routes(
        "pub.example",
        vec![route("pub.example", "/", PathType::Prefix, &[public])],
    )
    .unwrap();
    core.set_host_routes(
        "hidden.example",
        vec![route("hidden.example", "/", PathType::Prefix, &[hidden])],
    )
    .unwrap();
    core
}

/// Serves one request on a tunnel stream opened for `pub.example`.
async fn on_stream_for_pub(core: &ProxyCore, request: &str) -> String {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let info = ConnInfo {
        client_addr: "198.51.100.7:40000".parse().unwrap(),
        local_addr: None,
        scheme: Scheme::Https,
        trusted: true,
        host: Some("pub.example".into()),
    };
    let core2 = core.clone();
    let serving = tokio::spawn(async move { core2.serve_stream(server, info).await });
    let resp = exchange(client, request).await;
    serving.await.unwrap();
    resp
}

#[tokio::test]
async fn a_tunnel_stream_serves_only_the_host_it_was_opened_for() {
    let core = two_tenants().await;
    // (request, status, backend that must answer)
    let cases: &[(&str, &str, Option<&str>)] = &[
        // Fast path: Host alone.
        (
            "GET / HTTP/1.1\r\nHost: pub.example\r\nConnection: close\r\n\r\n",
            "200",
            Some("public"),
        ),
        (
            "GET / HTTP/1.1\r\nHost: PUB.example.:443\r\nConnection: close\r\n\r\n",
            "200",
            Some("public"),
        ),
        (
            "GET / HTTP/1.1\r\nHost: hidden.example\r\nConnection: close\r\n\r\n",
            "421",
            None,
        ),
        (
            "GET / HTTP/1.1\r\nHost: hidden.example@pub.example\r\nConnection: close\r\n\r\n",
            "400",
            None,
        ),
        // Pingora path (absolute form, chunked upload): the target's
        // authority is what counts, and it must be the stream's host.
        (
            "GET http://hidden.example/ HTTP/1.1\r\nHost: hidden.example\r\nConnection: close\r\n\r\n",
            "421",
            None,
        ),
        (
            "GET http://pub.example/ HTTP/1.1\r\nHost: pub.example\r\nConnection: close\r\n\r\n",
            "200",
            Some("public"),
        ),
        // A target and a Host that disagree: Pingora refuses it itself.
        (
            "GET http://pub.example/ HTTP/1.1\r\nHost: hidden.example\r\nConnection: close\r\n\r\n",
            "400",
            None,
        ),
        (
            "GET http://hidden.example/ HTTP/1.1\r\nHost: pub.example\r\nConnection: close\r\n\r\n",
            "400",
            None,
        ),
        (
            "POST / HTTP/1.1\r\nHost: hidden.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n",
            "421",
            None,
        ),
        (
            "POST / HTTP/1.1\r\nHost: pub.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n",
            "200",
            Some("public"),
        ),
    ];
    for (request, want, backend) in cases {
        let resp = on_stream_for_pub(&core, request).await;
        assert_eq!(status(&resp), *want, "{request:?}\n{resp:?}");
        if let Some(backend) = backend {
            assert!(
                resp.contains(&format!("backend: {backend}")),
                "{request:?}\n{resp}"
            );
        }
        assert!(!resp.contains("backend: hidden"), "{request:?}\n{resp}");
    }

    // A plain listener's connections (no stream host) reach every host.
    let addr = core.listen("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let resp = exchange(
        tcp,
        "GET / HTTP/1.1\r\nHost: hidden.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(resp.contains("backend: hidden"), "{resp}");
}

#[tokio::test]
async fn clients_cannot_set_forwarding_fields_or_the_request_id() {
    let web = echo_backend("web").await;
    let (core, addr) = proxy(ProxyConfig::default()).await;
    core.set_host_routes(
        "app.example",
        vec![route("app.example", "/", PathType::Prefix, &[web])],
    )
    .unwrap();
    let claims = "X-Forwarded-For: 6.6.6.6\r\nForwarded: for=6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\n\
                  X-Request-Id: forged-id\r\nX-Forwarded-Host: evil.example\r\nX-Forwarded-Proto: https\r\n";
    for body in [
        // fast path
        "Content-Length: 0\r\n\r\n",
        // Pingora path
        "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ] {
        let request =
            format!("POST / HTTP/1.1\r\nHost: app.example\r\nConnection: close\r\n{claims}{body}");
        let tcp = TcpStream::connect(addr).await.unwrap();
        let resp = exchange(tcp, &request).await;
        assert_eq!(status(&resp), "200", "{resp}");
        let seen = parse_echo(resp.split("\r\n\r\n").nth(1).unwrap_or(""));
        assert_eq!(seen["x-forwarded-for"], ["127.0.0.1"], "{body:?}");
        assert_eq!(seen["x-forwarded-host"], ["app.example"], "{body:?}");
        assert_eq!(seen["x-forwarded-proto"], ["http"], "{body:?}");
        assert!(!seen.contains_key("forwarded"), "{body:?}: {seen:?}");
        assert!(!seen.contains_key("x-real-ip"), "{body:?}: {seen:?}");
        assert_ne!(seen["x-request-id"], ["forged-id"], "{body:?}");
    }
}

/// A backend that answers every request with `response` and closes; the
/// request is read up to its blank line and, if chunked, its last chunk.
async fn canned_backend(response: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let text = String::from_utf8_lossy(&buf).to_ascii_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let chunked = text[..end].contains("transfer-encoding: chunked");
                        if !chunked || text[end..].contains("0\r\n\r\n") {
                            break;
                        }
                    }
                    match tcp.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = tcp.write_all(response.as_bytes()).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_content_length_beside_transfer_encoding_never_reaches_the_client() {
    let backend = canned_backend(
        "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .await;
    let (core, addr) = proxy(ProxyConfig::default()).await;
    core.set_host_routes(
        "app.example",
        vec![route("app.example", "/", PathType::Prefix, &[backend])],
    )
    .unwrap();
    for request in [
        "GET / HTTP/1.1\r\nHost: app.example\r\nConnection: close\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: app.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n",
    ] {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let resp = exchange(tcp, request).await;
        let head = resp.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
        assert_eq!(status(&resp), "200", "{resp}");
        assert!(head.contains("transfer-encoding: chunked"), "{resp}");
        assert!(!head.contains("content-length"), "{request:?}\n{resp}");
        assert!(resp.ends_with("3\r\nabc\r\n0\r\n\r\n"), "{resp:?}");
    }
}

#[tokio::test]
async fn ambiguous_request_framing_is_refused_before_any_backend() {
    let web = echo_backend("web").await;
    let (core, addr) = proxy(ProxyConfig::default()).await;
    core.set_host_routes(
        "app.example",
        vec![route("app.example", "/", PathType::Prefix, &[web])],
    )
    .unwrap();
    for framing in [
        "Content-Length: 5, 5\r\n",
        "Content-Length: 5\r\nContent-Length: 5\r\n",
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked, chunked\r\n",
        "Connection: content-length\r\nContent-Length: 5\r\n",
    ] {
        let request = format!(
            "POST / HTTP/1.1\r\nHost: app.example\r\n{framing}Connection: close\r\n\r\nhello"
        );
        let tcp = TcpStream::connect(addr).await.unwrap();
        let resp = exchange(tcp, &request).await;
        assert_eq!(status(&resp), "400", "{framing:?}\n{resp}");
        assert!(!resp.contains("backend: web"), "{framing:?}\n{resp}");
    }
}
