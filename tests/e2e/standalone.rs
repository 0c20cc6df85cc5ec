//! Standalone mode end to end, in process: real sockets on 127.0.0.1, the
//! embedded edge, agent sessions over TLS, the proxy core, real HTTP backends and
//! a real HTTP client resolving `*.localhost` to the edge.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tuna_operator::standalone::{Standalone, StandaloneConfig, TunnelKey};

/// A bound wait for things that happen asynchronously; never a sleep.
const WAIT: Duration = Duration::from_secs(15);

/// An HTTP backend that answers every request with its name and the request's
/// Host and forwarding headers, one `key: value` per line.
async fn http_backend(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let mut lines = head.split("\r\n");
                let path = lines
                    .next()
                    .unwrap_or_default()
                    .split(' ')
                    .nth(1)
                    .unwrap_or_default()
                    .to_owned();
                let mut body = format!("backend: {name}\npath: {path}\n");
                for line in lines {
                    if let Some((k, v)) = line.split_once(':') {
                        let k = k.trim().to_ascii_lowercase();
                        if k == "host" || k.starts_with("x-forwarded-") {
                            body.push_str(&format!("{k}: {}\n", v.trim()));
                        }
                    }
                }
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(response.as_bytes()).await;
            });
        }
    });
    addr
}

/// A TCP echo server.
async fn echo_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

