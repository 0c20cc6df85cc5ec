//! The Gateway API end to end (issue 31): a real control plane with the
//! Gateway API v1.6.1 standard CRDs (`kubectl apply --server-side`), the real
//! `tuna-operator edge`, `controller` and `agent`, the real `kubectl`, and real
//! HTTP through the edge to backends standing in for Services.

use crate::support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use serde_json::Value;
use support::{
    Cluster, Edge, EdgeOptions, Process, agent, bind_loopback, controller, echo_backend, events_of,
    http_backend, http_get, http_request, wait_for, wait_for_event,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tuna_crds::gateway::{Gateway, GatewayClass, HttpRoute, TcpRoute};

const CONTROLLER: &str = "k8s.tuna.am/gateway-controller";

/// The pinned standard-channel CRDs (`scripts/setup.sh --k8s MINOR` puts them there).
fn crds_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools/gateway-api-v1.6.1")
}

fn service(namespace: &str, name: &str, addr: std::net::SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec: {{clusterIP: {}, ports: [{{port: {}}}]}}\n",
        addr.ip(),
        addr.port()
    )
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

fn is_true(conditions: &[Condition], type_: &str) -> bool {
    condition(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Whether our `status.parents` entry of a route has condition `type_` False.
fn parent_says_false(r: &HttpRoute, type_: &str) -> bool {
    our_parent(r)
        .is_some_and(|p| condition(&p.conditions, type_).is_some_and(|c| c.status == "False"))
}

/// Our `status.parents` entry of a route (the first).
fn our_parent(r: &HttpRoute) -> Option<&tuna_crds::gateway::httproutes::HttpRouteStatusParents> {
    r.status
        .as_ref()?
        .parents
        .iter()
        .find(|p| p.controller_name == CONTROLLER)
}

struct Env {
    cluster: Cluster,
    edge: Edge,
    controller: Process,
    agent: Process,
    client: kube::Client,
}

impl Env {
    /// A cluster with the Gateway API CRDs (Established), the class `tuna`
    /// (as the chart creates it), a Gateway `web` with one HTTP listener, and
    /// the edge, controller and agent.
    async fn start() -> Self {
        Self::start_with(EdgeOptions::default()).await
    }

    /// [`Env::start`] with an edge of these options.
    async fn start_with(edge_options: EdgeOptions) -> Self {
        let cluster = Cluster::start().await;
        let dir = crds_dir();
        assert!(
            dir.is_dir(),
            "{} is missing: run scripts/setup.sh --k8s 1.37 (or scripts/test.sh)",
            dir.display()
        );
        cluster.kubectl_ok(&["apply", "--server-side", "-f", dir.to_str().unwrap()]);
        cluster.kubectl_ok(&[
            "wait",
            "--for",
            "condition=Established",
            "--timeout",
            "60s",
            "crd/gatewayclasses.gateway.networking.k8s.io",
            "crd/gateways.gateway.networking.k8s.io",
            "crd/httproutes.gateway.networking.k8s.io",
            "crd/referencegrants.gateway.networking.k8s.io",
            "crd/tcproutes.gateway.networking.k8s.io",
        ]);
        let edge = Edge::start(cluster.dir.path(), edge_options).await;
        let controller = controller(&cluster, &edge, "controller", &[]);
        let agent = agent(&cluster, &edge, "agent", &[]);
        let client = cluster.client().await;
        cluster.apply(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: tuna}\nspec: {controllerName: k8s.tuna.am/gateway-controller}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: web, namespace: default}\nspec:\n  gatewayClassName: tuna\n  listeners:\n  - {name: http, protocol: HTTP, port: 80}\n",
        );
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

    fn http(&self) -> std::net::SocketAddr {
        self.edge.addrs.http.expect("public HTTP listener")
    }

    async fn route(&self, name: &str, what: &str, cond: impl Fn(&HttpRoute) -> bool) -> HttpRoute {
        wait_for(&self.client, "default", name, what, &self.procs(), cond).await
    }

    async fn gateway(&self, what: &str, cond: impl Fn(&Gateway) -> bool) -> Gateway {
        wait_for(&self.client, "default", "web", what, &self.procs(), cond).await
    }

    /// Waits until a fresh request for `host` `path` answers `status` from
    /// `backend` (any body when `backend` is empty).
    async fn serves(&self, host: &str, path: &str, extra: &str, status: u16, backend: &str) {
        let mut last = (0, String::new());
        let done = tokio::time::timeout(support::WAIT, async {
            loop {
                let mut conn = tokio::net::TcpStream::connect(self.http()).await.unwrap();
                last = http_request(&mut conn, host, path, extra).await;
                let from = serde_json::from_str::<Value>(&last.1)
                    .ok()
                    .and_then(|v| v["backend"].as_str().map(str::to_owned))
                    .unwrap_or_default();
                if last.0 == status && (backend.is_empty() || from == backend) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        assert!(
            done.is_ok(),
            "{host}{path} never answered {status} from {backend:?}; last {last:?}\n{}",
            self.agent.log()
        );
    }
}

/// The class, a Gateway and an HTTPRoute of the documentation's shape: the
/// route's rules route by path (PathPrefix by segment, Exact) and header through the
/// edge; GatewayClass,
/// Gateway and HTTPRoute statuses say so (observedGeneration, addresses,
/// attachedRoutes); a new path is live on an open keep-alive connection
/// without reconnecting the tunnel; another controller's `status.parents`
/// entry survives the agent's writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn httproutes_route_by_path_report_status_and_change_without_reconnecting() {
    let env = Env::start().await;
    let web = http_backend("web", bind_loopback(8080).await).await;
    let api = http_backend("api", bind_loopback(8080).await).await;
    let canary = http_backend("canary", bind_loopback(8080).await).await;
    let v2 = http_backend("v2", bind_loopback(8080).await).await;
    for (name, addr) in [("web", web), ("api", api), ("canary", canary), ("v2", v2)] {
        env.cluster.apply(&service("default", name, addr));
    }
    let route = |extra: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: shop, namespace: default}}\nspec:\n  parentRefs: [{{name: web}}]\n  hostnames: [shop.tuna.test]\n  rules:\n{extra}  - matches: [{{path: {{type: PathPrefix, value: /api}}}}]\n    backendRefs: [{{name: api, port: 8080}}]\n  - matches: [{{path: {{type: PathPrefix, value: /api}}, headers: [{{name: X-Env, value: canary}}]}}]\n    backendRefs: [{{name: canary, port: 8080}}]\n  - matches: [{{path: {{type: Exact, value: /about}}}}]\n    backendRefs: [{{name: canary, port: 8080}}]\n  - backendRefs: [{{name: web, port: 8080}}]\n"
        )
    };
    env.cluster.apply(&format!(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {{name: shop}}\nspec: {{subdomain: shop}}\n---\n{}",
        route("")
    ));

    // Status: the class, the Gateway (address = the host once served), the route.
    let classes: Api<GatewayClass> = Api::all(env.client.clone());
    let accepted = tokio::time::timeout(support::WAIT, async {
        loop {
            let c = classes.get("tuna").await.unwrap();
            let conds = c.status.as_ref().and_then(|s| s.conditions.clone());
            if let Some(a) = conds.as_deref().and_then(|c| condition(c, "Accepted"))
                && a.status == "True"
            {
                return (a.clone(), c.metadata.generation);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let (a, generation) =
        accepted.unwrap_or_else(|_| panic!("class not Accepted\n{}", env.agent.log()));
    assert_eq!(a.observed_generation, generation);
    // The class says what it supports, sorted, as the specification asks.
    let features: Vec<String> = classes
        .get("tuna")
        .await
        .unwrap()
        .status
        .and_then(|s| s.supported_features)
        .unwrap_or_default()
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert!(
        features.contains(&"HTTPRoute".to_owned())
            && features.contains(&"ReferenceGrant".to_owned()),
        "{features:?}"
    );
    assert!(features.windows(2).all(|w| w[0] < w[1]), "{features:?}");
    // On the edge's shared ports a listener has no port of its own.
    assert!(
        !features.contains(&"HTTPRouteParentRefPort".to_owned()),
        "{features:?}"
    );
    let g = env
        .gateway("Programmed with its host as address", |g: &Gateway| {
            g.status.as_ref().is_some_and(|s| {
                is_true(s.conditions.as_deref().unwrap_or_default(), "Programmed")
                    && s.addresses.as_ref().is_some_and(|a| {
                        a.iter().any(|a| {
                            a.value == "shop.tuna.test" && a.r#type.as_deref() == Some("Hostname")
                        })
                    })
            })
        })
        .await;
    let status = g.status.unwrap();
    let conditions = status.conditions.unwrap();
    assert!(is_true(&conditions, "Accepted"), "{conditions:?}");
    assert!(
        conditions
            .iter()
            .all(|c| c.observed_generation == g.metadata.generation),
        "{conditions:?}"
    );
    let listeners = status.listeners.unwrap();
    assert_eq!(listeners.len(), 1);
    assert_eq!(listeners[0].name, "http");
    assert_eq!(listeners[0].attached_routes, 1);
    let kinds = listeners[0].supported_kinds.clone().unwrap();
    assert_eq!(kinds.len(), 1);
    assert_eq!(kinds[0].kind, "HTTPRoute");
    assert_eq!(kinds[0].group.as_deref(), Some("gateway.networking.k8s.io"));
    assert!(is_true(&listeners[0].conditions, "Programmed"));
    let r = env
        .route("shop", "Accepted and ResolvedRefs", |r: &HttpRoute| {
            our_parent(r).is_some_and(|p| {
                is_true(&p.conditions, "Accepted") && is_true(&p.conditions, "ResolvedRefs")
            })
        })
        .await;
    let parent = our_parent(&r).unwrap();
    assert_eq!(parent.parent_ref.name, "web");
    assert!(
        parent
            .conditions
            .iter()
            .all(|c| c.observed_generation == r.metadata.generation),
        "{parent:?}"
    );

    // Traffic: by path, by header, the rest.
    env.serves("shop.tuna.test", "/api/users", "", 200, "api")
        .await;
    for (path, header, backend) in [
        ("/api/users", "", "api"),
        // The same prefix with a header match ranks first (more header
        // matches), header names case-insensitive; another value does not match.
        ("/api/users", "x-env: canary\r\n", "canary"),
        ("/api/users", "X-ENV: other\r\n", "api"),
        ("/apix", "", "web"),
        ("/", "", "web"),
        ("/about", "", "canary"),
        ("/about/x", "", "web"),
    ] {
        let mut conn = tokio::net::TcpStream::connect(env.http()).await.unwrap();
        let (status, body) = http_request(&mut conn, "shop.tuna.test", path, header).await;
        assert_eq!(status, 200, "{path}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["backend"], backend, "{path} {header:?}");
        assert_eq!(body["headers"]["host"], "shop.tuna.test");
    }
    let events = events_of(&env.cluster, "default", "HTTPRoute", "shop");
    assert!(
        events.contains_key("RoutesUpdated") && events.contains_key("TunnelConnected"),
        "{events:?}"
    );

    // Another controller's entry in status.parents (it names a Gateway of
    // another class) must survive our writes.
    let mut parents = serde_json::to_value(&r.status.as_ref().unwrap().parents).unwrap();
    parents.as_array_mut().unwrap().insert(
        0,
        serde_json::json!({
            "controllerName": "example.com/other-controller",
            "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "theirs"},
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "theirs", "lastTransitionTime": "2025-01-01T00:00:00Z"}],
        }),
    );
    env.cluster.kubectl_ok(&[
        "patch",
        "httproute",
        "shop",
        "--subresource=status",
        "--type=merge",
        "-p",
        &serde_json::json!({"status": {"parents": parents}}).to_string(),
    ]);

    // A new path, on an open keep-alive connection, without reconnecting.
    let mut conn = tokio::net::TcpStream::connect(env.http()).await.unwrap();
    let (_, body) = http_request(&mut conn, "shop.tuna.test", "/v2/x", "").await;
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["backend"],
        "web"
    );
    env.cluster.apply(&route(
        "  - matches: [{path: {type: PathPrefix, value: /v2}}]\n    backendRefs: [{name: v2, port: 8080}]\n",
    ));
    let switched = tokio::time::timeout(support::WAIT, async {
        loop {
            let (_, body) = http_request(&mut conn, "shop.tuna.test", "/v2/x", "").await;
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
    let r = env
        .route(
            "shop",
            "our entry at the new generation",
            |r: &HttpRoute| {
                our_parent(r).is_some_and(|p| {
                    p.conditions
                        .iter()
                        .all(|c| c.observed_generation == r.metadata.generation)
                })
            },
        )
        .await;
    assert!(r.metadata.generation > Some(1));
    let controllers: BTreeSet<&str> = r
        .status
        .as_ref()
        .unwrap()
        .parents
        .iter()
        .map(|p| p.controller_name.as_str())
        .collect();
    assert_eq!(
        controllers,
        BTreeSet::from(["example.com/other-controller", CONTROLLER]),
        "{:?}",
        r.status
    );
    let events = events_of(&env.cluster, "default", "HTTPRoute", "shop");
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

    // The route deleted: its host is unpublished, the Gateway's address goes.
    env.cluster.kubectl_ok(&["delete", "httproute", "shop"]);
    env.gateway("no address, no attached route", |g: &Gateway| {
        g.status.as_ref().is_some_and(|s| {
            s.addresses.as_ref().is_none_or(|a| a.is_empty())
                && s.listeners
                    .as_ref()
                    .is_some_and(|l| l[0].attached_routes == 0)
        })
    })
    .await;
    let gone = tokio::time::timeout(support::WAIT, async {
        loop {
            let (status, _) = http_get(env.http(), "shop.tuna.test", "/").await;
            if status != 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "still served: {}", env.agent.log());
}

/// A backendRef to a Service of another namespace is refused
/// (`ResolvedRefs=False`, `RefNotPermitted`, a `BackendSkipped` event, the
/// request answers 500) until a ReferenceGrant of that namespace allows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_namespace_backend_is_refused_until_a_reference_grant_allows_it() {
    let env = Env::start().await;
    let api = http_backend("api", bind_loopback(8080).await).await;
    env.cluster.kubectl_ok(&["create", "namespace", "backends"]);
    env.cluster.apply(&service("backends", "api", api));
    env.cluster.apply(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: cross}\nspec: {subdomain: cross}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: cross, namespace: default}\nspec:\n  parentRefs: [{name: web}]\n  hostnames: [cross.tuna.test]\n  rules:\n  - backendRefs: [{name: api, namespace: backends, port: 8080}]\n",
    );
    let r = env
        .route("cross", "ResolvedRefs False", |r: &HttpRoute| {
            parent_says_false(r, "ResolvedRefs")
        })
        .await;
    let parent = our_parent(&r).unwrap();
    let resolved = condition(&parent.conditions, "ResolvedRefs").unwrap();
    assert_eq!(resolved.reason, "RefNotPermitted", "{resolved:?}");
    assert!(is_true(&parent.conditions, "Accepted"), "{parent:?}");
    env.serves("cross.tuna.test", "/", "", 500, "").await;
    // `route explain` on the live cluster says the same, in the pinned JSON.
    let explain = || -> Value {
        let out = std::process::Command::new(support::operator_bin())
            .args([
                "route",
                "explain",
                "--output",
                "json",
                "https://cross.tuna.test/x",
            ])
            .env("KUBECONFIG", &env.cluster.kubeconfig)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let refused = explain();
    assert_eq!(refused["matched"], true, "{refused}");
    assert_eq!(refused["status"], 500, "{refused}");
    assert_eq!(refused["route"]["kind"], "HTTPRoute");
    assert_eq!(refused["route"]["name"], "cross");
    assert_eq!(
        refused["invalidBackends"][0]["reason"], "RefNotPermitted",
        "{refused}"
    );
    assert_eq!(refused["backends"], serde_json::json!([]));
    let events = events_of(&env.cluster, "default", "HTTPRoute", "cross");
    assert!(
        events
            .get("BackendSkipped")
            .is_some_and(|m| m.iter().any(|m| m.contains("RefNotPermitted"))),
        "{events:?}"
    );

    env.cluster.apply(
        "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: routes-from-default, namespace: backends}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: default}]\n  to: [{group: '', kind: Service, name: api}]\n",
    );
    env.route("cross", "ResolvedRefs True", |r: &HttpRoute| {
        our_parent(r).is_some_and(|p| is_true(&p.conditions, "ResolvedRefs"))
    })
    .await;
    env.serves("cross.tuna.test", "/", "", 200, "api").await;
    let allowed = explain();
    assert!(allowed.get("status").is_none(), "{allowed}");
    assert_eq!(
        allowed["backends"],
        serde_json::json!([{"namespace": "backends", "service": "api", "port": 8080, "weight": 1}]),
        "{allowed}"
    );
}

/// TCPRoute v1 through a TCPEndpoint: a Gateway's TCP listener named after
/// the TCPEndpoint's alias, a TCPRoute to an echo Service; the Gateway's
/// `status.addresses` shows the public `host:port` (type
/// `k8s.tuna.am/TCPEndpoint`), bytes are echoed through it, the TCPRoute is
/// Accepted with ResolvedRefs; a younger TCPRoute on the same listener is
/// refused naming the winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcproute_is_published_through_its_listeners_tcpendpoint() {
    let env = Env::start().await;
    let pg = echo_backend(bind_loopback(5432).await).await;
    env.cluster.apply(&service("default", "pg", pg));
    env.cluster.apply(&format!(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: TCPEndpoint\nmetadata: {{name: postgres, namespace: default}}\nspec: {{alias: postgres}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: db, namespace: default}}\nspec:\n  gatewayClassName: tuna\n  listeners:\n  - {{name: postgres, protocol: TCP, port: 5432}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\nmetadata: {{name: pg, namespace: default}}\nspec:\n  parentRefs: [{{name: db, sectionName: postgres}}]\n  rules: [{{backendRefs: [{{name: pg, port: {}}}]}}]\n",
        pg.port()
    ));
    let g: Gateway = wait_for(
        &env.client,
        "default",
        "db",
        "a k8s.tuna.am/TCPEndpoint address",
        &env.procs(),
        |g: &Gateway| {
            g.status.as_ref().is_some_and(|s| {
                s.addresses
                    .iter()
                    .flatten()
                    .any(|a| a.r#type.as_deref() == Some("k8s.tuna.am/TCPEndpoint"))
            })
        },
    )
    .await;
    let status = g.status.unwrap();
    let address = status
        .addresses
        .unwrap()
        .into_iter()
        .find(|a| a.r#type.as_deref() == Some("k8s.tuna.am/TCPEndpoint"))
        .unwrap()
        .value;
    let port: u16 = address
        .rsplit_once(':')
        .expect("host:port")
        .1
        .parse()
        .unwrap();
    assert!(
        (env.edge.tcp_ports.0..=env.edge.tcp_ports.1).contains(&port),
        "{address}"
    );
    let listener = &status.listeners.unwrap()[0];
    assert_eq!(listener.attached_routes, 1);
    assert_eq!(
        listener.supported_kinds.as_ref().unwrap()[0].kind,
        "TCPRoute"
    );
    assert!(is_true(&listener.conditions, "Accepted"), "{listener:?}");

    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    conn.write_all(b"hello postgres\n").await.unwrap();
    let mut buf = [0u8; 15];
    tokio::time::timeout(support::WAIT, conn.read_exact(&mut buf))
        .await
        .expect("echo in time")
        .unwrap();
    assert_eq!(&buf, b"hello postgres\n");

    let ours = |r: &TcpRoute| {
        r.status.as_ref().and_then(|s| {
            s.parents
                .iter()
                .find(|p| p.controller_name == CONTROLLER)
                .map(|p| p.conditions.clone())
        })
    };
    let r: TcpRoute = wait_for(
        &env.client,
        "default",
        "pg",
        "Accepted and ResolvedRefs",
        &env.procs(),
        |r: &TcpRoute| {
            ours(r).is_some_and(|c| is_true(&c, "Accepted") && is_true(&c, "ResolvedRefs"))
        },
    )
    .await;
    assert!(
        ours(&r)
            .unwrap()
            .iter()
            .all(|c| c.observed_generation == r.metadata.generation)
    );

    // A younger TCPRoute on the same listener: refused, naming the winner.
    env.cluster.apply(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\nmetadata: {{name: pg2, namespace: default}}\nspec:\n  parentRefs: [{{name: db, sectionName: postgres}}]\n  rules: [{{backendRefs: [{{name: pg, port: {}}}]}}]\n",
        pg.port()
    ));
    let r2: TcpRoute = wait_for(
        &env.client,
        "default",
        "pg2",
        "Accepted=False",
        &env.procs(),
        |r: &TcpRoute| {
            ours(r).is_some_and(|c| condition(&c, "Accepted").is_some_and(|a| a.status == "False"))
        },
    )
    .await;
    let refused = ours(&r2).unwrap();
    let accepted = condition(&refused, "Accepted").unwrap();
    assert_eq!(accepted.reason, "TcpEndpointInUse");
    assert!(
        accepted.message.contains("TCPRoute default/pg"),
        "{accepted:?}"
    );
    // Events as for Ingresses: the winner's tunnel, the loser's refusal.
    wait_for_event(
        &env.cluster,
        "default",
        "TCPRoute",
        "pg",
        "TunnelConnected",
        "served at",
    )
    .await;
    wait_for_event(
        &env.cluster,
        "default",
        "TCPRoute",
        "pg2",
        "RuleSkipped",
        "TcpEndpointInUse",
    )
    .await;
}

/// Issue 41 on the real control plane, an edge with a Gateway address pool
/// (`--gateway-addresses`, two loopback addresses): each Gateway gets an
/// address of its own (`spec.addresses` honoured), shown first in its
/// status as `IPAddress`; two Gateways serve the same TCP listener name and
/// port, each on its own address, without a TCPEndpoint; a Gateway deleted
/// gives its address back and stops listening; a Gateway the exhausted pool
/// cannot serve is `Programmed=False, AddressNotAssigned` until one is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_gateway_serves_its_tcp_listeners_on_its_own_address() {
    // Three addresses for three Gateways: the Env's `web` (HTTP) and two here.
    let env = Env::start_with(EdgeOptions {
        extra: vec![
            "--gateway-addresses".into(),
            "127.0.100.40/31,127.0.100.42".into(),
        ],
        ..EdgeOptions::default()
    })
    .await;
    let asked: std::net::IpAddr = "127.0.100.41".parse().unwrap();
    let pool: BTreeSet<std::net::IpAddr> = ["127.0.100.40", "127.0.100.41", "127.0.100.42"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    // A port free on both addresses a moment ago (nothing else listens there).
    let port = std::net::TcpListener::bind((asked, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let pg = echo_backend(bind_loopback(5432).await).await;
    env.cluster.apply(&service("default", "pg", pg));
    let gateway = |name: &str, addresses: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  gatewayClassName: tuna\n{addresses}  listeners:\n  - {{name: db, protocol: TCP, port: {port}}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  parentRefs: [{{name: {name}, sectionName: db}}]\n  rules: [{{backendRefs: [{{name: pg, port: {}}}]}}]\n",
            pg.port()
        )
    };
    env.cluster.apply(&gateway(
        "first",
        "  addresses: [{type: IPAddress, value: 127.0.100.41}]\n",
    ));
    env.cluster.apply(&gateway("second", ""));
    let own = |g: &Gateway| {
        g.status
            .as_ref()
            .and_then(|s| s.addresses.as_ref()?.first().cloned())
            .filter(|a| a.r#type.as_deref() == Some("IPAddress"))
            .map(|a| a.value)
    };
    let mut other = asked;
    for name in ["first", "second"] {
        let g: Gateway = wait_for(
            &env.client,
            "default",
            name,
            "its own address first in status.addresses and its TCPRoute attached",
            &env.procs(),
            |g: &Gateway| {
                own(g).is_some()
                    && g.status
                        .as_ref()
                        .and_then(|s| s.listeners.as_ref()?.first().map(|l| l.attached_routes))
                        == Some(1)
            },
        )
        .await;
        let address: std::net::IpAddr = own(&g).unwrap().parse().unwrap();
        if name == "first" {
            assert_eq!(address, asked, "spec.addresses is honoured");
        } else {
            assert!(address != asked && pool.contains(&address), "{address}");
            other = address;
        }
        let listener = &g.status.as_ref().unwrap().listeners.as_ref().unwrap()[0];
        assert!(is_true(&listener.conditions, "Accepted"), "{listener:?}");
        assert_eq!(listener.attached_routes, 1, "{listener:?}");
        // The listener's own port on the Gateway's own address.
        let deadline = tokio::time::Instant::now() + support::WAIT;
        let mut conn = loop {
            match tokio::net::TcpStream::connect((address, port)).await {
                Ok(c) => break c,
                Err(e) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "{address}:{port} never listened: {e}\n{}",
                        env.edge.log()
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        conn.write_all(b"hello postgres\n").await.unwrap();
        let mut buf = [0u8; 15];
        tokio::time::timeout(support::WAIT, conn.read_exact(&mut buf))
            .await
            .expect("echo in time")
            .unwrap();
        assert_eq!(&buf, b"hello postgres\n", "{name}");
    }
    // No TCP endpoint was reserved for either.
    let api = env.edge.client();
    assert!(api.list_tcp_endpoints().await.unwrap().is_empty());
    let held: BTreeSet<std::net::IpAddr> = api
        .list_gateway_addresses()
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.address)
        .collect();
    // Every Gateway holds one: the pool's three.
    assert_eq!(held, pool);
    let web = *pool.iter().find(|a| **a != asked && **a != other).unwrap();

    // The first Gateway goes while the agent is down: the next agent adopts
    // the second's address (the pool has no other) and gives the first's
    // back; the first's port closes.
    let mut env = env;
    env.agent.terminate().await;
    env.cluster.kubectl_ok(&[
        "delete",
        "gateway",
        "first",
        "-n",
        "default",
        "--wait=false",
    ]);
    env.agent = agent(&env.cluster, &env.edge, "agent-new", &[]);
    let deadline = tokio::time::Instant::now() + support::WAIT;
    loop {
        let held: Vec<_> = api
            .list_gateway_addresses()
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.address)
            .collect();
        let mut held = held;
        held.sort();
        let mut want = vec![other, web];
        want.sort();
        if held == want && tokio::net::TcpStream::connect((asked, port)).await.is_err() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first Gateway's address is still held or served: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The second serves on, through the new agent, once it has taken the
    // tunnel up again (the edge may accept on the port a moment before the
    // agent has the port's upstream installed: such a connection closes).
    let deadline = tokio::time::Instant::now() + support::WAIT;
    loop {
        let echoed = async {
            let mut conn = tokio::net::TcpStream::connect((other, port)).await.ok()?;
            conn.write_all(b"hello again\n").await.ok()?;
            let mut buf = [0u8; 12];
            tokio::time::timeout(support::WAIT, conn.read_exact(&mut buf))
                .await
                .ok()?
                .ok()?;
            Some(buf)
        }
        .await;
        if let Some(buf) = echoed {
            assert_eq!(&buf, b"hello again\n");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second Gateway never served again through the new agent\n{}",
            env.agent.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One request on a fresh connection to a Gateway's own address: its
/// status and the backend that answered (`None` when the connection failed
/// or closed early, as it may while the listener is being set up).
async fn on_address(at: (std::net::IpAddr, u16), host: &str, path: &str) -> Option<(u16, String)> {
    let mut conn = tokio::net::TcpStream::connect(at).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).await.ok()?;
    let mut out = Vec::new();
    tokio::time::timeout(support::WAIT, conn.read_to_end(&mut out))
        .await
        .ok()?
        .ok()?;
    status_and_backend(&out)
}

/// An HTTP answer's status and the backend its JSON body names (empty when
/// it names none).
fn status_and_backend(answer: &[u8]) -> Option<(u16, String)> {
    let text = String::from_utf8_lossy(answer);
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let backend = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["backend"].as_str().map(str::to_owned))
        .unwrap_or_default();
    Some((status, backend))
}

/// Issue 41: a Gateway's HTTP listeners on its own address, on their own
/// port, routing any `Host` by the specification's rules, with no host
/// reserved: the most specific listener hostname serves a host (a wildcard
/// spans labels, and a host it claims never falls back to the catch-all
/// listener), a host the shared ports serve by reservation is just a host
/// there, and a route's change is live on the address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_gateway_serves_its_http_listeners_on_its_own_address() {
    let env = Env::start_with(EdgeOptions {
        extra: vec!["--gateway-addresses".into(), "127.0.100.48/30".into()],
        ..EdgeOptions::default()
    })
    .await;
    let web = http_backend("web", bind_loopback(8080).await).await;
    let api = http_backend("api", bind_loopback(8080).await).await;
    for (name, addr) in [("web", web), ("api", api)] {
        env.cluster.apply(&service("default", name, addr));
    }
    let address: std::net::IpAddr = "127.0.100.50".parse().unwrap();
    let port = std::net::TcpListener::bind((address, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    env.cluster.apply(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: alpha, namespace: default}}\nspec:\n  gatewayClassName: tuna\n  addresses: [{{value: {address}}}]\n  listeners:\n  - {{name: any, protocol: HTTP, port: {port}}}\n  - {{name: bar, protocol: HTTP, port: {port}, hostname: '*.bar.example'}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: alpha-any, namespace: default}}\nspec:\n  parentRefs: [{{name: alpha, sectionName: any}}]\n  rules: [{{backendRefs: [{{name: web, port: 8080}}]}}]\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: alpha-bar, namespace: default}}\nspec:\n  parentRefs: [{{name: alpha, sectionName: bar}}]\n  rules: [{{matches: [{{path: {{type: PathPrefix, value: /api}}}}], backendRefs: [{{name: api, port: 8080}}]}}]\n---\napiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {{name: shop}}\nspec: {{subdomain: shop}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: shop, namespace: default}}\nspec:\n  parentRefs: [{{name: web}}]\n  hostnames: [shop.tuna.test]\n  rules: [{{backendRefs: [{{name: api, port: 8080}}]}}]\n"
    ));
    let g: Gateway = wait_for(
        &env.client,
        "default",
        "alpha",
        "its own address first and a route on each listener",
        &env.procs(),
        |g: &Gateway| {
            g.status.as_ref().is_some_and(|s| {
                s.addresses
                    .as_ref()
                    .and_then(|a| a.first())
                    .is_some_and(|a| a.r#type.as_deref() == Some("IPAddress"))
                    && s.listeners
                        .as_ref()
                        .is_some_and(|l| l.len() == 2 && l.iter().all(|l| l.attached_routes == 1))
            })
        },
    )
    .await;
    let status = g.status.unwrap();
    assert_eq!(status.addresses.unwrap()[0].value, address.to_string());

    // Each case until it holds: the port is set up a moment after the status.
    let expect = |host: &'static str, path: &'static str, want: (u16, &'static str)| {
        let log = env.agent.log();
        async move {
            let mut last = None;
            let done = tokio::time::timeout(support::WAIT, async {
                loop {
                    last = on_address((address, port), host, path).await;
                    if last
                        .as_ref()
                        .is_some_and(|(s, b)| *s == want.0 && (want.1.is_empty() || b == want.1))
                    {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await;
            assert!(
                done.is_ok(),
                "{host}{path} on {address}:{port} never answered {want:?}; last {last:?}\n{log}"
            );
        }
    };
    // The catch-all listener: any host, no reservation.
    expect("anything.example", "/", (200, "web")).await;
    expect("198.51.100.7", "/x", (200, "web")).await;
    // The wildcard listener over two labels.
    expect("a.b.bar.example", "/api/users", (200, "api")).await;
    // It claims the host: no fallback to the catch-all listener's route.
    expect("a.b.bar.example", "/", (404, "")).await;
    // A host the shared ports serve by reservation is just a host here...
    expect("shop.tuna.test", "/", (200, "web")).await;
    // ...and the shared ports still serve it by its reservation.
    env.serves("shop.tuna.test", "/", "", 200, "api").await;
    // Nothing of the address leaks to the shared ports.
    env.serves("anything.example", "/", "", 404, "").await;

    // A route's change is live on the address: alpha-bar now sends / too.
    env.cluster.apply(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: alpha-bar, namespace: default}\nspec:\n  parentRefs: [{name: alpha, sectionName: bar}]\n  rules: [{backendRefs: [{name: api, port: 8080}]}]\n",
    );
    expect("a.b.bar.example", "/", (200, "api")).await;
    // With a pool, each listener has its own port: the class says so.
    let classes: Api<GatewayClass> = Api::all(env.client.clone());
    let features: Vec<String> = classes
        .get("tuna")
        .await
        .unwrap()
        .status
        .and_then(|s| s.supported_features)
        .unwrap_or_default()
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert!(
        features.contains(&"HTTPRouteParentRefPort".to_owned()),
        "{features:?}"
    );
    assert!(features.windows(2).all(|w| w[0] < w[1]), "{features:?}");
    // The Env's `web` Gateway holds an address of the pool too.
    let held: BTreeSet<std::net::IpAddr> = env
        .edge
        .client()
        .list_gateway_addresses()
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.address)
        .collect();
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(held.contains(&address));
}

/// Creates a `kubernetes.io/tls` Secret (`kubectl create secret tls`)
/// holding a new self-signed certificate for `names` and its key; returns
/// the certificate, as a client trusts it.
fn tls_secret(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    names: &[&str],
) -> rustls::pki_types::CertificateDer<'static> {
    let cert = rcgen::generate_simple_self_signed(
        names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&crt, cert.cert.pem()).unwrap();
    std::fs::write(&key, cert.signing_key.serialize_pem()).unwrap();
    cluster.kubectl_ok(&[
        "create",
        "secret",
        "tls",
        name,
        "-n",
        namespace,
        "--cert",
        crt.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ]);
    cert.cert.der().clone()
}

/// One HTTPS request on a fresh connection to a Gateway's own address, as
/// a client that trusts `root` alone and names `sni`: its status, backend
/// and the leaf certificate presented (`None` when the handshake or the
/// exchange failed, as it may while the listener is being set up).
async fn over_tls(
    at: (std::net::IpAddr, u16),
    sni: &str,
    root: &rustls::pki_types::CertificateDer<'static>,
    path: &str,
) -> Option<(u16, String)> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.clone()).ok()?;
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .ok()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(at).await.ok()?;
    let name = rustls::pki_types::ServerName::try_from(sni.to_owned()).ok()?;
    let mut tls = tokio::time::timeout(
        support::WAIT,
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp),
    )
    .await
    .ok()?
    .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.ok()?;
    let mut out = Vec::new();
    // A peer that closes without close_notify still gave its answer.
    let _ = tokio::time::timeout(support::WAIT, tls.read_to_end(&mut out))
        .await
        .ok()?;
    status_and_backend(&out)
}

/// Issue 41: a Gateway's HTTPS listeners on its own address. The edge
/// carries the client's TLS unterminated; the agent terminates it with the
/// certificate of the listener the SNI selects, from the listener's
/// `certificateRefs` Secret (of another namespace only with a
/// ReferenceGrant), and routes the requests by that port's listeners. A
/// client that trusts only the Secret's certificate is served, so the
/// certificate is the listener's, not the edge's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_serves_its_https_listeners_with_their_own_certificates() {
    let env = Env::start_with(EdgeOptions {
        extra: vec!["--gateway-addresses".into(), "127.0.100.52/30".into()],
        ..EdgeOptions::default()
    })
    .await;
    let web = http_backend("web", bind_loopback(8080).await).await;
    let api = http_backend("api", bind_loopback(8080).await).await;
    for (name, addr) in [("web", web), ("api", api)] {
        env.cluster.apply(&service("default", name, addr));
    }
    env.cluster
        .apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: certs}\n");
    let secure = tls_secret(&env.cluster, "default", "secure-cert", &["secure.example"]);
    let any = tls_secret(&env.cluster, "certs", "any-cert", &["fallback.example"]);
    let address: std::net::IpAddr = "127.0.100.54".parse().unwrap();
    let port = std::net::TcpListener::bind((address, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // An HTTPS-only Gateway: the catch-all listener's Secret is in another
    // namespace, with no ReferenceGrant yet.
    env.cluster.apply(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: tls, namespace: default}}\nspec:\n  gatewayClassName: tuna\n  addresses: [{{value: {address}}}]\n  listeners:\n  - {{name: secure, protocol: HTTPS, port: {port}, hostname: secure.example, tls: {{certificateRefs: [{{name: secure-cert}}]}}}}\n  - {{name: any, protocol: HTTPS, port: {port}, tls: {{certificateRefs: [{{name: any-cert, namespace: certs}}]}}}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: secure, namespace: default}}\nspec:\n  parentRefs: [{{name: tls, sectionName: secure}}]\n  rules: [{{backendRefs: [{{name: web, port: 8080}}]}}]\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: any, namespace: default}}\nspec:\n  parentRefs: [{{name: tls, sectionName: any}}]\n  rules: [{{backendRefs: [{{name: api, port: 8080}}]}}]\n"
    ));
    let g: Gateway = wait_for(
        &env.client,
        "default",
        "tls",
        "its own address, and the foreign Secret refused",
        &env.procs(),
        |g: &Gateway| {
            g.status.as_ref().is_some_and(|s| {
                s.addresses
                    .as_ref()
                    .and_then(|a| a.first())
                    .is_some_and(|a| a.value == address.to_string())
                    && s.listeners.as_ref().is_some_and(|l| {
                        l.iter().any(|l| {
                            l.name == "any"
                                && condition(&l.conditions, "ResolvedRefs")
                                    .is_some_and(|c| c.reason == "RefNotPermitted")
                        })
                    })
            })
        },
    )
    .await;
    let secure_listener = g
        .status
        .unwrap()
        .listeners
        .unwrap()
        .into_iter()
        .find(|l| l.name == "secure")
        .unwrap();
    assert!(
        is_true(&secure_listener.conditions, "ResolvedRefs"),
        "{secure_listener:?}"
    );

    // Each case until it holds: the port is set up a moment after the status.
    let expect = |sni: &'static str, root, want: Option<(u16, &'static str)>| {
        let log = env.agent.log();
        async move {
            let mut last = None;
            let done = tokio::time::timeout(support::WAIT, async {
                loop {
                    last = over_tls((address, port), sni, root, "/").await;
                    let holds = match (&last, want) {
                        (Some((s, b)), Some((ws, wb))) => *s == ws && b == wb,
                        (None, None) => true,
                        _ => false,
                    };
                    if holds {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await;
            assert!(
                done.is_ok(),
                "{sni} on {address}:{port} never gave {want:?}; last {last:?}\n{log}"
            );
        }
    };
    // The exact listener, with its own certificate.
    expect("secure.example", &secure, Some((200, "web"))).await;
    // The catch-all listener's Secret is not granted: no handshake for a
    // name only it would serve.
    expect("fallback.example", &any, None).await;
    // The grant opens it, at the next sync (the Gateway's change brings it).
    env.cluster.apply(
        "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: gateways, namespace: certs}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: default}]\n  to: [{group: '', kind: Secret}]\n",
    );
    expect("fallback.example", &any, Some((200, "api"))).await;
    // The exact listener still presents its own certificate: a client that
    // trusts only the catch-all's refuses it.
    expect("secure.example", &any, None).await;
    expect("secure.example", &secure, Some((200, "web"))).await;
    // Plain HTTP on the HTTPS port gets no HTTP answer.
    assert!(
        on_address((address, port), "secure.example", "/")
            .await
            .is_none(),
        "plain HTTP was answered on an HTTPS port"
    );
}

/// Issue 41: on an edge with a pool, a GatewayClass annotated
/// `k8s.tuna.am/addresses: shared` keeps its Gateways on the shared ports:
/// no address of their own, their routes served by reserved host, and the
/// class claims only what the shared ports can serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_that_asks_for_the_shared_ports_keeps_its_gateways_there() {
    let env = Env::start_with(EdgeOptions {
        extra: vec!["--gateway-addresses".into(), "127.0.100.56/30".into()],
        ..EdgeOptions::default()
    })
    .await;
    let web = http_backend("web", bind_loopback(8080).await).await;
    env.cluster.apply(&service("default", "web", web));
    env.cluster.apply(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata:\n  name: tuna-shared\n  annotations: {k8s.tuna.am/addresses: shared}\nspec: {controllerName: k8s.tuna.am/gateway-controller}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: plain, namespace: default}\nspec:\n  gatewayClassName: tuna-shared\n  listeners:\n  - {name: http, protocol: HTTP, port: 80}\n---\napiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: shared}\nspec: {subdomain: shared}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: shared, namespace: default}\nspec:\n  parentRefs: [{name: plain}]\n  hostnames: [shared.tuna.test]\n  rules: [{backendRefs: [{name: web, port: 8080}]}]\n",
    );
    env.serves("shared.tuna.test", "/", "", 200, "web").await;
    let g: Gateway = wait_for(
        &env.client,
        "default",
        "plain",
        "Programmed, with the edge's host as its address",
        &env.procs(),
        |g: &Gateway| {
            g.status.as_ref().is_some_and(|s| {
                is_true(s.conditions.as_deref().unwrap_or_default(), "Programmed")
                    && s.addresses.as_ref().is_some_and(|a| !a.is_empty())
            })
        },
    )
    .await;
    let addresses = g.status.unwrap().addresses.unwrap();
    assert!(
        addresses
            .iter()
            .all(|a| a.r#type.as_deref() != Some("IPAddress")),
        "{addresses:?}"
    );
    // Only the Env's `web` Gateway (class `tuna`) holds an address.
    let held = env.edge.client().list_gateway_addresses().await.unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    // Each class claims what its model serves.
    let classes: Api<GatewayClass> = Api::all(env.client.clone());
    let features = |c: GatewayClass| -> Vec<String> {
        c.status
            .and_then(|s| s.supported_features)
            .unwrap_or_default()
            .into_iter()
            .map(|f| f.name)
            .collect()
    };
    let deadline = tokio::time::Instant::now() + support::WAIT;
    loop {
        let shared = features(classes.get("tuna-shared").await.unwrap());
        let own = features(classes.get("tuna").await.unwrap());
        if !shared.is_empty() && own.contains(&"GatewayPort8080".to_owned()) {
            assert!(
                !shared.contains(&"GatewayPort8080".to_owned()),
                "{shared:?}"
            );
            assert!(shared.contains(&"HTTPRoute".to_owned()), "{shared:?}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the classes never listed their features: {shared:?} {own:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// With every address of the pool held, a third Gateway with a TCP listener
/// says why it has none; it gets the one the first gives back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_the_pool_cannot_serve_says_so_until_an_address_is_free() {
    // Two addresses: the Env's `web` (HTTP) holds one, then one is left.
    let env = Env::start_with(EdgeOptions {
        extra: vec!["--gateway-addresses".into(), "127.0.100.44/31".into()],
        ..EdgeOptions::default()
    })
    .await;
    let gateway = |name: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  gatewayClassName: tuna\n  listeners:\n  - {{name: db, protocol: TCP, port: 5432}}\n"
        )
    };
    let own = |g: &Gateway| {
        g.status
            .as_ref()
            .and_then(|s| s.addresses.as_ref()?.first().cloned())
            .filter(|a| a.r#type.as_deref() == Some("IPAddress"))
            .map(|a| a.value)
    };
    let web = own(&env
        .gateway("an address", |g: &Gateway| own(g).is_some())
        .await)
    .unwrap();
    let left = if web == "127.0.100.44" {
        "127.0.100.45"
    } else {
        "127.0.100.44"
    };
    env.cluster.apply(&gateway("holder"));
    let held: Gateway = wait_for(
        &env.client,
        "default",
        "holder",
        "an address",
        &env.procs(),
        |g: &Gateway| own(g).is_some(),
    )
    .await;
    assert_eq!(own(&held).as_deref(), Some(left));
    env.cluster.apply(&gateway("waiting"));
    let waiting: Gateway = wait_for(
        &env.client,
        "default",
        "waiting",
        "Programmed=False, AddressNotAssigned",
        &env.procs(),
        |g: &Gateway| {
            g.status.as_ref().is_some_and(|s| {
                condition(s.conditions.as_deref().unwrap_or_default(), "Programmed")
                    .is_some_and(|c| c.status == "False" && c.reason == "AddressNotAssigned")
            })
        },
    )
    .await;
    let programmed = condition(
        waiting
            .status
            .as_ref()
            .unwrap()
            .conditions
            .as_deref()
            .unwrap(),
        "Programmed",
    )
    .unwrap();
    assert!(
        programmed.message.contains("addresses_exhausted"),
        "{programmed:?}"
    );
    assert_eq!(own(&waiting), None);
    env.cluster.kubectl_ok(&[
        "delete",
        "gateway",
        "holder",
        "-n",
        "default",
        "--wait=false",
    ]);
    let served: Gateway = wait_for(
        &env.client,
        "default",
        "waiting",
        "the freed address",
        &env.procs(),
        |g: &Gateway| own(g).is_some(),
    )
    .await;
    assert_eq!(own(&served).as_deref(), Some(left));
    assert!(is_true(
        served
            .status
            .as_ref()
            .unwrap()
            .conditions
            .as_deref()
            .unwrap(),
        "Programmed"
    ));
}

/// Issue 37, items 1, 2 and 5, on the real control plane: `shop.tuna.test`,
/// an account host, is served by team-b's HTTPRoute and recorded in the
/// agent's claim book. Then team-a tries every way the security review
/// found: (a) a younger HTTPRoute carrying a forged
/// `k8s.tuna.am/hosts-claimed-at`, (b) an older HTTPRoute edited to add the
/// hostname, (c) an HTTPRoute without hostnames, (2) a new Ingress and an
/// http Tunnel naming the host, (5) the forged annotation written through
/// `ingresses/status`. The host keeps team-b's backend throughout, each
/// explicit claimant is refused `HostOwnedByOtherNamespace`, and so it stays
/// after an agent restart (the book lives in a ConfigMap). Deleting team-b's
/// route frees the host for team-a.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_other_namespace_takes_a_held_host_by_any_kind_even_after_a_restart() {
    let mut env = Env::start().await;
    const H: &str = "shop.tuna.test";
    for ns in ["team-a", "team-b"] {
        env.cluster.kubectl_ok(&["create", "namespace", ns]);
        env.cluster.apply(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: {ns}}}\nspec:\n  gatewayClassName: tuna\n  listeners:\n  - {{name: http, protocol: HTTP, port: 80}}\n"
        ));
    }
    let web = http_backend("web", bind_loopback(8080).await).await;
    let thief = http_backend("thief", bind_loopback(8080).await).await;
    env.cluster.apply(&service("team-b", "web", web));
    env.cluster.apply(&service("team-a", "thief", thief));
    env.edge
        .client()
        .create_domain(&tuna_protocol::api::CreateDomain {
            subdomain: Some("shop".into()),
            domain: None,
        })
        .await
        .unwrap();
    let route = |ns: &str,
                 name: &str,
                 extra_meta: &str,
                 hostnames: &str,
                 backend: &str,
                 port: u16| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: {ns}{extra_meta}}}\nspec:\n  parentRefs: [{{name: gw}}]\n  {hostnames}\n  rules: [{{backendRefs: [{{name: {backend}, port: {port}}}]}}]\n"
        )
    };
    // team-a's route first: the older object, on another host for now.
    env.cluster.apply(&route(
        "team-a",
        "old",
        "",
        "hostnames: [elsewhere.tuna.test]",
        "thief",
        thief.port(),
    ));
    wait_for(
        &env.client,
        "team-a",
        "old",
        "a status",
        &env.procs(),
        |r: &HttpRoute| our_parent(r).is_some(),
    )
    .await;
    // team-b's route comes after: its creationTimestamp is the same second
    // or later, so by age (then namespace) team-a's route would win.
    env.cluster.apply(&route(
        "team-b",
        "shop",
        "",
        &format!("hostnames: [{H}]"),
        "web",
        web.port(),
    ));
    env.serves(H, "/", "", 200, "web").await;
    // The holder is recorded where no tenant writes: the agent's ConfigMap.
    let book = wait_for(
        &env.client,
        "default",
        "tuna-operator-claims",
        "the claim book recording team-b",
        &env.procs(),
        |cm: &k8s_openapi::api::core::v1::ConfigMap| {
            cm.data
                .as_ref()
                .and_then(|d| d.get("hosts.json"))
                .is_some_and(|h| h.contains(&format!("\"{H}\":{{\"namespace\":\"team-b\"")))
        },
    )
    .await;
    assert_eq!(book.metadata.labels.unwrap()["k8s.tuna.am/claims"], "true");
    let http = env.http();
    let still_web = || async move {
        for _ in 0..5 {
            let mut conn = tokio::net::TcpStream::connect(http).await.unwrap();
            let (status, body) = http_request(&mut conn, H, "/", "").await;
            assert_eq!(status, 200, "{body}");
            assert!(body.contains("\"web\""), "{body}");
        }
    };
    let refused = |kind: &'static str, name: &'static str| {
        let cluster = &env.cluster;
        async move {
            wait_for_event(
                cluster,
                "team-a",
                kind,
                name,
                "RuleSkipped",
                "HostOwnedByOtherNamespace",
            )
            .await
        }
    };

    // (a) A younger route with a forged record.
    env.cluster.apply(&route(
        "team-a",
        "forged",
        &format!(
            ", annotations: {{k8s.tuna.am/hosts-claimed-at: '{{\"{H}\":\"2000-01-01T00:00:00Z\"}}'}}"
        ),
        &format!("hostnames: [{H}]"),
        "thief",
        thief.port(),
    ));
    refused("HTTPRoute", "forged").await;
    still_web().await;
    // (b) The older route edited to add the hostname.
    env.cluster.apply(&route(
        "team-a",
        "old",
        "",
        &format!("hostnames: [elsewhere.tuna.test, {H}]"),
        "thief",
        thief.port(),
    ));
    refused("HTTPRoute", "old").await;
    still_web().await;
    // (c) A route without hostnames (it covers every account host).
    env.cluster
        .apply(&route("team-a", "all", "", "", "thief", thief.port()));
    wait_for(
        &env.client,
        "team-a",
        "all",
        "Accepted",
        &env.procs(),
        |r: &HttpRoute| our_parent(r).is_some_and(|p| is_true(&p.conditions, "Accepted")),
    )
    .await;
    still_web().await;
    // (2) A new Ingress, and an http Tunnel, of team-a naming the host.
    env.cluster.apply(&format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: steal, namespace: team-a}}\nspec:\n  ingressClassName: tuna\n  rules:\n  - host: {H}\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: thief, port: {{number: {}}}}}}}}}]}}\n",
        thief.port()
    ));
    refused("Ingress", "steal").await;
    env.cluster.apply(&format!(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {{name: steal, namespace: team-a}}\nspec: {{subdomain: shop, upstream: {{url: 'http://thief:{}'}}}}\n",
        thief.port()
    ));
    let tunnel_refused = |t: &tuna_crds::Tunnel| {
        t.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "HostOwnedByOtherNamespace")
        })
    };
    wait_for(
        &env.client,
        "team-a",
        "steal",
        "Ready=False HostOwnedByOtherNamespace",
        &env.procs(),
        tunnel_refused,
    )
    .await;
    still_web().await;
    // (5) The forged record through the status subresource: Kubernetes keeps
    // metadata sent there for Ingresses, and the agent does not read it.
    env.cluster.kubectl_ok(&[
        "-n",
        "team-a",
        "patch",
        "ingress",
        "steal",
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!(
            "{{\"metadata\":{{\"annotations\":{{\"k8s.tuna.am/hosts-claimed-at\":\"{{\\\"{H}\\\":\\\"2000-01-01T00:00:00Z\\\"}}\"}}}}}}"
        ),
    ]);
    let kept = env.cluster.kubectl_ok(&[
        "-n",
        "team-a",
        "get",
        "ingress",
        "steal",
        "-o",
        "jsonpath={.metadata.annotations}",
    ]);
    assert!(kept.contains("2000-01-01"), "{kept}");

    // A restarted agent reads every object afresh, the forged records
    // included, and decides the same: the book, not the objects.
    env.agent.terminate().await;
    env.agent = agent(&env.cluster, &env.edge, "agent-new", &[]);
    env.serves(H, "/", "", 200, "web").await;
    wait_for(
        &env.client,
        "team-a",
        "steal",
        "Ready=False HostOwnedByOtherNamespace",
        &env.procs(),
        tunnel_refused,
    )
    .await;
    wait_for(
        &env.client,
        "team-a",
        "forged",
        "Accepted",
        &env.procs(),
        |r: &HttpRoute| our_parent(r).is_some(),
    )
    .await;
    still_web().await;
    // `route explain`, reading the cluster (the claim book included), decides
    // as the agent did: team-b's route serves, team-a's claims are refused.
    let out = std::process::Command::new(support::operator_bin())
        .args([
            "route",
            "explain",
            "--base-domain",
            "tuna.test",
            "--account-domain",
            H,
            "--output",
            "json",
            &format!("https://{H}/"),
        ])
        .env("KUBECONFIG", &env.cluster.kubeconfig)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let explained: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(explained["matched"], true, "{explained}");
    assert_eq!(explained["route"]["kind"], "HTTPRoute", "{explained}");
    assert_eq!(explained["route"]["namespace"], "team-b", "{explained}");
    assert_eq!(explained["route"]["name"], "shop", "{explained}");
    for name in ["forged", "old"] {
        assert!(
            explained["refusedRoutes"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| {
                    r["namespace"] == "team-a"
                        && r["name"] == name
                        && r["reason"] == "HostOwnedByOtherNamespace"
                })),
            "{name}: {explained}"
        );
    }

    // team-b lets go: its route deleted, the host is free, and team-a's
    // Tunnel (a Tunnel ranks first within its namespace) takes it.
    env.cluster
        .kubectl_ok(&["-n", "team-b", "delete", "httproute", "shop"]);
    env.serves(H, "/", "", 200, "thief").await;
}

