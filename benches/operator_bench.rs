//! Scale benchmark of the operator's roles against the real binaries: a real
//! Kubernetes control plane (`scripts/test-cluster.sh`: etcd, kube-apiserver,
//! kube-controller-manager), a `tuna-operator edge`, `controller` and `agent`
//! processes on loopback. Run by `benches/operator.sh` (release builds); the
//! figures go to `benches/README.md`.
//!
//! ```text
//! operator_bench [--k8s MINOR] --operator BIN --scenario NAME [--count N] [--changes M]
//! ```
//!
//! Scenarios:
//! - `controller`: N Domains and N TCPEndpoints created at once (64 requests in
//!   flight, like a big `kubectl apply`); time until all are `Ready=True`; the
//!   controller's RSS then.
//! - `tunnels`: N http Tunnels to one Service; time until all are `Ready=True`;
//!   the agent's RSS and its TCP connections to the edge's agent listener.
//! - `ingress-latency`: N Ingresses (one host and Domain each) published,
//!   then M changes of one Ingress's backend; each timed from the API write to
//!   the first request through the edge that reaches the new backend.
//!
//! Objects are created through the API with kube-rs (not kubectl, whose own
//! per-object round trips would dominate); the clock starts before the first
//! create.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tuna_crds::{Domain, TcpEndpoint, Tunnel};

#[path = "support/test_cluster.rs"]
mod test_cluster;
use test_cluster::TestCluster;

struct Args {
    /// The Kubernetes minor version (`scripts/test-cluster.sh --version`).
    k8s: String,
    operator: PathBuf,
    scenario: String,
    count: usize,
    changes: usize,
}

fn args() -> Args {
    let mut a = std::env::args().skip(1);
    let mut out = Args {
        k8s: "1.37".into(),
        operator: PathBuf::new(),
        scenario: "controller".into(),
        count: 1000,
        changes: 100,
    };
    while let Some(flag) = a.next() {
        let value = a.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--k8s" => out.k8s = value,
            "--operator" => out.operator = value.into(),
            "--scenario" => out.scenario = value,
            "--count" => out.count = value.parse().expect("--count N"),
            "--changes" => out.changes = value.parse().expect("--changes M"),
            other => panic!("unknown flag {other}"),
        }
    }
    out
}

struct Proc {
    child: Child,
}

