//! The `connectors-csi` node plugin end to end: a test client speaks real
//! CSI gRPC to the plugin's Unix socket, as kubelet does for an inline
//! ephemeral volume (`podInfoOnMount: true`, `requiresRepublish: true`),
//! against the connector family's two real control planes
//! (tests/e2e/support/connectors.rs):
//! the real `tuna-operator csi` process runs with exactly the RBAC of
//! `examples/connectors/csi-rbac.yaml` and its ServiceAccount's token, the
//! real connectors role serves the proxy, and the real `kubectl` uses the
//! kubeconfig the plugin wrote. The test does what kubelet does for the
//! CSIDriver's `tokenRequests`: a TokenRequest bound to the pod, with its
//! own identity, passed in `csi.storage.k8s.io/serviceAccount.tokens`.
//!
//! What only a real kubelet shows is not here: the registration through the
//! node-driver-registrar, the bind mount into the container, the periodic
//! republish schedule (the test calls NodePublishVolume again itself). The
//! test clusters run no kubelet and no scheduler: pods name their node
//! (`spec.nodeName`, what the scheduler's binding sets) and stay Pending.

use crate::support;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use serde_json::Value;
use support::connectors::{
    Env, KUBELET_TOKENS, NS, Pod, channel, kubelet_tokens, ok, publish_request, quick_start,
    rbac_rules, rbac_used, repo, with_tokens,
};
use support::{Process, WAIT, operator_bin};
use tonic::Code;
use tuna_operator::csi::proto::identity_client::IdentityClient;
use tuna_operator::csi::proto::node_client::NodeClient;
use tuna_operator::csi::proto::{
    GetPluginInfoRequest, NodeGetCapabilitiesRequest, NodeGetInfoRequest,
    NodeUnpublishVolumeRequest, ProbeRequest, node_service_capability, volume_capability,
};

const CSI_SA: &str = "system:serviceaccount:tuna-system:tuna-operator-csi";

/// Applies a pod running on `node` (as the scheduler binds it) and reads
/// its uid.
fn create_pod(env: &Env, namespace: &str, name: &str, service_account: &str, node: &str) -> Pod {
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  nodeName: {node}\n  serviceAccountName: {service_account}\n  restartPolicy: Never\n  containers:\n  - name: kubectl\n    image: bitnami/kubectl:1.30.1\n    env: [{{name: KUBECONFIG, value: /opt/kube/kubeconfig}}]\n    volumeMounts: [{{name: kubeconfig, mountPath: /opt/kube}}]\n  volumes:\n  - name: kubeconfig\n    csi:\n      readOnly: true\n      driver: connectors-csi\n      volumeAttributes: {{connector.name: k8s-connector, connector.namespace: {NS}, configuration.names: kubeconfig}}\n"
    );
    ok(env.op(&["apply", "-f", "-"], Some(&manifest)), "a pod");
    let uid = ok(
        env.op(
            &[
                "-n",
                namespace,
                "get",
                "pod",
                name,
                "-o",
                "jsonpath={.metadata.uid}",
            ],
            None,
        ),
        "its uid",
    );
    Pod {
        name: name.into(),
        namespace: namespace.into(),
        uid,
        service_account: service_account.into(),
    }
}

/// The plugin and the kubelet directory it writes into.
struct Plugin {
    process: Process,
    socket: PathBuf,
}

