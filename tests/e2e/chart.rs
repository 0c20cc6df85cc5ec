//! The chart end to end, as the product documentation tells users to run it:
//! a real Helm 4 installs it from a chart repository (`helm repo add tuna …`,
//! `helm install tuna-operator tuna/tuna-k8s-operator … --set
//! credentials.apiKey=…` plus the edge values) into a real control plane; the real
//! `controller` and `agent` processes then run with the arguments and
//! environment of the *installed* Deployments (`helm get manifest`; env from
//! the chart's Secret, the edge CA from its ConfigMap) and the tokens of the
//! chart's own ServiceAccounts (`kubectl create token`), so RBAC is enforced
//! with exactly the chart's rules. The documentation's Tunnel, Domain +
//! Ingress, TCPEndpoint and apiKeySecretRef journeys (the chart's `examples/`
//! files, verbatim: the edge's base domain is the documentation's `a.2na.am`)
//! pass through a real `tuna-operator edge`. The audit log then proves the
//! rules sufficient (nothing refused) and minimal (every verb used, or listed
//! in `NOT_EXERCISED` with the reason), and that the controller never read a
//! Secret. Then the documented upgrade (`helm pull --untar`, `kubectl apply -f
//! tuna-k8s-operator/crds/`, `helm upgrade --reuse-values`, the agent recreated) and uninstall (delete the
//! resources, `helm uninstall`, delete the CRDs): nothing hangs, nothing is
//! left.

use crate::chart_support;
use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use chart_support::{NAMESPACE, RELEASE, chart_dir, documents, text};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::Api;
use serde_json::{Value, json};
use support::{
    Cluster, Edge, EdgeOptions, Process, WAIT, bind_loopback, echo_backend, http_backend, http_get,
    ready_of, wait_for,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tuna_crds::{Domain, Tunnel};

/// The documentation's base domain (`my-app.a.2na.am` in its Ingress).
const BASE_DOMAIN: &str = "a.2na.am";

/// Granted verbs the journeys do not exercise, and why the code needs them.
const NOT_EXERCISED: &[(&str, &str, &str, &str)] = &[
    // (component, resource, verb, why)
    (
        "controller",
        "events.k8s.io/events",
        "patch",
        "kube's Recorder patches an event repeated within 6 minutes (series.count)",
    ),
    (
        "agent",
        "events.k8s.io/events",
        "patch",
        "kube's Recorder patches an event repeated within 6 minutes (series.count)",
    ),
    (
        "agent",
        "/configmaps",
        "create",
        "the chart creates the claim book; the agent's apply creates it only if someone deleted it",
    ),
];

/// A Helm chart repository on 127.0.0.1 (standing in for the documentation's
/// code.tuna.am package registry): `helm package` + `helm repo index`, served
/// over HTTP. Returns the repository URL.
async fn chart_repository(cluster: &Cluster) -> String {
    let dir = cluster.path("repo");
    std::fs::create_dir_all(&dir).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let chart = chart_dir();
    helm(
        cluster,
        &[
            "package",
            chart.to_str().unwrap(),
            "-d",
            dir.to_str().unwrap(),
        ],
    );
    helm(
        cluster,
        &["repo", "index", dir.to_str().unwrap(), "--url", &url],
    );
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let dir = dir.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match conn.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let path = head
                    .split(' ')
                    .nth(1)
                    .unwrap_or("/")
                    .trim_start_matches('/');
                let file = (!path.contains("..")).then(|| dir.join(path));
                let response = match file.and_then(|f| std::fs::read(f).ok()) {
                    Some(body) => [
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                            body.len()
                        )
                        .into_bytes(),
                        body,
                    ]
                    .concat(),
                    None => {
                        b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                            .to_vec()
                    }
                };
                let _ = conn.write_all(&response).await;
            });
        }
    });
    url
}

/// Runs helm against the cluster as admin (the user installing the chart).
fn helm(cluster: &Cluster, args: &[&str]) -> String {
    let out = chart_support::helm(cluster.dir.path(), args, Some(&cluster.kubeconfig));
    assert!(out.status.success(), "helm {args:?} failed: {}", text(&out));
    text(&out)
}

/// Runs the real kubectl with a deadline: the documented commands must not hang.
async fn kubectl_within(cluster: &Cluster, args: &[&str]) -> String {
    let out = tokio::time::timeout(
        WAIT,
        tokio::process::Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &cluster.kubeconfig)
            .env("HOME", cluster.dir.path())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("kubectl {args:?} hung for {WAIT:?}"))
    .expect("kubectl runs");
    assert!(out.status.success(), "kubectl {args:?}: {}", text(&out));
    text(&out)
}

/// The Deployments (and DaemonSets) of the installed release, by name.
fn installed_deployments(cluster: &Cluster) -> BTreeMap<String, Value> {
    let manifest = helm(cluster, &["get", "manifest", RELEASE, "-n", NAMESPACE]);
    documents(&manifest)
        .into_iter()
        .filter(|d| d["kind"] == "Deployment" || d["kind"] == "DaemonSet")
        .map(|d| (d["metadata"]["name"].as_str().unwrap().to_owned(), d))
        .collect()
}

/// A pod of a Deployment, as the kubelet would start it here: the container's
/// args and env resolved against the cluster (fieldRef, secretKeyRef), its
/// ConfigMap volumes written to a directory, and a kubeconfig with a token of
/// the pod's ServiceAccount. Only the listeners move to 127.0.0.1:0, since
/// both "pods" share this machine's network.
struct Pod {
    args: Vec<String>,
    env: Vec<(String, String)>,
    service_account: String,
    kubeconfig: PathBuf,
}