/// Issue 37, item 3, on the real control plane: team-b's TCPEndpoint `pg`
/// is reserved a port P and served by team-b's tcp Tunnel. team-a names P
/// (1) as a number in a tcp Tunnel's `portOrAlias`, (2) as the same digits
/// in a string, (3) as the name of a Gateway TCP listener with a TCPRoute.
/// Each is refused (`TcpEndpointOwnedByOtherNamespace`, the listener
/// `PortUnavailable`), and after each, 20 connections to P all reach
/// team-b's echo backend (team-a's backend answers HTTP, never an echo).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_other_namespace_takes_a_tcp_endpoint_by_its_port() {
    let env = Env::start().await;
    for ns in ["team-a", "team-b"] {
        env.cluster.kubectl_ok(&["create", "namespace", ns]);
    }
    let echo = echo_backend(bind_loopback(5432).await).await;
    let thief = http_backend("thief", bind_loopback(5432).await).await;
    env.cluster.apply(&service("team-b", "db", echo));
    env.cluster.apply(&service("team-a", "grab", thief));
    env.cluster.apply(&format!(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: TCPEndpoint\nmetadata: {{name: pg, namespace: team-b}}\nspec: {{alias: pg}}\n---\napiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {{name: db, namespace: team-b}}\nspec: {{protocol: tcp, portOrAlias: pg, upstream: {{url: 'tcp://db:{}'}}}}\n",
        echo.port()
    ));
    let ready = |t: &tuna_crds::Tunnel| {
        t.status.as_ref().is_some_and(|s| {
            s.url.is_some()
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    };
    let t: tuna_crds::Tunnel =
        wait_for(&env.client, "team-b", "db", "Ready", &env.procs(), ready).await;
    let port: u16 = t
        .status
        .unwrap()
        .url
        .unwrap()
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();
    let all_reach_team_b = || async move {
        for i in 0..20 {
            let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            let line = format!("ping {i:02}\n");
            conn.write_all(line.as_bytes()).await.unwrap();
            let mut buf = vec![0u8; line.len()];
            tokio::time::timeout(support::WAIT, conn.read_exact(&mut buf))
                .await
                .expect("an answer in time")
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&buf), line, "connection {i}");
        }
    };
    all_reach_team_b().await;
    let refused = |t: &tuna_crds::Tunnel| {
        t.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "TcpEndpointOwnedByOtherNamespace")
        })
    };
    // (1) and (2): the port as a number, and as the same digits in a string.
    for (name, written) in [
        ("grab-int", port.to_string()),
        ("grab-str", format!("'{port}'")),
    ] {
        env.cluster.apply(&format!(
            "apiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {{name: {name}, namespace: team-a}}\nspec: {{protocol: tcp, portOrAlias: {written}, upstream: {{url: 'tcp://grab:{}'}}}}\n",
            thief.port()
        ));
        wait_for(
            &env.client,
            "team-a",
            name,
            "Ready=False TcpEndpointOwnedByOtherNamespace",
            &env.procs(),
            refused,
        )
        .await;
        all_reach_team_b().await;
    }
    // (3) A Gateway TCP listener named with the port's digits.
    env.cluster.apply(&format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: grab, namespace: team-a}}\nspec:\n  gatewayClassName: tuna\n  listeners:\n  - {{name: '{port}', protocol: TCP, port: 5432}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\nmetadata: {{name: grab, namespace: team-a}}\nspec:\n  parentRefs: [{{name: grab}}]\n  rules: [{{backendRefs: [{{name: grab, port: {}}}]}}]\n",
        thief.port()
    ));
    let g: Gateway = wait_for(
        &env.client,
        "team-a",
        "grab",
        "the listener PortUnavailable",
        &env.procs(),
        |g: &Gateway| {
            g.status
                .as_ref()
                .and_then(|s| s.listeners.as_ref())
                .and_then(|l| l.first())
                .is_some_and(|l| {
                    condition(&l.conditions, "Accepted")
                        .is_some_and(|c| c.status == "False" && c.reason == "PortUnavailable")
                })
        },
    )
    .await;
    let message = &condition(
        &g.status.unwrap().listeners.unwrap()[0].conditions,
        "Accepted",
    )
    .unwrap()
    .message
    .clone();
    assert!(
        message.contains("belongs to namespace \"team-b\""),
        "{message}"
    );
    all_reach_team_b().await;
}

