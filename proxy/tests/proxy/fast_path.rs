//! The HTTP/1.1 fast path: response framings relayed exactly, pipelining,
//! request bodies, stale pooled connections, and the hand-off to Pingora in
//! the middle of a connection. Backends here are scripted over raw TCP so
//! that each framing is exactly what the test says.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tuna_proxy::{PathType, ProxyConfig, ProxyCore};

const FAST: &str = "tuna_proxy_http_fast_path_requests_total";
const HANDOFFS: &str = "tuna_proxy_http_pingora_handoffs_total";

/// Reads one request (head + Content-Length body) from `tcp` into `buf`;
/// returns (method, path, body length) or None at end of stream.
async fn read_request(tcp: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(String, String, usize)> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        if let Ok(httparse::Status::Complete(n)) = req.parse(buf) {
            let len: usize = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .map(|h| std::str::from_utf8(h.value).unwrap().parse().unwrap())
                .unwrap_or(0);
            let method = req.method.unwrap().to_owned();
            let path = req.path.unwrap().to_owned();
            while buf.len() < n + len {
                if tcp.read_buf(buf).await.ok()? == 0 {
                    return None;
                }
            }
            buf.drain(..n + len);
            return Some((method, path, len));
        }
        if tcp.read_buf(buf).await.ok()? == 0 {
            return None;
        }
    }
}

/// One request as a scripted backend saw it; `nth` counts from 0 on each
/// connection.
struct Seen<'a> {
    method: &'a str,
    path: &'a str,
    len: usize,
    nth: usize,
}

/// A scripted answer: raw response bytes and whether to close afterwards;
/// `None` closes without answering.
type Answer = Option<(Vec<u8>, bool)>;

/// A backend that answers each request with `script`: the raw response
/// bytes and whether to close afterwards, or `None` to close without
/// answering. Counts the connections it accepted.
async fn scripted_backend(script: fn(&Seen<'_>) -> Answer) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let count = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut nth = 0;
                while let Some((method, path, len)) = read_request(&mut tcp, &mut buf).await {
                    let seen = Seen {
                        method: &method,
                        path: &path,
                        len,
                        nth,
                    };
                    nth += 1;
                    let Some((resp, close)) = script(&seen) else {
                        return;
                    };
                    if tcp.write_all(&resp).await.is_err() || close {
                        return;
                    }
                }
            });
        }
    });
    (addr, connections)
}

/// Reads one response from a raw connection: (status, headers lower-cased,
/// body). Handles Content-Length, chunked (trailers dropped), no body for
/// HEAD/204/304/1xx, and until-close.
async fn read_response(
    tcp: &mut TcpStream,
    buf: &mut Vec<u8>,
    head_request: bool,
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        if let Ok(httparse::Status::Complete(n)) = resp.parse(buf) {
            let status = resp.code.unwrap();
            let hs: Vec<(String, String)> = resp
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            buf.drain(..n);
            let get = |k: &str| hs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            if head_request || status == 204 || status == 304 || status < 200 {
                return (status, hs, Vec::new());
            }
            if let Some(len) = get("content-length") {
                let len: usize = len.parse().unwrap();
                while buf.len() < len {
                    assert!(tcp.read_buf(buf).await.unwrap() > 0, "short body");
                }
                let body = buf.drain(..len).collect();
                return (status, hs, body);
            }
            if get("transfer-encoding").is_some() {
                let mut body = Vec::new();
                loop {
                    while !buf.windows(2).any(|w| w == b"\r\n") {
                        assert!(tcp.read_buf(buf).await.unwrap() > 0);
                    }
                    let line_end = buf.windows(2).position(|w| w == b"\r\n").unwrap();
                    let line = String::from_utf8(buf[..line_end].to_vec()).unwrap();
                    let size = usize::from_str_radix(line.split(';').next().unwrap(), 16).unwrap();
                    buf.drain(..line_end + 2);
                    if size == 0 {
                        // Trailers until an empty line.
                        loop {
                            while !buf.windows(2).any(|w| w == b"\r\n") {
                                assert!(tcp.read_buf(buf).await.unwrap() > 0);
                            }
                            let end = buf.windows(2).position(|w| w == b"\r\n").unwrap();
                            buf.drain(..end + 2);
                            if end == 0 {
                                return (status, hs, body);
                            }
                        }
                    }
                    while buf.len() < size + 2 {
                        assert!(tcp.read_buf(buf).await.unwrap() > 0);
                    }
                    body.extend(buf.drain(..size));
                    buf.drain(..2);
                }
            }
            let mut body = std::mem::take(buf);
            tcp.read_to_end(&mut body).await.unwrap();
            return (status, hs, body);
        }
        assert!(
            tcp.read_buf(buf).await.unwrap() > 0,
            "closed before a response"
        );
    }
}

fn header<'a>(hs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    hs.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