/// The plugin as `name`, with `--proxy-url` of the test's proxy unless
/// `extra` has `--cluster-domain` (then the URL is the Connector's Service).
async fn start_plugin(env: &Env, name: &str, extra: &[&str]) -> Plugin {
    let socket = env.dir.path().join(format!("{name}/csi.sock"));
    let token = env
        .operator
        .token_for_service_account("tuna-system", "tuna-operator-csi", &[]);
    let kubeconfig = env.dir.path().join(format!("{name}.kubeconfig"));
    env.operator.write_token_kubeconfig(&kubeconfig, &token);
    let mut args: Vec<String> = [
        "--log-format",
        "json",
        "csi",
        "--endpoint",
        &format!("unix://{}", socket.display()),
        "--node-id",
        "node-1",
        "--namespace",
        "tuna-system",
    ]
    .map(String::from)
    .to_vec();
    if !extra.contains(&"--cluster-domain") {
        args.extend(["--proxy-url".to_owned(), format!("http://{}", env.proxy)]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let process = Process::spawn(
        env.dir.path(),
        name,
        &operator_bin(),
        &args,
        &[("KUBECONFIG", kubeconfig.display().to_string())],
    );
    // Ready once it logs its socket.
    let ready = tokio::time::timeout(WAIT, async {
        loop {
            if process.log().lines().any(|l| {
                serde_json::from_str::<Value>(l)
                    .is_ok_and(|v| v["fields"]["message"] == "CSI plugin listening")
            }) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        ready.is_ok(),
        "the plugin never listened:\n{}",
        process.log()
    );
    Plugin { process, socket }
}

/// The target path kubelet would give this pod's volume; its parent exists.
fn target_of(env: &Env, pod: &Pod) -> PathBuf {
    let parent = env.dir.path().join(format!(
        "kubelet/pods/{}/volumes/kubernetes.io~csi/kubeconfig",
        pod.uid
    ));
    std::fs::create_dir_all(&parent).unwrap();
    parent.join("mount")
}

/// The documentation's volume attributes.
const DOCUMENTED: &[(&str, &str)] = &[
    ("connector.name", "k8s-connector"),
    ("configuration.names", "kubeconfig"),
];

/// The documentation's examples carry exactly [`DOCUMENTED`], read-only.
fn check_examples_use_the_documented_volume() {
    for (file, spec) in [
        ("examples/connectors/job.yaml", "/spec/template/spec"),
        ("examples/connectors/inspect-pod.yaml", "/spec"),
    ] {
        let doc: Value =
            serde_saphyr::from_str(&std::fs::read_to_string(repo(file)).unwrap()).unwrap();
        let csi = &doc.pointer(spec).unwrap()["volumes"][0]["csi"];
        assert_eq!(csi["driver"], "connectors-csi", "{file}");
        assert_eq!(csi["readOnly"], true, "{file}");
        let attributes: BTreeSet<(String, String)> = csi["volumeAttributes"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect();
        let documented: BTreeSet<(String, String)> = DOCUMENTED
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(attributes, documented, "{file}");
    }
}

fn files_of(target: &Path) -> BTreeSet<String> {
    std::fs::read_dir(target)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".."))
        .collect()
}

fn token_of(target: &Path) -> String {
    std::fs::read_to_string(target.join("context.token")).unwrap()
}

/// Who a token is and which pod it is bound to (a TokenReview as admin).
async fn review(env: &Env, token: &str) -> Option<(String, String)> {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_owned()),
            audiences: Some(vec!["connectors.alauda.io".into()]),
        },
        ..Default::default()
    };
    let answer = Api::<TokenReview>::all(env.client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    let status = answer.status?;
    if status.authenticated != Some(true) {
        return None;
    }
    let user = status.user?;
    let pod = user
        .extra
        .and_then(|e| e.get("authentication.kubernetes.io/pod-name").cloned())
        .and_then(|v| v.into_iter().next())
        .unwrap_or_default();
    Some((user.username?, pod))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_publishes_a_kubeconfig_that_kubectl_uses_through_the_proxy() {
    let env = Env::start().await;
    ok(
        env.op(
            &["apply", "-n", NS, "-f", "-"],
            Some(&quick_start(&env.target_token, env.target.url())),
        ),
        "apply the quick start",
    );
    env.connector("Ready", |c| {
        c.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    })
    .await;
    ok(
        env.op(
            &[
                "apply",
                "-f",
                repo("examples/connectors/csi-rbac.yaml").to_str().unwrap(),
            ],
            None,
        ),
        "the plugin's RBAC",
    );
    let plugin = start_plugin(&env, "csi", &[]).await;
    let channel = channel(&plugin.socket).await;
    let mut identity = IdentityClient::new(channel.clone());
    let mut node = NodeClient::new(channel.clone());

    // --- Identity and Node capabilities, as the registrar and kubelet ask. --
    let info = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "connectors-csi");
    assert!(!info.vendor_version.is_empty());
    let probe = identity.probe(ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
    let node_info = node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node_info.node_id, "node-1");
    let caps = node
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let rpcs: Vec<i32> = caps
        .capabilities
        .iter()
        .filter_map(|c| {
            c.r#type
                .as_ref()
                .map(|node_service_capability::Type::Rpc(rpc)| rpc.r#type)
        })
        .collect();
    assert_eq!(
        rpcs,
        [node_service_capability::rpc::Type::VolumeMountGroup as i32],
        "no staging: inline volumes are published only"
    );

    // --- The documentation's Job: publish writes a kubeconfig. -------------
    // Its pod runs as `default`, which the kube-controller-manager's
    // ServiceAccount controller makes in every namespace.
    env.operator.wait_for_service_account(NS, "default");
    let job = create_pod(&env, NS, "k8s-access-x7k2p", "default", "node-1");
    let target = target_of(&env, &job);
    let (tokens, kubelet_token) = kubelet_tokens(&env.client, &job).await;
    node.node_publish_volume(with_tokens(
        publish_request(&job, &target, DOCUMENTED),
        &tokens,
    ))
    .await
    .unwrap();
    assert_eq!(
        files_of(&target),
        [
            "connector.status.proxyAddress",
            "context.proxy.caCert",
            "context.token",
            "kubeconfig"
        ]
        .map(String::from)
        .into_iter()
        .collect()
    );
    let kubeconfig = std::fs::read_to_string(target.join("kubeconfig")).unwrap();
    let v: Value = serde_saphyr::from_str(&kubeconfig).unwrap();
    assert_eq!(v["users"][0]["user"]["token"], "fake-token");
    assert_eq!(v["clusters"][0]["cluster"]["server"], env.target.url());
    for name in files_of(&target) {
        let text = std::fs::read_to_string(target.join(&name)).unwrap();
        assert!(
            !text.contains(&env.target_token),
            "the target's real token is in {name}"
        );
        let mode = std::fs::metadata(target.join(&name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o777,
            0o444,
            "{name}: read-only, readable by a non-root pod"
        );
    }
    let dir_mode = std::fs::metadata(&target).unwrap().permissions().mode();
    assert_eq!(dir_mode & 0o777, 0o555, "readonly: no write bits");
    let token = token_of(&target);
    assert_eq!(token, kubelet_token, "the token kubelet passed");
    assert!(
        kubeconfig.contains(&token),
        "the proxy password is the pod's token"
    );
    assert_eq!(
        review(&env, &token).await,
        Some((
            format!("system:serviceaccount:{NS}:default"),
            job.name.clone()
        )),
        "a token of the pod's own ServiceAccount, bound to the pod"
    );
    // The real kubectl with it lists the target's pods through the proxy.
    let pods = ok(
        env.via(
            &target.join("kubeconfig"),
            &["get", "pods", "--all-namespaces"],
        ),
        "kubectl get pods -A with the published kubeconfig",
    );
    assert!(
        pods.contains("web-7d4f9") && pods.contains("coredns-5d78c"),
        "{pods}"
    );

    // --- A repeated call is idempotent: same files, no API call. ----------
    let requests = |env: &Env| {
        env.operator
            .audit()
            .into_iter()
            .filter(|e| e["user"] == CSI_SA)
            .count()
    };
    let before = requests(&env);
    node.node_publish_volume(with_tokens(
        publish_request(&job, &target, DOCUMENTED),
        &tokens,
    ))
    .await
    .unwrap();
    assert_eq!(token_of(&target), token, "the same token");
    assert_eq!(requests(&env), before, "no API call for a fresh volume");

    // --- The pod plants links in its volume (as root in its container) ----
    // aiming at another pod's Secret volume and emptyDir on the node; the
    // republish with kubelet's renewed token leaves them untouched.
    let other_uid = env.dir.path().join("kubelet/pods/another-pod-uid/volumes");
    let secret = other_uid.join("kubernetes.io~secret/token/token");
    let cache = other_uid.join("kubernetes.io~empty-dir/cache");
    std::fs::create_dir_all(secret.parent().unwrap()).unwrap();
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::write(&secret, "another pod's token").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::write(cache.join("data"), "cache").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(&secret, target.join("..state.tmp")).unwrap();
    std::fs::remove_file(target.join("..data")).unwrap();
    std::os::unix::fs::symlink(&cache, target.join("..data")).unwrap();

    // --- kubelet renews the token and republishes: the new one is written.
    let old_kubeconfig = env.kubeconfig_file("old.kubeconfig", &kubeconfig);
    let (renewed, new_token) = kubelet_tokens(&env.client, &job).await;
    node.node_publish_volume(with_tokens(
        publish_request(&job, &target, DOCUMENTED),
        &renewed,
    ))
    .await
    .unwrap();
    assert_eq!(
        token_of(&target),
        new_token,
        "republish wrote the renewed token"
    );
    assert_ne!(new_token, token);
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "another pod's token",
        "nothing written through ..state.tmp"
    );
    assert_eq!(
        std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert_eq!(
        std::fs::read_to_string(cache.join("data")).unwrap(),
        "cache",
        "nothing removed through ..data"
    );
    ok(
        env.via(&target.join("kubeconfig"), &["get", "pods", "-A"]),
        "kubectl with the rotated kubeconfig",
    );
    // The old token, once expired, is refused by the proxy. Both of
    // kubelet's tokens are bound to the same pod, and a real API server
    // accepts the old one until its own expiry (30 min): here it is that
    // token as its issuer would have signed it two hours ago, expired an
    // hour ago. (That a token the proxy accepted stops working once the API
    // server refuses it is shown when the pod goes, below.)
    let now = std::time::SystemTime::now();
    let hour = Duration::from_secs(3600);
    let expired = env
        .operator
        .reissue_token(&token, now - 2 * hour, now - hour);
    let expired_kubeconfig =
        env.kubeconfig_file("expired.kubeconfig", &kubeconfig.replace(&token, &expired));
    let out = env.via(&expired_kubeconfig, &["get", "pods", "-A"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Proxy Authentication Required"),
        "the expired token is refused at the proxy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ok(
        env.via(&old_kubeconfig, &["get", "pods", "-A"]),
        "the old token works until it expires",
    );
    ok(
        env.via(&target.join("kubeconfig"), &["get", "pods", "-A"]),
        "the rotated kubeconfig works",
    );

    // --- Refusals: no files, the right codes. -----------------------------
    ok(env.op(&["create", "namespace", "other"], None), "namespace");
    ok(
        env.op(
            &["-n", "other", "create", "serviceaccount", "intruder"],
            None,
        ),
        "sa",
    );
    let intruder = create_pod(&env, "other", "intruder", "intruder", "node-1");
    let intruder_target = target_of(&env, &intruder);
    let attrs = [
        ("connector.name", "k8s-connector"),
        ("connector.namespace", NS),
        ("configuration.names", "kubeconfig"),
    ];
    let (intruder_tokens, _) = kubelet_tokens(&env.client, &intruder).await;
    let err = node
        .node_publish_volume(with_tokens(
            publish_request(&intruder, &intruder_target, &attrs),
            &intruder_tokens,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("may not use connector"),
        "{}",
        err.message()
    );
    assert!(!intruder_target.exists(), "a refused pod gets no files");
    type Case<'a> = (&'a [(&'a str, &'a str)], Code, &'a str);
    let table: &[Case] = &[
        (
            &[("configuration.names", "kubeconfig")],
            Code::InvalidArgument,
            "connector.name",
        ),
        (
            &[
                ("connector.name", "k8s-connector"),
                ("token.expiration", "5m"),
            ],
            Code::InvalidArgument,
            "too short",
        ),
        (
            &[
                ("connector.name", "k8s-connector"),
                ("token.expiration", "soon"),
            ],
            Code::InvalidArgument,
            "not a duration",
        ),
        (
            &[("connector.name", "Not_A_Name")],
            Code::InvalidArgument,
            "not a connector",
        ),
        (
            &[
                ("connector.name", "k8s-connector"),
                ("configuration.names", ".env"),
            ],
            Code::InvalidArgument,
            "no configuration",
        ),
        (
            &[
                ("connector.name", "k8s-connector"),
                ("configuration.names", "!nope"),
            ],
            Code::InvalidArgument,
            "excludes no file",
        ),
        (
            &[("connector.name", "missing")],
            Code::NotFound,
            "no connector",
        ),
        (
            &[
                ("connector.name", "k8s-connector"),
                ("csi.storage.k8s.io/ephemeral", "false"),
            ],
            Code::InvalidArgument,
            "inline ephemeral",
        ),
    ];
    // The documentation's inspect Pod, applied as written, on node-1 (what
    // the scheduler's binding sets: the test cluster runs no scheduler).
    check_examples_use_the_documented_volume();
    let mut inspect: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo("examples/connectors/inspect-pod.yaml")).unwrap(),
    )
    .unwrap();
    inspect["spec"]["nodeName"] = "node-1".into();
    ok(
        env.op(&["apply", "-n", NS, "-f", "-"], Some(&inspect.to_string())),
        "the inspect Pod",
    );
    let other_pod = Pod {
        name: "inspect-k8s-access".into(),
        namespace: NS.into(),
        uid: ok(
            env.op(
                &[
                    "-n",
                    NS,
                    "get",
                    "pod",
                    "inspect-k8s-access",
                    "-o",
                    "jsonpath={.metadata.uid}",
                ],
                None,
            ),
            "its uid",
        ),
        service_account: "default".into(),
    };
    let other_target = target_of(&env, &other_pod);
    let (other_tokens, _) = kubelet_tokens(&env.client, &other_pod).await;
    for (attrs, code, message) in table {
        let err = node
            .node_publish_volume(with_tokens(
                publish_request(&other_pod, &other_target, attrs),
                &other_tokens,
            ))
            .await
            .unwrap_err();
        assert_eq!(err.code(), *code, "{attrs:?}: {err:?}");
        assert!(
            err.message().contains(message),
            "{attrs:?}: {}",
            err.message()
        );
        assert!(!other_target.exists(), "{attrs:?}: no files");
    }
    // No token from kubelet (a CSIDriver without tokenRequests), or none
    // for the proxy's audience: kubelet is told to retry, no files.
    for (tokens, message) in [
        (None, "tokenRequests"),
        (
            Some(r#"{"vault":{"token":"t","expirationTimestamp":"2030-01-01T00:00:00Z"}}"#),
            "no token for the audience",
        ),
    ] {
        let mut request = publish_request(&other_pod, &other_target, DOCUMENTED);
        if let Some(tokens) = tokens {
            request = with_tokens(request, tokens);
        }
        let err = node.node_publish_volume(request).await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        assert!(err.message().contains(message), "{}", err.message());
        assert!(!other_target.exists(), "no files");
    }
    // A pod of another node: this node's plugin does not publish it.
    let elsewhere = create_pod(&env, NS, "on-node-2", "default", "node-2");
    let elsewhere_target = target_of(&env, &elsewhere);
    let (elsewhere_tokens, _) = kubelet_tokens(&env.client, &elsewhere).await;
    let err = node
        .node_publish_volume(with_tokens(
            publish_request(&elsewhere, &elsewhere_target, DOCUMENTED),
            &elsewhere_tokens,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message()
            .contains("runs on node \"node-2\", not on this plugin's node \"node-1\""),
        "{}",
        err.message()
    );
    assert!(!elsewhere_target.exists(), "no files");
    let mut no_pod_info = publish_request(&other_pod, &other_target, DOCUMENTED);
    no_pod_info
        .volume_context
        .remove("csi.storage.k8s.io/pod.name");
    let err = node.node_publish_volume(no_pod_info).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("podInfoOnMount"),
        "{}",
        err.message()
    );
    let mut no_target = publish_request(&other_pod, &other_target, DOCUMENTED);
    no_target.target_path.clear();
    let err = node.node_publish_volume(no_target).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let mut block = publish_request(&other_pod, &other_target, DOCUMENTED);
    block.volume_capability.as_mut().unwrap().access_type = Some(
        volume_capability::AccessType::Block(volume_capability::BlockVolume {}),
    );
    let err = node.node_publish_volume(block).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    // --- Two publishes at once, of different volumes, don't interfere. ----
    // One with kubelet's tokens in `secrets` (Kubernetes 1.35 with
    // serviceAccountTokenInSecrets: only there, not in volume_context).
    let mut in_secrets = publish_request(&other_pod, &other_target, DOCUMENTED);
    in_secrets
        .secrets
        .insert(KUBELET_TOKENS.into(), other_tokens.clone());
    let (mut node_a, mut node_b) = (node.clone(), node.clone());
    let (a, b) = tokio::join!(
        node_a.node_publish_volume(in_secrets),
        node_b.node_publish_volume(with_tokens(
            publish_request(
                &job,
                &target,
                &[
                    ("connectors", &format!("{NS}/k8s-connector")),
                    ("configuration.names", "kubeconfig,!context.proxy.caCert"),
                    ("token.expiration", "1h"),
                ]
            ),
            &renewed
        )),
    );
    a.unwrap();
    b.unwrap();
    let (ta, tb) = (token_of(&other_target), token_of(&target));
    assert_ne!(ta, tb);
    assert_eq!(
        review(&env, &ta).await.map(|(_, pod)| pod).as_deref(),
        Some("inspect-k8s-access")
    );
    assert_eq!(
        review(&env, &tb).await.map(|(_, pod)| pod).as_deref(),
        Some("k8s-access-x7k2p")
    );
    assert!(
        !files_of(&target).contains("context.proxy.caCert"),
        "an excluded file is left out (and removed from the older generation)"
    );
    for t in [&target, &other_target] {
        ok(
            env.via(&t.join("kubeconfig"), &["get", "pods", "-A"]),
            "each volume's kubeconfig",
        );
    }

    // --- The Job's pod goes: its tokens die with it. -----------------------
    // (Deleted at once, as kubelet confirms a stopped pod's deletion: the
    // test cluster has no kubelet.) The API server refuses every token bound
    // to it from then on — after its own cache of successful token
    // authentications (10 s) and the proxy's (`--proxy-recheck-interval`,
    // 10 s) let go —, the other pod's volume still works.
    ok(
        env.op(
            &[
                "-n",
                NS,
                "delete",
                "pod",
                &job.name,
                "--grace-period=0",
                "--force",
            ],
            None,
        ),
        "delete the Job's pod",
    );
    let refused = tokio::time::timeout(Duration::from_secs(45), async {
        loop {
            let refused = |kubeconfig: &Path| {
                let out = env.via(kubeconfig, &["get", "pods", "-A"]);
                String::from_utf8_lossy(&out.stderr).contains("Proxy Authentication Required")
            };
            if refused(&old_kubeconfig) && refused(&target.join("kubeconfig")) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    assert!(
        refused.is_ok(),
        "the deleted pod's tokens stop working at the proxy:\n{}",
        env.role.log()
    );
    ok(
        env.via(&other_target.join("kubeconfig"), &["get", "pods", "-A"]),
        "the other pod's volume still works",
    );

    // --- Unpublish leaves nothing; again is fine. --------------------------
    for (pod, t) in [(&job, &target), (&other_pod, &other_target)] {
        for _ in 0..2 {
            node.node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: format!("csi-{}", pod.uid),
                target_path: t.display().to_string(),
            })
            .await
            .unwrap();
        }
        assert!(!t.exists(), "{} is gone", t.display());
        assert_eq!(
            std::fs::read_dir(t.parent().unwrap()).unwrap().count(),
            0,
            "nothing left beside it"
        );
    }
    // The links the pod planted reached nothing, through every publish
    // and the unpublish.
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "another pod's token"
    );
    assert_eq!(
        std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert_eq!(
        std::fs::read_to_string(cache.join("data")).unwrap(),
        "cache"
    );
    let err = node
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: String::new(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    // --- Whoever may patch connectors/status cannot redirect workloads: the
    // proxy's URL and CA come from its Service's name and its CA's ConfigMap. The
    // role is stopped first, so that the status stays as patched. ---------
    let proxy_ca = ok(
        env.op(
            &[
                "get",
                "secret",
                "-n",
                "tuna-system",
                "tuna-operator-connectors-ca",
                "-o",
                "jsonpath={.data.tls\\.crt}",
            ],
            None,
        ),
        "the proxy's CA certificate",
    );
    let published = |target: &Path| {
        let v: Value =
            serde_saphyr::from_str(&std::fs::read_to_string(target.join("kubeconfig")).unwrap())
                .unwrap();
        (
            // http://<user>:<token>@host[:port], without the credentials.
            v["clusters"][0]["cluster"]["proxy-url"]
                .as_str()
                .and_then(|u| u.rsplit_once('@'))
                .map(|(_, host)| format!("http://{host}"))
                .unwrap(),
            v["clusters"][0]["cluster"]["certificate-authority-data"]
                .as_str()
                .unwrap()
                .to_owned(),
        )
    };
    let mut env = env;
    env.role.kill().await;
    let forged = serde_json::json!({"status": {"proxy": {"httpAddress": {
        "url": "http://proxy.attacker.example:8080",
        "CACerts": env.target.ca_pem(),
        // The real audience, so that the URL and CA are what differ (an
        // audience of its own would fail the publish).
        "audience": "connectors.alauda.io",
    }}}})
    .to_string();
    ok(
        env.op(
            &[
                "patch",
                "connector",
                "-n",
                NS,
                "k8s-connector",
                "--subresource=status",
                "--type=merge",
                "-p",
                &forged,
            ],
            None,
        ),
        "forge the Connector's status",
    );
    env.connector("the forged status", |c| {
        c.status
            .as_ref()
            .and_then(|s| s.proxy.as_ref())
            .and_then(|p| p.http_address.as_ref())
            .and_then(|a| a.url.as_deref())
            == Some("http://proxy.attacker.example:8080")
    })
    .await;
    let dns = start_plugin(&env, "csi-dns", &["--cluster-domain", "cluster.local"]).await;
    let mut dns_node = NodeClient::new(support::connectors::channel(&dns.socket).await);
    for (client, want_url, pod_name) in [
        (&mut node, format!("http://{}", env.proxy), "after-forgery"),
        (
            &mut dns_node,
            // The proxy's own Service in the operator's namespace, never
            // `c-<name>` in the Connector's (issue 37 item 7, C1).
            "http://tuna-operator-connectors.tuna-system.svc.cluster.local".to_owned(),
            "after-forgery-dns",
        ),
    ] {
        let pod = create_pod(&env, NS, pod_name, "default", "node-1");
        let target = target_of(&env, &pod);
        let (tokens, _) = kubelet_tokens(&env.client, &pod).await;
        client
            .node_publish_volume(with_tokens(
                publish_request(&pod, &target, DOCUMENTED),
                &tokens,
            ))
            .await
            .unwrap();
        assert_eq!(
            published(&target),
            (want_url, proxy_ca.trim().to_owned()),
            "the proxy's own URL and CA, not the forged status's"
        );
        client
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: format!("csi-{}", pod.uid),
                target_path: target.display().to_string(),
            })
            .await
            .unwrap();
    }

    // --- No token in the plugin's log. -------------------------------------
    let log = plugin.process.log();
    for secret in [&token, &new_token, &ta, &tb, &env.target_token] {
        assert!(
            !log.contains(secret.as_str()),
            "a token in the plugin's log"
        );
    }

    // --- The plugin minted no token; its RBAC (examples/connectors/
    // csi-rbac.yaml): enough, all used. ------------------------------------
    let minted: Vec<_> = env
        .operator
        .audit()
        .into_iter()
        .filter(|e| e["user"] == CSI_SA && e["subresource"] == "token")
        .collect();
    assert!(minted.is_empty(), "the plugin minted tokens: {minted:?}");
    // It read no Secret: the CA's certificate comes from the ConfigMap the
    // role publishes, and the CA's key stays off the nodes.
    let secrets: Vec<_> = env
        .operator
        .audit()
        .into_iter()
        .filter(|e| e["user"] == CSI_SA && e["resource"] == "secrets")
        .collect();
    assert!(secrets.is_empty(), "the plugin read Secrets: {secrets:?}");
    let used = rbac_used(&env.operator, CSI_SA);
    let granted =
        rbac_rules(&std::fs::read_to_string(repo("examples/connectors/csi-rbac.yaml")).unwrap());
    assert_eq!(used, granted, "used (left) and granted (right) differ");
}

/// Self-registration (no registrar sidecar): the plugin serves kubelet's
/// plugin-registration API on its registration socket once its CSI socket
/// listens; the test calls it as kubelet's plugin watcher does (a real
/// kubelet does so in the node journey, tests/node). Nothing here needs the
/// API server: the kubeconfig names an address nobody listens on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_registers_itself_over_kubelets_registration_api_as_kubelet_calls_it() {
    use tuna_operator::csi::registration::proto::registration_client::RegistrationClient;
    use tuna_operator::csi::registration::proto::{InfoRequest, RegistrationStatus};

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:9\"}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n",
    )
    .unwrap();
    let socket = dir.path().join("plugins/connectors-csi/csi.sock");
    let registration = dir.path().join("plugins_registry/connectors-csi-reg.sock");
    // What the chart passes: the CSI socket by its node path.
    let node_endpoint = "/var/lib/kubelet/plugins/connectors-csi/csi.sock";
    let args: Vec<String> = [
        "--log-format",
        "json",
        "csi",
        "--endpoint",
        &format!("unix://{}", socket.display()),
        "--node-id",
        "node-1",
        "--namespace",
        "tuna-system",
        "--proxy-url",
        "http://127.0.0.1:9",
        "--registration-socket",
        registration.to_str().unwrap(),
        "--kubelet-endpoint",
        node_endpoint,
    ]
    .map(String::from)
    .to_vec();
    let mut plugin = Process::spawn(
        dir.path(),
        "csi",
        &operator_bin(),
        &args,
        &[("KUBECONFIG", kubeconfig.display().to_string())],
    );
    let logged = |message: &str| {
        plugin.log().lines().any(|l| {
            serde_json::from_str::<Value>(l).is_ok_and(|v| v["fields"]["message"] == message)
        })
    };
    let ready = tokio::time::timeout(WAIT, async {
        while !logged("registration socket for the kubelet listening") {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(ready.is_ok(), "never registered:\n{}", plugin.log());
    // kubelet dials the CSI socket right after GetInfo: it listens first.
    assert!(
        socket.exists(),
        "the CSI socket listens before registration"
    );
    let mode = std::fs::metadata(&registration)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "root (kubelet) alone may call");

    // As the kubelet's registration client calls it: grpc-go dialling the
    // bare socket path sends that path as `:authority` (tonic's client
    // refuses to, so the frames are written here). Without the plugin's
    // HTTP/2 front, tonic's server reset this stream (PROTOCOL_ERROR).
    let raw = get_info_with_path_authority(&registration).await;
    assert_eq!(raw.r#type, "CSIPlugin", "{raw:?}");
    assert_eq!(raw.endpoint, node_endpoint);
    let mut kubelet = RegistrationClient::new(channel(&registration).await);
    let info = kubelet.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, "connectors-csi");
    assert_eq!(info.endpoint, node_endpoint);
    assert_eq!(info.supported_versions, vec!["1.0.0".to_owned()]);
    // The CSI socket answers as the driver kubelet was told about.
    let mut identity = IdentityClient::new(channel(&socket).await);
    let plugin_info = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(plugin_info.name, info.name);

    kubelet
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    kubelet
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "driver name conflicts".into(),
        })
        .await
        .unwrap();
    let reported = tokio::time::timeout(WAIT, async {
        while !(logged("registered with the kubelet")
            && logged("the kubelet refused the registration"))
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(reported.is_ok(), "{}", plugin.log());

    // Stopped as a pod is: both sockets go (kubelet unregisters the driver
    // when the registration socket disappears).
    plugin.terminate().await;
    assert!(!registration.exists(), "{}", plugin.log());
    assert!(!socket.exists(), "{}", plugin.log());
}

/// `GetInfo` over the registration socket, written frame by frame as grpc-go
/// sends it when the kubelet dials the socket's path: `:authority` is that
/// path. Answers the server's SETTINGS, and returns the decoded reply; panics
/// on a reset stream or a gRPC error.
async fn get_info_with_path_authority(
    socket: &Path,
) -> tuna_operator::csi::registration::proto::PluginInfo {
    use prost::Message as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }
    let authority = socket.to_str().unwrap().as_bytes();
    let block = loona_hpack::Encoder::new().encode([
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", b"/pluginregistration.Registration/GetInfo"),
        (b":authority", authority),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]);
    let mut conn = tokio::net::UnixStream::connect(socket).await.unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    out.extend(frame(0x1, 0x4, 1, &block)); // HEADERS, END_HEADERS
    out.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0])); // DATA: an empty InfoRequest
    conn.write_all(&out).await.unwrap();
    let mut decoder = loona_hpack::Decoder::new();
    let mut message = Vec::new();
    let read = tokio::time::timeout(WAIT, async {
        loop {
            let mut head = [0u8; 9];
            conn.read_exact(&mut head)
                .await
                .expect("the server closed the connection");
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            conn.read_exact(&mut payload).await.unwrap();
            match head[3] {
                0x4 if head[4] & 0x1 == 0 => {
                    conn.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap();
                }
                0x3 => panic!("the stream was reset: error code {payload:?}"),
                0x7 => panic!("GOAWAY: {payload:?}"),
                0x0 => message.extend_from_slice(&payload),
                0x1 => {
                    let fields = decoder.decode(&payload).unwrap();
                    for (name, value) in &fields {
                        if name == b"grpc-status" {
                            assert_eq!(value, b"0", "{fields:?}");
                        }
                    }
                    if head[4] & 0x1 != 0 {
                        return;
                    }
                }
                _ => {}
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer to GetInfo");
    tuna_operator::csi::registration::proto::PluginInfo::decode(&message[5..]).unwrap()
}
