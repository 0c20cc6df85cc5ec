//! The connector family's two-cluster set-up (tests/e2e/connector.rs,
//! tests/e2e/csi.rs): two real control planes (`scripts/test-cluster.sh`),
//! the operator's cluster with the connector CRDs and the role's RBAC, the
//! target API server with a reader and some pods, and the real
//! `tuna-operator connectors` process with its proxy.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use tonic::transport::{Channel, Endpoint};
use tuna_crds::Connector;
use tuna_operator::csi::proto::{NodePublishVolumeRequest, VolumeCapability, volume_capability};

use super::{Cluster, Process, WAIT, operator_bin, wait_for};

pub const NS: &str = "k8s-connector-demo";
pub const ROLE_SA: &str = "system:serviceaccount:tuna-system:tuna-operator-connectors";

/// The quick start's manifests, with this test's token and address.
pub fn quick_start(token: &str, address: &str) -> String {
    format!(
        "kind: Secret
apiVersion: v1
metadata:
  name: k8s-secret
type: connectors.cpaas.io/bearer-token
stringData:
  token: {token} # Замените на ваш k8s bearer token
---
apiVersion: connectors.alauda.io/v1alpha1
kind: Connector
metadata:
  name: k8s-connector
spec:
  connectorClassName: k8s
  address: {address} # Замените на адрес вашего k8s apiserver
  auth:
    name: bearerTokenAuth
    secretRef:
      name: k8s-secret
"
    )
}

pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The real kubectl with `kubeconfig`, a discovery cache of its own, no
/// proxy from the environment; `stdin` if given.
pub fn kubectl(kubeconfig: &Path, home: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write;
    let mut child = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("HOME", home)
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .env_remove("KUBECONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl on PATH");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.unwrap_or("").as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

pub fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub fn fails(out: Output, what: &str) -> String {
    assert!(
        !out.status.success(),
        "{what} should fail: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).unwrap()
}

/// The proxy password of a rendered kubeconfig.
pub fn password_of(kubeconfig: &str) -> String {
    let v: Value = serde_saphyr::from_str(kubeconfig).unwrap();
    let url = v["clusters"][0]["cluster"]["proxy-url"].as_str().unwrap();
    let userinfo = url
        .strip_prefix("http://")
        .unwrap()
        .split_once('@')
        .unwrap()
        .0;
    userinfo.split_once(':').unwrap().1.to_owned()
}

pub struct Env {
    pub dir: tempfile::TempDir,
    pub operator: Cluster,
    pub target: Cluster,
    /// The target's token the Connector's Secret holds.
    pub target_token: String,
    pub role: Process,
    pub proxy: SocketAddr,
    pub client: kube::Client,
}

impl Env {
    pub async fn start() -> Self {
        Self::start_with(&[], &[]).await
    }

    /// [`Self::start`], the role with `extra_args` and `extra_env` too.
    pub async fn start_with(extra_args: &[&str], extra_env: &[(&str, String)]) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let (operator, target) = tokio::join!(Cluster::start(), Cluster::start());
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let admin = operator.kubeconfig.clone();
        let k = |args: &[&str], stdin: Option<&str>| kubectl(&admin, &home, args, stdin);
        ok(
            k(
                &["apply", "-f", repo("crds/connectors").to_str().unwrap()],
                None,
            ),
            "installing the connector CRDs",
        );
        ok(
            k(&["create", "namespace", "tuna-system"], None),
            "namespace",
        );
        ok(
            k(
                &[
                    "apply",
                    "-f",
                    repo("examples/connectors/rbac.yaml").to_str().unwrap(),
                ],
                None,
            ),
            "the role's RBAC",
        );
        ok(k(&["create", "namespace", NS], None), "namespace");
        let role_token =
            operator.token_for_service_account("tuna-system", "tuna-operator-connectors", &[]);
        let role_kubeconfig = dir.path().join("role.kubeconfig");
        operator.write_token_kubeconfig(&role_kubeconfig, &role_token);

        // The target: a reader that may list and watch pods, and some pods.
        let target_token = seed_target(&target, &home);

        let target_ca = dir.path().join("target-ca.pem");
        std::fs::write(&target_ca, target.ca_pem()).unwrap();
        let args: Vec<String> = [
            "--log-format",
            "json",
            "connectors",
            "--proxy-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--probe-listen",
            "127.0.0.1:0",
            "--namespace",
            "tuna-system",
        ]
        .map(String::from)
        .to_vec();
        // A fast resync unless the test sets its own (clap takes a flag once).
        let resync = (!extra_args.contains(&"--resync-interval"))
            .then_some(["--resync-interval", "1s"])
            .into_iter()
            .flatten();
        let args: Vec<String> = args
            .into_iter()
            .chain(resync.map(String::from))
            .chain(extra_args.iter().map(|a| a.to_string()))
            .collect();
        let mut env = vec![
            ("KUBECONFIG", role_kubeconfig.display().to_string()),
            ("POD_NAME", "tuna-operator-connectors-0".into()),
            // The target's CA is a system root of the role's host.
            ("SSL_CERT_FILE", target_ca.display().to_string()),
        ];
        env.extend(extra_env.iter().cloned());
        let role = Process::spawn(dir.path(), "connectors", &operator_bin(), &args, &env);
        let proxy = proxy_addr(&role).await;
        let client = operator.client().await;
        Self {
            dir,
            operator,
            target,
            target_token,
            role,
            proxy,
            client,
        }
    }

    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// kubectl as the operator cluster's admin.
    pub fn op(&self, args: &[&str], stdin: Option<&str>) -> Output {
        kubectl(&self.operator.kubeconfig, &self.home(), args, stdin)
    }

    /// kubectl as the target's admin.
    pub fn tgt(&self, args: &[&str], stdin: Option<&str>) -> Output {
        kubectl(&self.target.kubeconfig, &self.home(), args, stdin)
    }

    /// `tuna-operator connector kubeconfig …` as the operator cluster's admin
    /// (a person or a CI job), with the proxy at its test address.
    pub fn mint_kubeconfig(&self, service_account: &str) -> String {
        let out = std::process::Command::new(operator_bin())
            .args([
                "connector",
                "kubeconfig",
                "-n",
                NS,
                "k8s-connector",
                "--service-account",
                service_account,
                "--duration",
                "30m",
                "--proxy-url",
                &format!("http://{}", self.proxy),
            ])
            .env("KUBECONFIG", &self.operator.kubeconfig)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "connector kubeconfig: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Writes `text` as a kubeconfig file and returns its path.
    pub fn kubeconfig_file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// kubectl with a rendered kubeconfig: through the proxy.
    pub fn via(&self, kubeconfig: &Path, args: &[&str]) -> Output {
        let home = self.dir.path().join("home-via");
        std::fs::create_dir_all(&home).unwrap();
        kubectl(kubeconfig, &home, args, None)
    }

    pub async fn connector(&self, what: &str, cond: impl Fn(&Connector) -> bool) -> Connector {
        wait_for(&self.client, NS, "k8s-connector", what, &[&self.role], cond).await
    }
}

/// Waits until the role logs where its proxy listens.
pub async fn proxy_addr(role: &Process) -> SocketAddr {
    let found = tokio::time::timeout(WAIT, async {
        loop {
            for line in role.log().lines() {
                if let Ok(v) = serde_json::from_str::<Value>(line)
                    && v["fields"]["message"] == "connector proxy listening"
                {
                    return v["fields"]["addr"].as_str().unwrap().parse().unwrap();
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("the proxy never listened:\n{}", role.log()))
}

pub const TARGET_RBAC: &str = "apiVersion: v1
kind: ServiceAccount
metadata: {name: reader, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: pod-reader}
rules:
- apiGroups: ['']
  resources: [pods]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: reader-pods}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-reader}
subjects:
- {kind: ServiceAccount, name: reader, namespace: default}
- {kind: ServiceAccount, name: reader2, namespace: default}
";

pub const TARGET_PODS: &str = "apiVersion: v1
kind: Pod
metadata: {name: web-7d4f9, namespace: default}
spec: {containers: [{name: web, image: nginx}]}
---
apiVersion: v1
kind: Pod
metadata: {name: coredns-5d78c, namespace: kube-system}
spec: {containers: [{name: coredns, image: coredns}]}
";

/// Seeds a target API server: a `reader` that may list and watch pods
/// ([`TARGET_RBAC`]), some pods ([`TARGET_PODS`]); returns a 2 h token of
/// the reader.
pub fn seed_target(target: &Cluster, home: &Path) -> String {
    let t = |args: &[&str], stdin: Option<&str>| kubectl(&target.kubeconfig, home, args, stdin);
    ok(t(&["apply", "-f", "-"], Some(TARGET_RBAC)), "target RBAC");
    // The pods run as their namespace's `default` ServiceAccount, which the
    // kube-controller-manager creates (ServiceAccount admission refuses a
    // pod whose ServiceAccount does not exist yet).
    for namespace in ["default", "kube-system"] {
        target.wait_for_service_account(namespace, "default");
    }
    ok(t(&["apply", "-f", "-"], Some(TARGET_PODS)), "target pods");
    let token = t(
        &[
            "-n",
            "default",
            "create",
            "token",
            "reader",
            "--duration",
            "2h",
        ],
        None,
    );
    ok(token, "the target's token").trim().to_owned()
}

/// Every (group, resource, verb) `user` asked the cluster for (its audit
/// log), none refused. A server-side apply that creates its object (`201`)
/// counts as a `patch` and a `create`: the API server's patch handler
/// authorizes the creation as a create.
pub fn rbac_used(cluster: &Cluster, user: &str) -> BTreeSet<(String, String, String)> {
    let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
    cluster
        .audit()
        .into_iter()
        .filter(|e| e["user"] == user && text(&e["path"]).is_empty())
        .flat_map(|e| {
            assert!(e["code"] != 403, "{user} was refused {e}");
            let (resource, subresource) = (text(&e["resource"]), text(&e["subresource"]));
            let resource = if subresource.is_empty() {
                resource
            } else {
                format!("{resource}/{subresource}")
            };
            let verb = text(&e["verb"]);
            let create = (verb == "patch" && e["code"] == 201)
                .then(|| (text(&e["group"]), resource.clone(), "create".to_owned()));
            std::iter::once((text(&e["group"]), resource, verb)).chain(create)
        })
        .collect()
}

/// Every (group, resource, verb) the RBAC manifest grants.
pub fn rbac_rules(yaml: &str) -> BTreeSet<(String, String, String)> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).unwrap();
    let mut out = BTreeSet::new();
    for doc in docs {
        for rule in doc["rules"].as_array().into_iter().flatten() {
            for group in rule["apiGroups"].as_array().unwrap() {
                for resource in rule["resources"].as_array().unwrap() {
                    for verb in rule["verbs"].as_array().unwrap() {
                        out.insert((
                            group.as_str().unwrap().to_owned(),
                            resource.as_str().unwrap().to_owned(),
                            verb.as_str().unwrap().to_owned(),
                        ));
                    }
                }
            }
        }
    }
    out
}

/// A pod of the operator's cluster, as kubelet knows it.
pub struct Pod {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub service_account: String,
}

/// A gRPC channel over the plugin's Unix socket, as kubelet dials it.
pub async fn channel(socket: &Path) -> Channel {
    let socket = socket.to_owned();
    Endpoint::try_from("http://csi.invalid")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(socket).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .expect("connecting to the plugin's socket")
}

/// What kubelet sends to publish `pod`'s inline volume with `attributes`.
pub fn publish_request(
    pod: &Pod,
    target: &Path,
    attributes: &[(&str, &str)],
) -> NodePublishVolumeRequest {
    let mut context: HashMap<String, String> = attributes
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    for (k, v) in [
        ("csi.storage.k8s.io/pod.name", &pod.name),
        ("csi.storage.k8s.io/pod.namespace", &pod.namespace),
        ("csi.storage.k8s.io/pod.uid", &pod.uid),
        (
            "csi.storage.k8s.io/serviceAccount.name",
            &pod.service_account,
        ),
        ("csi.storage.k8s.io/ephemeral", &"true".to_owned()),
    ] {
        context.entry(k.to_owned()).or_insert_with(|| v.clone());
    }
    NodePublishVolumeRequest {
        volume_id: format!("csi-{}", pod.uid),
        publish_context: HashMap::new(),
        staging_target_path: String::new(),
        target_path: target.display().to_string(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(volume_capability::AccessType::Mount(
                volume_capability::MountVolume::default(),
            )),
            access_mode: Some(volume_capability::AccessMode {
                mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
        }),
        readonly: true,
        secrets: HashMap::new(),
        volume_context: context,
    }
}

/// kubelet's key for the pod's tokens (`volume_context`, or `secrets` on
/// Kubernetes 1.35 with `serviceAccountTokenInSecrets`).
pub const KUBELET_TOKENS: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// What kubelet does for the CSIDriver's `tokenRequests` (the chart's:
/// audience `connectors.alauda.io`, 1800 s): a TokenRequest for the pod's
/// ServiceAccount bound to the pod, made with `client` (the test's admin,
/// as kubelet makes it with its own identity); returns kubelet's JSON
/// `{"<audience>": {"token", "expirationTimestamp"}}` and the token.
pub async fn kubelet_tokens(client: &kube::Client, pod: &Pod) -> (String, String) {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    use k8s_openapi::api::core::v1::ServiceAccount;
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec!["connectors.alauda.io".into()],
            expiration_seconds: Some(1800),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name.clone()),
                uid: Some(pod.uid.clone()),
            }),
        },
        ..Default::default()
    };
    let status = kube::Api::<ServiceAccount>::namespaced(client.clone(), &pod.namespace)
        .create_token_request(&pod.service_account, &Default::default(), &request)
        .await
        .expect("kubelet's TokenRequest")
        .status
        .expect("a token");
    let json = serde_json::json!({"connectors.alauda.io": {
        "token": status.token,
        "expirationTimestamp": status.expiration_timestamp,
    }});
    (json.to_string(), status.token)
}

/// `request` with kubelet's `tokens` in its `volume_context`.
pub fn with_tokens(
    mut request: NodePublishVolumeRequest,
    tokens: &str,
) -> NodePublishVolumeRequest {
    request
        .volume_context
        .insert(KUBELET_TOKENS.into(), tokens.into());
    request
}
