//! The agent role end to end: a real control plane (kube-apiserver, etcd,
//! kube-controller-manager), the real `tuna-operator edge`, `controller` and
//! `agent` processes, the real `kubectl`, and real HTTP and TCP traffic
//! through the edge to backends standing in for Services (a Service's cluster
//! IP is a loopback address of the clusters' service CIDR here). The journeys are those of
//! the product documentation.

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::networking::v1::Ingress;
use serde_json::Value;
use support::{
    Cluster, Edge, EdgeOptions, INGRESS_CLASS, Process, agent, bind_loopback, controller,
    echo_backend, events_of, http_backend, http_get, http_request, ready_of, wait_for,
    wait_for_event,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tuna_crds::Tunnel;

fn tunnel_ready(t: &Tunnel) -> Option<(String, String, String)> {
    t.status.as_ref().and_then(|s| ready_of(&s.conditions))
}

fn ready_true(t: &Tunnel) -> bool {
    tunnel_ready(t).is_some_and(|(s, _, _)| s == "True")
}

fn refused(t: &Tunnel, reason: &str) -> bool {
    tunnel_ready(t).is_some_and(|(s, r, _)| s == "False" && r == reason)
}

fn service(name: &str, addr: std::net::SocketAddr, port_name: Option<&str>) -> String {
    let name_field = port_name
        .map(|n| format!("name: {n}, "))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{clusterIP: {}, ports: [{{{name_field}port: {}}}]}}\n",
        addr.ip(),
        addr.port()
    )
}

struct Env {
    cluster: Cluster,
    edge: Edge,
    controller: Process,
    agent: Process,
    client: kube::Client,
}

impl Env {
    async fn start(agent_flags: &[&str]) -> Self {
        let cluster = Cluster::start().await;
        let edge = Edge::start(cluster.dir.path(), EdgeOptions::default()).await;
        cluster.apply(INGRESS_CLASS);
        let controller = controller(&cluster, &edge, "controller", &[]);
        let agent = agent(&cluster, &edge, "agent", agent_flags);
        let client = cluster.client().await;
        Self {
            cluster,
            edge,
            controller,
            agent,
            client,
        }
    }

    fn procs(&self) -> Vec<&Process> {
        let mut procs = vec![&self.agent, &self.controller];
        procs.extend(self.edge.process.as_ref());
        procs
    }

    async fn tunnel(&self, name: &str, what: &str, cond: impl Fn(&Tunnel) -> bool) -> Tunnel {
        wait_for(&self.client, "default", name, what, &self.procs(), cond).await
    }

    fn http(&self) -> std::net::SocketAddr {
        self.edge.addrs.http.expect("public HTTP listener")
    }