/// Waits until `host` `/` answers a status `pred` accepts, within 30 s
/// (the bound); panics with the agent's log.
async fn answers_within_30s(env: &Env, host: &str, what: &str, pred: impl Fn(u16, &str) -> bool) {
    let mut last = (0, String::new());
    let done = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            last = http_get(env.http(), host, "/").await;
            if pred(last.0, &last.1) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        done.is_ok(),
        "{host}: {what} not within 30 s; last {last:?}\n{}",
        env.agent.log()
    );
}

fn backend_of(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["backend"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Issue 37 item 4: a deleted Ingress whose cleanup fails is cleaned up
/// again with backoff, without waiting for a resync; and no host changes
/// hands before its holder is recorded. The agent's claim book is frozen by
/// a ValidatingAdmissionPolicy (the API server refuses its writes) while one
/// Ingress (holding an account host, so recorded) is deleted and another
/// arrives for a new account host: both fail and are retried, the deleted
/// one keeps serving and the new one is not served until the book takes
/// them (a retry that found the book "unchanged" in memory and published
/// was the bug). Once the policy is gone both settle within 30 s, with the
/// agent's resync (and so its sweep) 10 minutes away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_ingress_cleanup_is_retried_and_nothing_moves_unrecorded() {
    let mut env = Env::start().await;
    env.agent.terminate().await;
    env.agent = agent(
        &env.cluster,
        &env.edge,
        "agent-slow-resync",
        &["--resync-interval", "600s"],
    );
    let web = http_backend("web", bind_loopback(8080).await).await;
    env.cluster.apply(&service("default", "web", web));
    // Account hosts (no Domain object): their holders are recorded.
    for subdomain in ["leaving", "arriving"] {
        env.edge
            .client()
            .create_domain(&tuna_protocol::api::CreateDomain {
                subdomain: Some(subdomain.into()),
                domain: None,
            })
            .await
            .unwrap();
    }
    let ingress = |name: &str| {
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  ingressClassName: tuna\n  rules:\n  - host: {name}.tuna.test\n    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: {}}}}}}}}}]}}\n",
            web.port()
        )
    };
    env.cluster.apply(&ingress("leaving"));
    env.serves("leaving.tuna.test", "/", "", 200, "web").await;

    // Freeze the claim book, and wait until the API server enforces it.
    env.cluster.apply(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {name: freeze-claim-book}\nspec:\n  failurePolicy: Fail\n  matchConstraints:\n    resourceRules:\n    - apiGroups: ['']\n      apiVersions: [v1]\n      operations: [CREATE, UPDATE, DELETE]\n      resources: [configmaps]\n      resourceNames: [tuna-operator-claims]\n  validations:\n  - {expression: 'false', message: the claim book is frozen by the test}\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {name: freeze-claim-book}\nspec:\n  policyName: freeze-claim-book\n  validationActions: [Deny]\n",
    );
    let enforced = tokio::time::timeout(support::WAIT, async {
        loop {
            let out = env.cluster.kubectl(&[
                "-n",
                "default",
                "annotate",
                "--dry-run=server",
                "--overwrite",
                "configmap",
                "tuna-operator-claims",
                "probe=1",
            ]);
            if String::from_utf8_lossy(&out.stderr).contains("frozen by the test") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(enforced.is_ok(), "the policy was never enforced");

    env.cluster
        .kubectl_ok(&["-n", "default", "delete", "ingress", "leaving"]);
    env.cluster.apply(&ingress("arriving"));
    // Each has failed at least twice: the first attempt and a retry.
    let failed_twice = tokio::time::timeout(support::WAIT, async {
        loop {
            let log = env.agent.log();
            let arriving = log
                .lines()
                .filter(|l| l.contains("reconcile failed") && l.contains("arriving"))
                .count();
            if arriving >= 2 && log.contains("cleaning up a deleted Ingress failed again") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        failed_twice.is_ok(),
        "the frozen book did not make both fail twice:\n{}",
        env.agent.log()
    );
    // Nothing moved while the book could not record it.
    let (status, body) = http_get(env.http(), "leaving.tuna.test", "/").await;
    assert_eq!((status, backend_of(&body).as_str()), (200, "web"), "{body}");
    let (status, body) = http_get(env.http(), "arriving.tuna.test", "/").await;
    assert_ne!(status, 200, "served before its holder was recorded: {body}");

    env.cluster.kubectl_ok(&[
        "delete",
        "validatingadmissionpolicybinding,validatingadmissionpolicy",
        "freeze-claim-book",
    ]);
    // The edge answers 503 (tunnel offline) for a reserved host nothing serves.
    answers_within_30s(&env, "leaving.tuna.test", "unpublished", |status, _| {
        status != 200
    })
    .await;
    answers_within_30s(&env, "arriving.tuna.test", "served", |status, body| {
        status == 200 && backend_of(body) == "web"
    })
    .await;
    assert!(
        env.agent
            .log()
            .contains("deleted Ingress cleaned up after a retry"),
        "{}",
        env.agent.log()
    );
    let book = env.cluster.kubectl_ok(&[
        "-n",
        "default",
        "get",
        "configmap",
        "tuna-operator-claims",
        "-o",
        "jsonpath={.data.hosts\\.json}",
    ]);
    assert!(book.contains("arriving.tuna.test"), "{book}");
    assert!(!book.contains("leaving.tuna.test"), "{book}");
}

/// Issue 37 item 4: HTTPRoutes of team-a whose backendRef names `x y` (no
/// Service can have that name; once with a parentRef to team-a's Gateway
/// and no hostname, so that it touches every host, once with no parentRef
/// at all) stall nothing else. With them present, a new Ingress of team-b
/// serves, a deleted HTTPRoute's host stops and a deleted ReferenceGrant
/// stops the cross-namespace traffic, each within 30 s; only the bad route
/// gets `ResolvedRefs=False` (`BackendNotFound`), a good one stays resolved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_name_that_cannot_be_a_service_stalls_only_its_own_route() {
    let env = Env::start().await;
    let web = http_backend("web", bind_loopback(8080).await).await;
    let api = http_backend("api", bind_loopback(8080).await).await;
    let shop = http_backend("shop", bind_loopback(8080).await).await;
    for namespace in ["team-a", "team-b", "backends"] {
        env.cluster.kubectl_ok(&["create", "namespace", namespace]);
    }
    env.cluster.apply(&service("default", "web", web));
    env.cluster.apply(&service("backends", "api", api));
    env.cluster.apply(&service("team-b", "shop", shop));
    let route = |name: &str, backend: &str| {
        format!(
            "apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {{name: {name}, namespace: default}}\nspec: {{subdomain: {name}}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  parentRefs: [{{name: web}}]\n  hostnames: [{name}.tuna.test]\n  rules:\n  - backendRefs: [{backend}]\n"
        )
    };
    env.cluster.apply(&route("fine", "{name: web, port: 8080}"));
    env.cluster.apply(&route("gone", "{name: web, port: 8080}"));
    env.cluster.apply(&route(
        "cross",
        "{name: api, namespace: backends, port: 8080}",
    ));
    env.cluster.apply(
        "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: routes-from-default, namespace: backends}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: default}]\n  to: [{group: '', kind: Service, name: api}]\n",
    );
    env.serves("fine.tuna.test", "/", "", 200, "web").await;
    env.serves("gone.tuna.test", "/", "", 200, "web").await;
    env.serves("cross.tuna.test", "/", "", 200, "api").await;

    // The poison: any tenant may create these in its own namespace.
    env.cluster.apply(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: edge, namespace: team-a}\nspec:\n  gatewayClassName: tuna\n  listeners:\n  - {name: http, protocol: HTTP, port: 80, hostname: poison.tuna.test}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: poison, namespace: team-a}\nspec:\n  parentRefs: [{name: edge}]\n  rules: [{backendRefs: [{name: \"x y\", port: 80}]}]\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: orphan, namespace: team-a}\nspec:\n  rules: [{backendRefs: [{name: \"x y\", port: 80}]}]\n",
    );
    let poison: HttpRoute = wait_for(
        &env.client,
        "team-a",
        "poison",
        "ResolvedRefs=False",
        &env.procs(),
        |r: &HttpRoute| parent_says_false(r, "ResolvedRefs"),
    )
    .await;
    let resolved = condition(&our_parent(&poison).unwrap().conditions, "ResolvedRefs")
        .unwrap()
        .clone();
    assert_eq!(resolved.reason, "BackendNotFound", "{resolved:?}");

    // With the poison present, each change takes effect within 30 s.
    env.cluster.apply(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: shop, namespace: team-b}\nspec: {subdomain: shop}\n---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: shop, namespace: team-b}\nspec:\n  ingressClassName: tuna\n  rules:\n  - host: shop.tuna.test\n    http:\n      paths:\n      - {path: /, pathType: Prefix, backend: {service: {name: shop, port: {number: 8080}}}}\n",
    );
    env.cluster
        .kubectl_ok(&["delete", "httproute", "gone", "-n", "default"]);
    env.cluster.kubectl_ok(&[
        "delete",
        "referencegrant",
        "routes-from-default",
        "-n",
        "backends",
    ]);
    answers_within_30s(
        &env,
        "shop.tuna.test",
        "team-b's new Ingress serving",
        |s, b| s == 200 && backend_of(b) == "shop",
    )
    .await;
    answers_within_30s(
        &env,
        "gone.tuna.test",
        "the deleted route's host stopping",
        |s, _| s != 200,
    )
    .await;
    answers_within_30s(
        &env,
        "cross.tuna.test",
        "the revoked grant refusing",
        |s, b| s == 500 && backend_of(b) != "api",
    )
    .await;

    // The bad route alone is unresolved: the good one on the same agent is not.
    let fine = env
        .route("fine", "Accepted", |r: &HttpRoute| {
            our_parent(r).is_some_and(|p| is_true(&p.conditions, "Accepted"))
        })
        .await;
    assert!(
        is_true(&our_parent(&fine).unwrap().conditions, "ResolvedRefs"),
        "{:?}",
        fine.status
    );
    env.serves("fine.tuna.test", "/", "", 200, "web").await;
}

/// Issue 37 item 6: 300 HTTPRoutes of 128 matches each (two rules of 64
/// header matches on `/`, the CRD's maximum) on one host of team-a do not
/// delay an unrelated team-b route: once the agent has judged all 300, the
/// team-b route is published within 5 s. Team-a's routes beyond 1 024 specs
/// on the host (8 routes) are not accepted (`TooManyRoutes`, with a
/// `RuleSkipped` event); the first 8 serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_bulky_routes_of_one_namespace_do_not_delay_another() {
    let env = Env::start().await;
    let a = http_backend("a", bind_loopback(8080).await).await;
    let b = http_backend("b", bind_loopback(8080).await).await;
    for namespace in ["team-a", "team-b"] {
        env.cluster.kubectl_ok(&["create", "namespace", namespace]);
    }
    env.cluster.apply(&service("team-a", "web", a));
    env.cluster.apply(&service("team-b", "web", b));
    env.cluster.apply(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: open, namespace: default}\nspec:\n  gatewayClassName: tuna\n  listeners:\n  - {name: http, protocol: HTTP, port: 80, allowedRoutes: {namespaces: {from: All}}}\n---\napiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: big, namespace: team-a}\nspec: {subdomain: big}\n---\napiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: quick, namespace: team-b}\nspec: {subdomain: quick}\n",
    );
    for (namespace, name) in [("team-a", "big"), ("team-b", "quick")] {
        wait_for(
            &env.client,
            namespace,
            name,
            "Ready",
            &env.procs(),
            |d: &tuna_crds::Domain| {
                d.status
                    .as_ref()
                    .is_some_and(|s| is_true(&s.conditions, "Ready"))
            },
        )
        .await;
    }
    let rule = |first: usize| {
        let matches: Vec<String> = (first..first + 64)
            .map(|i| format!("{{path: {{type: PathPrefix, value: /}}, headers: [{{name: x, value: 'v{i}'}}]}}"))
            .collect();
        format!(
            "  - matches: [{}]\n    backendRefs: [{{name: web, port: 8080}}]\n",
            matches.join(", ")
        )
    };
    let routes: Vec<String> = (0..300)
        .map(|i| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: bulk-{i:03}, namespace: team-a}}\nspec:\n  parentRefs: [{{name: open, namespace: default}}]\n  hostnames: [big.tuna.test]\n  rules:\n{}{}",
                rule(i * 128),
                rule(i * 128 + 64)
            )
        })
        .collect();
    // `create` (no last-applied annotation): 300 objects of ~12 KB.
    for chunk in routes.chunks(50) {
        let out = env
            .cluster
            .kubectl_stdin(&["create", "-f", "-"], Some(&chunk.join("---\n")));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Ready: the agent has judged all 300 (our status entry on each).
    let api: Api<HttpRoute> = Api::namespaced(env.client.clone(), "team-a");
    let mut judged = Vec::new();
    let all = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            judged = api
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|r| {
                    let p = our_parent(&r)?;
                    let a = condition(&p.conditions, "Accepted")?;
                    (a.observed_generation == r.metadata.generation).then(|| {
                        (
                            r.metadata.name.clone().unwrap(),
                            a.status.clone(),
                            a.reason.clone(),
                        )
                    })
                })
                .collect::<Vec<_>>();
            if judged.len() == 300 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        all.is_ok(),
        "{} of 300 judged\n{}",
        judged.len(),
        env.agent.log()
    );
    // The unrelated route: published within 5 s.
    let started = std::time::Instant::now();
    env.cluster.apply(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: quick, namespace: team-b}\nspec:\n  parentRefs: [{name: open, namespace: default}]\n  hostnames: [quick.tuna.test]\n  rules: [{backendRefs: [{name: web, port: 8080}]}]\n",
    );
    let mut last = (0, String::new());
    let served = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            last = http_get(env.http(), "quick.tuna.test", "/").await;
            if last.0 == 200 && backend_of(&last.1) == "b" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        served.is_ok(),
        "team-b's route not served within 5 s (last {last:?})\n{}",
        env.agent.log()
    );
    eprintln!("team-b's route served after {:?}", started.elapsed());

    let accepted = judged.iter().filter(|(_, s, _)| s == "True").count();
    let refused = judged
        .iter()
        .filter(|(_, s, r)| s == "False" && r == "TooManyRoutes")
        .count();
    assert_eq!((accepted, refused), (8, 292), "{judged:?}");

    // Team-a's first 8 routes serve on its host; a refused one says why.
    let mut conn = tokio::net::TcpStream::connect(env.http()).await.unwrap();
    let (status, body) = http_request(&mut conn, "big.tuna.test", "/", "x: v0\r\n").await;
    assert_eq!((status, backend_of(&body)), (200, "a".to_owned()), "{body}");
    let (name, _, _) = judged
        .iter()
        .find(|(_, s, _)| s == "False")
        .unwrap()
        .clone();
    wait_for_event(
        &env.cluster,
        "team-a",
        "HTTPRoute",
        &name,
        "RuleSkipped",
        "TooManyRoutes",
    )
    .await;
}