async fn pod_of(cluster: &Cluster, deploy: &Value, pod_name: &str) -> Pod {
    let client = cluster.client().await;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let secrets: Api<Secret> = Api::namespaced(client, NAMESPACE);
    let spec = &deploy["spec"]["template"]["spec"];
    let container = &spec["containers"][0];
    let dir = cluster.path(pod_name);
    std::fs::create_dir_all(&dir).unwrap();
    // Volumes: ConfigMaps only (the chart mounts nothing else).
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for m in container["volumeMounts"].as_array().into_iter().flatten() {
        let volume = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .expect("mounted volume exists");
        let target = dir.join(m["name"].as_str().unwrap());
        std::fs::create_dir_all(&target).unwrap();
        if volume["hostPath"].is_object() {
            // A node directory (the CSI plugin's): a directory of this "node".
            mounts.push((m["mountPath"].as_str().unwrap().to_owned(), target));
            continue;
        }
        let cm_name = volume["configMap"]["name"]
            .as_str()
            .expect("only ConfigMap and hostPath volumes");
        let cm = config_maps
            .get(cm_name)
            .await
            .expect("the mounted ConfigMap");
        for (k, v) in cm.data.unwrap_or_default() {
            std::fs::write(target.join(k), v).unwrap();
        }
        mounts.push((m["mountPath"].as_str().unwrap().to_owned(), target));
    }
    let args = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let a = a.as_str().unwrap().to_owned();
            if a.starts_with("--metrics-listen=") {
                return "--metrics-listen=127.0.0.1:0".to_owned();
            }
            if a.starts_with("--probe-listen=") {
                return "--probe-listen=127.0.0.1:0".to_owned();
            }
            if a.starts_with("--proxy-listen=") {
                return "--proxy-listen=127.0.0.1:0".to_owned();
            }
            mounts.iter().fold(a, |a, (mount, target)| {
                a.replacen(&format!("{mount}/"), &format!("{}/", target.display()), 1)
            })
        })
        .collect();
    let mut env = Vec::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap().to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_owned()
        } else if let Some(path) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            match path {
                "metadata.name" => pod_name.to_owned(),
                "metadata.namespace" => NAMESPACE.to_owned(),
                "spec.nodeName" => "node-1".to_owned(),
                other => panic!("fieldRef {other} is not resolved by this test"),
            }
        } else if let Some(r) = e["valueFrom"]["secretKeyRef"].as_object() {
            let secret = secrets
                .get(r["name"].as_str().unwrap())
                .await
                .expect("the referenced Secret");
            let data = secret.data.unwrap_or_default();
            let bytes = &data
                .get(r["key"].as_str().unwrap())
                .expect("the Secret has the key")
                .0;
            String::from_utf8(bytes.clone()).unwrap()
        } else {
            panic!("env {e} is not resolved by this test");
        };
        env.push((name, value));
    }
    let service_account = spec["serviceAccountName"].as_str().unwrap().to_owned();
    // The pod's token, from the TokenRequest API as the kubelet gets it.
    let token = cluster.kubectl_ok(&["-n", NAMESPACE, "create", "token", &service_account]);
    let mut kubeconfig: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&cluster.kubeconfig).unwrap()).unwrap();
    kubeconfig["users"][0]["user"] = json!({"token": token.trim()});
    kubeconfig["contexts"][0]["context"]["namespace"] = json!(NAMESPACE);
    let kubeconfig_path = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig_path,
        serde_json::to_string(&kubeconfig).unwrap(),
    )
    .unwrap();
    Pod {
        args,
        env,
        service_account,
        kubeconfig: kubeconfig_path,
    }
}

/// Starts the pod's process and waits until its /readyz answers 200.
async fn run_pod(cluster: &Cluster, pod: &Pod, name: &str) -> Process {
    let mut env: Vec<(&str, String)> = pod
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    env.push(("KUBECONFIG", pod.kubeconfig.display().to_string()));
    let process = Process::spawn(
        cluster.dir.path(),
        name,
        &support::operator_bin(),
        &pod.args,
        &env,
    );
    let ready = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(probe) = probe_addr(&process.log())
                && http_get(probe, "localhost", "/healthz").await.0 == 200
                && http_get(probe, "localhost", "/readyz").await.0 == 200
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    if ready.is_err() {
        let readyz = match probe_addr(&process.log()) {
            Some(probe) => http_get(probe, "localhost", "/readyz").await.1,
            None => "no probe listener".into(),
        };
        let failed: Vec<String> = cluster
            .audit()
            .iter()
            .filter(|e| e["code"].as_u64().is_some_and(|c| c == 401 || c == 403))
            .map(|e| e.to_string())
            .collect();
        panic!(
            "{name} never became ready (/readyz: {readyz}):\n{}\nrefused requests: {failed:#?}",
            process.log()
        );
    }
    process
}

fn logs(processes: &[&Process]) -> String {
    processes
        .iter()
        .map(|p| format!("--- {} ---\n{}", p.name, p.log()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The probe listener from the JSON log line "probes and metrics listening".
fn probe_addr(log: &str) -> Option<SocketAddr> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["fields"]["message"] == "probes and metrics listening")
        .and_then(|l| l["fields"]["probe"].as_str()?.parse().ok())
}

fn tunnel_ready(t: &Tunnel) -> bool {
    t.status
        .as_ref()
        .and_then(|s| ready_of(&s.conditions))
        .is_some_and(|(s, _, _)| s == "True")
}

fn service(name: &str, addr: SocketAddr, port_name: Option<&str>) -> String {
    let name_field = port_name
        .map(|n| format!("name: {n}, "))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{clusterIP: {}, ports: [{{{name_field}port: {}}}]}}\n",
        addr.ip(),
        addr.port()
    )
}

fn chart_version() -> String {
    let chart: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap())
            .unwrap();
    chart["version"].as_str().unwrap().to_owned()
}

fn example(name: &str) -> String {
    std::fs::read_to_string(chart_dir().join("examples").join(name)).unwrap()
}

/// (verb, "group/resource[/subresource]") of a request, as RBAC names them.
fn request_of(e: &Value) -> (String, String) {
    let group = e["group"].as_str().unwrap_or("");
    let mut resource = format!("{group}/{}", e["resource"].as_str().unwrap_or(""));
    if let Some(sub) = e["subresource"].as_str().filter(|s| !s.is_empty()) {
        resource = format!("{resource}/{sub}");
    }
    (e["verb"].as_str().unwrap_or("").to_owned(), resource)
}