    /// The cast of the cross-namespace ownership tests: backends `web`
    /// (Service `web` of `default`) and `thief` (Service `thief` of a new
    /// namespace `other_ns`), and the account host `<subdomain>.tuna.test`
    /// reserved at the edge.
    async fn web_and_thief(&self, other_ns: &str, subdomain: &str) {
        let web = http_backend("web", bind_loopback(8080).await).await;
        let thief = http_backend("thief", bind_loopback(8080).await).await;
        self.cluster.apply(&service("web", web, None));
        self.cluster.kubectl_ok(&["create", "namespace", other_ns]);
        self.cluster.apply(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: thief, namespace: {other_ns}}}\nspec: {{clusterIP: {}, ports: [{{port: {}}}]}}\n",
            thief.ip(),
            thief.port()
        ));
        self.edge
            .client()
            .create_domain(&tuna_protocol::api::CreateDomain {
                subdomain: Some(subdomain.into()),
                domain: None,
            })
            .await
            .unwrap();
    }

    /// Waits until the agent's `/metrics` has `sample` (`name{labels} value`).
    async fn agent_metric(&self, sample: &str) {
        let addr: std::net::SocketAddr = self
            .agent
            .log()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["fields"]["message"] == "probes and metrics listening")
            .and_then(|l| l["fields"]["metrics"].as_str()?.parse().ok())
            .expect("the agent's metrics address in its log");
        let mut last = String::new();
        let found = tokio::time::timeout(support::WAIT, async {
            loop {
                let (_, body) = http_get(addr, "metrics", "/metrics").await;
                if body.lines().any(|l| l == sample) {
                    return;
                }
                last = body;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        assert!(found.is_ok(), "{sample:?} not in /metrics:\n{last}");
    }

    async fn tokens(&self) -> Vec<tuna_protocol::api::Token> {
        self.edge
            .client()
            .list_tokens("")
            .await
            .expect("list tokens")
            .into_iter()
            .filter(|t| !t.expired)
            .collect()
    }
}

/// The documentation's Tunnel: `kubectl get tunnel web` shows the public URL
/// and READY True; a request through the edge reaches the Service with the
/// public Host and X-Forwarded-Host/-Proto; deleting it revokes its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documentation_tunnel_is_published_and_revoked_on_delete() {
    let env = Env::start(&[]).await;
    let web = http_backend("web", bind_loopback(8080).await).await;
    env.cluster.apply(&service("web", web, None));
    env.cluster.apply(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata:\n  name: web\nspec:\n  protocol: http\n  subdomain: my-app\n  upstream:\n    url: http://web:8080\n",
    );
    let t = env.tunnel("web", "Ready", ready_true).await;
    assert_eq!(
        t.status.unwrap().url.as_deref(),
        Some("https://my-app.tuna.test")
    );
    let get = env.cluster.kubectl_ok(&["get", "tunnel", "web"]);
    let lines: Vec<Vec<&str>> = get
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["NAME", "PROTOCOL", "URL", "READY", "AGE"],
        "{get}"
    );
    assert_eq!(
        &lines[1][..4],
        ["web", "http", "https://my-app.tuna.test", "True"],
        "{get}"
    );

    let (status, body) = http_get(env.http(), "my-app.tuna.test", "/hello").await;
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["backend"], "web");
    assert_eq!(body["headers"]["host"], "my-app.tuna.test");
    assert_eq!(body["headers"]["x-forwarded-host"], "my-app.tuna.test");
    assert_eq!(body["headers"]["x-forwarded-proto"], "http");
    let describe = env.cluster.kubectl_ok(&["describe", "tunnel", "web"]);
    assert!(describe.contains("TunnelConnected"), "{describe}");
    // The documented gauge counts it (it was never set before).
    env.agent_metric("tuna_operator_tunnels{state=\"serving\"} 1")
        .await;

    // One token for this tunnel, with its owner labels.
    let tokens = env.tokens().await;
    let mine: Vec<_> = tokens
        .iter()
        .filter(|t| t.info.labels.get("k8s.tuna.am/name").map(String::as_str) == Some("web"))
        .collect();
    assert_eq!(mine.len(), 1, "{tokens:?}");
    assert_eq!(mine[0].info.labels["k8s.tuna.am/kind"], "Tunnel");
    assert_eq!(mine[0].info.bindings.hosts, ["my-app.tuna.test"]);

    env.cluster.kubectl_ok(&["delete", "tunnel", "web"]);
    let gone = tokio::time::timeout(support::WAIT, async {
        loop {
            if env.tokens().await.iter().all(|t| t.id != mine[0].id) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "token not revoked: {}", env.agent.log());
    let (status, _) = http_get(env.http(), "my-app.tuna.test", "/").await;
    assert_ne!(status, 200);
    // The subdomain the agent reserved for the Tunnel is released (after the
    // token: the tunnel stops first).
    let released = tokio::time::timeout(support::WAIT, async {
        loop {
            let domains = env.edge.client().list_domains().await.unwrap();
            if domains.iter().all(|d| d.name != "my-app.tuna.test") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(released.is_ok(), "subdomain kept: {}", env.agent.log());
    env.agent_metric("tuna_operator_tunnels{state=\"serving\"} 0")
        .await;
}

/// The documentation's Domain + Ingress: `/api/users` → api, `/apix` → web,
/// `/` → web (a named port); the backend sees the public Host and
/// X-Forwarded-*; `status.loadBalancer` lists the host; a path change is live
/// on an open keep-alive connection through the edge, without reconnecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documentation_ingress_routes_by_segment_and_changes_without_reconnecting() {
    let env = Env::start(&[]).await;
    let api = http_backend("api", bind_loopback(8080).await).await;
    let web = http_backend("web", bind_loopback(80).await).await;
    let v2 = http_backend("v2", bind_loopback(8080).await).await;
    env.cluster.apply(&service("api", api, None));
    env.cluster.apply(&service("web", web, Some("http")));
    env.cluster.apply(&service("v2", v2, None));
    let ingress = |extra: &str| {
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: my-app\nspec:\n  ingressClassName: tuna\n  rules:\n    - host: my-app.tuna.test\n      http:\n        paths:\n{extra}          - path: /api\n            pathType: Prefix\n            backend:\n              service:\n                name: api\n                port:\n                  number: 8080\n          - path: /\n            pathType: Prefix\n            backend:\n              service:\n                name: web\n                port:\n                  name: http\n"
        )
    };
    env.cluster.apply(&format!(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata:\n  name: my-app\nspec:\n  subdomain: my-app\n---\n{}",
        ingress("")
    ));
    let i: Ingress = wait_for(
        &env.client,
        "default",
        "my-app",
        "load balancer hostname",
        &env.procs(),
        |i: &Ingress| support::load_balancer_hostnames(i).contains(&"my-app.tuna.test"),
    )
    .await;
    assert!(i.status.is_some());
    let cases = [
        ("/api/users", "api"),
        ("/api", "api"),
        ("/apix", "web"),
        ("/", "web"),
        ("/v2/x", "web"),
    ];
    for (path, backend) in cases {
        let (status, body) = http_get(env.http(), "my-app.tuna.test", path).await;
        assert_eq!(status, 200, "{path}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["backend"], backend, "{path}");
        assert_eq!(body["path"], path);
        assert_eq!(body["headers"]["host"], "my-app.tuna.test");
        assert_eq!(body["headers"]["x-forwarded-host"], "my-app.tuna.test");
        assert_eq!(body["headers"]["x-forwarded-proto"], "http");
    }
    let events = events_of(&env.cluster, "default", "Ingress", "my-app");
    assert!(
        events.contains_key("RoutesUpdated") && events.contains_key("TunnelConnected"),
        "{events:?}"
    );

    // A keep-alive connection through the edge sees the new route on its
    // next request; the tunnel is not reconnected.
    let mut conn = tokio::net::TcpStream::connect(env.http()).await.unwrap();
    let (_, body) = http_request(&mut conn, "my-app.tuna.test", "/v2/x", "").await;
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["backend"],
        "web"
    );
    env.cluster.apply(&ingress(
        "          - path: /v2\n            pathType: Prefix\n            backend:\n              service:\n                name: v2\n                port:\n                  number: 8080\n",
    ));
    let switched = tokio::time::timeout(support::WAIT, async {
        loop {
            let (_, body) = http_request(&mut conn, "my-app.tuna.test", "/v2/x", "").await;
            if serde_json::from_str::<Value>(&body).unwrap()["backend"] == "v2" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        switched.is_ok(),
        "the route change never reached the open connection: {}",
        env.agent.log()
    );
    let events = events_of(&env.cluster, "default", "Ingress", "my-app");
    assert_eq!(
        events["TunnelConnected"].len(),
        1,
        "reconnected? {events:?}"
    );
    assert!(
        events["RoutesUpdated"]
            .iter()
            .any(|m| m.contains("/v2 -> v2:8080")),
        "{events:?}"
    );
    assert_eq!(
        env.agent.log().matches("tunnel session open").count(),
        1,
        "{}",
        env.agent.log()
    );
}

/// Rules without a host, wildcard hosts, non-Service backends, a missing
/// Service and a missing port name are skipped with events naming the rule,
/// path and backend; the rest of the Ingress is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipped_rules_and_backends_are_reported_and_the_rest_is_served() {
    let env = Env::start(&[]).await;
    let web = http_backend("web", bind_loopback(8080).await).await;
    env.cluster.apply(&service("web", web, Some("http")));
    env.cluster.apply("apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: shop}\nspec: {subdomain: shop}\n");
    env.cluster.apply(
        r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: mixed}
spec:
  ingressClassName: tuna
  rules:
  - http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 8080}}}}]}
  - host: "*.tuna.test"
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 8080}}}}]}
  - host: shop.tuna.test
    http:
      paths:
      - {path: /files, pathType: Prefix, backend: {resource: {apiGroup: storage.example.com, kind: Bucket, name: files}}}
      - {path: /gone, pathType: Prefix, backend: {service: {name: missing, port: {number: 80}}}}
      - {path: /badport, pathType: Prefix, backend: {service: {name: web, port: {name: nope}}}}
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}}
"#,
    );
    let wait = tokio::time::timeout(support::WAIT, async {
        loop {
            let events = events_of(&env.cluster, "default", "Ingress", "mixed");
            let rules = events.get("RuleSkipped").map_or(0, Vec::len);
            let backends = events.get("BackendSkipped").map_or(0, Vec::len);
            if rules >= 2 && backends >= 3 {
                return events;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let events = wait.unwrap_or_else(|_| {
        panic!(
            "events missing: {:?}\n{}",
            events_of(&env.cluster, "default", "Ingress", "mixed"),
            env.agent.log()
        )
    });
    let all: Vec<&String> = events.values().flatten().collect();
    for needle in [
        "RuleWithoutHost",
        "WildcardHost",
        "ResourceBackend",
        "Bucket files",
        "ServiceNotFound",
        "default/missing",
        "ServicePortNotFound",
        "path /badport",
    ] {
        assert!(
            all.iter().any(|m| m.contains(needle)),
            "{needle:?} in {events:?}"
        );
    }
    // The events come with the plan; the tunnel connects on its own time
    // (the Domain's reservation may still be on its way): wait for it.
    let mut last = (0, String::new());
    let served = tokio::time::timeout(support::WAIT, async {
        loop {
            last = http_get(env.http(), "shop.tuna.test", "/anything").await;
            if last.0 == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(served.is_ok(), "{last:?}\n{}", env.agent.log());
    let (status, _) = http_get(env.http(), "shop.tuna.test", "/gone").await;
    assert_eq!(
        status, 200,
        "a skipped path falls back to the longest remaining prefix (/)"
    );
}

/// Events a user reads on an Ingress that serves nothing, and on a host it
/// stops naming: an Ingress whose only rule has no host, and one whose only
/// host is a wildcard, each get `RuleSkipped`; a host removed from an
/// Ingress gets `TunnelStopped` (its tunnel stops), the other host goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingresses_without_hosts_and_removed_hosts_are_reported() {
    let env = Env::start(&[]).await;
    let web = http_backend("web", bind_loopback(8080).await).await;
    env.cluster.apply(&service("web", web, None));
    let rule = |host: Option<&str>| {
        let host = host
            .map(|h| format!("host: \"{h}\"\n    "))
            .unwrap_or_default();
        format!(
            "  - {host}http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 8080}}}}}}}}]}}\n"
        )
    };
    let ingress = |name: &str, rules: &[Option<&str>]| {
        let rules: String = rules.iter().map(|h| rule(*h)).collect();
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}}}\nspec:\n  ingressClassName: tuna\n  rules:\n{rules}"
        )
    };
    env.cluster.apply(&ingress("nohost", &[None]));
    env.cluster.apply(&ingress("wild", &[Some("*.tuna.test")]));
    env.cluster.apply("apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: one}\nspec: {subdomain: one}\n---\napiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: two}\nspec: {subdomain: two}\n");
    env.cluster.apply(&ingress(
        "two-hosts",
        &[Some("one.tuna.test"), Some("two.tuna.test")],
    ));
    let event = |name: &'static str, reason: &'static str, needle: &'static str| {
        wait_for_event(&env.cluster, "default", "Ingress", name, reason, needle)
    };
    event("nohost", "RuleSkipped", "RuleWithoutHost").await;
    event("wild", "RuleSkipped", "WildcardHost").await;
    event("two-hosts", "TunnelConnected", "two.tuna.test").await;
    event("two-hosts", "TunnelConnected", "one.tuna.test").await;
    assert_eq!(http_get(env.http(), "two.tuna.test", "/").await.0, 200);

    env.cluster
        .apply(&ingress("two-hosts", &[Some("one.tuna.test")]));
    event("two-hosts", "TunnelStopped", "two.tuna.test").await;
    let stopped = events_of(&env.cluster, "default", "Ingress", "two-hosts");
    assert!(
        !stopped["TunnelStopped"]
            .iter()
            .any(|m| m.contains("one.tuna.test")),
        "{stopped:?}"
    );
    assert_eq!(http_get(env.http(), "one.tuna.test", "/").await.0, 200);
}