async fn proxied(backend: SocketAddr) -> (ProxyCore, SocketAddr) {
    let (core, addr) = proxy(ProxyConfig::default()).await;
    core.set_host_routes(
        "app.test",
        vec![route("app.test", "/", PathType::Prefix, &[backend])],
    )
    .unwrap();
    (core, addr)
}

fn framings(req: &Seen<'_>) -> Answer {
    let resp: &[u8] = match req.path {
        "/chunked" => {
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-kind: chunked\r\n\r\n\
              5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nx-trailer: t\r\n\r\n"
        }
        "/head" if req.method == "HEAD" => b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n",
        "/empty" => b"HTTP/1.1 204 No Content\r\nx-kind: empty\r\n\r\n",
        "/early" => {
            b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n\
              HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        }
        "/close" => {
            let resp = b"HTTP/1.1 200 OK\r\nx-kind: close\r\n\r\nuntil the end";
            return Some((resp.to_vec(), true));
        }
        "/garbage" => b"this is not HTTP\r\n\r\n",
        _ => b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\nconnection: keep-alive, x-hop\r\nx-hop: 1\r\n\r\ndefault",
    };
    Some((resp.to_vec(), false))
}

/// Every response framing, back to back on one client connection, with
/// the upstream connection reused throughout.
#[tokio::test]
async fn response_framings_are_relayed_exactly_on_one_connection() {
    let (backend, upstream_conns) = scripted_backend(framings).await;
    let (core, addr) = proxied(backend).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    let send = |m: &str, p: &str| format!("{m} {p} HTTP/1.1\r\nHost: app.test\r\n\r\n");

    tcp.write_all(send("GET", "/chunked").as_bytes())
        .await
        .unwrap();
    let (status, hs, body) = read_response(&mut tcp, &mut buf, false).await;
    assert_eq!((status, body.as_slice()), (200, b"hello world".as_slice()));
    assert_eq!(header(&hs, "transfer-encoding"), Some("chunked"));
    assert!(header(&hs, "x-request-id").is_some());

    tcp.write_all(send("HEAD", "/head").as_bytes())
        .await
        .unwrap();
    let (status, hs, _) = read_response(&mut tcp, &mut buf, true).await;
    assert_eq!(status, 200);
    assert_eq!(
        header(&hs, "content-length"),
        Some("1000"),
        "HEAD keeps the length"
    );

    tcp.write_all(send("GET", "/empty").as_bytes())
        .await
        .unwrap();
    let (status, hs, _) = read_response(&mut tcp, &mut buf, false).await;
    assert_eq!((status, header(&hs, "x-kind")), (204, Some("empty")));

    tcp.write_all(send("GET", "/early").as_bytes())
        .await
        .unwrap();
    let (status, hs, _) = read_response(&mut tcp, &mut buf, false).await;
    assert_eq!((status, header(&hs, "link")), (103, Some("</a.css>")));
    let (status, _, body) = read_response(&mut tcp, &mut buf, false).await;
    assert_eq!((status, body.as_slice()), (200, b"ok".as_slice()));

    tcp.write_all(send("GET", "/plain").as_bytes())
        .await
        .unwrap();
    let (status, hs, body) = read_response(&mut tcp, &mut buf, false).await;
    assert_eq!((status, body.as_slice()), (200, b"default".as_slice()));
    assert_eq!(
        header(&hs, "x-hop"),
        None,
        "headers named in Connection are stripped"
    );
    assert_eq!(header(&hs, "connection"), None);
    assert_eq!(
        upstream_conns.load(Ordering::SeqCst),
        1,
        "one pooled upstream connection"
    );

    // Delimited by close: relayed to the end, then the client connection
    // closes too.
    tcp.write_all(send("GET", "/close").as_bytes())
        .await
        .unwrap();
    let (status, hs, body) = read_response(&mut tcp, &mut buf, false).await;
    assert_eq!(
        (status, body.as_slice()),
        (200, b"until the end".as_slice())
    );
    assert_eq!(header(&hs, "connection"), Some("close"));

    assert_eq!(metric(&core, FAST), 6);
    assert_eq!(metric(&core, HANDOFFS), 0);
}

#[tokio::test]
async fn upstream_garbage_is_502() {
    let (backend, _) = scripted_backend(framings).await;
    let (core, addr) = proxied(backend).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /garbage HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    let (status, _, body) = read_response(&mut tcp, &mut Vec::new(), false).await;
    assert_eq!(status, 502);
    assert!(String::from_utf8_lossy(&body).contains("Bad Gateway"));
    assert!(core.render_metrics().contains("cause=\"other\"} 1"));
}

/// Three requests in one write are answered in order.
#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let web = echo_backend("web").await;
    let (_core, addr) = proxied(web).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        b"GET /a HTTP/1.1\r\nHost: app.test\r\n\r\n\
          POST /b HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\n\r\nhello\
          GET /c HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    for path in ["/a", "/b", "/c"] {
        let (status, _, body) = read_response(&mut tcp, &mut buf, false).await;
        assert_eq!(status, 200);
        let echo = parse_echo(&String::from_utf8(body).unwrap());
        assert_eq!(echo["path"], vec![path.to_string()]);
    }
    let mut rest = Vec::new();
    assert_eq!(
        tcp.read_to_end(&mut rest).await.unwrap(),
        0,
        "closed after /c"
    );
}

