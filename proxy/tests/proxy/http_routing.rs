//! Routing and header policy through a real listener, real client, real
//! backends.

use crate::common;

use common::*;
use reqwest::header::HOST;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tuna_proxy::{PathType, ProxyConfig};

#[tokio::test]
async fn routes_by_host_and_path_and_answers_404_naming_the_host() {
    let web = echo_backend("web").await;
    let api = echo_backend("api").await;
    let other = echo_backend("other").await;
    let (core, addr) = proxy(ProxyConfig::default()).await;
    let issues = core
        .set_host_routes(
            "shop.example.com",
            vec![
                route("shop.example.com", "/", PathType::Prefix, &[web]),
                route("shop.example.com", "/api", PathType::Prefix, &[api]),
            ],
        )
        .unwrap();
    assert!(issues.is_empty(), "{issues:?}");
    core.set_host_routes(
        "other.example.com",
        vec![route(
            "other.example.com",
            "/only",
            PathType::Exact,
            &[other],
        )],
    )
    .unwrap();

    let client = client();
    let cases: &[(&str, &str, u16, Option<&str>)] = &[
        ("shop.example.com", "/", 200, Some("web")),
        ("SHOP.example.com:8080", "/api/users?x=1", 200, Some("api")),
        ("shop.example.com", "/apix", 200, Some("web")),
        ("other.example.com", "/only", 200, Some("other")),
        ("other.example.com", "/only/more", 404, None),
        ("nobody.example.com", "/", 404, None),
    ];
    for (host, path, status, backend) in cases {
        let resp = client
            .get(format!("http://{addr}{path}"))
            .header(HOST, *host)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), *status, "{host}{path}");
        let body = resp.text().await.unwrap();
        match backend {
            Some(b) => {
                let echo = parse_echo(&body);
                assert_eq!(echo["backend"], vec![b.to_string()], "{host}{path}");
                assert_eq!(
                    echo["path"],
                    vec![path.to_string()],
                    "path reaches backend unchanged"
                );
            }
            None => assert!(body.contains(host), "404 page names the host: {body}"),
        }
    }

    // Removing a host makes it 404 at once.
    assert!(core.remove_host("other.example.com").unwrap());
    let resp = client
        .get(format!("http://{addr}/only"))
        .header(HOST, "other.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
}

#[tokio::test]
async fn build_issues_are_returned_per_host() {
    let web = echo_backend("web").await;
    let core = tuna_proxy::ProxyCore::new(ProxyConfig::default());
    let issues = core
        .set_host_routes(
            "a.example.com",
            vec![
                route("a.example.com", "/ok", PathType::Prefix, &[web]),
                route("a.example.com", "/a/../b", PathType::Prefix, &[web]),
            ],
        )
        .unwrap();
    assert_eq!(issues.len(), 1);
    assert_eq!(issues[0].reason(), "PathDotSegment");
    assert!(
        core.set_host_routes(
            "bad host/",
            vec![route("bad host/", "/", PathType::Prefix, &[web])]
        )
        .is_err()
    );
    assert!(
        core.set_host_routes(
            "b.example.com",
            vec![route("b.example.com", "/", PathType::Prefix, &[])]
        )
        .is_err(),
        "a backend without addresses is refused"
    );
}

