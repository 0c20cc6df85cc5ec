//! Gateway API rules (`HttpBackend::gateway`): weighted backends, the
//! `HTTPRoute` filters and timeouts, through a real listener, real client
//! and real backends. The expectations are the Gateway API conformance
//! tests' (HTTPRouteWeight, HTTPRouteRequestHeaderModifier,
//! HTTPRouteResponseHeaderModifier, HTTPRouteRedirect*, HTTPRouteRewrite*,
//! HTTPRouteTimeout*).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use reqwest::header::HOST;
use tokio::net::TcpListener;
use tuna_routing::action::{Filter, HeaderModifier, PathModifier, Redirect, Rewrite, Timeouts};

use crate::common;
use common::*;
use tuna_proxy::{
    GatewayRule, HttpBackend, HttpRoute, PathType, ProxyConfig, ProxyCore, UpstreamProtocol,
    WeightedTarget,
};

const HOST_NAME: &str = "gw.example.com";

fn target(addrs: &[SocketAddr], weight: u32) -> WeightedTarget {
    WeightedTarget {
        addrs: addrs.to_vec(),
        protocol: UpstreamProtocol::Http1,
        weight,
    }
}

fn rule(backends: Vec<WeightedTarget>, filters: Vec<Filter>) -> GatewayRule {
    GatewayRule {
        backends,
        filters,
        timeouts: Timeouts::default(),
    }
}

/// A `PathPrefix` route of a Gateway rule on [`HOST_NAME`].
fn gateway_route(path: &str, rule: GatewayRule) -> HttpRoute {
    let mut r = route(HOST_NAME, path, PathType::Prefix, &[]);
    r.backend = HttpBackend::gateway(rule);
    r
}

async fn serve(routes: Vec<HttpRoute>) -> (ProxyCore, SocketAddr) {
    let (core, addr) = proxy(ProxyConfig::default()).await;
    let issues = core.set_host_routes(HOST_NAME, routes).unwrap();
    assert!(issues.is_empty(), "{issues:?}");
    (core, addr)
}