/// The documentation's TCPEndpoint + tcp Tunnel: bytes are echoed through the
/// reserved port; `status.url` is `tcp://<host>:<port>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documentation_tcp_tunnel_echoes_bytes() {
    let env = Env::start(&[]).await;
    let pg = echo_backend(bind_loopback(5432).await).await;
    env.cluster.apply(&service("postgres", pg, None));
    env.cluster.apply(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: TCPEndpoint\nmetadata:\n  name: postgres\nspec:\n  alias: postgres\n---\napiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata:\n  name: postgres\nspec:\n  protocol: tcp\n  portOrAlias: postgres\n  upstream:\n    url: tcp://postgres:5432\n",
    );
    let t = env.tunnel("postgres", "Ready", ready_true).await;
    let url = t.status.unwrap().url.unwrap();
    let port: u16 = url
        .strip_prefix("tcp://tuna.test:")
        .expect("tcp://host:port")
        .parse()
        .unwrap();
    assert!((env.edge.tcp_ports.0..=env.edge.tcp_ports.1).contains(&port));
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    conn.write_all(b"hello postgres\n").await.unwrap();
    let mut buf = [0u8; 15];
    conn.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"hello postgres\n");
}

/// `apiKeySecretRef`: a connect-only key serves; a key without the scope, a
/// missing Secret and a Secret without the key are Ready=False with the
/// reason, and each recovers by itself once the Secret is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_secret_refs_connect_only_missing_scope_and_recovery() {
    let mut env = Env::start(&[]).await;
    env.edge.stop().await;
    let connect_only = Edge::create_key(&env.edge.data_dir, "default", &["tunnels:connect"]);
    let write_only = Edge::create_key(&env.edge.data_dir, "default", &["tunnels:write"]);
    env.edge.run().await;
    let web = http_backend("web", bind_loopback(8080).await).await;
    env.cluster.apply(&service("web", web, None));
    let secret = |name: &str, key: &str, value: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}}}\nstringData: {{{key}: {value}}}\n"
        )
    };
    let tunnel = |name: &str, secret: &str| {
        format!(
            "apiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {{name: {name}}}\nspec:\n  protocol: http\n  subdomain: {name}\n  upstream: {{url: 'http://web:8080'}}\n  apiKeySecretRef:\n    name: {secret}\n"
        )
    };
    env.cluster
        .apply(&secret("team-tuna-api-key", "api-key", &connect_only));
    env.cluster
        .apply(&secret("write-only", "api-key", &write_only));
    env.cluster
        .apply(&secret("wrong-key", "token", &connect_only));
    env.cluster.apply(&tunnel("team", "team-tuna-api-key"));
    env.cluster.apply(&tunnel("nowrite", "write-only"));
    env.cluster.apply(&tunnel("nosecret", "absent"));
    env.cluster.apply(&tunnel("nokey", "wrong-key"));
    env.tunnel("team", "Ready with a connect-only key", ready_true)
        .await;
    let (status, _) = http_get(env.http(), "team.tuna.test", "/").await;
    assert_eq!(status, 200);
    let t = env
        .tunnel("nowrite", "MissingConnectScope", |t| {
            refused(t, "MissingConnectScope")
        })
        .await;
    assert!(
        tunnel_ready(&t).unwrap().2.contains("tunnels:connect"),
        "{t:?}"
    );
    env.tunnel("nosecret", "SecretNotFound", |t| {
        refused(t, "SecretNotFound")
    })
    .await;
    let t = env
        .tunnel("nokey", "SecretKeyNotFound", |t| {
            refused(t, "SecretKeyNotFound")
        })
        .await;
    assert!(tunnel_ready(&t).unwrap().2.contains("api-key"), "{t:?}");
    // The token of `team` was minted with its own key: its account's token.
    // Fix the Secrets: each recovers at the next resync, nothing restarted.
    env.cluster
        .apply(&secret("absent", "api-key", &connect_only));
    env.cluster
        .apply(&secret("wrong-key", "api-key", &connect_only));
    env.tunnel("nosecret", "Ready once the Secret exists", ready_true)
        .await;
    env.tunnel("nokey", "Ready once the key is there", ready_true)
        .await;
    // The Secrets were only ever read with get.
    let verbs: BTreeSet<String> = env
        .cluster
        .audit()
        .iter()
        .filter(|e| {
            e["resource"] == "secrets"
                && e["user"] == support::ADMIN_USER
                && !e["user_agent"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("kubectl")
        })
        .map(|e| e["verb"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(verbs, BTreeSet::from(["get".to_owned()]));
}

/// Each refused upstream kind is Ready=False naming the rule; with
/// --allow-external-upstreams an IP upstream is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_upstreams_and_allow_external_upstreams() {
    let env = Env::start(&[]).await;
    let web = http_backend("web", bind_loopback(8080).await).await;
    // Another namespace's Service, with a cluster IP of its own (the API
    // server allocates each at most once).
    let theirs = http_backend("theirs", bind_loopback(8080).await).await;
    env.cluster.kubectl_ok(&["create", "namespace", "other"]);
    env.cluster.apply(&service("web", web, None));
    env.cluster.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: theirs, namespace: other}}\nspec: {{clusterIP: {}, ports: [{{port: {}}}]}}\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: ext}}\nspec: {{type: ExternalName, externalName: example.com, ports: [{{port: 80}}]}}\n",
        theirs.ip(),
        theirs.port()
    ));
    let cases = [
        (
            "ip",
            format!("http://{}:{}", web.ip(), web.port()),
            "IpAddressUpstream",
        ),
        (
            "external",
            "http://example.org:80".to_owned(),
            "ExternalHostUpstream",
        ),
        (
            "other-ns",
            "http://theirs.other:8080".to_owned(),
            "OtherNamespaceService",
        ),
        ("extname", "http://ext:80".to_owned(), "ExternalNameService"),
        (
            "malformed",
            "http://web:99999".to_owned(),
            "InvalidUpstreamUrl",
        ),
        (
            "no-service",
            "http://nothere:8080".to_owned(),
            "ServiceNotFound",
        ),
        (
            "no-port-name",
            "http://web:metrics".to_owned(),
            "ServicePortNotFound",
        ),
    ];
    for (name, url, _) in &cases {
        env.cluster.apply(&format!(
            "apiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {{name: {name}}}\nspec: {{subdomain: {name}, upstream: {{url: '{url}'}}}}\n"
        ));
    }
    env.cluster.apply("apiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {name: fine}\nspec: {subdomain: fine, upstream: {url: 'http://web:8080'}}\n");
    for (name, _, reason) in &cases {
        let t = env.tunnel(name, reason, |t| refused(t, reason)).await;
        let message = tunnel_ready(&t).unwrap().2;
        assert!(!message.is_empty());
        let events = events_of(&env.cluster, "default", "Tunnel", name);
        assert!(events.contains_key(*reason), "{name}: {events:?}");
    }
    // Bad input loses nothing else.
    env.tunnel("fine", "Ready beside the refused ones", ready_true)
        .await;
    let http = env.http();
    let Env {
        cluster,
        edge,
        agent: first,
        client,
        controller: _controller,
    } = env;
    drop(first);

    // --allow-external-upstreams: the IP upstream is served.
    let agent = agent(
        &cluster,
        &edge,
        "agent-allow",
        &["--allow-external-upstreams"],
    );
    wait_for(
        &client,
        "default",
        "ip",
        "Ready with --allow-external-upstreams",
        &[&agent],
        ready_true,
    )
    .await;
    let (status, body) = http_get(http, "ip.tuna.test", "/").await;
    assert_eq!(status, 200, "{body}");
}