/// Issue 41: the statuses the conformance suite reads. An HTTPS listener
/// whose certificateRef names no Secret is `ResolvedRefs=False`,
/// `InvalidCertificateRef` (still accepted, not programmed) and its Gateway
/// `Accepted=True`, `ListenersNotValid`; once the Secret holds a PEM
/// certificate and key (seen at the next sync) both resolve. A Gateway with
/// a `parametersRef` is `Accepted=False`, `InvalidParameters`. Every
/// condition is at the Gateway's generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_and_listener_conditions_name_bad_certificates_and_parameters() {
    let env = Env::start().await;
    env.cluster.apply(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: secure, namespace: default}\nspec:\n  gatewayClassName: tuna\n  listeners:\n  - {name: https, protocol: HTTPS, port: 443, tls: {certificateRefs: [{name: site-cert}]}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: params, namespace: default}\nspec:\n  gatewayClassName: tuna\n  infrastructure: {parametersRef: {group: invalid.io, kind: InvalidParameters, name: invalid}}\n  listeners:\n  - {name: http, protocol: HTTP, port: 80}\n",
    );
    let listener_reason = |g: &Gateway| -> Option<String> {
        let l = g.status.as_ref()?.listeners.as_ref()?.first()?;
        condition(&l.conditions, "ResolvedRefs").map(|c| format!("{} {}", c.status, c.reason))
    };
    let at_generation = |g: &Gateway| {
        let generation = g.metadata.generation;
        let s = g.status.as_ref().unwrap();
        s.conditions
            .iter()
            .flatten()
            .chain(s.listeners.iter().flatten().flat_map(|l| &l.conditions))
            .all(|c| c.observed_generation == generation)
    };
    let secure = wait_for(
        &env.client,
        "default",
        "secure",
        "ResolvedRefs False",
        &env.procs(),
        |g: &Gateway| listener_reason(g).as_deref() == Some("False InvalidCertificateRef"),
    )
    .await;
    let status = secure.status.as_ref().unwrap();
    let accepted = condition(status.conditions.as_deref().unwrap(), "Accepted").unwrap();
    assert_eq!(
        (accepted.status.as_str(), accepted.reason.as_str()),
        ("True", "ListenersNotValid")
    );
    let listener = &status.listeners.as_ref().unwrap()[0];
    assert!(is_true(&listener.conditions, "Accepted"), "{listener:?}");
    assert!(!is_true(&listener.conditions, "Programmed"), "{listener:?}");
    assert!(
        condition(&listener.conditions, "ResolvedRefs")
            .unwrap()
            .message
            .contains("default/site-cert: no such Secret"),
        "{listener:?}"
    );
    assert!(at_generation(&secure), "{status:?}");

    let params = wait_for(
        &env.client,
        "default",
        "params",
        "Accepted False",
        &env.procs(),
        |g: &Gateway| {
            g.status
                .as_ref()
                .and_then(|s| condition(s.conditions.as_deref()?, "Accepted"))
                .is_some_and(|c| c.status == "False")
        },
    )
    .await;
    let accepted = condition(
        params
            .status
            .as_ref()
            .unwrap()
            .conditions
            .as_deref()
            .unwrap(),
        "Accepted",
    )
    .unwrap();
    assert_eq!(accepted.reason, "InvalidParameters", "{accepted:?}");
    assert!(at_generation(&params));
    // A Gateway that is not accepted takes no route: a route naming it is
    // refused with the reason, and its listener is not programmed.
    env.cluster.apply(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: params}\nspec: {subdomain: params}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: on-params, namespace: default}\nspec:\n  parentRefs: [{name: params}]\n  hostnames: [params.tuna.test]\n  rules:\n  - backendRefs: [{name: web, port: 80}]\n",
    );
    let r = env
        .route("on-params", "Accepted False", |r: &HttpRoute| {
            parent_says_false(r, "Accepted")
        })
        .await;
    let refused = condition(&our_parent(&r).unwrap().conditions, "Accepted").unwrap();
    assert_eq!(refused.reason, "GatewayNotAccepted", "{refused:?}");
    let params: Gateway = Api::namespaced(env.client.clone(), "default")
        .get("params")
        .await
        .unwrap();
    let listener = &params.status.as_ref().unwrap().listeners.as_ref().unwrap()[0];
    assert!(!is_true(&listener.conditions, "Programmed"), "{listener:?}");
    assert_eq!(listener.attached_routes, 0, "{listener:?}");

    // A usable Secret; Secrets are not watched, so a change of the Gateway
    // (a new generation) brings the next sync.
    tls_secret(&env.cluster, "default", "site-cert", &["secure.tuna.test"]);
    env.cluster.apply(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: secure, namespace: default}\nspec:\n  gatewayClassName: tuna\n  listeners:\n  - {name: https, protocol: HTTPS, port: 8443, tls: {certificateRefs: [{name: site-cert}]}}\n",
    );
    let secure = wait_for(
        &env.client,
        "default",
        "secure",
        "ResolvedRefs True",
        &env.procs(),
        |g: &Gateway| {
            listener_reason(g).as_deref() == Some("True ResolvedRefs") && at_generation(g)
        },
    )
    .await;
    let status = secure.status.as_ref().unwrap();
    let accepted = condition(status.conditions.as_deref().unwrap(), "Accepted").unwrap();
    assert_eq!(
        (accepted.status.as_str(), accepted.reason.as_str()),
        ("True", "Accepted")
    );
    assert!(is_true(
        &status.listeners.as_ref().unwrap()[0].conditions,
        "Programmed"
    ));
}