/// The (verb, group/resource) pairs a component's installed Roles grant.
fn granted(manifest: &[Value], service_account: &str) -> BTreeSet<(String, String)> {
    let bound: BTreeSet<(String, String)> = manifest
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
        .filter(|d| {
            d["subjects"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["name"] == service_account)
        })
        .map(|d| {
            (
                d["roleRef"]["kind"].as_str().unwrap().to_owned(),
                d["roleRef"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut out = BTreeSet::new();
    for role in manifest.iter().filter(|d| {
        bound.contains(&(
            d["kind"].as_str().unwrap_or("").to_owned(),
            d["metadata"]["name"].as_str().unwrap_or("").to_owned(),
        ))
    }) {
        for rule in role["rules"].as_array().unwrap() {
            for g in rule["apiGroups"].as_array().unwrap() {
                for r in rule["resources"].as_array().unwrap() {
                    for v in rule["verbs"].as_array().unwrap() {
                        out.insert((
                            v.as_str().unwrap().to_owned(),
                            format!("{}/{}", g.as_str().unwrap(), r.as_str().unwrap()),
                        ));
                    }
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_runs_the_documented_journeys_with_least_privilege_then_upgrades_and_uninstalls()
 {
    let cluster = Cluster::start().await;
    // `helm install` brings the CRDs itself (crds/) on a fresh cluster.
    cluster.kubectl_ok(&[
        "delete",
        "crd",
        "tunnels.k8s.tuna.am",
        "domains.k8s.tuna.am",
        "tcpendpoints.k8s.tuna.am",
    ]);
    // The Gateway API CRDs (the cluster's, not the chart's): the chart then
    // renders its GatewayClass and the agent serves HTTPRoutes.
    let gateway_crds =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools/gateway-api-v1.6.1");
    cluster.kubectl_ok(&[
        "apply",
        "--server-side",
        "-f",
        gateway_crds.to_str().unwrap(),
    ]);
    cluster.kubectl_ok(&[
        "wait",
        "--for",
        "condition=Established",
        "--timeout",
        "60s",
        "crd/gatewayclasses.gateway.networking.k8s.io",
        "crd/gateways.gateway.networking.k8s.io",
        "crd/httproutes.gateway.networking.k8s.io",
    ]);
    let edge = Edge::start(
        cluster.dir.path(),
        EdgeOptions {
            base_domain: BASE_DOMAIN.into(),
            extra: Vec::new(),
        },
    )
    .await;
    // The documentation's commands, the repository on 127.0.0.1.
    let repo = chart_repository(&cluster).await;
    helm(&cluster, &["repo", "add", "tuna", &repo]);
    helm(&cluster, &["repo", "update"]);
    let key_arg = format!("credentials.apiKey={}", edge.key);
    let api_arg = format!("edge.apiUrl={}", edge.api_url());
    let agent_arg = format!("edge.agentAddress={}", edge.addrs.agent);
    let ca_arg = format!("edge.ca.pem={}", edge.ca_file().display());
    let installed = helm(
        &cluster,
        &[
            "install",
            RELEASE,
            "tuna/tuna-k8s-operator",
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "--set",
            &key_arg,
            // The edge of this test (the defaults name the hosted Tuna).
            "--set",
            &api_arg,
            "--set",
            &agent_arg,
            "--set-file",
            &ca_arg,
        ],
    );
    assert!(installed.contains("STATUS: deployed"), "{installed}");
    assert!(!installed.contains(&edge.key), "helm printed the API key");
    for crd in ["tunnels", "domains", "tcpendpoints"] {
        cluster.kubectl_ok(&["get", "crd", &format!("{crd}.k8s.tuna.am")]);
    }
    cluster.kubectl_ok(&["get", "ingressclass", "tuna"]);
    let class = cluster.kubectl_ok(&[
        "get",
        "gatewayclass",
        "tuna",
        "-o",
        "jsonpath={.spec.controllerName}",
    ]);
    assert_eq!(class, "k8s.tuna.am/gateway-controller");

    let deployments = installed_deployments(&cluster);
    let controller_pod = pod_of(
        &cluster,
        &deployments["tuna-operator-controller"],
        "tuna-operator-controller-5d8c7-x2x9q",
    )
    .await;
    let agent_pod = pod_of(
        &cluster,
        &deployments["tuna-operator-agent"],
        "tuna-operator-agent-6f4b9-k7m2c",
    )
    .await;
    assert!(
        controller_pod
            .env
            .iter()
            .any(|(k, v)| k == "TUNA_API_KEY" && *v == edge.key),
        "the key comes from the chart's Secret"
    );
    let mut controller = run_pod(&cluster, &controller_pod, "controller").await;
    let mut agent = run_pod(&cluster, &agent_pod, "agent").await;
    let client = cluster.client().await;
    // The documentation's Tunnel (examples/tunnel.yaml).
    let web = http_backend("web", bind_loopback(8080).await).await;
    let api = http_backend("api", bind_loopback(8080).await).await;
    cluster.apply(&service("web", web, Some("http")));
    cluster.apply(&service("api", api, None));
    cluster.apply(&example("tunnel.yaml"));
    let t: Tunnel = wait_for(&client, "default", "web", "Ready", &[&agent], tunnel_ready).await;
    assert_eq!(
        t.status.unwrap().url.as_deref(),
        Some("https://my-app.a.2na.am")
    );
    let http = edge.addrs.http.expect("public HTTP");
    let (status, body) = http_get(http, "my-app.a.2na.am", "/").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["backend"],
        "web"
    );
    // The Ingress wants the host my-app.a.2na.am: release the Tunnel first,
    // and wait until its subdomain is released at the edge.
    cluster.kubectl_ok(&["delete", "tunnel", "web"]);
    let released = tokio::time::timeout(WAIT, async {
        loop {
            let domains = edge.client().list_domains().await.unwrap();
            if domains.iter().all(|d| d.name != "my-app.a.2na.am") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        released.is_ok(),
        "{}",
        logs(&[&controller, &agent, edge.process.as_ref().unwrap()])
    );

    // Domain + Ingress (examples/domain-ingress.yaml).
    cluster.apply(&example("domain-ingress.yaml"));
    wait_for(
        &client,
        "default",
        "my-app",
        "Ingress status.loadBalancer",
        &[&agent, &controller],
        |i: &Ingress| support::load_balancer_hostnames(i).contains(&"my-app.a.2na.am"),
    )
    .await;
    let routed = tokio::time::timeout(WAIT, async {
        loop {
            let (s1, b1) = http_get(http, "my-app.a.2na.am", "/api/users").await;
            let (s2, b2) = http_get(http, "my-app.a.2na.am", "/apix").await;
            if s1 == 200 && s2 == 200 {
                return (b1, b2);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let (b1, b2) = routed.unwrap_or_else(|_| {
        panic!(
            "Ingress not routed\n{}",
            logs(&[&controller, &agent, edge.process.as_ref().unwrap()])
        )
    });
    assert_eq!(
        serde_json::from_str::<Value>(&b1).unwrap()["backend"],
        "api"
    );
    assert_eq!(
        serde_json::from_str::<Value>(&b2).unwrap()["backend"],
        "web"
    );

    // ---- the Gateway API: a Gateway of the chart's class and an HTTPRoute ----
    // (the agent watches the Gateway API kinds and Namespaces, and writes the
    // four statuses).
    cluster.apply(
        "apiVersion: k8s.tuna.am/v1alpha1\nkind: Domain\nmetadata: {name: gw}\nspec: {subdomain: gw}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: web, namespace: default}\nspec:\n  gatewayClassName: tuna\n  listeners: [{name: http, protocol: HTTP, port: 80}]\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: gw, namespace: default}\nspec:\n  parentRefs: [{name: web}]\n  hostnames: [gw.a.2na.am]\n  rules:\n  - matches: [{path: {type: PathPrefix, value: /api}}]\n    backendRefs: [{name: api, port: 8080}]\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\nmetadata: {name: tcp, namespace: default}\nspec:\n  parentRefs: [{name: web}]\n  rules: [{backendRefs: [{name: api, port: 8080}]}]\n",
    );
    let routed = tokio::time::timeout(WAIT, async {
        loop {
            let (status, body) = http_get(http, "gw.a.2na.am", "/api/x").await;
            if status == 200 {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let body = routed.unwrap_or_else(|_| {
        panic!(
            "HTTPRoute not routed\n{}",
            logs(&[&controller, &agent, edge.process.as_ref().unwrap()])
        )
    });
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["backend"],
        "api"
    );
    wait_for(
        &client,
        "default",
        "web",
        "Gateway Programmed",
        &[&agent],
        |g: &tuna_crds::gateway::Gateway| {
            g.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "Programmed" && c.status == "True")
                })
        },
    )
    .await;
    wait_for(
        &client,
        "default",
        "gw",
        "HTTPRoute Accepted",
        &[&agent],
        |r: &tuna_crds::gateway::HttpRoute| {
            r.status.as_ref().is_some_and(|s| {
                s.parents.iter().any(|p| {
                    p.conditions
                        .iter()
                        .any(|c| c.type_ == "Accepted" && c.status == "True")
                })
            })
        },
    )
    .await;
    // A TCPRoute on the HTTP listener: not attached, and its status says
    // so (the agent's tcproutes and tcproutes/status rules).
    wait_for(
        &client,
        "default",
        "tcp",
        "TCPRoute NotAllowedByListeners",
        &[&agent],
        |r: &tuna_crds::gateway::TcpRoute| {
            r.status.as_ref().is_some_and(|s| {
                s.parents.iter().any(|p| {
                    p.conditions
                        .iter()
                        .any(|c| c.type_ == "Accepted" && c.reason == "NotAllowedByListeners")
                })
            })
        },
    )
    .await;
    let accepted = cluster.kubectl_ok(&[
        "get",
        "gatewayclass",
        "tuna",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Accepted\")].status}",
    ]);
    assert_eq!(accepted, "True");

    // ---- the claim book and the legacy-record admission policy (issue 37) ----
    // The agent keeps its claim book in the ConfigMap of its Role (get, and
    // create then patch by server-side apply, of that one name; my-app.a.2na.am
    // is a Domain's, so it is not recorded there); a tenant who may edit
    // Ingresses and Tunnels can neither write the book nor forge the legacy
    // annotation, on the object or through its status subresource.
    const CLAIMS: &str = "k8s.tuna.am/hosts-claimed-at";
    let book_name = format!("{RELEASE}-agent-claims");
    let holds = |cm: &k8s_openapi::api::core::v1::ConfigMap| {
        cm.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.get("k8s.tuna.am/claims").map(String::as_str) == Some("true"))
            && cm.data.as_ref().is_some_and(|d| {
                d.get("hosts.json")
                    .is_some_and(|h| serde_json::from_str::<Value>(h).is_ok())
            })
    };
    wait_for(
        &client,
        NAMESPACE,
        &book_name,
        "the agent's claim book",
        &[&agent],
        holds,
    )
    .await;
    cluster.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: publisher, namespace: default}\nrules:\n- {apiGroups: [networking.k8s.io], resources: [ingresses, ingresses/status], verbs: [get, list, create, update, patch]}\n- {apiGroups: [k8s.tuna.am], resources: [tunnels], verbs: [get, list, create, update, patch]}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: tenant-publishes, namespace: default}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: publisher}\nsubjects: [{kind: User, name: tenant}]\n",
    );
    let tenant = cluster.user_kubeconfig("tenant", &[]);
    let home = cluster.path("tenant-home");
    std::fs::create_dir_all(&home).unwrap();
    let as_tenant = |args: &[&str], stdin: Option<&str>| {
        support::connectors::kubectl(&tenant, &home, args, stdin)
    };
    let forbidden = as_tenant(
        &[
            "-n",
            NAMESPACE,
            "patch",
            "configmap",
            &book_name,
            "--type=merge",
            "-p",
            r#"{"data":{"hosts.json":"{}"}}"#,
        ],
        None,
    );
    assert!(
        !forbidden.status.success() && text(&forbidden).contains("forbidden"),
        "{}",
        text(&forbidden)
    );
    let denied = format!(
        "ValidatingAdmissionPolicy '{RELEASE}-agent-host-claims' with binding '{RELEASE}-agent-host-claims' denied request: only the tuna agent (system:serviceaccount:{NAMESPACE}:{RELEASE}-agent) may set or change the annotation {CLAIMS}"
    );
    let backdated = format!("{CLAIMS}={{\"my-app.a.2na.am\":\"2000-01-01T00:00:00Z\"}}");
    let refused = as_tenant(
        &["annotate", "--overwrite", "ingress", "my-app", &backdated],
        None,
    );
    assert!(
        !refused.status.success() && text(&refused).contains(&denied),
        "{}",
        text(&refused)
    );
    // Through ingresses/status, where Kubernetes keeps metadata (G7).
    let through_status = as_tenant(
        &[
            "patch",
            "ingress",
            "my-app",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"metadata":{"annotations":{"k8s.tuna.am/hosts-claimed-at":"{\"my-app.a.2na.am\":\"2000-01-01T00:00:00Z\"}"}}}"#,
        ],
        None,
    );
    assert!(
        !through_status.status.success() && text(&through_status).contains(&denied),
        "{}",
        text(&through_status)
    );
    let annotated = |kind: &str, name: &str, spec: &str| {
        format!(
            "apiVersion: {kind}\nmetadata:\n  name: {name}\n  namespace: default\n  annotations: {{{CLAIMS}: '{{\"taken.a.2na.am\":\"2000-01-01T00:00:00Z\"}}'}}\n{spec}"
        )
    };
    for manifest in [
        annotated(
            "networking.k8s.io/v1\nkind: Ingress",
            "backdated",
            "spec:\n  ingressClassName: tuna\n  rules:\n  - host: taken.a.2na.am\n    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 8080}}}}]}\n",
        ),
        annotated(
            "k8s.tuna.am/v1alpha1\nkind: Tunnel",
            "backdated",
            "spec: {subdomain: taken, upstream: {url: 'http://web:8080'}}\n",
        ),
    ] {
        let refused = as_tenant(&["create", "-f", "-"], Some(&manifest));
        assert!(
            !refused.status.success() && text(&refused).contains(&denied),
            "{manifest}\n{}",
            text(&refused)
        );
    }
    // Other edits pass; the book still holds the host for default.
    let labelled = as_tenant(&["label", "ingress", "my-app", "team=web"], None);
    assert!(labelled.status.success(), "{}", text(&labelled));
    wait_for(
        &client,
        NAMESPACE,
        &book_name,
        "the claim book unchanged",
        &[&agent],
        holds,
    )
    .await;

    // Custom domain (examples/custom-domain.yaml): reserved, DNS records in status.
    cluster.apply(&example("custom-domain.yaml"));
    wait_for(
        &client,
        "default",
        "api-example-com",
        "status.dnsRecords",
        &[&controller],
        |d: &Domain| d.status.as_ref().is_some_and(|s| !s.dns_records.is_empty()),
    )
    .await;

    // TCPEndpoint + tcp Tunnel (examples/tcp-endpoint.yaml).
    let pg = echo_backend(bind_loopback(5432).await).await;
    cluster.apply(&service("postgres", pg, None));
    cluster.apply(&example("tcp-endpoint.yaml"));
    let t: Tunnel = wait_for(
        &client,
        "default",
        "postgres",
        "Ready",
        &[&agent, &controller],
        tunnel_ready,
    )
    .await;
    let url = t.status.unwrap().url.unwrap();
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    conn.write_all(b"hello postgres\n").await.unwrap();
    let mut buf = [0u8; 15];
    conn.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"hello postgres\n");
    drop(conn);

    // apiKeySecretRef (examples/api-key-secret-ref.yaml) with a real key.
    cluster.apply(
        &example("api-key-secret-ref.yaml").replace("<API key with tunnels:connect>", &edge.key),
    );
    wait_for(
        &client,
        "default",
        "team-web",
        "Ready with its own key",
        &[&agent],
        tunnel_ready,
    )
    .await;

    // A headless Service: the agent lists its EndpointSlices.
    // Its endpoint is a pod address, which Kubernetes refuses in the loopback
    // range: the backend is a host of its own.
    let pod_host = support::NetnsHost::create();
    let headless = http_backend("headless", pod_host.bind(8080)).await;
    cluster.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: stateful}}\nspec: {{clusterIP: None, ports: [{{port: 8080}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: stateful-1, labels: {{kubernetes.io/service-name: stateful}}}}\naddressType: IPv4\nports: [{{port: 8080}}]\nendpoints: [{{addresses: ['{}'], conditions: {{ready: true}}}}]\n---\napiVersion: k8s.tuna.am/v1alpha1\nkind: Tunnel\nmetadata: {{name: stateful}}\nspec: {{subdomain: stateful, upstream: {{url: 'http://stateful:8080'}}}}\n",
        headless.ip()
    ));
    wait_for(
        &client,
        "default",
        "stateful",
        "Ready (headless)",
        &[&agent],
        tunnel_ready,
    )
    .await;
    let (status, body) = http_get(http, "stateful.a.2na.am", "/").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["backend"],
        "headless"
    );

    // ---- the audit: sufficient and minimal ----
    let manifest = documents(&helm(
        &cluster,
        &["get", "manifest", RELEASE, "-n", NAMESPACE],
    ));
    let audit = cluster.audit();
    for (component, pod) in [("controller", &controller_pod), ("agent", &agent_pod)] {
        let unexercised: Vec<(&str, &str)> = NOT_EXERCISED
            .iter()
            .filter(|(c, ..)| *c == component)
            .map(|(_, resource, verb, _why)| (*verb, *resource))
            .collect();
        assert_least_privilege(
            &audit,
            &manifest,
            component,
            &pod.service_account,
            &unexercised,
        );
        // Leases only in the release namespace.
        let user = format!("system:serviceaccount:{NAMESPACE}:{}", pod.service_account);
        assert!(
            audit
                .iter()
                .filter(|e| e["user"] == user.as_str() && e["resource"] == "leases")
                .all(|e| e["namespace"] == NAMESPACE),
            "{component} used a lease outside {NAMESPACE}"
        );
    }
    for p in [&controller, &agent] {
        assert!(
            !p.log().contains(&edge.key),
            "{} logged the API key",
            p.name
        );
    }
    let controller_user = format!("system:serviceaccount:{NAMESPACE}:tuna-operator-controller");
    assert!(
        !audit
            .iter()
            .any(|e| e["user"] == controller_user.as_str() && e["resource"] == "secrets"),
        "the controller touched Secrets"
    );
    let agent_user = format!("system:serviceaccount:{NAMESPACE}:tuna-operator-agent");
    let secret_and_service_verbs: BTreeSet<&str> = audit
        .iter()
        .filter(|e| {
            e["user"] == agent_user.as_str()
                && (e["resource"] == "secrets" || e["resource"] == "services")
        })
        .map(|e| e["verb"].as_str().unwrap())
        .collect();
    assert_eq!(secret_and_service_verbs, BTreeSet::from(["get"]));

    // ---- upgrade, as documented for Helm ----
    let version = chart_version();
    helm(
        &cluster,
        &[
            "pull",
            "tuna/tuna-k8s-operator",
            "--untar",
            "--version",
            &version,
        ],
    );
    let crds = cluster.path("tuna-k8s-operator/crds/");
    kubectl_within(&cluster, &["apply", "-f", crds.to_str().unwrap()]).await;
    let upgraded = helm(
        &cluster,
        &[
            "upgrade",
            RELEASE,
            "tuna/tuna-k8s-operator",
            "--namespace",
            NAMESPACE,
            "--reuse-values",
            "--version",
            &version,
        ],
    );
    assert!(upgraded.contains("REVISION: 2"), "{upgraded}");
    let after = installed_deployments(&cluster);
    assert_eq!(
        after["tuna-operator-agent"]["spec"]["template"]["spec"]["containers"][0]["args"],
        deployments["tuna-operator-agent"]["spec"]["template"]["spec"]["containers"][0]["args"],
        "--reuse-values keeps the edge settings"
    );
    // Recreate: the old agent stops, the new one reconnects the tunnels.
    agent.terminate().await;
    let agent_pod = pod_of(
        &cluster,
        &after["tuna-operator-agent"],
        "tuna-operator-agent-7c5d8-p4w6n",
    )
    .await;
    agent = run_pod(&cluster, &agent_pod, "agent-upgraded").await;
    let served = tokio::time::timeout(WAIT, async {
        loop {
            if http_get(http, "stateful.a.2na.am", "/").await.0 == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        served.is_ok(),
        "tunnels not back after the upgrade\n{}",
        logs(&[&controller, &agent, edge.process.as_ref().unwrap()])
    );

    // ---- uninstall, as documented ----
    kubectl_within(
        &cluster,
        &[
            "delete",
            "tunnels,domains,tcpendpoints",
            "--all",
            "--all-namespaces",
        ],
    )
    .await;
    let uninstalled = helm(&cluster, &["uninstall", RELEASE, "-n", NAMESPACE]);
    assert!(uninstalled.contains("uninstalled"), "{uninstalled}");
    assert!(!uninstalled.contains("Failed"), "{uninstalled}");
    // helm uninstall deleted the Deployments: the kubelet stops the pods with SIGTERM.
    agent.terminate().await;
    controller.terminate().await;
    kubectl_within(
        &cluster,
        &[
            "delete",
            "crd",
            "tunnels.k8s.tuna.am",
            "domains.k8s.tuna.am",
            "tcpendpoints.k8s.tuna.am",
        ],
    )
    .await;
    let left = cluster.kubectl_ok(&[
        "get",
        "deployments,serviceaccounts,secrets,configmaps,roles,rolebindings,services,poddisruptionbudgets",
        "-n",
        NAMESPACE,
        "-o",
        "name",
    ]);
    // What kube-controller-manager puts in every namespace is not the chart's.
    let left: Vec<&str> = left
        .lines()
        .filter(|l| *l != "serviceaccount/default" && *l != "configmap/kube-root-ca.crt")
        .collect();
    assert!(left.is_empty(), "left in {NAMESPACE}: {left:?}");
    let cluster_wide = cluster.kubectl_ok(&[
        "get",
        "clusterroles,clusterrolebindings,ingressclasses,crds",
        "-o",
        "name",
    ]);
    assert!(!cluster_wide.contains("tuna"), "left: {cluster_wide}");
    // The reservations went with their resources (reclaimPolicy Delete), the
    // Retain one stays; no tunnel token is left.
    let domains: BTreeSet<String> = edge
        .client()
        .list_domains()
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert!(
        domains.contains("api.example.com"),
        "Retain keeps it: {domains:?}"
    );
    // An agent that restarted (every upgrade: Recreate) still releases the
    // subdomains its predecessor reserved for Tunnels.
    let leaked: Vec<&String> = domains.iter().filter(|d| *d != "api.example.com").collect();
    assert!(
        leaked.is_empty(),
        "reservations left: {leaked:?}\n{}",
        logs(&[&controller, &agent, edge.process.as_ref().unwrap()])
    );
    let tokens: Vec<_> = edge
        .client()
        .list_tokens("")
        .await
        .unwrap()
        .into_iter()
        .filter(|t| !t.expired)
        .collect();
    assert!(
        tokens.is_empty(),
        "{tokens:?}\n{}",
        logs(&[&controller, &agent, edge.process.as_ref().unwrap()])
    );
}

/// Every rule bound to `service_account` in `manifest` was used by it, and
/// nothing it asked for was refused; `unexercised` lists (verb, resource)
/// pairs the journey cannot reach, each still granted.
fn assert_least_privilege(
    audit: &[Value],
    manifest: &[Value],
    component: &str,
    service_account: &str,
    unexercised: &[(&str, &str)],
) {
    let user = format!("system:serviceaccount:{NAMESPACE}:{service_account}");
    let mine: Vec<&Value> = audit
        .iter()
        .filter(|e| e["user"] == user.as_str())
        .collect();
    assert!(!mine.is_empty(), "{component} made no request as {user}");
    let refused: Vec<String> = mine
        .iter()
        .filter(|e| e["code"] == 403 || e["code"] == 401)
        .map(|e| e.to_string())
        .collect();
    assert!(
        refused.is_empty(),
        "{component}: refused requests (a missing rule): {refused:#?}"
    );
    // A server-side apply that creates its object (201) is authorized as a
    // patch and as a create (k8s.io/apiserver, handlers/patch.go).
    let used: BTreeSet<(String, String)> = mine
        .iter()
        .filter(|e| !e["resource"].as_str().unwrap_or("").is_empty())
        .flat_map(|e| {
            let (verb, resource) = request_of(e);
            let create =
                (verb == "patch" && e["code"] == 201).then(|| ("create".into(), resource.clone()));
            std::iter::once((verb, resource)).chain(create)
        })
        .collect();
    let grants = granted(manifest, service_account);
    let unused: Vec<&(String, String)> = grants
        .iter()
        .filter(|(verb, resource)| {
            !used.contains(&(verb.clone(), resource.clone()))
                && !unexercised.iter().any(|(v, r)| v == verb && r == resource)
        })
        .collect();
    assert!(
        unused.is_empty(),
        "{component}: granted but never used: {unused:?}\nused: {used:?}"
    );
    for (v, r) in unexercised {
        assert!(
            grants.contains(&(v.to_string(), r.to_string())),
            "{component}: {v} {r} is not granted"
        );
    }
}

/// `--set connectors.enabled=true`: the connectors role and the CSI node
/// plugin run with the installed Deployment's and DaemonSet's arguments and
/// their ServiceAccounts' tokens; the documentation's Connector becomes
/// Ready, kubelet's publish (real CSI gRPC on the plugin's socket) writes a
/// kubeconfig that the real kubectl uses through the proxy, for a pod of the
/// Connector's namespace and one of another namespace that RBAC lets in;
/// the audit proves both components' rules sufficient and minimal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connectors_enabled_runs_the_role_and_the_csi_plugin_with_least_privilege() {
    use support::connectors::{
        NS, Pod as KubeletPod, channel, kubectl, kubelet_tokens, ok, proxy_addr, publish_request,
        quick_start, seed_target, with_tokens,
    };
    use tuna_crds::Connector;
    use tuna_operator::csi::proto::node_client::NodeClient;

    // The operator's cluster, and the target API server (a cluster of its
    // own): a reader's token and some pods.
    let (cluster, target) = tokio::join!(Cluster::start(), Cluster::start());
    let home = cluster.path("home");
    std::fs::create_dir_all(&home).unwrap();
    let target_token = seed_target(&target, &home);
    let target_ca = cluster.path("target-ca.pem");
    std::fs::write(&target_ca, target.ca_pem()).unwrap();

    let chart = chart_dir();
    let installed = helm(
        &cluster,
        &[
            "install",
            RELEASE,
            chart.to_str().unwrap(),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "--set",
            "credentials.apiKey=test-api-key",
            "--set",
            "connectors.enabled=true",
        ],
    );
    assert!(installed.contains("STATUS: deployed"), "{installed}");
    cluster.kubectl_ok(&["get", "csidriver", "connectors-csi"]);
    let workloads = installed_deployments(&cluster);

    // The connectors role, as its Deployment says (the target's CA is a
    // system root of its node).
    let mut role_pod = pod_of(
        &cluster,
        &workloads["tuna-operator-connectors"],
        "tuna-operator-connectors-6c8d9-q2w4e",
    )
    .await;
    role_pod
        .env
        .push(("SSL_CERT_FILE".into(), target_ca.display().to_string()));
    let role = run_pod(&cluster, &role_pod, "connectors").await;
    let proxy = proxy_addr(&role).await;
    cluster.kubectl_ok(&["create", "namespace", NS]);
    let applied = cluster.kubectl_stdin(
        &["apply", "-n", NS, "-f", "-"],
        Some(&quick_start(&target_token, target.url())),
    );
    assert!(applied.status.success(), "{}", text(&applied));
    let client = cluster.client().await;
    wait_for(
        &client,
        NS,
        "k8s-connector",
        "Ready",
        &[&role],
        |c: &Connector| {
            c.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        },
    )
    .await;

    // ---- the chart's admission policy (issue 19, item 4) ----
    // The quick start above passed it (as admin) and the role's status
    // writes did; a ServiceAccount that may write Connectors but may not get
    // the token Secret is refused.
    cluster.apply(&format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: editor, namespace: {NS}}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: connector-editor, namespace: {NS}}}\nrules:\n- {{apiGroups: [connectors.alauda.io], resources: [connectors], verbs: [get, create, patch]}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: editor-edits-connectors, namespace: {NS}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: connector-editor}}\nsubjects: [{{kind: ServiceAccount, name: editor, namespace: {NS}}}]\n"
    ));
    let editor_token = cluster.kubectl_ok(&["-n", NS, "create", "token", "editor"]);
    let editor_kubeconfig = cluster.path("editor.kubeconfig");
    cluster.write_token_kubeconfig(&editor_kubeconfig, editor_token.trim());
    let stolen = quick_start(&target_token, "https://127.0.0.1:9")
        .split("---\n")
        .nth(1)
        .unwrap()
        .replace("name: k8s-connector", "name: elsewhere");
    // The API server loads policies asynchronously (its policy source
    // refreshes from an informer, apiserver pkg/admission/plugin/policy/
    // generic/policy_source.go), so under load a policy may not be in
    // effect seconds after `helm install`: wait for the editor's
    // server-side dry run to be refused, as Kubernetes' own e2e waits for a
    // marker to be denied (test/e2e/apimachinery/validatingadmissionpolicy.go).
    // A policy that never denies still fails below.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let dry_run = kubectl(
            &editor_kubeconfig,
            &home,
            &["apply", "--dry-run=server", "-n", NS, "-f", "-"],
            Some(&stolen),
        );
        if text(&dry_run).contains("denied request") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let refused = kubectl(
        &editor_kubeconfig,
        &home,
        &["apply", "-n", NS, "-f", "-"],
        Some(&stolen),
    );
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        text(&refused).contains(&format!(
            "connectors.connectors.alauda.io \"elsewhere\" is forbidden: ValidatingAdmissionPolicy 'tuna-operator-connectors-secret-access' with binding 'tuna-operator-connectors-secret-access' denied request: system:serviceaccount:{NS}:editor may not get Secret k8s-secret"
        )),
        "{}",
        text(&refused)
    );

    // The CSI plugin, as its DaemonSet says; the proxy at its test address.
    let csi_pod = pod_of(
        &cluster,
        &workloads["tuna-operator-csi"],
        "tuna-operator-csi-node-1",
    )
    .await;
    let endpoint = csi_pod
        .args
        .iter()
        .find_map(|a| a.strip_prefix("--endpoint=unix://"))
        .expect("--endpoint")
        .to_owned();
    let mut args = csi_pod.args.clone();
    args.push(format!("--proxy-url=http://{proxy}"));
    // `$(NODE_NAME)` is kubelet's expansion of the env var. The
    // registration socket goes where this test keeps its files, not into
    // the host's root (kubelet's registration directory is mounted there in
    // the pod; tests/node has a real kubelet read it).
    let registration = cluster
        .dir
        .path()
        .join("plugins_registry/connectors-csi-reg.sock");
    for a in &mut args {
        *a = a.replace("$(NODE_NAME)", "node-1");
        if a.starts_with("--registration-socket=") {
            *a = format!("--registration-socket={}", registration.display());
        }
    }
    let mut env: Vec<(&str, String)> = csi_pod
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    env.push(("KUBECONFIG", csi_pod.kubeconfig.display().to_string()));
    let plugin = Process::spawn(
        cluster.dir.path(),
        "csi",
        &support::operator_bin(),
        &args,
        &env,
    );
    let listening = tokio::time::timeout(WAIT, async {
        while !plugin.log().contains("CSI plugin listening") {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(listening.is_ok(), "{}", plugin.log());
    let mut node = NodeClient::new(channel(std::path::Path::new(&endpoint)).await);

    // Pods as kubelet knows them: the documentation's Job in the Connector's
    // namespace, and a pod of another namespace that RBAC lets in.
    // (`default` is the kube-controller-manager's, in every namespace.)
    cluster.wait_for_service_account(NS, "default");
    cluster.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: other}}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: reader, namespace: other}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: use-k8s-connector, namespace: {NS}}}\nrules:\n- {{apiGroups: [connectors.alauda.io], resources: [connectors], resourceNames: [k8s-connector], verbs: [get]}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: other-uses-k8s-connector, namespace: {NS}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: use-k8s-connector}}\nsubjects: [{{kind: ServiceAccount, name: reader, namespace: other}}]\n"
    ));
    let mut published = Vec::new();
    for (namespace, name, sa) in [
        (NS, "k8s-access-x7k2p", "default"),
        ("other", "reporter", "reader"),
    ] {
        cluster.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec: {{nodeName: node-1, serviceAccountName: {sa}, containers: [{{name: kubectl, image: bitnami/kubectl:1.30.1}}]}}\n"
        ));
        let uid = cluster.kubectl_ok(&[
            "-n",
            namespace,
            "get",
            "pod",
            name,
            "-o",
            "jsonpath={.metadata.uid}",
        ]);
        let pod = KubeletPod {
            name: name.into(),
            namespace: namespace.into(),
            uid,
            service_account: sa.into(),
        };
        let target_path = cluster.path(&format!(
            "kubelet/pods/{}/volumes/kubernetes.io~csi/kubeconfig/mount",
            pod.uid
        ));
        std::fs::create_dir_all(target_path.parent().unwrap()).unwrap();
        // As kubelet does for the CSIDriver's tokenRequests.
        let (tokens, _) = kubelet_tokens(&client, &pod).await;
        node.node_publish_volume(with_tokens(
            publish_request(
                &pod,
                &target_path,
                &[
                    ("connector.name", "k8s-connector"),
                    ("connector.namespace", NS),
                    ("configuration.names", "kubeconfig"),
                ],
            ),
            &tokens,
        ))
        .await
        .unwrap_or_else(|e| panic!("publish for {namespace}/{name}: {e:?}\n{}", plugin.log()));
        let pods = ok(
            kubectl(
                &target_path.join("kubeconfig"),
                &home,
                &["get", "pods", "--all-namespaces"],
                None,
            ),
            "kubectl with the published kubeconfig",
        );
        assert!(pods.contains("web-7d4f9"), "{pods}");
        published.push(target_path);
    }

    // ---- the audit: both components' rules sufficient and minimal ----
    let manifest = documents(&helm(
        &cluster,
        &["get", "manifest", RELEASE, "-n", NAMESPACE],
    ));
    let audit = cluster.audit();
    assert_least_privilege(
        &audit,
        &manifest,
        "connectors",
        &role_pod.service_account,
        &[(
            // kube's Recorder patches an event repeated within 6 minutes.
            "patch",
            "events.k8s.io/events",
        )],
    );
    assert_least_privilege(&audit, &manifest, "csi", &csi_pod.service_account, &[]);
    let csi_user = format!(
        "system:serviceaccount:{NAMESPACE}:{}",
        csi_pod.service_account
    );
    assert!(
        !audit
            .iter()
            .any(|e| e["user"] == csi_user.as_str() && e["subresource"] == "token"),
        "the CSI plugin minted a token"
    );
    for p in [&role, &plugin] {
        assert!(
            !p.log().contains(&target_token),
            "{} logged the target's token",
            p.name
        );
    }
}