#[tokio::test]
async fn header_policy_untrusted_listener() {
    let web = echo_backend("web").await;
    let (core, addr) = proxy(ProxyConfig::default()).await;
    core.set_host_routes(
        "shop.example.com",
        vec![route("shop.example.com", "/", PathType::Prefix, &[web])],
    )
    .unwrap();
    let resp = client()
        .get(format!("http://{addr}/x"))
        .header(HOST, "shop.example.com")
        .header("x-forwarded-for", "6.6.6.6")
        .header("x-request-id", "spoofed")
        .header("connection", "keep-alive, x-secret")
        .header("x-secret", "hop")
        .header("keep-alive", "timeout=5")
        .header("proxy-authorization", "Basic Zm9v")
        .header("x-custom", "kept")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let rid = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_ne!(rid, "spoofed");
    assert!(
        resp.headers().get("keep-alive").is_none(),
        "hop-by-hop stripped from response"
    );
    let echo = parse_echo(&resp.text().await.unwrap());
    assert_eq!(
        echo["host"],
        vec!["shop.example.com"],
        "public Host unchanged"
    );
    assert_eq!(echo["x-forwarded-host"], vec!["shop.example.com"]);
    assert_eq!(echo["x-forwarded-proto"], vec!["http"]);
    assert_eq!(
        echo["x-forwarded-for"],
        vec!["127.0.0.1"],
        "untrusted XFF is replaced"
    );
    assert_eq!(
        echo["x-request-id"],
        vec![rid],
        "backend sees the same request id"
    );
    assert_eq!(echo["x-custom"], vec!["kept"]);
    for hop in ["x-secret", "keep-alive", "proxy-authorization"] {
        assert!(!echo.contains_key(hop), "{hop} must be stripped: {echo:?}");
    }
    // The policy above is the fast path's (see also the h2c test below,
    // which goes through Pingora's hooks).
    assert_eq!(metric(&core, "tuna_proxy_http_fast_path_requests_total"), 1);
    assert_eq!(metric(&core, "tuna_proxy_http_pingora_handoffs_total"), 0);
}

#[tokio::test]
async fn header_policy_trusted_peer_appends_and_keeps_request_id() {
    let web = echo_backend("web").await;
    let config = ProxyConfig {
        trusted_peers: vec!["127.0.0.1".parse().unwrap()],
        ..ProxyConfig::default()
    };
    let (core, addr) = proxy(config).await;
    core.set_host_routes(
        "shop.example.com",
        vec![route("shop.example.com", "/", PathType::Prefix, &[web])],
    )
    .unwrap();
    let resp = client()
        .get(format!("http://{addr}/"))
        .header(HOST, "shop.example.com")
        .header("x-forwarded-for", "203.0.113.9")
        .header("x-request-id", "edge-abc-123")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-request-id"], "edge-abc-123");
    let echo = parse_echo(&resp.text().await.unwrap());
    assert_eq!(echo["x-forwarded-for"], vec!["203.0.113.9, 127.0.0.1"]);
    assert_eq!(echo["x-request-id"], vec!["edge-abc-123"]);
    assert_eq!(metric(&core, "tuna_proxy_http_fast_path_requests_total"), 1);
}

#[tokio::test]
async fn h2c_client_is_served() {
    let web = echo_backend("web").await;
    let (core, addr) = proxy(ProxyConfig::default()).await;
    core.set_host_routes(
        "shop.example.com",
        vec![route("shop.example.com", "/", PathType::Prefix, &[web])],
    )
    .unwrap();
    init();
    // h2 carries the host in :authority (a differing Host header is a
    // protocol error), so the client resolves the public names to the proxy.
    let client = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .resolve("shop.example.com", addr)
        .resolve("x.test", addr)
        .build()
        .unwrap();
    // Several requests on one h2 connection, one of them unknown.
    for (host, status) in [
        ("shop.example.com", 200),
        ("shop.example.com", 200),
        ("x.test", 404),
    ] {
        let resp = client
            .get(format!("http://{host}:{}/h2", addr.port()))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.version(), reqwest::Version::HTTP_2);
        assert_eq!(resp.status().as_u16(), status);
        let text = resp.text().await.unwrap();
        if status == 200 {
            let echo = parse_echo(&text);
            assert_eq!(echo["backend"], vec!["web"]);
            assert_eq!(
                echo["x-forwarded-host"],
                vec![format!("{host}:{}", addr.port())]
            );
            assert_eq!(echo["x-forwarded-proto"], vec!["http"]);
        } else {
            assert!(text.contains("x.test"), "{text}");
        }
    }
}