fn count_body(req: &Seen<'_>) -> Answer {
    let body = req.len.to_string();
    let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
    Some(([head.as_bytes(), body.as_bytes()].concat(), false))
}

/// A Content-Length body much larger than one read reaches the backend
/// whole, and the connection goes on.
#[tokio::test]
async fn large_request_body_is_streamed_whole() {
    let (backend, _) = scripted_backend(count_body).await;
    let (core, addr) = proxied(backend).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let len = 3 * 1024 * 1024 + 17;
    let head = format!("PUT /upload HTTP/1.1\r\nHost: app.test\r\nContent-Length: {len}\r\n\r\n");
    let (mut rd, mut wr) = tcp.split();
    let write = async {
        wr.write_all(head.as_bytes()).await.unwrap();
        wr.write_all(&vec![b'x'; len]).await.unwrap();
        wr.write_all(b"GET /after HTTP/1.1\r\nHost: app.test\r\n\r\n")
            .await
            .unwrap();
    };
    let read = async {
        let mut out = Vec::new();
        // Two responses: "3145745" and "0".
        while !String::from_utf8_lossy(&out).contains("\r\n\r\n0") {
            assert!(rd.read_buf(&mut out).await.unwrap() > 0);
        }
        out
    };
    let ((), out) = tokio::join!(write, read);
    assert!(String::from_utf8_lossy(&out).contains(&format!("\r\n\r\n{len}")));
    assert_eq!(metric(&core, FAST), 2);
}

/// Answers the first request of each connection, then reads the next one
/// and closes without answering: a keep-alive connection the upstream
/// dropped just as the proxy reused it.
fn one_shot(req: &Seen<'_>) -> Answer {
    (req.nth == 0).then(|| {
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(),
            false,
        )
    })
}

/// A reused connection that dies before any response byte is retried on a
/// new connection for an idempotent request, and answered 502 for a POST
/// (the upstream may have acted on it).
#[tokio::test]
async fn stale_pooled_connection_is_retried_only_when_idempotent() {
    let (backend, conns) = scripted_backend(one_shot).await;
    let (core, addr) = proxied(backend).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    let get = b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n";
    tcp.write_all(get).await.unwrap();
    assert_eq!(read_response(&mut tcp, &mut buf, false).await.0, 200);
    tcp.write_all(get).await.unwrap();
    assert_eq!(
        read_response(&mut tcp, &mut buf, false).await.0,
        200,
        "retried"
    );
    assert_eq!(conns.load(Ordering::SeqCst), 2);

    tcp.write_all(b"POST / HTTP/1.1\r\nHost: app.test\r\nContent-Length: 2\r\n\r\nhi")
        .await
        .unwrap();
    assert_eq!(read_response(&mut tcp, &mut buf, false).await.0, 502);
    assert_eq!(
        conns.load(Ordering::SeqCst),
        2,
        "no second attempt for POST"
    );
    assert!(
        core.render_metrics()
            .contains("cause=\"connection_closed\"} 1")
    );
}

/// A connection starts on the fast path and moves to Pingora when a
/// request needs it (a chunked upload); HTTP/1.0 goes to Pingora at once.
#[tokio::test]
async fn connections_move_to_pingora_when_a_request_needs_it() {
    let web = echo_backend("web").await;
    let (core, addr) = proxied(web).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    tcp.write_all(b"GET /first HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut tcp, &mut buf, false).await.0, 200);
    tcp.write_all(
        b"POST /second HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n\
          3\r\nabc\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    let (status, _, body) = read_response(&mut tcp, &mut buf, false).await;
    assert_eq!(status, 200);
    let echo = parse_echo(&String::from_utf8(body).unwrap());
    assert_eq!(echo["path"], vec!["/second"]);
    assert_eq!(
        echo["x-forwarded-host"],
        vec!["app.test"],
        "Pingora's policy holds"
    );
    assert_eq!((metric(&core, FAST), metric(&core, HANDOFFS)), (1, 1));

    let mut old = TcpStream::connect(addr).await.unwrap();
    old.write_all(b"GET /old HTTP/1.0\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    // An HTTP/1.0 request without keep-alive ends with the connection
    // (Pingora's path used to keep it open for the idle timeout).
    let mut out = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        old.read_to_end(&mut out),
    )
    .await
    .expect("the proxy closes after an HTTP/1.0 response")
    .unwrap();
    let out = String::from_utf8_lossy(&out);
    assert!(out.contains(" 200 OK\r\n"), "{out}");
    assert!(out.contains("path: /old"), "{out}");
    assert_eq!(metric(&core, HANDOFFS), 2);
}