fn no_redirects() -> reqwest::Client {
    init();
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn get(
    client: &reqwest::Client,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = client
        .get(format!("http://{addr}{path}"))
        .header(HOST, HOST_NAME);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

async fn echo(
    client: &reqwest::Client,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> BTreeMap<String, Vec<String>> {
    let resp = get(client, addr, path, headers).await;
    assert_eq!(resp.status(), 200, "{path}");
    parse_echo(&resp.text().await.unwrap())
}

#[tokio::test]
async fn weights_share_requests_exactly_and_weight_zero_gets_none() {
    let a = echo_backend("a").await;
    let b = echo_backend("b").await;
    let never = echo_backend("never").await;
    let (_core, addr) = serve(vec![gateway_route(
        "/",
        rule(
            vec![target(&[a], 1), target(&[b], 3), target(&[never], 0)],
            vec![],
        ),
    )])
    .await;
    let client = client();
    let mut seen = Vec::new();
    for _ in 0..8 {
        let e = echo(&client, addr, "/", &[]).await;
        seen.push(e["backend"][0].clone());
    }
    // Smooth weighted round-robin: b a b b, twice.
    assert_eq!(seen, ["b", "a", "b", "b", "b", "a", "b", "b"]);
}

#[tokio::test]
async fn a_rule_without_a_backend_to_give_answers_500() {
    let web = echo_backend("web").await;
    let (core, addr) = serve(vec![
        gateway_route("/none", rule(vec![], vec![])),
        gateway_route("/zero", rule(vec![target(&[web], 0)], vec![])),
        gateway_route("/unresolved", rule(vec![target(&[], 1)], vec![])),
    ])
    .await;
    let client = client();
    for path in ["/none", "/zero/x", "/unresolved"] {
        let resp = get(&client, addr, path, &[]).await;
        assert_eq!(resp.status(), 500, "{path}");
        assert!(
            resp.text().await.unwrap().starts_with("500 "),
            "a short page"
        );
    }
    let metrics = core.render_metrics();
    assert!(
        metrics.contains(&format!("host=\"{HOST_NAME}\",class=\"5xx\"}} 3")),
        "counted on the host: {metrics}"
    );
}

fn modifier(set: &[(&str, &str)], add: &[(&str, &str)], remove: &[&str]) -> HeaderModifier {
    let pairs = |p: &[(&str, &str)]| {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    HeaderModifier {
        set: pairs(set),
        add: pairs(add),
        remove: remove.iter().map(|s| s.to_string()).collect(),
    }
}

/// HTTPRouteRequestHeaderModifier: set overwrites, add appends, remove
/// drops, whatever case the request used.
#[tokio::test]
async fn request_header_modifier_sets_adds_and_removes() {
    let web = echo_backend("web").await;
    let m = modifier(
        &[("x-header-set", "set-overwrites-values")],
        &[("x-header-add", "add-appends-values")],
        &["x-header-remove"],
    );
    let (_core, addr) = serve(vec![gateway_route(
        "/",
        rule(
            vec![target(&[web], 1)],
            vec![Filter::RequestHeaderModifier(m)],
        ),
    )])
    .await;
    let client = client();
    let e = echo(
        &client,
        addr,
        "/set",
        &[
            ("X-Header-Set", "some-other-value"),
            ("x-header-add", "some-other-value"),
            ("X-HEADER-REMOVE", "val"),
            ("another-header", "kept"),
        ],
    )
    .await;
    assert_eq!(e["x-header-set"], ["set-overwrites-values"]);
    assert_eq!(
        e["x-header-add"],
        ["some-other-value", "add-appends-values"]
    );
    assert!(!e.contains_key("x-header-remove"), "{e:?}");
    assert_eq!(e["another-header"], ["kept"]);

    let e = echo(&client, addr, "/plain", &[]).await;
    assert_eq!(e["x-header-set"], ["set-overwrites-values"]);
    assert_eq!(e["x-header-add"], ["add-appends-values"]);
}

/// A backend whose responses carry `x-header-set`, `x-header-add` and
/// `x-header-remove`.
async fn header_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req: Request<Incoming>| async {
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header("X-Header-Set", "original")
                            .header("x-header-add", "original")
                            .header("X-Header-Remove", "gone")
                            .body(Full::new(Bytes::from_static(b"ok")))
                            .unwrap(),
                    )
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

/// HTTPRouteResponseHeaderModifier.
#[tokio::test]
async fn response_header_modifier_sets_adds_and_removes() {
    let backend = header_backend().await;
    let m = modifier(
        &[("x-header-set", "set-overwrites-values")],
        &[("x-header-add", "add-appends-values"), ("x-new", "added")],
        &["x-header-remove"],
    );
    let (_core, addr) = serve(vec![gateway_route(
        "/",
        rule(
            vec![target(&[backend], 1)],
            vec![Filter::ResponseHeaderModifier(m)],
        ),
    )])
    .await;
    let resp = get(&client(), addr, "/", &[]).await;
    assert_eq!(resp.status(), 200);
    let values = |name: &str| -> Vec<String> {
        resp.headers()
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(values("x-header-set"), ["set-overwrites-values"]);
    assert_eq!(values("x-header-add"), ["original", "add-appends-values"]);
    assert_eq!(values("x-new"), ["added"]);
    assert!(values("x-header-remove").is_empty());
}

fn redirect(
    scheme: Option<&str>,
    hostname: Option<&str>,
    path: Option<PathModifier>,
    port: Option<u16>,
    status_code: u16,
) -> Filter {
    Filter::RequestRedirect(Redirect {
        scheme: scheme.map(Into::into),
        hostname: hostname.map(Into::into),
        path,
        port,
        status_code,
    })
}

/// HTTPRouteRedirect{Path,HostAndStatus,Scheme,Port,PortAndScheme} and
/// the 303/307/308 ones: answered by the proxy, the backend never asked.
#[tokio::test]
async fn request_redirect_answers_with_the_location_it_builds() {
    let prefix = |p: &str| Some(PathModifier::ReplacePrefixMatch(p.into()));
    let full = |p: &str| Some(PathModifier::ReplaceFullPath(p.into()));
    // No backends: a redirect never needs one.
    let r = |path: &str, f: Filter| gateway_route(path, rule(vec![], vec![f]));
    let (_core, addr) = serve(vec![
        r(
            "/original-prefix",
            redirect(None, None, prefix("/replacement-prefix"), None, 302),
        ),
        r(
            "/full",
            redirect(None, None, full("/full-path-replacement"), None, 302),
        ),
        r(
            "/path-and-host",
            redirect(
                None,
                Some("example.org"),
                prefix("/replacement-prefix"),
                None,
                301,
            ),
        ),
        r("/scheme", redirect(Some("https"), None, None, None, 302)),
        r("/port", redirect(None, None, None, Some(8083), 307)),
        r(
            "/scheme-and-port",
            redirect(Some("https"), Some("example.org"), None, Some(8443), 308),
        ),
        r("/see-other", redirect(None, None, None, Some(80), 303)),
    ])
    .await;
    let client = no_redirects();
    let host_port = format!("{HOST_NAME}:8080");
    let cases: &[(&str, &str, u16, &str)] = &[
        (
            HOST_NAME,
            "/original-prefix/lemon?x=1",
            302,
            "http://gw.example.com/replacement-prefix/lemon?x=1",
        ),
        (
            HOST_NAME,
            "/full/path/original",
            302,
            "http://gw.example.com/full-path-replacement",
        ),
        (
            HOST_NAME,
            "/path-and-host",
            301,
            "http://example.org/replacement-prefix",
        ),
        (
            HOST_NAME,
            "/scheme/a",
            302,
            "https://gw.example.com/scheme/a",
        ),
        // The client's port is kept unless the filter sets a scheme or a port.
        (&host_port, "/scheme", 302, "https://gw.example.com/scheme"),
        (
            &host_port,
            "/original-prefix",
            302,
            "http://gw.example.com:8080/replacement-prefix",
        ),
        (HOST_NAME, "/port", 307, "http://gw.example.com:8083/port"),
        (
            HOST_NAME,
            "/scheme-and-port",
            308,
            "https://example.org:8443/scheme-and-port",
        ),
        (
            &host_port,
            "/see-other",
            303,
            "http://gw.example.com/see-other",
        ),
    ];
    for (host, path, status, location) in cases {
        let resp = client
            .get(format!("http://{addr}{path}"))
            .header(HOST, *host)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), *status, "{host}{path}");
        assert_eq!(resp.headers()["location"], *location, "{host}{path}");
    }
}

/// HTTPRouteRewritePath and HTTPRouteRewriteHost, with a header modifier
/// after the rewrite (the query is kept).
#[tokio::test]
async fn url_rewrite_changes_the_forwarded_host_and_path() {
    let web = echo_backend("web").await;
    let rewrite = |hostname: Option<&str>, path: Option<PathModifier>| {
        Filter::UrlRewrite(Rewrite {
            hostname: hostname.map(Into::into),
            path,
        })
    };
    let prefix = |p: &str| Some(PathModifier::ReplacePrefixMatch(p.into()));
    let full = |p: &str| Some(PathModifier::ReplaceFullPath(p.into()));
    let r = |path: &str, filters: Vec<Filter>| {
        gateway_route(path, rule(vec![target(&[web], 1)], filters))
    };
    let (_core, addr) = serve(vec![
        r("/prefix/one", vec![rewrite(None, prefix("/one"))]),
        r("/strip-prefix", vec![rewrite(None, prefix("/"))]),
        r("/full/one", vec![rewrite(None, full("/one"))]),
        r(
            "/foo",
            vec![rewrite(Some("one.example.org"), prefix("/bar"))],
        ),
        r(
            "/host-and-headers",
            vec![
                rewrite(Some("test.example.org"), None),
                Filter::RequestHeaderModifier(modifier(&[("x-header-set", "v")], &[], &[])),
            ],
        ),
    ])
    .await;
    let client = client();
    let cases: &[(&str, &str, &str)] = &[
        ("/prefix/one/two", "/one/two", HOST_NAME),
        ("/strip-prefix/three", "/three", HOST_NAME),
        ("/strip-prefix", "/", HOST_NAME),
        ("/full/one/two?q=1", "/one?q=1", HOST_NAME),
        ("/foo/baz", "/bar/baz", "one.example.org"),
        ("/foo", "/bar", "one.example.org"),
        (
            "/host-and-headers/x",
            "/host-and-headers/x",
            "test.example.org",
        ),
    ];
    for (path, upstream_path, upstream_host) in cases {
        let e = echo(&client, addr, path, &[]).await;
        assert_eq!(e["path"], [*upstream_path], "{path}");
        assert_eq!(e["host"], [*upstream_host], "{path}");
        assert_eq!(e["x-forwarded-host"], [HOST_NAME], "{path}");
    }
    let e = echo(&client, addr, "/host-and-headers", &[]).await;
    assert_eq!(e["x-header-set"], ["v"]);
}

/// A backend that accepts connections, reads, and never answers.
async fn silent_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    addr
}

/// HTTPRouteTimeoutRequest, HTTPRouteTimeoutBackendRequest: a backend that
/// does not answer in time is a 504, long before the proxy's own read
/// timeout (60 s by default); one that answers in time is served.
#[tokio::test]
async fn rule_timeouts_answer_504_when_they_elapse() {
    let silent = silent_backend().await;
    let web = echo_backend("web").await;
    let timed = |path: &str, addr: SocketAddr, timeouts: Timeouts| {
        let mut rule = rule(vec![target(&[addr], 1)], vec![]);
        rule.timeouts = timeouts;
        gateway_route(path, rule)
    };
    let short = Some(Duration::from_millis(300));
    let (_core, addr) = serve(vec![
        timed(
            "/request",
            silent,
            Timeouts {
                request: short,
                backend_request: None,
            },
        ),
        timed(
            "/backend",
            silent,
            Timeouts {
                request: None,
                backend_request: short,
            },
        ),
        timed(
            "/fine",
            web,
            Timeouts {
                request: Some(Duration::from_secs(10)),
                backend_request: Some(Duration::from_secs(10)),
            },
        ),
    ])
    .await;
    let client = client();
    for path in ["/request", "/backend"] {
        let start = Instant::now();
        let resp = get(&client, addr, path, &[]).await;
        assert_eq!(resp.status(), 504, "{path}");
        let took = start.elapsed();
        assert!(took < Duration::from_secs(5), "{path} took {took:?}");
    }
    let e = echo(&client, addr, "/fine", &[]).await;
    assert_eq!(e["backend"], ["web"]);
}

/// Issue 37 item 7 (G10): a header filter cannot touch the message's
/// framing, hop-by-hop fields, `Host` or what the proxy vouches for
/// (`X-Forwarded-*`, the request id), on the request or the response; the
/// plan refuses such filters, and the proxy ignores those names too.
#[tokio::test]
async fn header_filters_leave_framing_and_proxy_headers_alone() {
    let web = echo_backend("web").await;
    let request = modifier(
        &[
            ("Transfer-Encoding", "chunked"),
            ("X-Forwarded-For", "10.0.0.1"),
            ("host", "evil.example"),
            ("x-request-id", "forged"),
            ("Connection", "upgrade"),
            ("Upgrade", "h2c"),
            ("x-custom", "ok"),
        ],
        &[("x-forwarded-proto", "ftp"), ("TE", "trailers")],
        &["x-forwarded-host"],
    );
    let response = modifier(&[("content-length", "0"), ("x-out", "ok")], &[], &[]);
    let (_core, addr) = serve(vec![gateway_route(
        "/",
        rule(
            vec![target(&[web], 1)],
            vec![
                Filter::RequestHeaderModifier(request),
                Filter::ResponseHeaderModifier(response),
            ],
        ),
    )])
    .await;
    let resp = client()
        .post(format!("http://{addr}/x"))
        .header(HOST, HOST_NAME)
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-out"], "ok");
    let text = resp.text().await.unwrap();
    assert!(text.starts_with("backend: web"), "the body was cut: {text}");
    let e = parse_echo(&text);
    assert!(!e.contains_key("transfer-encoding"), "{e:?}");
    assert_eq!(e["content-length"], ["5"]);
    assert_eq!(e["x-forwarded-for"], ["127.0.0.1"]);
    assert_eq!(e["host"], [HOST_NAME]);
    assert_eq!(e["x-forwarded-host"], [HOST_NAME]);
    assert_eq!(e["x-forwarded-proto"], ["http"]);
    assert_ne!(e["x-request-id"], ["forged"]);
    assert!(!e.contains_key("upgrade") && !e.contains_key("te"), "{e:?}");
    assert_eq!(e["x-custom"], ["ok"]);
}

/// Issue 37 item 7 (G11): `ReplacePrefixMatch` (rewrite and redirect) works
/// on the canonical path the router matched, so a path that matched `/api`
/// only once canonicalised (`/%61pi/…`, `//api/…`, dot segments) is still
/// rewritten; the query is kept as sent.
#[tokio::test]
async fn replace_prefix_match_works_on_the_canonical_path() {
    let web = echo_backend("web").await;
    let prefix = |p: &str| Some(PathModifier::ReplacePrefixMatch(p.into()));
    let (_core, addr) = serve(vec![
        gateway_route(
            "/api",
            rule(
                vec![target(&[web], 1)],
                vec![Filter::UrlRewrite(Rewrite {
                    hostname: None,
                    path: prefix("/public/api"),
                })],
            ),
        ),
        gateway_route(
            "/old",
            rule(
                vec![],
                vec![redirect(None, None, prefix("/new"), None, 302)],
            ),
        ),
    ])
    .await;
    let client = no_redirects();
    for (path, upstream) in [
        ("/api/admin", "/public/api/admin"),
        ("/%61pi/admin", "/public/api/admin"),
        ("//api/admin", "/public/api/admin"),
        ("/x/../api/admin?q=%61", "/public/api/admin?q=%61"),
        ("/%61pi", "/public/api"),
    ] {
        let e = echo(&client, addr, path, &[]).await;
        assert_eq!(e["path"], [upstream], "{path}");
    }
    for (path, location) in [("/%6fld/x", "/new/x"), ("//old/x?k=v", "/new/x?k=v")] {
        let resp = get(&client, addr, path, &[]).await;
        assert_eq!(resp.status(), 302, "{path}");
        let got = resp.headers()["location"].to_str().unwrap().to_owned();
        assert_eq!(got, format!("http://{HOST_NAME}{location}"), "{path}");
    }
}
