//! Shared support of the end-to-end tests: a real Kubernetes control plane
//! (`scripts/test-cluster.sh`), the real binaries (`tuna-operator edge`,
//! `controller`, `agent`), the real `kubectl`, and readiness by signals (the
//! API server's /readyz, the edge's addresses file, watches of conditions),
//! never by sleeping.
//!
//! Every process is killed when its handle is dropped; its output goes to a
//! log file in the test's temporary directory, printed when a wait fails.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::await_condition;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::process::{Child, Command};

pub mod connectors;

/// How long any wait of a test may take before it fails (with logs).
pub const WAIT: Duration = Duration::from_secs(30);

/// The operator binary of this package.
pub fn operator_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tuna-operator"))
}

/// A child process killed on drop, its stdout and stderr in `log`.
pub struct Process {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

impl Process {
    /// Spawns `program args` with `env`, output to `<dir>/<name>.log`.
    pub fn spawn(
        dir: &Path,
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
    ) -> Self {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // TUNA_TEST_LOG (a RUST_LOG filter) raises what the processes log
            // while a test is being debugged.
            .env(
                "RUST_LOG",
                std::env::var("TUNA_TEST_LOG")
                    .unwrap_or_else(|_| "info,kube=warn,tower=warn,hyper=warn".into()),
            )
            .kill_on_drop(true);
        for (k, v) in env {
            command.env(k, v);
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", program.display()));
        Self {
            name: name.to_owned(),
            child,
            log,
        }
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the process (SIGKILL: no clean-up, as a crash).
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Sends SIGTERM and waits for the exit, as Kubernetes stops a pod.
    pub async fn terminate(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let _ = tokio::time::timeout(WAIT, self.child.wait()).await;
    }
}

/// The user of the test clusters' admin kubeconfig (a client certificate of
/// `scripts/test-cluster.sh`, group `system:masters`): what kubectl and the
/// operator's roles in most suites act as. The control plane's own components
/// have users of their own.
pub const ADMIN_USER: &str = "tuna-test-admin";

/// The Kubernetes minor version the cluster suites run on: `TUNA_TEST_K8S`
/// (`scripts/test.sh --k8s 1.34`), 1.37 by default.
pub fn k8s_version() -> String {
    std::env::var("TUNA_TEST_K8S").unwrap_or_else(|_| "1.37".into())
}

/// The workspace's `scripts/test-cluster.sh`.
fn test_cluster_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test-cluster.sh")
}

/// A real control plane (etcd, kube-apiserver, kube-controller-manager of
/// [`k8s_version`]) started by `scripts/test-cluster.sh`, with the chart's
/// CRDs applied. One per test: the operator's roles watch the whole cluster,
/// so two tests' agents in one cluster would both serve every Tunnel.
///
/// Dropping it stops every process it started; a watchdog stops them too
/// when the test binary dies without dropping it.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    /// The cluster's files (`scripts/test-cluster.sh --dir`).
    pub cluster_dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub audit_log: PathBuf,
    /// The API server's URL, for a suite that talks to it without kubectl.
    pub url: String,
    /// Closed on drop or exit: the watchdog then stops the cluster.
    watchdog: Option<Watchdog>,
}

/// A control plane of `scripts/test-cluster.sh`, started but not yet a
/// test's. Dropped untaken, it stops its processes.
struct Started {
    dir: Option<tempfile::TempDir>,
    cluster_dir: PathBuf,
    url: String,
    watchdog: Option<Watchdog>,
}

/// The shell that started a control plane and stops it once `pipe` closes.
struct Watchdog {
    pipe: Option<std::process::ChildStdin>,
    shell: std::process::Child,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.pipe.take());
        let _ = self.shell.wait();
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if self.dir.is_some() {
            stop_cluster(&self.cluster_dir);
        }
    }
}

/// `scripts/test-cluster.sh stop --dir DIR`.
fn stop_cluster(cluster_dir: &Path) {
    let _ = std::process::Command::new(test_cluster_script())
        .arg("stop")
        .arg("--dir")
        .arg(cluster_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status();
}

/// Starts a control plane: the start, then `stop` once the returned pipe
/// closes (dropped, or the test binary gone), run by one watchdog shell in a
/// session of its own (a ^C to the tests does not kill it first). The start
/// runs inside it, so a test binary that dies mid-start leaves nothing
/// (`harness::a_test_binary_that_exits_while_its_spare_starts_leaves_no_control_plane`).
fn start_control_plane() -> Result<Started, String> {
    use std::io::BufRead;
    let dir = tempfile::tempdir().expect("temp dir");
    let cluster_dir = dir.path().join("cluster");
    let start_log = dir.path().join("cluster-start.log");
    let mut watchdog = std::process::Command::new("setsid")
        .arg("sh")
        .arg("-c")
        .arg(
            // The status is written from a subshell: if the test binary is
            // gone, SIGPIPE ends that subshell, not the watchdog.
            r#""$0" start --version "$2" --dir "$1" >"$3" 2>&1; s=$?; (echo "$s"); cat >/dev/null; exec "$0" stop --dir "$1""#,
        )
        .arg(test_cluster_script())
        .arg(&cluster_dir)
        .arg(k8s_version())
        .arg(&start_log)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the watchdog shell");
    let pipe = watchdog.stdin.take();
    let stdout = watchdog.stdout.take().expect("piped");
    let watchdog = Watchdog {
        pipe,
        shell: watchdog,
    };
    let mut status = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut status)
        .expect("the start's status");
    let mut started = Started {
        dir: Some(dir),
        cluster_dir,
        url: String::new(),
        watchdog: Some(watchdog),
    };
    if status.trim() != "0" {
        return Err(format!(
            "scripts/test-cluster.sh start failed ({}):\n{}",
            status.trim(),
            std::fs::read_to_string(&start_log).unwrap_or_default()
        ));
    }
    let env = std::fs::read_to_string(started.cluster_dir.join("cluster.env"))
        .map_err(|e| format!("cluster.env: {e}"))?;
    started.url = env
        .lines()
        .find_map(|l| l.strip_prefix("SERVER="))
        .ok_or("no SERVER in cluster.env")?
        .to_owned();
    Ok(started)
}