fn parse_body(body: &str) -> BTreeMap<String, String> {
    body.lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

struct Env {
    dir: tempfile::TempDir,
    standalone: Standalone,
    client: reqwest::Client,
    port: u16,
}

impl Env {
    async fn start(files: &[(&str, String)]) -> Env {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let manifests = dir.path().join("manifests");
        std::fs::create_dir_all(&manifests).unwrap();
        for (name, text) in files {
            std::fs::write(manifests.join(name), text).unwrap();
        }
        let mut config = StandaloneConfig::new(vec![manifests], dir.path().join("state"));
        config.http_listen = "127.0.0.1:0".parse().unwrap();
        // The TCP endpoint's port: bound here (port 0) and handed to the edge,
        // so no other process can take it in between.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp = listener.local_addr().unwrap().port();
        config.tcp_port_range = tcp..=tcp;
        config.tcp_listeners = vec![std::sync::Arc::new(listener)];
        config.poll_interval = Duration::from_millis(50);
        let standalone = tokio::time::timeout(WAIT, Standalone::start(config))
            .await
            .expect("start in time")
            .expect("start");
        let http = standalone
            .http_addr()
            .expect("embedded edge has an HTTP listener");
        let client = reqwest::Client::builder()
            .resolve("shop.localhost", http)
            .resolve("app.localhost", http)
            .resolve("nobody.localhost", http)
            .build()
            .unwrap();
        Env {
            dir,
            standalone,
            client,
            port: http.port(),
        }
    }

    fn manifests(&self) -> std::path::PathBuf {
        self.dir.path().join("manifests")
    }

    async fn get(&self, host: &str, path: &str) -> (u16, String) {
        let url = format!("http://{host}:{}{path}", self.port);
        let response = self
            .client
            .get(&url)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        (response.status().as_u16(), response.text().await.unwrap())
    }

    /// Writes (or with `None` removes) a manifest and waits until the change is live.
    async fn change(&self, name: &str, text: Option<String>) {
        let mut generation = self.standalone.generation();
        let before = *generation.borrow_and_update();
        let path = self.manifests().join(name);
        match text {
            Some(t) => std::fs::write(&path, t).unwrap(),
            None => std::fs::remove_file(&path).unwrap(),
        }
        tokio::time::timeout(WAIT, generation.wait_for(|g| *g > before))
            .await
            .expect("change applied in time")
            .unwrap();
    }
}

fn services(web: SocketAddr, api: SocketAddr, echo: SocketAddr) -> String {
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: web}}
spec: {{type: ExternalName, externalName: 127.0.0.1, ports: [{{name: http, port: 80, targetPort: {}}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: api}}
spec: {{clusterIP: 127.0.0.1, ports: [{{port: {}}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: echo}}
spec: {{type: ExternalName, externalName: localhost, ports: [{{name: echo, port: {}}}]}}
"#,
        web.port(),
        api.port(),
        echo.port()
    )
}

fn shop_ingress(paths: &[(&str, &str, &str)]) -> String {
    let mut out = String::from(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: shop}\nspec: {subdomain: shop}\n---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: shop}\nspec:\n  ingressClassName: tuna\n  rules:\n  - host: shop.localhost\n    http:\n      paths:\n",
    );
    for (path, service, port) in paths {
        let port = if port.chars().all(|c| c.is_ascii_digit()) {
            format!("number: {port}")
        } else {
            format!("name: {port}")
        };
        out.push_str(&format!("      - {{path: {path}, pathType: Prefix, backend: {{service: {{name: {service}, port: {{{port}}}}}}}}}\n"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_http_tunnel_and_tcp_tunnel_through_the_edge() {
    let (web, api, echo) = (
        http_backend("web").await,
        http_backend("api").await,
        echo_backend().await,
    );
    let tunnels = r#"
apiVersion: k8s.tuna.am/v1alpha1
kind: Tunnel
metadata: {name: app}
spec: {protocol: http, subdomain: app, upstream: {url: "http://web:http"}}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: TCPEndpoint
metadata: {name: echo}
spec: {alias: echo}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Tunnel
metadata: {name: echo}
spec: {protocol: tcp, portOrAlias: echo, upstream: {url: "tcp://echo:echo"}}
"#;
    let env = Env::start(&[
        ("services.yaml", services(web, api, echo)),
        (
            "shop.yaml",
            shop_ingress(&[("/", "web", "80"), ("/api", "api", &api.port().to_string())]),
        ),
        ("tunnels.yaml", tunnels.to_owned()),
    ])
    .await;
    let report = env.standalone.report().await;
    assert!(!report.contains("Skipped"), "{report}");

    // Ingress paths go to the right backends, segment-wise.
    let (status, body) = env.get("shop.localhost", "/api/users?page=2").await;
    assert_eq!(status, 200, "{body}");
    let seen = parse_body(&body);
    assert_eq!(seen["backend"], "api");
    assert_eq!(seen["path"], "/api/users?page=2");
    // The backend sees the public Host and the forwarding headers.
    let public_host = format!("shop.localhost:{}", env.port);
    assert_eq!(seen["host"], public_host);
    assert_eq!(seen["x-forwarded-host"], public_host);
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert_eq!(
        parse_body(&env.get("shop.localhost", "/apix").await.1)["backend"],
        "web"
    );
    assert_eq!(
        parse_body(&env.get("shop.localhost", "/").await.1)["backend"],
        "web"
    );

    // The http Tunnel.
    let (status, body) = env.get("app.localhost", "/hello").await;
    assert_eq!(
        (status, parse_body(&body)["backend"].as_str()),
        (200, "web")
    );

    // A host nobody publishes.
    assert_eq!(env.get("nobody.localhost", "/").await.0, 404);

    // The tcp Tunnel: echo through the reserved port.
    let addr = env
        .standalone
        .tcp_address("default/echo")
        .await
        .expect("tcp tunnel has a public address");
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"ping through the tunnel").await.unwrap();
    let mut got = [0u8; 23];
    tokio::time::timeout(WAIT, conn.read_exact(&mut got))
        .await
        .expect("echo in time")
        .unwrap();
    assert_eq!(&got, b"ping through the tunnel");
    assert!(report.contains(&format!("tcp://{addr}")), "{report}");

    env.standalone.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_change_goes_live_without_reconnecting() {
    let (web, api, echo) = (
        http_backend("web").await,
        http_backend("api").await,
        echo_backend().await,
    );
    let env = Env::start(&[
        ("services.yaml", services(web, api, echo)),
        ("shop.yaml", shop_ingress(&[("/", "web", "http")])),
    ])
    .await;
    let key = TunnelKey::Host("shop.localhost".into());
    let session = env.standalone.session_ids().await[&key]
        .clone()
        .expect("connected");
    assert_eq!(
        parse_body(&env.get("shop.localhost", "/api").await.1)["backend"],
        "web"
    );

    env.change(
        "shop.yaml",
        Some(shop_ingress(&[
            ("/", "web", "http"),
            ("/api", "api", &api.port().to_string()),
        ])),
    )
    .await;
    assert_eq!(
        parse_body(&env.get("shop.localhost", "/api").await.1)["backend"],
        "api"
    );
    assert_eq!(
        parse_body(&env.get("shop.localhost", "/").await.1)["backend"],
        "web"
    );
    assert_eq!(
        env.standalone.session_ids().await[&key],
        Some(session),
        "same tunnel session after a route change"
    );
    env.standalone.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_tunnel_stops_serving_and_its_token_is_revoked() {
    let web = http_backend("web").await;
    let tunnel = format!(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {{name: app}}\nspec: {{subdomain: app, upstream: {{url: \"http://127.0.0.1:{}\"}}}}\n",
        web.port()
    );
    let env = Env::start(&[("app.yaml", tunnel)]).await;
    assert_eq!(env.get("app.localhost", "/").await.0, 200);
    let key = TunnelKey::Host("app.localhost".into());
    let token = env
        .standalone
        .token(&key)
        .await
        .expect("the tunnel holds a token");

    env.change("app.yaml", None).await;
    // The backend is no longer reached. The edge answers 404 for a host it never
    // saw, 503 "tunnel offline" for one it served before, or 502 while it has not
    // yet noticed the closed session (it learns asynchronously).
    let (status, body) = env.get("app.localhost", "/").await;
    assert!(
        matches!(status, 404 | 502 | 503) && !body.contains("backend:"),
        "{status} {body}"
    );
    assert!(env.standalone.token(&key).await.is_none());

    // The old token no longer opens a session at the edge.
    let mut config = tuna_agent::AgentConfig::new(
        env.standalone.agent_addr(),
        tuna_agent::Trust::CaFile(env.standalone.ca_file().unwrap().clone()),
    );
    config.server_name = Some("localhost".into());
    let agent = tuna_agent::Agent::start(config, |_s, _m| {}).unwrap();
    agent
        .attach(
            "app",
            token,
            vec![tuna_protocol::wire::Binding::http("app.localhost")],
        )
        .await
        .unwrap();
    let outcome = tokio::time::timeout(WAIT, agent.serving("app"))
        .await
        .expect("the edge answers in time");
    assert!(
        matches!(outcome, Err(tuna_agent::Error::Rejected(_))),
        "revoked token was accepted: {outcome:?}"
    );
    agent.shutdown().await;
    env.standalone.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_manifests_are_explained_and_the_rest_keeps_serving() {
    let web = http_backend("web").await;
    let good = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec: {{type: ExternalName, externalName: 127.0.0.1, ports: [{{port: {}}}]}}\n---\n{}",
        web.port(),
        shop_ingress(&[("/", "web", &web.port().to_string())])
    );
    let broken = format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: app}}
---
apiVersion: v1
kind: Service
metadata: {{name: db, namespace: data}}
spec: {{clusterIP: 127.0.0.1, ports: [{{port: 5432}}]}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: broken}}
spec:
  ingressClassName: tuna
  rules:
  - host: shop.localhost
    http:
      paths:
      - {{path: "/a//b", pathType: Prefix, backend: {{service: {{name: web, port: {{number: {port}}}}}}}}}
      - {{path: /missing, pathType: Prefix, backend: {{service: {{name: nope, port: {{number: 80}}}}}}}}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Tunnel
metadata: {{name: db}}
spec: {{subdomain: db, upstream: {{url: "http://db.data.svc:5432"}}}}
"#,
        port = web.port()
    );
    let env = Env::start(&[
        ("good.yaml", good),
        ("broken.yaml", broken),
        ("zz-not-yaml.yaml", "kind: [unclosed\n".to_owned()),
    ])
    .await;
    assert_eq!(
        parse_body(&env.get("shop.localhost", "/x").await.1)["backend"],
        "web"
    );
    let report = env.standalone.report().await;
    for expected in [
        "UnsupportedKind",
        "PathRepeatedSlash",
        "ServiceNotFound",
        "OtherNamespaceService",
        "InvalidManifest",
        "zz-not-yaml.yaml (document 0)",
    ] {
        assert!(report.contains(expected), "missing {expected} in\n{report}");
    }
    // Fixing the broken file live publishes what it now says.
    env.change("broken.yaml", Some(String::new())).await;
    let report = env.standalone.report().await;
    assert!(!report.contains("ServiceNotFound"), "{report}");
    assert_eq!(
        parse_body(&env.get("shop.localhost", "/missing").await.1)["backend"],
        "web"
    );
    env.standalone.shutdown().await;
}

#[test]
fn data_dir_keeps_tcp_ports() {
    // The allocation file format is plain JSON, documented for operators.
    let dir = tempfile::tempdir().unwrap();
    let file = Path::new(dir.path()).join(tuna_operator::standalone::edge::TCP_ENDPOINTS_FILE);
    std::fs::write(&file, r#"{"echo": 30005}"#).unwrap();
    let embedded = tuna_operator::standalone::edge::Embedded::open(
        tuna_edge::MemoryAuthority::new(),
        "localhost",
        30000..=30010,
        dir.path(),
    )
    .unwrap();
    let edge: &dyn tuna_operator::edge::api::EdgeApi = &embedded;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let reserve = |alias: &str, port: Option<u16>| {
        rt.block_on(
            edge.ensure_tcp_endpoint(&tuna_protocol::api::CreateTcpEndpoint {
                alias: alias.into(),
                port,
            }),
        )
    };
    let r = reserve("echo", None).unwrap();
    assert_eq!(
        (r.object.alias.as_str(), r.object.port, r.adopted),
        ("echo", 30005, true)
    );
    let r = reserve("other", None).unwrap();
    assert_eq!((r.object.port, r.adopted), (30000, false));
    assert_eq!(
        reserve("port-30009", Some(30009)).unwrap().object.port,
        30009
    );
    assert!(
        reserve("port-40000", Some(40000)).is_err(),
        "ports outside the range are refused"
    );
    let saved: BTreeMap<String, u16> =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(
        saved,
        BTreeMap::from([
            ("echo".into(), 30005),
            ("other".into(), 30000),
            ("port-30009".into(), 30009)
        ])
    );
}

/// A GatewayClass, a Gateway and an HTTPRoute for `shop.localhost` (its
/// Domain reserves it), with the given rules (YAML list items).
fn shop_gateway(rules: &str) -> String {
    format!(
        r#"apiVersion: k8s.tuna.am/v1alpha1
kind: Domain
metadata: {{name: shop}}
spec: {{subdomain: shop}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: tuna}}
spec: {{controllerName: k8s.tuna.am/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: public}}
spec:
  gatewayClassName: tuna
  listeners: [{{name: http, protocol: HTTP, port: 80}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: shop}}
spec:
  parentRefs: [{{name: public}}]
  hostnames: [shop.localhost]
  rules:
{rules}"#
    )
}

/// Standalone mode serves HTTPRoutes from files: header and path matching by
/// the specification's precedence, a rewrite, a redirect, and a rule added
/// later goes live on the same tunnel session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn httproutes_from_files_through_the_edge() {
    let (web, api, echo) = (
        http_backend("web").await,
        http_backend("api").await,
        echo_backend().await,
    );
    let api_port = api.port();
    let rules = format!(
        r#"  - backendRefs: [{{name: web, port: 80}}]
  - matches:
    - path: {{type: PathPrefix, value: /api}}
      headers: [{{name: X-Version, value: "2"}}]
    filters:
    - type: URLRewrite
      urlRewrite: {{path: {{type: ReplacePrefixMatch, replacePrefixMatch: /v2}}}}
    backendRefs: [{{name: api, port: {api_port}}}]
  - matches: [{{path: {{type: Exact, value: /old}}}}]
    filters:
    - type: RequestRedirect
      requestRedirect: {{path: {{type: ReplaceFullPath, replaceFullPath: /new}}, statusCode: 301}}
"#
    );
    let env = Env::start(&[
        ("services.yaml", services(web, api, echo)),
        ("shop.yaml", shop_gateway(&rules)),
    ])
    .await;
    let key = TunnelKey::Host("shop.localhost".into());
    let session = env.standalone.session_ids().await[&key]
        .clone()
        .expect("connected");

    let url = |path: &str| format!("http://shop.localhost:{}{path}", env.port);
    let get = |path: &str, version: Option<&str>| {
        let mut request = env.client.get(url(path));
        if let Some(v) = version {
            request = request.header("x-version", v);
        }
        request.send()
    };
    // Without the header the API prefix is not matched: the site serves.
    let plain = get("/api/orders", None)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(parse_body(&plain)["backend"], "web", "{plain}");
    // With it, the API, on the rewritten path.
    let v2 = get("/api/orders", Some("2"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let v2 = parse_body(&v2);
    assert_eq!(
        (v2["backend"].as_str(), v2["path"].as_str()),
        ("api", "/v2/orders")
    );
    // The redirect is answered by the proxy.
    let no_follow = reqwest::Client::builder()
        .resolve("shop.localhost", env.standalone.http_addr().unwrap())
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let moved = no_follow.get(url("/old")).send().await.unwrap();
    assert_eq!(moved.status().as_u16(), 301);
    let location = moved.headers()["location"].to_str().unwrap().to_owned();
    assert!(location.ends_with("/new"), "{location}");

    // A rule added later: live without reconnecting.
    let more = format!(
        "{rules}  - matches: [{{path: {{type: PathPrefix, value: /admin}}}}]\n    backendRefs: [{{name: api, port: {api_port}}}]\n"
    );
    env.change("shop.yaml", Some(shop_gateway(&more))).await;
    let admin = get("/admin", None).await.unwrap().text().await.unwrap();
    assert_eq!(parse_body(&admin)["backend"], "api", "{admin}");
    assert_eq!(
        env.standalone.session_ids().await[&key],
        Some(session),
        "same tunnel session after a route change"
    );
    env.standalone.shutdown().await;
}

/// Standalone mode serves a TCPRoute from files: the Gateway's TCP listener
/// is named after a TCPEndpoint's alias, and bytes reach the echo backend
/// through the edge's public TCP port for that alias.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcproute_through_a_tcpendpoint_and_the_edge() {
    let (web, api, echo) = (
        http_backend("web").await,
        http_backend("api").await,
        echo_backend().await,
    );
    let gateway = format!(
        r#"apiVersion: k8s.tuna.am/v1alpha1
kind: TCPEndpoint
metadata: {{name: echo}}
spec: {{alias: echo}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: tuna}}
spec: {{controllerName: k8s.tuna.am/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: public}}
spec:
  gatewayClassName: tuna
  listeners: [{{name: echo, protocol: TCP, port: 7}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {{name: echo}}
spec:
  parentRefs: [{{name: public, sectionName: echo}}]
  rules: [{{backendRefs: [{{name: echo, port: {}}}]}}]
"#,
        echo.port()
    );
    let env = Env::start(&[
        ("services.yaml", services(web, api, echo)),
        ("gateway.yaml", gateway),
    ])
    .await;
    let report = env.standalone.report().await;
    assert!(!report.contains("Skipped"), "{report}");

    let addr = env
        .standalone
        .tcp_address("TCPRoute/default/echo")
        .await
        .expect("the TCPRoute has a public address");
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"ping through the route").await.unwrap();
    let mut got = [0u8; 22];
    tokio::time::timeout(WAIT, conn.read_exact(&mut got))
        .await
        .expect("echo in time")
        .unwrap();
    assert_eq!(&got, b"ping through the route");
    assert!(report.contains(&format!("tcp://{addr}")), "{report}");
    assert!(report.contains("TCPRoute/default/echo"), "{report}");
    env.standalone.shutdown().await;
}