/// Issue 41: a certificate Secret created a moment after its Gateway (as the
/// conformance suite applies its base manifests), a Service created a
/// moment after its route, and a headless Service's endpoint that becomes
/// ready later are seen without waiting for the resync interval: they are
/// read, not watched, so while one is missing the agent looks again soon
/// (2 s, doubling). The agent here resyncs every 5 min, and nothing else
/// changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_or_service_created_after_its_object_is_seen_before_the_resync() {
    let mut env = Env::start().await;
    env.agent.terminate().await;
    env.agent = agent(
        &env.cluster,
        &env.edge,
        "agent-slow",
        &["--resync-interval", "5m"],
    );
    env.cluster.apply(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: late, namespace: default}\nspec:\n  gatewayClassName: tuna\n  listeners:\n  - {name: https, protocol: HTTPS, port: 443, tls: {certificateRefs: [{name: late-cert}]}}\n",
    );
    let resolved = |g: &Gateway| -> Option<String> {
        let l = g.status.as_ref()?.listeners.as_ref()?.first()?;
        condition(&l.conditions, "ResolvedRefs").map(|c| c.status.clone())
    };
    wait_for(
        &env.client,
        "default",
        "late",
        "ResolvedRefs False (no Secret yet)",
        &env.procs(),
        |g: &Gateway| resolved(g).as_deref() == Some("False"),
    )
    .await;
    tls_secret(&env.cluster, "default", "late-cert", &["late.tuna.test"]);
    wait_for(
        &env.client,
        "default",
        "late",
        "ResolvedRefs True, well before the 5 min resync",
        &env.procs(),
        |g: &Gateway| resolved(g).as_deref() == Some("True"),
    )
    .await;

    // The same for a route's Service (HTTPRouteServiceTypes of the suite
    // applies both in one manifest).
    env.cluster.apply(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: late, namespace: default}\nspec:\n  parentRefs: [{name: web}]\n  rules: [{backendRefs: [{name: late-svc, port: 8080}]}]\n",
    );
    let refs = |r: &HttpRoute| {
        our_parent(r)
            .and_then(|p| condition(&p.conditions, "ResolvedRefs"))
            .map(|c| format!("{} {}", c.status, c.reason))
    };
    env.route(
        "late",
        "ResolvedRefs False (no Service yet)",
        |r: &HttpRoute| refs(r).as_deref() == Some("False BackendNotFound"),
    )
    .await;
    let backend = http_backend("late", bind_loopback(8080).await).await;
    env.cluster.apply(&service("default", "late-svc", backend));
    env.route(
        "late",
        "ResolvedRefs True, well before the 5 min resync",
        |r: &HttpRoute| refs(r).as_deref() == Some("True ResolvedRefs"),
    )
    .await;

    // A headless Service whose EndpointSlice gets its endpoint later (as
    // HTTPRouteServiceTypes fills its manual EndpointSlices). The Service
    // exists, so the reference resolves at once; requests answer 500 until
    // an endpoint is ready, then reach it. Kubernetes refuses loopback
    // endpoints: the pod is a host of its own.
    let pod_host = support::NetnsHost::create();
    let pod = http_backend("pod", pod_host.bind(8080)).await;
    env.cluster.apply(&format!(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {{name: pods}}\nspec: {{subdomain: pods}}\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: pods, namespace: default}}\nspec: {{clusterIP: None, ports: [{{name: http, port: 8080}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: pods-1, namespace: default, labels: {{kubernetes.io/service-name: pods}}}}\naddressType: IPv4\nports: [{{name: http, port: {}}}]\nendpoints: []\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: headless, namespace: default}}\nspec:\n  parentRefs: [{{name: web}}]\n  hostnames: [pods.tuna.test]\n  rules: [{{backendRefs: [{{name: pods, port: 8080}}]}}]\n",
        pod.port()
    ));
    env.route(
        "headless",
        "ResolvedRefs True (the Service exists)",
        |r: &HttpRoute| refs(r).as_deref() == Some("True ResolvedRefs"),
    )
    .await;
    env.serves("pods.tuna.test", "/", "", 500, "").await;
    env.cluster.apply(&format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: pods-1, namespace: default, labels: {{kubernetes.io/service-name: pods}}}}\naddressType: IPv4\nports: [{{name: http, port: {}}}]\nendpoints:\n- addresses: ['{}']\n  conditions: {{ready: true}}\n",
        pod.port(),
        pod.ip()
    ));
    env.serves("pods.tuna.test", "/", "", 200, "pod").await;
}