/// Tokens of resources deleted while the agent was down are revoked at its
/// next start; the previous process's tokens are replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphaned_tokens_are_revoked_at_start_up() {
    let mut env = Env::start(&[]).await;
    let web = http_backend("web", bind_loopback(8080).await).await;
    env.cluster.apply(&service("web", web, None));
    for name in ["keep", "drop"] {
        env.cluster.apply(&format!(
            "apiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {{name: {name}}}\nspec: {{subdomain: {name}, upstream: {{url: 'http://web:8080'}}}}\n"
        ));
        env.tunnel(name, "Ready", ready_true).await;
    }
    let before: Vec<String> = env.tokens().await.into_iter().map(|t| t.id).collect();
    assert_eq!(before.len(), 2);
    env.agent.kill().await; // a crash: nothing revoked
    env.cluster.kubectl_ok(&["delete", "tunnel", "drop"]);
    assert_eq!(
        env.tokens().await.len(),
        2,
        "nobody revoked while the agent was down"
    );
    env.agent = agent(&env.cluster, &env.edge, "agent-2", &[]);
    env.tunnel("keep", "Ready after the restart", ready_true)
        .await;
    let swept = tokio::time::timeout(support::WAIT, async {
        loop {
            let now: Vec<String> = env.tokens().await.into_iter().map(|t| t.id).collect();
            if now.len() == 1 && !before.contains(&now[0]) {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        swept.is_ok(),
        "tokens: {:?}\n{}",
        env.tokens().await,
        env.agent.log()
    );
    // The deleted Tunnel's subdomain goes after its token.
    let domains_now = || async {
        env.edge
            .client()
            .list_domains()
            .await
            .unwrap()
            .into_iter()
            .map(|d| d.name)
            .collect::<Vec<String>>()
    };
    let released = tokio::time::timeout(support::WAIT, async {
        loop {
            if !domains_now().await.contains(&"drop.tuna.test".to_owned()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let domains = domains_now().await;
    assert!(
        released.is_ok(),
        "the deleted Tunnel's subdomain is released: {domains:?}"
    );
    assert!(domains.contains(&"keep.tuna.test".to_owned()));
    // The status of `keep` was Ready before the crash already: wait for the
    // traffic itself, which the new agent's session carries.
    let served = tokio::time::timeout(support::WAIT, async {
        loop {
            if http_get(env.http(), "keep.tuna.test", "/").await.0 == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(served.is_ok(), "{}\n{}", env.agent.log(), env.edge.log());
    // Services were only ever read with get by the operator.
    let verbs: BTreeSet<String> = env
        .cluster
        .audit()
        .iter()
        .filter(|e| {
            e["resource"] == "services"
                && e["user"] == support::ADMIN_USER
                && !e["user_agent"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("kubectl")
        })
        .map(|e| e["verb"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(verbs, BTreeSet::from(["get".to_owned()]));
}

/// `route explain URL` without `-f` reads the cluster of the current
/// kubeconfig (read-only) and explains what the agent serves, with the same
/// JSON as from files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_explain_reads_the_cluster_and_matches_what_is_served() {
    let env = Env::start(&[]).await;
    let api = http_backend("api", bind_loopback(8080).await).await;
    let web = http_backend("web", bind_loopback(80).await).await;
    env.cluster.apply(&service("api", api, None));
    env.cluster.apply(&service("web", web, Some("http")));
    let manifests = "apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: my-app}\nspec: {subdomain: my-app}\n---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: my-app}\nspec:\n  ingressClassName: tuna\n  rules:\n  - host: my-app.tuna.test\n    http:\n      paths:\n      - {path: /api, pathType: Prefix, backend: {service: {name: api, port: {number: 8080}}}}\n      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}}\n      - {path: /gone, pathType: Prefix, backend: {service: {name: missing, port: {number: 80}}}}\n";
    env.cluster.apply(manifests);
    // The Domain's status gives route explain the base domain.
    wait_for(
        &env.client,
        "default",
        "my-app",
        "Ready",
        &env.procs(),
        |d: &tuna_crds::Domain| d.status.as_ref().is_some_and(|s| s.fqdn.is_some()),
    )
    .await;
    // The Ingress's status says the agent serves the host.
    wait_for(
        &env.client,
        "default",
        "my-app",
        "served",
        &env.procs(),
        |i: &Ingress| {
            i.status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|l| l.ingress.as_ref())
                .is_some_and(|l| !l.is_empty())
        },
    )
    .await;
    let explain = |args: &[&str]| {
        let out = std::process::Command::new(support::operator_bin())
            .args(["route", "explain"])
            .args(args)
            .env("KUBECONFIG", &env.cluster.kubeconfig)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    for (path, backend) in [("/api/users", "api"), ("/apix", "web")] {
        let url = format!("https://my-app.tuna.test{path}");
        let json: Value = serde_json::from_str(&explain(&["-o", "json", &url])).unwrap();
        assert_eq!(json["service"], backend, "{json}");
        assert_eq!(json["ingress"], "my-app");
        // The cluster resolves Services: the missing one is skipped, as the agent does.
        let skipped: Vec<&str> = json["skipped"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["reason"].as_str().unwrap())
            .collect();
        assert_eq!(skipped, ["ServiceNotFound"], "{json}");
        let (_, served) = http_get(env.http(), "my-app.tuna.test", path).await;
        assert_eq!(
            serde_json::from_str::<Value>(&served).unwrap()["backend"],
            backend
        );
    }
    let text = explain(&["https://my-app.tuna.test/api/users"]);
    assert!(text.contains("served by Ingress default/my-app rule 0 path 0 (Prefix /api) -> Service default/api:8080"), "{text}");
    let dir = env.cluster.dir.path().join("files");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("all.yaml"), manifests).unwrap();
    let from_files: Value = serde_json::from_str(&explain(&[
        "-f",
        dir.to_str().unwrap(),
        "--base-domain",
        "tuna.test",
        "-o",
        "json",
        "https://my-app.tuna.test/api/users",
    ]))
    .unwrap();
    let from_cluster: Value = serde_json::from_str(&explain(&[
        "-o",
        "json",
        "https://my-app.tuna.test/api/users",
    ]))
    .unwrap();
    for key in [
        "matched",
        "namespace",
        "ingress",
        "host",
        "path",
        "pathType",
        "service",
        "port",
    ] {
        assert_eq!(from_files[key], from_cluster[key], "{key}");
    }
}

/// `Ready=True` only while the edge serves the tunnel: an edge restart is
/// `Disconnected` (with a TunnelStopped event), then Ready again by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_follows_the_connection_to_the_edge() {
    let mut env = Env::start(&[]).await;
    let web = http_backend("web", bind_loopback(8080).await).await;
    env.cluster.apply(&service("web", web, None));
    env.cluster.apply("apiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {name: web}\nspec: {subdomain: web, upstream: {url: 'http://web:8080'}}\n");
    env.tunnel("web", "Ready", ready_true).await;
    env.edge.stop().await;
    let down = env
        .tunnel("web", "not Ready while the edge is down", |t| {
            !ready_true(t)
        })
        .await;
    assert!(
        tunnel_ready(&down).is_some_and(|(_, r, _)| r == "Disconnected" || r == "Connecting"),
        "{down:?}"
    );
    assert!(events_of(&env.cluster, "default", "Tunnel", "web").contains_key("TunnelStopped"));
    env.edge.run().await;
    env.tunnel("web", "Ready again", ready_true).await;
    let (status, _) = http_get(env.http(), "web.tuna.test", "/").await;
    assert_eq!(status, 200);
}

/// Tunnel tokens are short-lived and renewed in place: with
/// `--tunnel-token-ttl 6s` (renewed every 2 s) against the test edge, which
/// re-checks every grant every 2 s and closes a tunnel whose token expired,
/// the tunnel serves without one failed request for three lifetimes on its
/// first token, whose expiry moves forward; it never stops being Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnel_tokens_are_renewed_in_place_before_they_expire() {
    const TTL: u64 = 6;
    let env = Env::start(&["--tunnel-token-ttl", "6s"]).await;
    let web = http_backend("web", bind_loopback(8080).await).await;
    env.cluster.apply(&service("web", web, None));
    env.cluster.apply("apiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {name: web}\nspec: {subdomain: web, upstream: {url: 'http://web:8080'}}\n");
    env.tunnel("web", "Ready", ready_true).await;
    let token_of_web = |tokens: Vec<tuna_protocol::api::Token>| {
        tokens
            .into_iter()
            .find(|t| t.info.labels.get("k8s.tuna.am/name").map(String::as_str) == Some("web"))
            .expect("the tunnel's token")
    };
    let first = token_of_web(env.tokens().await);
    let now = tuna_protocol::api::Timestamp::now().unix_seconds();
    assert!(
        first.expires_at.unix_seconds() <= now + TTL as i64,
        "the token lives --tunnel-token-ttl: {first:?}"
    );

    // Three lifetimes of traffic, a request every 200 ms: none fails.
    let started = tokio::time::Instant::now();
    let mut pace = tokio::time::interval(Duration::from_millis(200));
    let mut served = 0;
    while started.elapsed() < Duration::from_secs(3 * TTL) {
        pace.tick().await;
        let (status, body) = http_get(env.http(), "web.tuna.test", "/").await;
        assert_eq!(
            status,
            200,
            "request {served}, {:?} in: {body}\n--- agent ---\n{}",
            started.elapsed(),
            env.agent.log()
        );
        served += 1;
    }
    let last = token_of_web(env.tokens().await);
    assert_eq!(last.id, first.id, "renewed in place, not replaced");
    assert!(
        last.expires_at.unix_seconds() >= first.expires_at.unix_seconds() + 2 * TTL as i64,
        "the expiry moved forward: {first:?} then {last:?}"
    );
    let t = env.tunnel("web", "still Ready", ready_true).await;
    let events = events_of(&env.cluster, "default", "Tunnel", "web");
    assert!(!events.contains_key("TunnelStopped"), "{events:?} {t:?}");
}

/// Which Ingresses are ours and who owns a host: the default IngressClass
/// takes class-less Ingresses, the legacy annotation is honoured, a domain of
/// the account needs no Domain, Ingresses of one namespace merge on a host,
/// and another namespace's claim is ignored with a Warning event. A headless
/// Service is reached at its ready EndpointSlice address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classes_account_domains_merging_ownership_and_headless_services() {
    let env = Env::start(&[]).await;
    let web = http_backend("web", bind_loopback(8080).await).await;
    let api = http_backend("api", bind_loopback(8080).await).await;
    // A headless Service's endpoints are pod addresses, which Kubernetes
    // refuses in the loopback range: its backend is a host of its own.
    let pod_host = support::NetnsHost::create();
    let pods = http_backend("pods", pod_host.bind(8080)).await;
    env.cluster.apply(&service("web", web, None));
    env.cluster.apply(&service("api", api, None));
    // A headless Service and its EndpointSlice (one ready endpoint, one not).
    env.cluster.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: pods}}\nspec: {{clusterIP: None, ports: [{{name: http, port: 80, targetPort: 8080}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: pods-1, labels: {{kubernetes.io/service-name: pods}}}}\naddressType: IPv4\nports: [{{name: http, port: {}}}]\nendpoints:\n- addresses: ['{}']\n  conditions: {{ready: true}}\n- addresses: ['{}']\n  conditions: {{ready: false}}\n",
        pods.port(),
        pods.ip(),
        pod_host.host_ip,
    ));
    env.cluster.kubectl_ok(&["create", "namespace", "other"]);
    // The default class; the account holds `account.example.com` (no Domain).
    env.cluster.kubectl_ok(&[
        "annotate",
        "ingressclass",
        "tuna",
        "ingressclass.kubernetes.io/is-default-class=true",
    ]);
    env.edge
        .client()
        .create_domain(&tuna_protocol::api::CreateDomain {
            subdomain: Some("account".into()),
            domain: None,
        })
        .await
        .unwrap();
    let rule = |host: &str, path: &str, svc: &str, port: &str| {
        format!(
            "  - host: {host}\n    http: {{paths: [{{path: {path}, pathType: Prefix, backend: {{service: {{name: {svc}, port: {port}}}}}}}]}}\n"
        )
    };
    env.cluster.apply(&format!(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {{name: shared}}\nspec: {{subdomain: shared}}\n---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: classless}}\nspec:\n  rules:\n{}---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: legacy\n  annotations: {{kubernetes.io/ingress.class: tuna}}\nspec:\n  rules:\n{}---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: headless}}\nspec:\n  ingressClassName: tuna\n  rules:\n{}",
        rule("account.tuna.test", "/", "web", "{number: 8080}"),
        rule("shared.tuna.test", "/api", "api", "{number: 8080}"),
        rule("shared.tuna.test", "/pods", "pods", "{name: http}"),
    ));
    env.cluster.apply(&format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: merged}}\nspec:\n  ingressClassName: tuna\n  rules:\n{}---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: hijack, namespace: other}}\nspec:\n  ingressClassName: tuna\n  rules:\n{}",
        rule("shared.tuna.test", "/", "web", "{number: 8080}"),
        rule("shared.tuna.test", "/admin", "web", "{number: 8080}"),
    ));
    let served = |host: &'static str, path: &'static str, backend: &'static str| {
        let http = env.http();
        async move {
            tokio::time::timeout(support::WAIT, async {
                loop {
                    let (status, body) = http_get(http, host, path).await;
                    if status == 200
                        && serde_json::from_str::<Value>(&body)
                            .is_ok_and(|b| b["backend"] == backend)
                    {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await
            .is_ok()
        }
    };
    assert!(
        served("account.tuna.test", "/", "web").await,
        "class-less Ingress on an account domain: {}",
        env.agent.log()
    );
    assert!(
        served("shared.tuna.test", "/api/x", "api").await,
        "legacy annotation"
    );
    assert!(
        served("shared.tuna.test", "/pods", "pods").await,
        "headless Service"
    );
    assert!(
        served("shared.tuna.test", "/", "web").await,
        "merged Ingress of the namespace"
    );
    // The other namespace's /admin is not served: / of `merged` answers it.
    let (_, body) = http_get(env.http(), "shared.tuna.test", "/admin").await;
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["backend"],
        "web"
    );
    wait_for_event(
        &env.cluster,
        "other",
        "Ingress",
        "hijack",
        "RuleSkipped",
        "HostOwnedByOtherNamespace",
    )
    .await;
}

/// A host on the account that no Domain reserves belongs to the namespace of
/// its oldest claimant, whatever its kind: a Tunnel of another namespace does
/// not take over the host an older Ingress serves. It is refused (`Ready`
/// False, a warning event), the Ingress keeps serving, `route explain` shows
/// why, and once the Ingress is gone the Tunnel gets the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_of_another_namespace_cannot_take_over_an_account_host_an_ingress_serves() {
    let env = Env::start(&[]).await;
    env.web_and_thief("other", "owned").await;
    let ingress = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: site}\nspec:\n  ingressClassName: tuna\n  rules:\n  - host: owned.tuna.test\n    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 8080}}}}]}\n";
    env.cluster.apply(ingress);
    let backend_of = |body: &str| {
        serde_json::from_str::<Value>(body)
            .ok()
            .and_then(|b| b["backend"].as_str().map(str::to_owned))
    };
    let serves = |backend: &'static str| {
        let http = env.http();
        async move {
            tokio::time::timeout(support::WAIT, async {
                loop {
                    let (status, body) = http_get(http, "owned.tuna.test", "/").await;
                    if status == 200 && backend_of(&body).as_deref() == Some(backend) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await
            .is_ok()
        }
    };
    assert!(serves("web").await, "the Ingress: {}", env.agent.log());

    let tunnel = "apiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {name: takeover, namespace: other}\nspec: {subdomain: owned, upstream: {url: 'http://thief:8080'}}\n";
    env.cluster.apply(tunnel);
    let t: Tunnel = wait_for(
        &env.client,
        "other",
        "takeover",
        "refused HostOwnedByOtherNamespace",
        &env.procs(),
        |t| refused(t, "HostOwnedByOtherNamespace"),
    )
    .await;
    let (_, _, message) = tunnel_ready(&t).unwrap();
    // It names the namespace, not the other tenant's objects.
    assert!(
        message.contains(r#"belongs to namespace "default""#) && !message.contains("site"),
        "{message}"
    );
    wait_for_event(
        &env.cluster,
        "other",
        "Tunnel",
        "takeover",
        "HostOwnedByOtherNamespace",
        "",
    )
    .await;
    // Still the Ingress's backend, on every request.
    for _ in 0..5 {
        let (status, body) = http_get(env.http(), "owned.tuna.test", "/").await;
        assert_eq!(
            (status, backend_of(&body).as_deref()),
            (200, Some("web")),
            "{body}"
        );
    }
    // route explain, from the same objects as files, plans as the agent did.
    let dir = env.cluster.dir.path().join("takeover");
    std::fs::create_dir_all(&dir).unwrap();
    let created = |kind: &str, ns: &str, name: &str| {
        env.cluster
            .kubectl_ok(&[
                "get",
                kind,
                name,
                "-n",
                ns,
                "-o",
                "jsonpath={.metadata.creationTimestamp}",
            ])
            .trim()
            .to_owned()
    };
    let with_created = |manifest: &str, ts: String| {
        manifest.replacen(
            "metadata: {",
            &format!("metadata: {{creationTimestamp: '{ts}', "),
            1,
        )
    };
    std::fs::write(
        dir.join("objects.yaml"),
        format!(
            "{}---\n{}",
            with_created(ingress, created("ingress", "default", "site")),
            with_created(tunnel, created("tunnel", "other", "takeover"))
        ),
    )
    .unwrap();
    let out = std::process::Command::new(support::operator_bin())
        .args(["route", "explain", "-f"])
        .arg(&dir)
        .args([
            "--base-domain",
            "tuna.test",
            "--account-domain",
            "owned.tuna.test",
            "-o",
            "json",
            "https://owned.tuna.test/",
        ])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let json: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(json["ingress"], "site", "{json}");
    assert_eq!(json["refusedTunnels"][0]["name"], "takeover", "{json}");
    assert_eq!(
        json["refusedTunnels"][0]["reason"], "HostOwnedByOtherNamespace",
        "{json}"
    );

    // The Ingress gone, the host is free: the Tunnel publishes it.
    env.cluster
        .kubectl_ok(&["delete", "ingress", "site", "--wait=false"]);
    wait_for(
        &env.client,
        "other",
        "takeover",
        "Ready",
        &env.procs(),
        ready_true,
    )
    .await;
    assert!(serves("thief").await, "the Tunnel: {}", env.agent.log());
}

/// Issue 30, item 2: a host belongs to the object that claimed it first, not
/// to the oldest object. An Ingress and a Tunnel of team-a, older than the
/// Ingress of `default` that serves an account host, are edited to claim that
/// host: both are refused (`HostOwnedByOtherNamespace`), the host keeps its
/// backend, `route explain` on the cluster says the same, and so does a
/// restarted agent (the holder is recorded in the agent's claim book).
/// Once the holder is deleted, team-a gets the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_a_host_to_an_older_ingress_does_not_take_it_even_after_a_restart() {
    let mut env = Env::start(&[]).await;
    env.web_and_thief("team-a", "shop").await;
    let ingress = |ns: &str, name: &str, host: &str, backend: &str| {
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  ingressClassName: tuna\n  rules:\n  - host: {host}\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: {backend}, port: {{number: 8080}}}}}}}}]}}\n"
        )
    };
    // team-a's Ingress and Tunnel first (the older objects), on other hosts.
    env.cluster
        .apply(&ingress("team-a", "old", "elsewhere.tuna.test", "thief"));
    let tunnel = |subdomain: &str| {
        format!(
            "apiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {{name: old-tun, namespace: team-a}}\nspec: {{subdomain: {subdomain}, upstream: {{url: 'http://thief:8080'}}}}\n"
        )
    };
    env.cluster.apply(&tunnel("aside"));
    wait_for(
        &env.client,
        "team-a",
        "old-tun",
        "Ready",
        &env.procs(),
        ready_true,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    env.cluster
        .apply(&ingress("default", "site", "shop.tuna.test", "web"));
    let backend_of = |body: &str| {
        serde_json::from_str::<Value>(body)
            .ok()
            .and_then(|b| b["backend"].as_str().map(str::to_owned))
    };
    let http = env.http();
    let serves = move |backend: &'static str| async move {
        tokio::time::timeout(support::WAIT, async {
            loop {
                let (status, body) = http_get(http, "shop.tuna.test", "/").await;
                if status == 200 && backend_of(&body).as_deref() == Some(backend) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .is_ok()
    };
    assert!(serves("web").await, "the Ingress: {}", env.agent.log());
    // The holder is recorded in the agent's claim book (issue 37), which no
    // tenant can write.
    wait_for(
        &env.client,
        "default",
        "tuna-operator-claims",
        "the claim book",
        &env.procs(),
        |cm: &k8s_openapi::api::core::v1::ConfigMap| {
            cm.data
                .as_ref()
                .and_then(|d| d.get("hosts.json"))
                .is_some_and(|h| h.contains("\"shop.tuna.test\":{\"namespace\":\"default\""))
        },
    )
    .await;

    // team-a adds the host to its older Ingress: refused, the host stays.
    env.cluster.apply(&format!(
        "{}  - host: shop.tuna.test\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: thief, port: {{number: 8080}}}}}}}}]}}\n",
        ingress("team-a", "old", "elsewhere.tuna.test", "thief")
    ));
    wait_for_event(
        &env.cluster,
        "team-a",
        "Ingress",
        "old",
        "RuleSkipped",
        "HostOwnedByOtherNamespace",
    )
    .await;
    let still_web = || async {
        for _ in 0..5 {
            let (status, body) = http_get(http, "shop.tuna.test", "/").await;
            assert_eq!(
                (status, backend_of(&body).as_deref()),
                (200, Some("web")),
                "{body}"
            );
        }
    };
    still_web().await;
    // team-a's older Tunnel switches to the host: refused too.
    env.cluster.apply(&tunnel("shop"));
    wait_for(
        &env.client,
        "team-a",
        "old-tun",
        "refused HostOwnedByOtherNamespace",
        &env.procs(),
        |t| refused(t, "HostOwnedByOtherNamespace"),
    )
    .await;
    still_web().await;
    // route explain, reading the cluster, plans as the agent did.
    let explain = || {
        let out = std::process::Command::new(support::operator_bin())
            .args([
                "route",
                "explain",
                "--base-domain",
                "tuna.test",
                "--account-domain",
                "shop.tuna.test",
                "-o",
                "json",
                "https://shop.tuna.test/",
            ])
            .env("KUBECONFIG", &env.cluster.kubeconfig)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
    };
    let json = explain();
    assert_eq!(json["ingress"], "site", "{json}");
    assert_eq!(json["namespace"], "default", "{json}");
    assert_eq!(json["refusedTunnels"][0]["name"], "old-tun", "{json}");
    assert_eq!(
        json["refusedTunnels"][0]["reason"], "HostOwnedByOtherNamespace",
        "{json}"
    );

    // A restarted agent decides the same: the record, not the ages.
    env.agent.terminate().await;
    env.agent = agent(&env.cluster, &env.edge, "agent-new", &[]);
    wait_for_event(
        &env.cluster,
        "team-a",
        "Ingress",
        "old",
        "RuleSkipped",
        "HostOwnedByOtherNamespace",
    )
    .await;
    // The old agent's tunnels are gone: what serves now is the new agent's plan.
    assert!(serves("web").await, "{}", env.agent.log());
    tokio::time::sleep(Duration::from_secs(2)).await;
    still_web().await;
    wait_for(
        &env.client,
        "team-a",
        "old-tun",
        "refused HostOwnedByOtherNamespace",
        &env.procs(),
        |t| refused(t, "HostOwnedByOtherNamespace"),
    )
    .await;

    // The holder deleted, its claim is gone: team-a gets the host (its
    // Tunnel, which owns it within the namespace).
    env.cluster
        .kubectl_ok(&["delete", "ingress", "site", "--wait=false"]);
    assert!(serves("thief").await, "{}", env.agent.log());
}

/// The subdomain an agent reserved for a Tunnel is released when the Tunnel
/// is deleted, even after the agent restarted (an upgrade) and the edge calls
/// the reservation "existing".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_still_releases_the_subdomains_it_reserved() {
    let mut env = Env::start(&[]).await;
    let web = http_backend("web", bind_loopback(8080).await).await;
    env.cluster.apply(&service("web", web, None));
    env.cluster.apply("apiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {name: web}\nspec: {subdomain: upgraded, upstream: {url: 'http://web:8080'}}\n");
    env.tunnel("web", "Ready", ready_true).await;
    env.agent.terminate().await; // as Kubernetes stops the old pod on an upgrade
    env.agent = agent(&env.cluster, &env.edge, "agent-new", &[]);
    let served = tokio::time::timeout(support::WAIT, async {
        while http_get(env.http(), "upgraded.tuna.test", "/").await.0 != 200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(served.is_ok(), "{}", env.agent.log());
    env.cluster.kubectl_ok(&["delete", "tunnel", "web"]);
    let released = tokio::time::timeout(support::WAIT, async {
        loop {
            let domains = env.edge.client().list_domains().await.unwrap();
            if domains.iter().all(|d| d.name != "upgraded.tuna.test") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        released.is_ok(),
        "the subdomain leaked: {}",
        env.agent.log()
    );
}