impl Proc {
    fn spawn(
        dir: &Path,
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
    ) -> Self {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let mut c = Command::new(program);
        c.args(args)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .env(
                "RUST_LOG",
                std::env::var("BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .kill_on_drop(true);
        for (k, v) in env {
            c.env(k, v);
        }
        Self {
            child: c
                .spawn()
                .unwrap_or_else(|e| panic!("{}: {e} (log: {})", program.display(), log.display())),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }
}

/// The numeric fields of `/proc/PID/status` (kB for sizes), 0 when absent.
fn status_fields(pid: u32) -> impl Fn(&str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    move |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    }
}

/// (VmRSS, VmHWM) in MiB.
fn memory(pid: u32) -> (f64, f64) {
    let field = status_fields(pid);
    (field("VmRSS:") / 1024.0, field("VmHWM:") / 1024.0)
}

/// What the resident set is made of: anonymous memory (heap, stacks, the
/// allocator's reserve), file-backed pages (the binary's code), threads.
fn memory_detail(pid: u32) -> String {
    let field = status_fields(pid);
    format!(
        "anon {:.1} MiB + file {:.1} MiB, {} threads",
        field("RssAnon:") / 1024.0,
        field("RssFile:") / 1024.0,
        field("Threads:")
    )
}

/// TCP connections of `pid` to `port` (its sockets matched in /proc/net/tcp).
fn connections_to(pid: u32, port: u16) -> usize {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| {
                    let s = l.to_string_lossy().to_string();
                    s.strip_prefix("socket:[")?
                        .strip_suffix(']')
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.len() > 9
                && cols[3] == "01" // ESTABLISHED
                && u16::from_str_radix(cols[2].rsplit(':').next().unwrap_or(""), 16).ok() == Some(port)
                && inodes.iter().any(|i| i == cols[9])
        })
        .count()
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

struct World {
    /// First: fields drop in order, and the cluster's `stop` reads its pids
    /// from a file in `dir`.
    _cluster: TestCluster,
    dir: tempfile::TempDir,
    client: Client,
    kubeconfig: PathBuf,
    edge: Proc,
    edge_addrs: serde_json::Value,
    key_file: PathBuf,
    operator: PathBuf,
}

async fn world(args: &Args) -> World {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let cluster = TestCluster::start(&args.k8s, &dir.path().join("cluster"));
    let kubeconfig = cluster.kubeconfig();
    let status = std::process::Command::new("kubectl")
        .args([
            "apply",
            "-f",
            concat!(env!("CARGO_MANIFEST_DIR"), "/charts/tuna-k8s-operator/crds"),
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("HOME", dir.path())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let established = std::process::Command::new("kubectl")
        .args([
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            concat!(env!("CARGO_MANIFEST_DIR"), "/charts/tuna-k8s-operator/crds"),
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("HOME", dir.path())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(established.success());
    let client = cluster.client().await;
    // The edge, with its request budget and quotas out of the way (the
    // benchmark measures the operator, not the edge's rate limit).
    let data = dir.path().join("edge");
    let key = std::process::Command::new(&args.operator)
        .args([
            "edge",
            "keys",
            "create",
            "--scope",
            "tunnels:write",
            "--scope",
            "tunnels:connect",
            "--data-dir",
        ])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        key.status.success(),
        "{}",
        String::from_utf8_lossy(&key.stderr)
    );
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, &key.stdout).unwrap();
    let addresses = dir.path().join("edge.json");
    let mut edge_args: Vec<String> = [
        "edge",
        "--data-dir",
        data.to_str().unwrap(),
        "--base-domain",
        "tuna.test",
        "--http-listen",
        "127.0.0.1:0",
        "--https-listen",
        "127.0.0.1:0",
        "--agent-listen",
        "127.0.0.1:0",
        "--api-listen",
        "127.0.0.1:0",
        "--tcp-bind",
        "127.0.0.1",
        "--tcp-port-range",
        "40000-51999",
        "--api-rate-burst",
        "1000000",
        "--api-rate-per-second",
        "1000000",
        // The defaults (100 TCP endpoints an account) are for a shared edge.
        "--quota-tcp-endpoints",
        "20000",
        "--addresses-file",
        addresses.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    edge_args.extend(
        std::env::var("EDGE_FLAGS")
            .unwrap_or_default()
            .split_whitespace()
            .map(String::from),
    );
    let edge = Proc::spawn(dir.path(), "edge", &args.operator, &edge_args, &[]);
    let edge_addrs = loop {
        if let Ok(text) = std::fs::read_to_string(&addresses) {
            break serde_json::from_str::<serde_json::Value>(&text).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    World {
        dir,
        _cluster: cluster,
        client,
        kubeconfig,
        edge,
        edge_addrs,
        key_file,
        operator: args.operator.clone(),
    }
}

impl World {
    fn addr(&self, name: &str) -> String {
        self.edge_addrs[name].as_str().unwrap().to_owned()
    }

    fn role(&self, role: &str, extra: &[&str]) -> Proc {
        let mut a: Vec<String> = vec![
            role.into(),
            "--edge-api".into(),
            format!("https://{}", self.addr("api")),
            "--edge-ca-file".into(),
            self.edge_addrs["caFile"].as_str().unwrap().into(),
            "--api-key-file".into(),
            self.key_file.display().to_string(),
            "--metrics-listen".into(),
            "127.0.0.1:0".into(),
            "--probe-listen".into(),
            "127.0.0.1:0".into(),
        ];
        a.extend(extra.iter().map(|s| (*s).to_owned()));
        Proc::spawn(
            self.dir.path(),
            role,
            &self.operator,
            &a,
            &[
                ("KUBECONFIG", self.kubeconfig.display().to_string()),
                ("POD_NAMESPACE", "default".into()),
            ],
        )
    }
}

/// Creates every object with 64 requests in flight.
async fn create_all<K>(api: &Api<K>, objects: Vec<K>)
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    futures::stream::iter(objects)
        .map(|o| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &o).await }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<_>>()
        .await
        .expect("create");
}

/// Waits until `n` objects of `K` satisfy `ready`, watching.
async fn until_ready<K>(client: &Client, n: usize, ready: fn(&K) -> bool)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let api: Api<K> = Api::all(client.clone());
    // Which objects are ready, and how many: counted as events arrive, not
    // by a scan per event, which made the harness itself O(n²) and took the
    // 2-core machine's CPU from the operator at 10 000 objects.
    let mut done: BTreeMap<String, bool> = BTreeMap::new();
    let mut ready_count = 0usize;
    let stream = watcher(api, watcher::Config::default());
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let (name, now) = match event {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                (o.name_any(), Some(ready(&o)))
            }
            Ok(watcher::Event::Delete(o)) => (o.name_any(), None),
            _ => continue,
        };
        let before = match now {
            Some(r) => done.insert(name, r),
            None => done.remove(&name),
        };
        ready_count =
            ready_count + usize::from(now == Some(true)) - usize::from(before == Some(true));
        if ready_count >= n {
            return;
        }
    }
}

fn cond_ready(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

fn object<K: DeserializeOwned>(value: serde_json::Value) -> K {
    serde_json::from_value(value).expect("object")
}

/// A backend on an address of the cluster's service CIDR (127.16.0.0/12) of
/// its own, which its Service takes as its cluster IP (each is allocated once).
async fn http_backend(name: &'static str) -> SocketAddr {
    static NEXT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(2);
    let host = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::new(127, 17, 0, host), 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut have = Vec::new();
                loop {
                    match c.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => have.extend_from_slice(&buf[..n]),
                    }
                    while let Some(end) = have.windows(4).position(|w| w == b"\r\n\r\n") {
                        have.drain(..end + 4);
                        let r = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{name}",
                            name.len()
                        );
                        if c.write_all(r.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

async fn get_body(conn: &mut tokio::net::TcpStream, host: &str) -> String {
    conn.write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = conn.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = conn.read(&mut chunk).await.unwrap();
                buf.extend_from_slice(&chunk[..n]);
            }
            return String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).to_string();
        }
    }
}

fn service(name: &str, addr: SocketAddr) -> Service {
    object(
        json!({"metadata": {"name": name, "namespace": "default"}, "spec": {"clusterIP": addr.ip().to_string(), "ports": [{"port": addr.port()}]}}),
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let args = args();
    let w = world(&args).await;
    let n = args.count;
    match args.scenario.as_str() {
        "controller" => {
            let controller = w.role("controller", &["--no-leader-election"]);
            let started = Instant::now();
            let domains: Vec<Domain> = (0..n)
                .map(|i| object(json!({"metadata": {"name": format!("d-{i}"), "namespace": "default"}, "spec": {"subdomain": format!("d-{i}")}})))
                .collect();
            let endpoints: Vec<TcpEndpoint> = (0..n)
                .map(|i| object(json!({"metadata": {"name": format!("t-{i}"), "namespace": "default"}, "spec": {"alias": format!("t-{i}")}})))
                .collect();
            let (d, e) = (
                Api::<Domain>::namespaced(w.client.clone(), "default"),
                Api::<TcpEndpoint>::namespaced(w.client.clone(), "default"),
            );
            futures::future::join(create_all(&d, domains), create_all(&e, endpoints)).await;
            let created = started.elapsed();
            futures::future::join(
                until_ready::<Domain>(&w.client, n, |d| {
                    d.status.as_ref().is_some_and(|s| cond_ready(&s.conditions))
                }),
                until_ready::<TcpEndpoint>(&w.client, n, |e| {
                    e.status.as_ref().is_some_and(|s| cond_ready(&s.conditions))
                }),
            )
            .await;
            let all = started.elapsed();
            let (rss, hwm) = memory(controller.pid());
            println!(
                "controller: {n} Domains + {n} TCPEndpoints: created in {created:.2?}, all Ready=True after {all:.2?}; controller RSS {rss:.1} MiB (peak {hwm:.1} MiB)"
            );
        }
        "tunnels" => {
            let agent = w.role("agent", &["--edge-agent", &w.addr("agent")]);
            let web = http_backend("web").await;
            Api::<Service>::namespaced(w.client.clone(), "default")
                .create(&PostParams::default(), &service("web", web))
                .await
                .unwrap();
            let started = Instant::now();
            let tunnels: Vec<Tunnel> = (0..n)
                .map(|i| object(json!({"metadata": {"name": format!("t-{i}"), "namespace": "default"}, "spec": {"subdomain": format!("t-{i}"), "upstream": {"url": format!("http://web:{}", web.port())}}})))
                .collect();
            create_all(
                &Api::<Tunnel>::namespaced(w.client.clone(), "default"),
                tunnels,
            )
            .await;
            let created = started.elapsed();
            until_ready::<Tunnel>(&w.client, n, |t| {
                t.status.as_ref().is_some_and(|s| cond_ready(&s.conditions))
            })
            .await;
            let all = started.elapsed();
            let agent_port: u16 = w.addr("agent").rsplit(':').next().unwrap().parse().unwrap();
            let (rss, hwm) = memory(agent.pid());
            let detail = memory_detail(agent.pid());
            let (edge_rss, _) = memory(w.edge.child.id().unwrap());
            println!(
                "agent: {n} http Tunnels: created in {created:.2?}, all Ready=True after {all:.2?}; agent RSS {rss:.1} MiB ({detail}; peak {hwm:.1} MiB), {} connection(s) to the edge, {} fds; edge RSS {edge_rss:.1} MiB",
                connections_to(agent.pid(), agent_port),
                fds(agent.pid())
            );
            let http = w.addr("http");
            let mut conn = tokio::net::TcpStream::connect(&http).await.unwrap();
            assert_eq!(
                get_body(&mut conn, &format!("t-{}.tuna.test", n - 1)).await,
                "web"
            );
        }
        "ingress-latency" => {
            let agent = w.role("agent", &["--edge-agent", &w.addr("agent")]);
            let controller = w.role("controller", &["--no-leader-election"]);
            let (a, b) = (http_backend("a").await, http_backend("b").await);
            let services = Api::<Service>::namespaced(w.client.clone(), "default");
            services
                .create(&PostParams::default(), &service("a", a))
                .await
                .unwrap();
            services
                .create(&PostParams::default(), &service("b", b))
                .await
                .unwrap();
            let class: k8s_openapi::api::networking::v1::IngressClass = object(
                json!({"metadata": {"name": "tuna"}, "spec": {"controller": "k8s.tuna.am/ingress-controller"}}),
            );
            Api::all(w.client.clone())
                .create(&PostParams::default(), &class)
                .await
                .unwrap();
            let ingress = |i: usize, backend: &str, port: u16| -> Ingress {
                object(
                    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": format!("i-{i}"), "namespace": "default"}, "spec": {"ingressClassName": "tuna", "rules": [{"host": format!("h-{i}.tuna.test"), "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": backend, "port": {"number": port}}}}]}}]}}),
                )
            };
            let domains: Vec<Domain> = (0..n)
                .map(|i| object(json!({"metadata": {"name": format!("h-{i}"), "namespace": "default"}, "spec": {"subdomain": format!("h-{i}")}})))
                .collect();
            create_all(
                &Api::<Domain>::namespaced(w.client.clone(), "default"),
                domains,
            )
            .await;
            until_ready::<Domain>(&w.client, n, |d| {
                d.status.as_ref().is_some_and(|s| cond_ready(&s.conditions))
            })
            .await;
            let started = Instant::now();
            let ingresses_api = Api::<Ingress>::namespaced(w.client.clone(), "default");
            create_all(
                &ingresses_api,
                (0..n).map(|i| ingress(i, "a", a.port())).collect(),
            )
            .await;
            until_ready::<Ingress>(&w.client, n, |i| {
                i.status
                    .as_ref()
                    .and_then(|s| s.load_balancer.as_ref())
                    .and_then(|l| l.ingress.as_ref())
                    .is_some_and(|l| !l.is_empty())
            })
            .await;
            println!(
                "agent: {n} Ingresses (one host each) published after {:.2?}",
                started.elapsed()
            );
            let http = w.addr("http");
            let mut latencies = Vec::new();
            let mut conn = tokio::net::TcpStream::connect(&http).await.unwrap();
            let host = format!("h-{}.tuna.test", n / 2);
            for k in 0..args.changes {
                let (name, port) = if k % 2 == 0 {
                    ("b", b.port())
                } else {
                    ("a", a.port())
                };
                let patch = json!({"spec": {"rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": name, "port": {"number": port}}}}]}}]}});
                let t0 = Instant::now();
                ingresses_api
                    .patch(
                        &format!("i-{}", n / 2),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                    .unwrap();
                loop {
                    if get_body(&mut conn, &host).await == name {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                latencies.push(t0.elapsed());
            }
            latencies.sort();
            let (rss, _) = memory(agent.pid());
            let agent_port: u16 = w.addr("agent").rsplit(':').next().unwrap().parse().unwrap();
            println!(
                "agent: Ingress change live at the edge with {n} Ingresses present, {} changes: p50 {:.1?}, p99 {:.1?}, max {:.1?}; agent RSS {rss:.1} MiB, {} connection(s) to the edge",
                latencies.len(),
                percentile(&latencies, 0.5),
                percentile(&latencies, 0.99),
                latencies.last().unwrap(),
                connections_to(agent.pid(), agent_port)
            );
            drop(controller);
        }
        other => panic!("unknown scenario {other}"),
    }
}