/// The spare: a control plane started on a thread of its own while tests
/// run, so that the next [`Cluster::start`] finds one ready (each test still
/// gets a fresh cluster; only the wait for its start is hidden).
static SPARE: std::sync::Mutex<Option<std::thread::JoinHandle<Result<Started, String>>>> =
    std::sync::Mutex::new(None);

impl Cluster {
    /// Starts a control plane (HTTPS, RBAC, ServiceAccount admission, audit
    /// log) and applies the chart's CRDs with the real kubectl.
    pub async fn start() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let spare = SPARE.lock().unwrap().take();
        let started = tokio::task::spawn_blocking(move || {
            let started = match spare {
                Some(thread) => thread.join().expect("the spare's thread"),
                None => start_control_plane(),
            };
            let mut next = SPARE.lock().unwrap();
            if next.is_none() {
                *next = Some(std::thread::spawn(start_control_plane));
            }
            started
        })
        .await
        .expect("start task");
        let mut started = started.unwrap_or_else(|e| panic!("{e}"));
        let cluster = Self {
            kubeconfig: started.cluster_dir.join("kubeconfig"),
            audit_log: started.cluster_dir.join("audit.jsonl"),
            cluster_dir: started.cluster_dir.clone(),
            dir: started.dir.take().expect("untaken"),
            url: std::mem::take(&mut started.url),
            watchdog: started.watchdog.take(),
        };
        let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/tuna-k8s-operator/crds");
        cluster.kubectl_ok(&["apply", "-f", crds.to_str().unwrap()]);
        // A CRD serves once it is Established.
        cluster.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            crds.to_str().unwrap(),
        ]);
        cluster
    }

    /// A directory for this test's files.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs the real kubectl against the cluster as admin.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_stdin(args, None)
    }

    /// Runs kubectl with `stdin`.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        use std::io::Write;
        let mut child = std::process::Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl on PATH");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        drop(child.stdin.take());
        child.wait_with_output().expect("kubectl runs")
    }

    /// kubectl that must succeed; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `kubectl apply -f -` with `yaml`; must succeed.
    pub fn apply(&self, yaml: &str) -> String {
        let out = self.kubectl_stdin(&["apply", "-f", "-"], Some(yaml));
        assert!(
            out.status.success(),
            "kubectl apply failed: {}\n{yaml}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// A kube-rs client acting as admin.
    pub async fn client(&self) -> Client {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig");
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .expect("kube config");
        Client::try_from(config).expect("kube client")
    }

    /// The audit log so far, one entry per answered request, flattened:
    /// `user`, `groups`, `verb`, `group`, `resource`, `subresource`,
    /// `namespace`, `name`, `path` (non-resource requests), `code`,
    /// `user_agent`. A watch is one entry (its `ResponseStarted` stage).
    pub fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.audit_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|e| flatten_audit_event(&e))
            .collect()
    }
}

impl Cluster {
    /// The API server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cluster's CA (PEM): it signs the API server's certificate and the
    /// client certificates the API server accepts.
    pub fn ca_pem(&self) -> String {
        std::fs::read_to_string(self.cluster_dir.join("pki/ca.crt")).expect("the cluster's CA")
    }

    /// Writes a kubeconfig of this cluster that authenticates with `token`.
    pub fn write_token_kubeconfig(&self, path: &Path, token: &str) {
        let ca = self.cluster_dir.join("pki/ca.crt");
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster: {{server: \"{}\", certificate-authority: \"{}\"}}\nusers:\n- name: user\n  user: {{token: \"{token}\"}}\ncontexts:\n- name: test\n  context: {{cluster: test, user: user}}\ncurrent-context: test\n",
                self.url,
                ca.display()
            ),
        )
        .expect("writing a kubeconfig");
    }