async fn raw_request(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tcp.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn limits_oversized_and_too_many_headers_get_431() {
    let web = echo_backend("web").await;
    let mut config = ProxyConfig::default();
    config.limits.max_header_bytes = 4096;
    config.limits.max_header_count = 20;
    let (core, addr) = proxy(config).await;
    core.set_host_routes(
        "shop.example.com",
        vec![route("shop.example.com", "/", PathType::Prefix, &[web])],
    )
    .unwrap();

    let big = format!(
        "GET / HTTP/1.1\r\nHost: shop.example.com\r\nX-Big: {}\r\n\r\n",
        "a".repeat(8000)
    );
    assert!(
        raw_request(addr, big.as_bytes())
            .await
            .starts_with("HTTP/1.1 431")
    );

    let mut many = String::from("GET / HTTP/1.1\r\nHost: shop.example.com\r\n");
    for i in 0..30 {
        many.push_str(&format!("X-H{i}: v\r\n"));
    }
    many.push_str("\r\n");
    assert!(
        raw_request(addr, many.as_bytes())
            .await
            .starts_with("HTTP/1.1 431")
    );

    // A keep-alive connection whose *second* request breaks the limits:
    // checked by the request filter rather than the first-request gate.
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(1)
        .build()
        .unwrap();
    let first = client
        .get(format!("http://{addr}/"))
        .header(HOST, "shop.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    first.bytes().await.unwrap();
    let mut second = client
        .get(format!("http://{addr}/"))
        .header(HOST, "shop.example.com");
    for i in 0..30 {
        second = second.header(format!("x-h{i}"), "v");
    }
    assert_eq!(second.send().await.unwrap().status(), 431);

    let ok = "GET / HTTP/1.1\r\nHost: shop.example.com\r\nConnection: close\r\n\r\n";
    assert!(
        raw_request(addr, ok.as_bytes())
            .await
            .starts_with("HTTP/1.1 200")
    );
}

#[tokio::test]
async fn slow_header_is_cut_with_408() {
    let mut config = ProxyConfig::default();
    config.limits.header_read_timeout = std::time::Duration::from_millis(300);
    let (_core, addr) = proxy(config).await;
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    // Start a request and never finish it: one byte at a time would not
    // help either, the deadline covers the whole header.
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: slow")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tcp.read_to_end(&mut out).await;
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 408"));
}

#[tokio::test]
async fn admin_endpoints_and_metrics() {
    let web = echo_backend("web").await;
    let (core, addr) = proxy(ProxyConfig::default()).await;
    let admin = core
        .serve_admin("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    core.set_host_routes(
        "shop.example.com",
        vec![route("shop.example.com", "/", PathType::Prefix, &[web])],
    )
    .unwrap();
    let client = client();
    for host in ["shop.example.com", "shop.example.com", "nope.test"] {
        client
            .get(format!("http://{addr}/"))
            .header(HOST, host)
            .send()
            .await
            .unwrap();
    }
    let get = |path: &'static str| {
        let client = client.clone();
        async move {
            let r = client
                .get(format!("http://{admin}{path}"))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(get("/healthz").await.0, 200);
    assert_eq!(get("/readyz").await.0, 200);
    core.set_ready(false);
    assert_eq!(get("/readyz").await.0, 503);
    let (status, metrics) = get("/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics
            .contains("tuna_proxy_http_requests_total{host=\"shop.example.com\",class=\"2xx\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("tuna_proxy_http_requests_total{host=\"\",class=\"4xx\"} 1"));
    assert!(metrics.contains("tuna_proxy_http_request_duration_seconds_count 3"));
    assert!(metrics.contains("tuna_proxy_http_connections_active"));
    assert!(metrics.contains("tuna_proxy_upstream_errors_total{cause=\"connect_refused\"} 0"));
}