    /// A 2 h token of ServiceAccount `namespace/name` for the API server
    /// (TokenRequest, `kubectl create token`); the ServiceAccount is created
    /// first if it does not exist. `extra`: more flags (`--audience`,
    /// `--bound-object-kind`, ...).
    pub fn token_for_service_account(&self, namespace: &str, name: &str, extra: &[&str]) -> String {
        self.apply(&format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {name}, namespace: {namespace}}}\n"
        ));
        let mut args = vec!["-n", namespace, "create", "token", name, "--duration", "2h"];
        args.extend_from_slice(extra);
        self.kubectl_ok(&args).trim().to_owned()
    }

    /// A kubeconfig of user `name` in `groups`: a client certificate signed
    /// by the cluster's CA (the API server's `--client-ca-file`), CN the
    /// user, O each group, as a cluster's administrator issues one.
    pub fn user_kubeconfig(&self, name: &str, groups: &[&str]) -> PathBuf {
        let pki = self.cluster_dir.join("pki");
        let (key, cert) = (
            self.path(&format!("{name}.key")),
            self.path(&format!("{name}.crt")),
        );
        let csr = self.path(&format!("{name}.csr"));
        let ext = self.path(&format!("{name}.ext"));
        std::fs::write(&ext, "extendedKeyUsage=clientAuth\n").unwrap();
        let subject: String = groups
            .iter()
            .map(|g| format!("/O={g}"))
            .chain([format!("/CN={name}")])
            .collect();
        let openssl = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .output()
                .expect("openssl on PATH");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let p = |p: &Path| p.display().to_string();
        openssl(&[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            &p(&key),
        ]);
        openssl(&[
            "req",
            "-new",
            "-key",
            &p(&key),
            "-subj",
            &subject,
            "-out",
            &p(&csr),
        ]);
        let serial = format!("0x{:x}", rand::random::<u64>());
        openssl(&[
            "x509",
            "-req",
            "-in",
            &p(&csr),
            "-CA",
            &p(&pki.join("ca.crt")),
            "-CAkey",
            &p(&pki.join("ca.key")),
            "-set_serial",
            &serial,
            "-days",
            "1",
            "-extfile",
            &p(&ext),
            "-out",
            &p(&cert),
        ]);
        let path = self.path(&format!("{name}.kubeconfig"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster: {{server: \"{}\", certificate-authority: \"{}\"}}\nusers:\n- name: {name}\n  user: {{client-certificate: \"{}\", client-key: \"{}\"}}\ncontexts:\n- name: test\n  context: {{cluster: test, user: {name}}}\ncurrent-context: test\n",
                self.url,
                p(&pki.join("ca.crt")),
                p(&cert),
                p(&key)
            ),
        )
        .unwrap();
        path
    }

    /// Waits until ServiceAccount `namespace/name` exists (the
    /// kube-controller-manager creates `default` in each new namespace;
    /// ServiceAccount admission refuses a pod of one that does not exist).
    pub fn wait_for_service_account(&self, namespace: &str, name: &str) {
        self.kubectl_ok(&[
            "-n",
            namespace,
            "wait",
            "--for=create",
            "--timeout=30s",
            &format!("serviceaccount/{name}"),
        ]);
    }

    /// `token` (a ServiceAccount token this cluster issued) with its times
    /// replaced: issued at `iat`, valid until `exp`, signed again with the
    /// cluster's service-account signing key (`pki/sa.key`, the API
    /// server's `--service-account-signing-key-file`) and the same key id.
    /// Every other claim (issuer, audiences, ServiceAccount and its UID,
    /// bound objects) is the real token's, so the API server treats it as
    /// the token it would have issued at `iat` for that lifetime: the only
    /// way to have a token that expires sooner than TokenRequest's
    /// ten-minute minimum.
    pub fn reissue_token(
        &self,
        token: &str,
        iat: std::time::SystemTime,
        exp: std::time::SystemTime,
    ) -> String {
        use base64::Engine as _;
        use rustls::pki_types::PrivateKeyDer;
        use rustls::pki_types::pem::PemObject;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut parts = token.split('.');
        let (header, payload) = (parts.next().unwrap(), parts.next().unwrap());
        let mut claims: Value = serde_json::from_slice(&b64.decode(payload).unwrap()).unwrap();
        let secs =
            |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        claims["iat"] = secs(iat).into();
        claims["nbf"] = secs(iat).into();
        claims["exp"] = secs(exp).into();
        let signed = format!("{header}.{}", b64.encode(claims.to_string()));
        let key = match PrivateKeyDer::from_pem_file(self.cluster_dir.join("pki/sa.key"))
            .expect("the service-account key")
        {
            PrivateKeyDer::Pkcs8(der) => der,
            other => panic!("sa.key is not PKCS#8: {other:?}"),
        };
        let pair = ring::signature::RsaKeyPair::from_pkcs8(key.secret_pkcs8_der()).unwrap();
        let mut signature = vec![0; pair.public().modulus_len()];
        pair.sign(
            &ring::signature::RSA_PKCS1_SHA256,
            &ring::rand::SystemRandom::new(),
            signed.as_bytes(),
            &mut signature,
        )
        .unwrap();
        format!("{signed}.{}", b64.encode(signature))
    }

    /// Waits until an entry of the audit log matches `pred`; returns it.
    pub async fn wait_for_audit(&self, pred: impl Fn(&Value) -> bool) -> Value {
        let found = tokio::time::timeout(WAIT, async {
            loop {
                if let Some(e) = self.audit().into_iter().find(|e| pred(e)) {
                    return e;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("no such request in the audit log within {WAIT:?}"))
    }

    /// Waits until at least `count` entries of the audit log match `pred`.
    pub async fn wait_for_audit_count(&self, count: usize, pred: impl Fn(&Value) -> bool) {
        let reached = tokio::time::timeout(WAIT, async {
            while self.audit().iter().filter(|e| pred(e)).count() < count {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        assert!(
            reached.is_ok(),
            "fewer than {count} such requests in the audit log within {WAIT:?}"
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        stop_cluster(&self.cluster_dir);
        drop(self.watchdog.take());
    }
}

/// One `audit.k8s.io/v1` Event as [`Cluster::audit`] gives it, or `None` for
/// a stage that repeats a request (a watch's `ResponseComplete`).
fn flatten_audit_event(e: &Value) -> Option<Value> {
    let stage = e["stage"].as_str().unwrap_or("");
    let watch = e["verb"] == "watch";
    if (watch && stage != "ResponseStarted") || (!watch && stage != "ResponseComplete") {
        return None;
    }
    let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
    let object = &e["objectRef"];
    let path = if object.is_null() {
        text(&e["requestURI"])
            .split('?')
            .next()
            .unwrap_or("")
            .to_owned()
    } else {
        String::new()
    };
    Some(serde_json::json!({
        "user": text(&e["user"]["username"]),
        "groups": e["user"]["groups"].clone(),
        "verb": text(&e["verb"]),
        "group": text(&object["apiGroup"]),
        "resource": text(&object["resource"]),
        "subresource": text(&object["subresource"]),
        "namespace": text(&object["namespace"]),
        "name": text(&object["name"]),
        "path": path,
        "code": e["responseStatus"]["code"].clone(),
        "user_agent": text(&e["userAgent"]),
    }))
}

/// The edge's bound addresses (`--addresses-file`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EdgeAddresses {
    pub agent: SocketAddr,
    pub http: Option<SocketAddr>,
    #[allow(dead_code)] // in the file; no suite dials the edge's HTTPS yet
    pub https: Option<SocketAddr>,
    pub api: Option<SocketAddr>,
    pub ca_file: Option<PathBuf>,
}

/// How to start an edge.
#[derive(Debug, Clone)]
pub struct EdgeOptions {
    pub base_domain: String,
    /// Extra flags (e.g. `--api-rate-burst 1`).
    pub extra: Vec<String>,
}

impl Default for EdgeOptions {
    fn default() -> Self {
        Self {
            base_domain: "tuna.test".into(),
            extra: Vec::new(),
        }
    }
}

/// A `tuna-operator edge` process with its data dir and an API key.
pub struct Edge {
    pub data_dir: PathBuf,
    pub process: Option<Process>,
    pub addrs: EdgeAddresses,
    /// An API key with tunnels:write and tunnels:connect.
    pub key: String,
    /// `--api-key-file` for the operator.
    pub key_file: PathBuf,
    /// The TCP port range of the edge.
    pub tcp_ports: (u16, u16),
    pub options: EdgeOptions,
    dir: PathBuf,
}

/// A random window of 20 TCP ports below the ephemeral range, for the edge's
/// TCP endpoints (the edge binds one only when a tunnel serves it).
fn tcp_window() -> (u16, u16) {
    use rand::Rng;
    let start = rand::rng().random_range(20_000u16..31_000);
    (start, start + 19)
}

impl Edge {
    /// Creates a key for `account` with `scopes` on a stopped edge's data dir
    /// (`tuna-operator edge keys create`), returning it.
    pub fn create_key(data_dir: &Path, account: &str, scopes: &[&str]) -> String {
        let mut args = vec![
            "edge".to_owned(),
            "keys".into(),
            "create".into(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--account".into(),
            account.into(),
        ];
        for s in scopes {
            args.push("--scope".into());
            args.push((*s).into());
        }
        let out = std::process::Command::new(operator_bin())
            .args(&args)
            .output()
            .expect("edge keys create");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// Starts an edge in `dir` (HTTPS REST API with the edge's own CA).
    pub async fn start(dir: &Path, options: EdgeOptions) -> Self {
        let data_dir = dir.join("edge-data");
        std::fs::create_dir_all(&data_dir).unwrap();
        let key = Self::create_key(&data_dir, "default", &["tunnels:write", "tunnels:connect"]);
        let key_file = dir.join("api-key");
        std::fs::write(&key_file, format!("{key}\n")).unwrap();
        let mut edge = Self {
            data_dir,
            process: None,
            addrs: EdgeAddresses {
                agent: "127.0.0.1:0".parse().unwrap(),
                http: None,
                https: None,
                api: None,
                ca_file: None,
            },
            key,
            key_file,
            tcp_ports: tcp_window(),
            options,
            dir: dir.to_owned(),
        };
        edge.run().await;
        edge
    }

    /// (Re)starts the process on the same data dir.
    pub async fn run(&mut self) {
        let addresses = self.dir.join("edge-addresses.json");
        let _ = std::fs::remove_file(&addresses);
        let api = self
            .addrs
            .api
            .map_or("127.0.0.1:0".to_owned(), |a| a.to_string());
        let mut args: Vec<String> = vec![
            "edge".into(),
            "--data-dir".into(),
            self.data_dir.display().to_string(),
            "--base-domain".into(),
            self.options.base_domain.clone(),
            "--http-listen".into(),
            self.addrs
                .http
                .map_or("127.0.0.1:0".to_owned(), |a| a.to_string()),
            "--https-listen".into(),
            "127.0.0.1:0".into(),
            "--agent-listen".into(),
            if self.addrs.agent.port() == 0 {
                "127.0.0.1:0".to_owned()
            } else {
                self.addrs.agent.to_string()
            },
            "--api-listen".into(),
            api,
            "--tcp-bind".into(),
            "127.0.0.1".into(),
            "--tcp-port-range".into(),
            format!("{}-{}", self.tcp_ports.0, self.tcp_ports.1),
            "--heartbeat-secs".into(),
            "2".into(),
            "--addresses-file".into(),
            addresses.display().to_string(),
        ];
        args.extend(self.options.extra.iter().cloned());
        let process = Process::spawn(&self.dir, "edge", &operator_bin(), &args, &[]);
        let read = tokio::time::timeout(WAIT, async {
            loop {
                if let Ok(text) = std::fs::read_to_string(&addresses) {
                    return serde_json::from_str::<EdgeAddresses>(&text).expect("addresses JSON");
                }
                // The file appears once every listener is bound.
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        let addrs = read.unwrap_or_else(|_| panic!("the edge did not start: {}", process.log()));
        self.addrs = addrs;
        self.process = Some(process);
    }

    /// Stops the process (SIGTERM), keeping the data dir.
    pub async fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.terminate().await;
        }
    }

    /// `https://127.0.0.1:PORT` of the REST API (`http://` with
    /// `--insecure-plaintext-api` among the extra flags).
    pub fn api_url(&self) -> String {
        let scheme = if self
            .options
            .extra
            .iter()
            .any(|f| f == "--insecure-plaintext-api")
        {
            "http"
        } else {
            "https"
        };
        format!("{scheme}://{}", self.addrs.api.expect("API listener"))
    }

    /// The CA file agents and API clients trust.
    pub fn ca_file(&self) -> PathBuf {
        self.addrs.ca_file.clone().expect("generated CA")
    }

    /// A REST client with the test's key.
    pub fn client(&self) -> tuna_agent::client::TunaClient {
        self.client_with(&self.key)
    }

    /// A REST client with another key.
    pub fn client_with(&self, key: &str) -> tuna_agent::client::TunaClient {
        let options = tuna_agent::client::ClientOptions::new(
            self.api_url(),
            tuna_protocol::api::Secret::new(key),
        )
        .with_ca_file(self.ca_file());
        tuna_agent::client::TunaClient::new(options).expect("edge client")
    }

    /// The flags a role takes to use this edge.
    pub fn operator_flags(&self) -> Vec<String> {
        vec![
            "--edge-api".into(),
            self.api_url(),
            "--edge-ca-file".into(),
            self.ca_file().display().to_string(),
            "--api-key-file".into(),
            self.key_file.display().to_string(),
        ]
    }

    /// The edge's log so far.
    pub fn log(&self) -> String {
        self.process.as_ref().map(Process::log).unwrap_or_default()
    }
}

/// Starts `tuna-operator <role> <args>` against the cluster's kubeconfig.
pub fn operator(cluster: &Cluster, name: &str, args: &[String], env: &[(&str, String)]) -> Process {
    let mut all_env = vec![("KUBECONFIG", cluster.kubeconfig.display().to_string())];
    all_env.extend(env.iter().cloned());
    Process::spawn(cluster.dir.path(), name, &operator_bin(), args, &all_env)
}

/// Probe and metrics listeners on port 0 plus `extra`.
pub fn role_args(role: &str, edge: &Edge, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["--log-format".to_owned(), "json".into(), role.to_owned()];
    args.extend(edge.operator_flags());
    args.extend(
        [
            "--metrics-listen",
            "127.0.0.1:0",
            "--probe-listen",
            "127.0.0.1:0",
        ]
        .map(String::from),
    );
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

/// Waits until `object` (namespaced) satisfies `cond`, else panics with the
/// logs of `processes`. Returns the object.
pub async fn wait_for<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    what: &str,
    processes: &[&Process],
    cond: impl Fn(&K) -> bool,
) -> K
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let waited = tokio::time::timeout(
        WAIT,
        await_condition(api.clone(), name, |o: Option<&K>| o.is_some_and(&cond)),
    )
    .await;
    match waited {
        Ok(Ok(Some(o))) => o,
        other => {
            let now = api.get_opt(name).await.ok().flatten();
            let logs: Vec<String> = processes
                .iter()
                .map(|p| format!("--- {} ---\n{}", p.name, p.log()))
                .collect();
            panic!(
                "{namespace}/{name}: {what} did not happen ({other:?}); now {now:#?}\n{}",
                logs.join("\n")
            );
        }
    }
}

/// Waits until `namespace/name` is gone.
pub async fn wait_gone<K>(client: &Client, namespace: &str, name: &str, processes: &[&Process])
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let gone = tokio::time::timeout(
        WAIT,
        kube::runtime::wait::await_condition(
            api.clone(),
            name,
            kube::runtime::wait::conditions::is_deleted(""),
        ),
    )
    .await;
    if gone.is_err() || api.get_opt(name).await.ok().flatten().is_some() {
        let logs: Vec<String> = processes
            .iter()
            .map(|p| format!("--- {} ---\n{}", p.name, p.log()))
            .collect();
        panic!("{namespace}/{name} was not deleted\n{}", logs.join("\n"));
    }
}

/// The hostnames in the Ingress's `status.loadBalancer.ingress`.
pub fn load_balancer_hostnames(ingress: &k8s_openapi::api::networking::v1::Ingress) -> Vec<&str> {
    ingress
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|e| e.hostname.as_deref())
        .collect()
}

/// The `Ready` condition of a status's conditions, as (status, reason, message).
pub fn ready_of(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Option<(String, String, String)> {
    conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Waits until `kind namespace/name` has an event `reason` whose message
/// contains `needle`, else panics with the events it has.
pub async fn wait_for_event(
    cluster: &Cluster,
    namespace: &str,
    kind: &str,
    name: &str,
    reason: &str,
    needle: &str,
) {
    let seen = tokio::time::timeout(WAIT, async {
        loop {
            if events_of(cluster, namespace, kind, name)
                .get(reason)
                .is_some_and(|m| m.iter().any(|m| m.contains(needle)))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    // With TUNA_TEST_LOG, a missing event also prints every process's log.
    if seen.is_err() && std::env::var_os("TUNA_TEST_LOG").is_some() {
        for e in std::fs::read_dir(cluster.dir.path()).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "log") {
                eprintln!(
                    "=== {}\n{}",
                    e.path().display(),
                    std::fs::read_to_string(e.path()).unwrap_or_default()
                );
            }
        }
    }
    assert!(
        seen.is_ok(),
        "no {reason} event with {needle:?} on {kind} {namespace}/{name}: {:?}",
        events_of(cluster, namespace, kind, name)
    );
}

/// Events (core/v1, as `kubectl describe` reads them) of an object: reason → messages.
pub fn events_of(
    cluster: &Cluster,
    namespace: &str,
    kind: &str,
    name: &str,
) -> BTreeMap<String, Vec<String>> {
    let out = cluster.kubectl_ok(&[
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        &format!("involvedObject.kind={kind},involvedObject.name={name}"),
        "-o",
        "json",
    ]);
    let list: Value = serde_json::from_str(&out).unwrap();
    let mut events: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in list["items"].as_array().into_iter().flatten() {
        events
            .entry(e["reason"].as_str().unwrap_or("").to_owned())
            .or_default()
            .push(e["message"].as_str().unwrap_or("").to_owned());
    }
    events
}

/// An authoritative DNS server on 127.0.0.1 (UDP and TCP) for one zone,
/// whose records a test adds live: the edge verifies custom domains with it
/// (`--dns-nameserver`).
pub struct DnsServer {
    pub addr: SocketAddr,
    zone: std::sync::Arc<hickory_server::store::in_memory::InMemoryZoneHandler>,
    server: hickory_server::Server<hickory_server::zone_handler::Catalog>,
    serial: u32,
}

impl DnsServer {
    /// Serves `zone` (e.g. `example.test.`).
    pub async fn start(zone: &str) -> Self {
        use hickory_server::proto::rr::rdata::SOA;
        use hickory_server::proto::rr::{LowerName, Name, RData, Record};
        use hickory_server::store::in_memory::InMemoryZoneHandler;
        use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneHandler, ZoneType};
        let origin = Name::from_ascii(zone).unwrap();
        let handler =
            InMemoryZoneHandler::empty(origin.clone(), ZoneType::Primary, AxfrPolicy::Deny);
        let soa = SOA::new(
            Name::from_ascii(format!("ns.{zone}")).unwrap(),
            Name::from_ascii(format!("admin.{zone}")).unwrap(),
            1,
            3600,
            600,
            86400,
            60,
        );
        assert!(
            handler
                .upsert(Record::from_rdata(origin.clone(), 60, RData::SOA(soa)), 1)
                .await
        );
        let handler = std::sync::Arc::new(handler);
        let mut catalog = Catalog::new();
        catalog.upsert(
            LowerName::new(&origin),
            vec![handler.clone() as std::sync::Arc<dyn ZoneHandler>],
        );
        let mut server = hickory_server::Server::new(catalog);
        let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = udp.local_addr().unwrap();
        server.register_socket(udp);
        if let Ok(tcp) = tokio::net::TcpListener::bind(addr).await {
            server.register_listener(tcp, Duration::from_secs(5), 64);
        }
        Self {
            addr,
            zone: handler,
            server,
            serial: 1,
        }
    }

    /// Adds a TXT record.
    pub async fn add_txt(&mut self, name: &str, value: &str) {
        use hickory_server::proto::rr::rdata::TXT;
        use hickory_server::proto::rr::{Name, RData, Record};
        self.serial += 1;
        let record = Record::from_rdata(
            Name::from_ascii(name).unwrap(),
            60,
            RData::TXT(TXT::new(vec![value.to_owned()])),
        );
        assert!(self.zone.upsert(record, self.serial).await);
    }

    /// Adds a CNAME record.
    pub async fn add_cname(&mut self, name: &str, target: &str) {
        use hickory_server::proto::rr::rdata::CNAME;
        use hickory_server::proto::rr::{Name, RData, Record};
        self.serial += 1;
        let record = Record::from_rdata(
            Name::from_ascii(name).unwrap(),
            60,
            RData::CNAME(CNAME(Name::from_ascii(target).unwrap())),
        );
        assert!(self.zone.upsert(record, self.serial).await);
    }

    /// Stops serving.
    pub async fn stop(mut self) {
        let _ = self.server.shutdown_gracefully().await;
    }
}

/// A random address of the test clusters' service CIDR (127.16.0.0/12,
/// `scripts/test-cluster.sh`), other than its first (the `kubernetes`
/// Service's): tests in parallel each bind the documentation's ports (8080,
/// 5432) on one and give it to a Service as its cluster IP, which the agent
/// dials as it dials a ClusterIP in a cluster.
pub fn loopback_ip() -> std::net::Ipv4Addr {
    use rand::Rng;
    let mut rng = rand::rng();
    std::net::Ipv4Addr::new(
        127,
        rng.random_range(16..=31),
        rng.random_range(1..=255),
        rng.random_range(1..=254),
    )
}

/// Binds `port` on a fresh loopback address (retrying other addresses if busy).
pub async fn bind_loopback(port: u16) -> tokio::net::TcpListener {
    for _ in 0..32 {
        if let Ok(l) = tokio::net::TcpListener::bind((loopback_ip(), port)).await {
            return l;
        }
    }
    panic!("no loopback address with port {port} free");
}

/// An HTTP/1.1 backend answering every request with JSON naming `name`, the
/// path and the request headers (keep-alive honoured).
pub async fn http_backend(name: &'static str, listener: tokio::net::TcpListener) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                buf.extend_from_slice(&chunk[..n]);
                                continue;
                            }
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    buf.drain(..end + 4);
                    let mut lines = head.split("\r\n");
                    let request = lines.next().unwrap_or("").to_owned();
                    let path = request.split(' ').nth(1).unwrap_or("").to_owned();
                    let mut headers = serde_json::Map::new();
                    for line in lines {
                        if let Some((k, v)) = line.split_once(':') {
                            headers.insert(
                                k.trim().to_ascii_lowercase(),
                                Value::String(v.trim().to_owned()),
                            );
                        }
                    }
                    let body =
                        serde_json::json!({"backend": name, "path": path, "headers": headers})
                            .to_string();
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if conn.write_all(response.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A TCP backend echoing every byte.
pub async fn echo_backend(listener: tokio::net::TcpListener) -> SocketAddr {
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

/// One HTTP/1.1 request on `conn` (keep-alive), returning status and body.
pub async fn http_request(
    conn: &mut tokio::net::TcpStream,
    host: &str,
    path: &str,
    extra_headers: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra_headers}\r\n");
    conn.write_all(request.as_bytes())
        .await
        .expect("send request");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let (status, header_end, length) = loop {
        let n = conn.read(&mut chunk).await.expect("read response");
        assert!(
            n > 0,
            "connection closed before the response: {}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let status: u16 = head
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            break (status, end + 4, length);
        }
    };
    while buf.len() < header_end + length {
        let n = conn.read(&mut chunk).await.expect("read body");
        assert!(n > 0, "connection closed in the body");
        buf.extend_from_slice(&chunk[..n]);
    }
    (
        status,
        String::from_utf8_lossy(&buf[header_end..header_end + length]).to_string(),
    )
}

/// A fresh connection to `addr` and one request.
pub async fn http_get(addr: SocketAddr, host: &str, path: &str) -> (u16, String) {
    let mut conn = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the edge");
    http_request(&mut conn, host, path, "").await
}

/// `tuna-operator agent` against the cluster and the edge (resync every 2 s
/// unless `extra` gives `--resync-interval`).
pub fn agent(cluster: &Cluster, edge: &Edge, name: &str, extra: &[&str]) -> Process {
    let agent_addr = edge.addrs.agent.to_string();
    let mut args = vec!["--edge-agent", &agent_addr];
    if !extra.contains(&"--resync-interval") {
        args.extend(["--resync-interval", "2s"]);
    }
    args.extend_from_slice(extra);
    operator(
        cluster,
        name,
        &role_args("agent", edge, &args),
        &[("POD_NAME", name.to_owned())],
    )
}

/// `tuna-operator controller` against the cluster and the edge.
/// Short intervals by default; a flag in `extra` replaces its default.
pub fn controller(cluster: &Cluster, edge: &Edge, name: &str, extra: &[&str]) -> Process {
    let mut args = vec![];
    for (flag, value) in [
        ("--resync-interval", "2s"),
        ("--dns-recheck-interval", "1s"),
        ("--leader-election-lease-duration", "3s"),
    ] {
        if !extra.contains(&flag) {
            args.extend([flag, value]);
        }
    }
    args.extend_from_slice(extra);
    operator(
        cluster,
        name,
        &role_args("controller", edge, &args),
        &[
            ("POD_NAME", name.to_owned()),
            ("POD_NAMESPACE", "default".to_owned()),
        ],
    )
}

/// The IngressClass the chart creates.
pub const INGRESS_CLASS: &str = "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata: {name: tuna}\nspec: {controller: k8s.tuna.am/ingress-controller}\n";

/// A plain-HTTP proxy in front of an edge's REST API that answers the first
/// `failures` requests itself with `503` (as an edge whose storage fails
/// would), then forwards connections untouched: the only way to get 5xx out
/// of a real edge on demand.
pub async fn fault_injecting_proxy(upstream: SocketAddr, failures: usize) -> SocketAddr {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = std::sync::Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let served = std::sync::Arc::clone(&served);
            tokio::spawn(async move {
                if served.fetch_add(1, Ordering::SeqCst) < failures {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match client.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let body = r#"{"code":"internal","message":"injected storage failure"}"#;
                    let _ = client
                        .write_all(
                            format!(
                                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                                body.len()
                            )
                            .as_bytes(),
                        )
                        .await;
                    return;
                }
                if let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    addr
}

/// A test host in a network namespace of its own, joined to this one by a
/// veth pair with a /30 of 198.18.0.0/16 (the lower half of RFC 2544's
/// benchmarking range, never routed; the upper half holds the test node's
/// bridge, `scripts/test-cluster.sh --node`): the only kind of non-loopback
/// address a test may send to.
/// Where Kubernetes refuses loopback addresses (EndpointSlice endpoints), a
/// backend listens here. Dropping it deletes the namespace and the pair.
pub struct NetnsHost {
    name: String,
    host_link: String,
    /// The address of the namespace's side.
    pub ip: std::net::Ipv4Addr,
    /// The address of this side (local: nothing of a test's listens there).
    pub host_ip: std::net::Ipv4Addr,
}

impl NetnsHost {
    /// Creates the namespace and its link (`ip netns add`, `ip link`).
    pub fn create() -> Self {
        use rand::Rng;
        let id: u32 = rand::rng().random_range(0..1 << 14);
        // The /30's base in 198.18.0.0/16: host .1, namespace .2.
        let base = u32::from(std::net::Ipv4Addr::new(198, 18, 0, 0)) + (id << 2);
        let (host_ip, ip) = (
            std::net::Ipv4Addr::from(base + 1),
            std::net::Ipv4Addr::from(base + 2),
        );
        let name = format!("tuna-e2e-{id}");
        let (host_link, ns_link) = (format!("tvh{id}"), format!("tvn{id}"));
        let ip_cmd = |args: &[&str]| {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .expect("`ip` (iproute2) on PATH");
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        ip_cmd(&["netns", "add", &name]);
        let host = Self {
            name: name.clone(),
            host_link: host_link.clone(),
            ip,
            host_ip,
        };
        ip_cmd(&[
            "link", "add", &host_link, "type", "veth", "peer", "name", &ns_link,
        ]);
        ip_cmd(&["link", "set", &ns_link, "netns", &name]);
        ip_cmd(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_link]);
        ip_cmd(&["link", "set", &host_link, "up"]);
        let ns_addr = format!("{ip}/30");
        for args in [
            ["addr", "add", ns_addr.as_str(), "dev", ns_link.as_str()],
            ["link", "set", ns_link.as_str(), "up", ""],
            ["link", "set", "lo", "up", ""],
        ] {
            let mut all = vec!["netns", "exec", name.as_str(), "ip"];
            all.extend(args.into_iter().filter(|a| !a.is_empty()));
            ip_cmd(&all);
        }
        host
    }

    /// A listener on `port` of the namespace's address: bound by a thread
    /// that entered the namespace (setns), so the socket lives there.
    pub fn bind(&self, port: u16) -> tokio::net::TcpListener {
        use std::os::fd::AsRawFd;
        let path = format!("/run/netns/{}", self.name);
        let addr = SocketAddr::from((self.ip, port));
        let listener = std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("the namespace's file");
            // SAFETY: setns on this short-lived thread only; the fd is open.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            std::net::TcpListener::bind(addr).expect("bind in the namespace")
        })
        .join()
        .expect("binding thread");
        listener.set_nonblocking(true).unwrap();
        tokio::net::TcpListener::from_std(listener).expect("tokio listener")
    }
}

impl Drop for NetnsHost {
    fn drop(&mut self) {
        for args in [
            ["link", "del", self.host_link.as_str()],
            ["netns", "del", self.name.as_str()],
        ] {
            let _ = std::process::Command::new("ip").args(args).output();
        }
    }
}
