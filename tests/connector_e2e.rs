//! The Kubernetes connector end to end, as the quick start tells it: two
//! Kubernetes API emulators — the operator's cluster (Connectors, Secrets,
//! ServiceAccounts) and the target API server (its own token, some pods) —,
//! the real `tuna-operator connectors` process running with exactly the
//! RBAC of `examples/connectors/rbac.yaml`, and the real `kubectl`, whose
//! kubeconfig comes from `tuna-operator connector kubeconfig`.
//!
//! Both clusters run in this process (the operator's, so that a token can be
//! ended early: TokenRequest refuses lifetimes under ten minutes); the role
//! and kubectl are separate processes. The role trusts the target's CA as a
//! system root (`SSL_CERT_FILE`), so that the quick start's Connector —
//! which has no `caCertSecretRef` — works as written.

mod support;

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use support::WAIT;
use support::connectors::{
    Env, NS, ROLE_SA, fails, ok, password_of, quick_start, rbac_rules, rbac_used, repo,
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tuna_crds::{Connector, ConnectorConditions};

fn condition(c: &Connector, type_: &str) -> Option<(String, String, String)> {
    let status = c.status.as_ref()?;
    let cond = status.conditions.condition(type_)?;
    Some((
        cond.status.clone(),
        cond.reason.clone(),
        cond.message.clone(),
    ))
}

fn is(c: &Connector, type_: &str, status: &str, reason: &str) -> bool {
    condition(c, type_).is_some_and(|(s, r, _)| s == status && r == reason)
}

fn ready(c: &Connector) -> bool {
    is(c, "Ready", "True", "Ready")
}

/// The whole journey, in the order a user meets it; every step says what it
/// proves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reaches_the_target_through_the_connector_without_its_credentials() {
    let env = Env::start().await;

    // --- The quick start, as written. -------------------------------------
    let manifests = quick_start(&env.target_token, env.target.url());
    ok(
        env.op(&["apply", "-n", NS, "-f", "-"], Some(&manifests)),
        "apply the quick start",
    );
    let connector = env.connector("Ready", ready).await;
    let get = ok(
        env.op(&["get", "connector", "k8s-connector", "-n", NS], None),
        "get",
    );
    let lines: Vec<Vec<&str>> = get
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["NAME", "CLASS", "ADDRESS", "READY", "AGE"],
        "{get}"
    );
    assert_eq!(
        &lines[1][..4],
        ["k8s-connector", "k8s", env.target.url(), "True"],
        "{get}"
    );
    let wide = ok(
        env.op(&["get", "connector", "-n", NS, "-o", "wide"], None),
        "get -o wide",
    );
    assert!(wide.lines().next().unwrap().contains("REASON"), "{wide}");
    let address = connector.status.as_ref().unwrap().proxy.as_ref().unwrap();
    let address = address.http_address.as_ref().unwrap();
    assert_eq!(
        address.url.as_deref(),
        Some("http://c-k8s-connector.k8s-connector-demo.svc.cluster.local")
    );
    for type_ in [
        "ConnectorClassReady",
        "SecretReady",
        "LivenessReady",
        "AuthReady",
        "ProxyServiceReady",
    ] {
        assert_eq!(
            condition(&connector, type_).unwrap().0,
            "True",
            "{type_}: {connector:?}"
        );
    }
    let service = ok(
        env.op(
            &["get", "service", "c-k8s-connector", "-n", NS, "-o", "json"],
            None,
        ),
        "service",
    );
    let service: Value = serde_json::from_str(&service).unwrap();
    assert_eq!(service["spec"]["type"], "ExternalName");
    assert_eq!(
        service["spec"]["externalName"],
        "tuna-operator-connectors.tuna-system.svc.cluster.local"
    );
    assert_eq!(
        service["metadata"]["ownerReferences"][0]["kind"],
        "Connector"
    );
    let class = ok(
        env.op(&["get", "connectorclass", "k8s"], None),
        "get connectorclass",
    );
    assert!(class.lines().nth(1).unwrap().contains("True"), "{class}");
    let explain = ok(env.op(&["explain", "connector.spec"], None), "explain");
    assert!(
        explain.contains("connectorClassName") && explain.contains("caCertSecretRef"),
        "{explain}"
    );

    // --- A kubeconfig for a workload of the namespace. ---------------------
    ok(
        env.op(&["-n", NS, "create", "serviceaccount", "k8s-access"], None),
        "the workload's SA",
    );
    let rendered = env.mint_kubeconfig("k8s-access");
    assert!(
        !rendered.contains(&env.target_token),
        "the real token is not in the kubeconfig"
    );
    let v: Value = serde_saphyr::from_str(&rendered).unwrap();
    assert_eq!(v["users"][0]["user"]["token"], "fake-token");
    assert_eq!(v["clusters"][0]["cluster"]["server"], env.target.url());
    let proxy_url = v["clusters"][0]["cluster"]["proxy-url"].as_str().unwrap();
    assert!(
        proxy_url.starts_with("http://k8s-connector-demo%2Fk8s-connector:"),
        "{proxy_url}"
    );
    let workload = env.kubeconfig_file("workload.kubeconfig", &rendered);

    // kubectl lists the target's pods through the proxy, as the reader.
    let pods = ok(
        env.via(&workload, &["get", "pods", "--all-namespaces"]),
        "get pods -A",
    );
    assert!(
        pods.contains("web-7d4f9") && pods.contains("coredns-5d78c"),
        "{pods}"
    );
    let list = env
        .target
        .wait_for_audit(|e| e.resource == "pods" && e.verb == "list" && e.namespace.is_empty())
        .await;
    assert_eq!(
        list.user, "system:serviceaccount:default:reader",
        "the real token was injected"
    );

    // A watch streams: a pod created meanwhile shows up.
    let mut watch = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&workload)
        .args(["get", "pods", "-n", "default", "--watch", "-o", "name"])
        .env("HOME", env.dir.path().join("home-via"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    env.target
        .wait_for_audit(|e| e.resource == "pods" && e.verb == "watch" && e.namespace == "default")
        .await;
    ok(
        env.tgt(
            &["apply", "-f", "-"],
            Some("apiVersion: v1\nkind: Pod\nmetadata: {name: watched, namespace: default}\nspec: {containers: [{name: c, image: busybox}]}\n"),
        ),
        "a new pod on the target",
    );
    let seen = tokio::time::timeout(WAIT, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.trim() == "pod/watched" {
                return;
            }
        }
        panic!("the watch ended before the new pod");
    })
    .await;
    assert!(seen.is_ok(), "the watch saw the new pod");
    let _ = watch.kill().await;

    // --- Refusals. ---------------------------------------------------------
    // A wrong password: 407, and kubectl says so.
    let token = password_of(&rendered);
    let wrong = env.kubeconfig_file("wrong.kubeconfig", &rendered.replace(&token, "not-a-token"));
    let err = fails(env.via(&wrong, &["get", "pods", "-A"]), "a wrong password");
    assert!(err.contains("Proxy Authentication Required"), "{err}");
    // An expired one: the same.
    let fresh = env.mint_kubeconfig("k8s-access");
    assert!(env.operator.expire_token(&password_of(&fresh)));
    let expired = env.kubeconfig_file("expired.kubeconfig", &fresh);
    let err = fails(
        env.via(&expired, &["get", "pods", "-A"]),
        "an expired password",
    );
    assert!(err.contains("Proxy Authentication Required"), "{err}");
    // A token for the API server's audience (not the proxy's) is no password.
    let api_token = env.operator.token_for_service_account(NS, "k8s-access");
    let api_aud = env.kubeconfig_file(
        "api-audience.kubeconfig",
        &rendered.replace(&token, &api_token),
    );
    let err = fails(
        env.via(&api_aud, &["get", "pods", "-A"]),
        "an API-audience token",
    );
    assert!(err.contains("Proxy Authentication Required"), "{err}");
    // A ServiceAccount of another namespace: 403.
    ok(env.op(&["create", "namespace", "other"], None), "namespace");
    ok(
        env.op(
            &["-n", "other", "create", "serviceaccount", "intruder"],
            None,
        ),
        "sa",
    );
    let intruder = ok(
        env.op(
            &[
                "-n",
                "other",
                "create",
                "token",
                "intruder",
                "--audience",
                "connectors.alauda.io",
            ],
            None,
        ),
        "intruder token",
    );
    let other_ns = env.kubeconfig_file(
        "other.kubeconfig",
        &rendered.replace(&token, intruder.trim()),
    );
    let err = fails(
        env.via(&other_ns, &["get", "pods", "-A"]),
        "another namespace's token",
    );
    assert!(err.contains("Forbidden"), "{err}");
    // …unless RBAC lets it get the Connector (a SubjectAccessReview says so).
    ok(
        env.op(
            &["apply", "-f", "-"],
            Some(&format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: use-k8s-connector, namespace: {NS}}}\nrules:\n- {{apiGroups: [connectors.alauda.io], resources: [connectors], resourceNames: [k8s-connector], verbs: [get]}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: intruder-uses-k8s-connector, namespace: {NS}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: use-k8s-connector}}\nsubjects: [{{kind: ServiceAccount, name: intruder, namespace: other}}]\n"
            )),
        ),
        "RBAC for the other namespace",
    );
    // The refusal above is cached for a few seconds; wait for the grant.
    let granted = tokio::time::timeout(WAIT, async {
        loop {
            if env.via(&other_ns, &["get", "pods", "-A"]).status.success() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    assert!(
        granted.is_ok(),
        "RBAC on the Connector lets another namespace in:\n{}",
        env.role.log()
    );
    // A CONNECT to another address than the connector's: 403.
    let elsewhere = env.kubeconfig_file(
        "elsewhere.kubeconfig",
        &rendered.replace(env.target.url(), env.operator.url()),
    );
    let err = fails(
        env.via(&elsewhere, &["get", "pods", "-A"]),
        "another address",
    );
    assert!(err.contains("Forbidden"), "{err}");

    // --- Conditions follow the Secret, the address and the target token. ---
    let secret_doc = |type_: &str, token: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: k8s-secret, namespace: {NS}}}\ntype: {type_}\nstringData: {{token: {token}}}\n"
        )
    };
    for round in 0..2 {
        ok(
            env.op(&["-n", NS, "delete", "secret", "k8s-secret"], None),
            "delete the Secret",
        );
        let c = env
            .connector("SecretNotFound", |c| {
                is(c, "SecretReady", "False", "SecretNotFound")
            })
            .await;
        assert!(is(&c, "Ready", "False", "SecretNotFound"), "{c:?}");
        if round == 0 {
            ok(
                env.op(
                    &["apply", "-f", "-"],
                    Some(&secret_doc("Opaque", &env.target_token)),
                ),
                "an Opaque Secret",
            );
            env.connector("SecretTypeMismatch", |c| {
                is(c, "SecretReady", "False", "SecretTypeMismatch")
            })
            .await;
            ok(
                env.op(&["-n", NS, "delete", "secret", "k8s-secret"], None),
                "delete it",
            );
        }
        ok(
            env.op(
                &["apply", "-f", "-"],
                Some(&secret_doc(
                    "connectors.cpaas.io/bearer-token",
                    &env.target_token,
                )),
            ),
            "the right Secret",
        );
        env.connector("Ready again", ready).await;
    }
    // A wrong address: an address nothing listens on.
    let closed = tokio::net::TcpSocket::new_v4().unwrap();
    closed.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let nowhere = format!("https://{}", closed.local_addr().unwrap());
    let patch = |address: &str| format!("{{\"spec\":{{\"address\":\"{address}\"}}}}");
    ok(
        env.op(
            &[
                "-n",
                NS,
                "patch",
                "connector",
                "k8s-connector",
                "--type",
                "merge",
                "-p",
                &patch(&nowhere),
            ],
            None,
        ),
        "a wrong address",
    );
    let c = env
        .connector("Unreachable", |c| {
            is(c, "LivenessReady", "False", "Unreachable")
        })
        .await;
    assert!(is(&c, "Ready", "False", "Unreachable"), "{c:?}");
    ok(
        env.op(
            &[
                "-n",
                NS,
                "patch",
                "connector",
                "k8s-connector",
                "--type",
                "merge",
                "-p",
                &patch(env.target.url()),
            ],
            None,
        ),
        "the right address",
    );
    env.connector("Ready again", ready).await;
    // A CA that did not sign the target's certificate.
    ok(
        env.op(
            &[
                "-n",
                NS,
                "create",
                "secret",
                "generic",
                "target-ca",
                "--from-literal",
                &format!("ca.crt={}", env.operator.ca_pem().unwrap()),
            ],
            None,
        ),
        "a wrong CA",
    );
    ok(
        env.op(
            &[
                "-n",
                NS,
                "patch",
                "connector",
                "k8s-connector",
                "--type",
                "merge",
                "-p",
                "{\"spec\":{\"caCertSecretRef\":{\"name\":\"target-ca\"}}}",
            ],
            None,
        ),
        "caCertSecretRef",
    );
    env.connector("TLSVerificationFailed", |c| {
        is(c, "LivenessReady", "False", "TLSVerificationFailed")
    })
    .await;
    let right_ca = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: target-ca, namespace: {NS}}}\nstringData:\n  ca.crt: |\n{}",
        env.target
            .ca_pem()
            .unwrap()
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    );
    ok(
        env.op(&["replace", "-f", "-"], Some(&right_ca)),
        "the right CA",
    );
    let c = env.connector("Ready with its CA", ready).await;
    assert!(is(&c, "CACertReady", "True", "CACertReady"), "{c:?}");
    // The target revokes the token (its ServiceAccount is deleted).
    ok(
        env.tgt(
            &["-n", "default", "delete", "serviceaccount", "reader"],
            None,
        ),
        "revoke",
    );
    let c = env
        .connector("Unauthorized", |c| {
            is(c, "AuthReady", "False", "Unauthorized")
        })
        .await;
    let (_, _, message) = condition(&c, "AuthReady").unwrap();
    assert!(message.contains("401"), "the server's answer: {message}");
    assert!(is(&c, "Ready", "False", "Unauthorized"), "{c:?}");
    let err = fails(
        env.via(&workload, &["get", "pods", "-A"]),
        "with a revoked target token",
    );
    assert!(err.contains("Unauthorized"), "{err}");
    // A new token in the Secret: Ready at the next resync (Secrets are read
    // by get at every reconcile, not watched; --resync-interval is 1s here).
    ok(
        env.tgt(
            &["-n", "default", "create", "serviceaccount", "reader2"],
            None,
        ),
        "a new reader",
    );
    let new_token = ok(
        env.tgt(
            &[
                "-n",
                "default",
                "create",
                "token",
                "reader2",
                "--duration",
                "2h",
            ],
            None,
        ),
        "its token",
    )
    .trim()
    .to_owned();
    ok(
        env.op(
            &["apply", "-f", "-"],
            Some(&secret_doc("connectors.cpaas.io/bearer-token", &new_token)),
        ),
        "the new token",
    );
    env.connector("Ready with the new token", ready).await;
    ok(
        env.via(&workload, &["get", "pods", "-A"]),
        "kubectl works again",
    );
    let describe = ok(
        env.op(&["describe", "connector", "k8s-connector", "-n", NS], None),
        "describe",
    );
    for reason in [
        "SecretNotFound",
        "SecretTypeMismatch",
        "Unreachable",
        "TLSVerificationFailed",
        "Unauthorized",
        "Ready",
    ] {
        assert!(
            describe.contains(reason),
            "{reason} in the events:\n{describe}"
        );
    }

    // --- Deleted: its Service goes with it, and the proxy forgets it. ------
    ok(
        env.op(&["-n", NS, "delete", "connector", "k8s-connector"], None),
        "delete",
    );
    let services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(env.client.clone(), NS);
    let collected = tokio::time::timeout(
        WAIT,
        kube::runtime::wait::await_condition(
            services,
            "c-k8s-connector",
            kube::runtime::wait::conditions::is_deleted(""),
        ),
    )
    .await;
    assert!(
        matches!(collected, Ok(Ok(_))),
        "the Service goes with its Connector"
    );
    // The role learns of the deletion from its watch; nothing outside shows
    // when, so the proxy is asked until it answers 403.
    let forgotten = tokio::time::timeout(WAIT, async {
        loop {
            let out = env.via(&workload, &["get", "pods", "-A"]);
            if String::from_utf8_lossy(&out.stderr).contains("Forbidden") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        forgotten.is_ok(),
        "the proxy forgets a deleted Connector:\n{}",
        env.role.log()
    );

    // --- No secret anywhere it should not be. -------------------------------
    let events = ok(
        env.op(&["get", "events", "-A", "-o", "json"], None),
        "events",
    );
    let status = ok(
        env.op(&["get", "connector", "-n", NS, "-o", "json"], None),
        "status",
    );
    let log = env.role.log();
    for secret in [&env.target_token, &new_token, &token] {
        assert!(!events.contains(secret.as_str()), "a token in the events");
        assert!(
            !status.contains(secret.as_str()),
            "a token in the Connector"
        );
        assert!(!log.contains(secret.as_str()), "a token in the role's log");
    }

    // --- The RBAC of examples/connectors/rbac.yaml: enough, and all used. ---
    let used = rbac_used(&env.operator, ROLE_SA);
    let granted =
        rbac_rules(&std::fs::read_to_string(repo("examples/connectors/rbac.yaml")).unwrap());
    assert_eq!(used, granted, "used (left) and granted (right) differ");
}

// ---- Connector editors and Secrets (issue 19, items 4 and 8) -------------

/// An HTTPS server of the attacker's own, with a CA of its own: counts the
/// connections it accepts and keeps every request head it reads.
struct AttackerServer {
    addr: std::net::SocketAddr,
    ca_pem: String,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

async fn attacker_server() -> AttackerServer {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = AttackerServer {
        addr: listener.local_addr().unwrap(),
        ca_pem: ca.pem(),
        connections: Arc::new(AtomicUsize::new(0)),
        heads: Arc::default(),
    };
    let (connections, heads) = (server.connections.clone(), server.heads.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            connections.fetch_add(1, Ordering::SeqCst);
            let (acceptor, heads) = (acceptor.clone(), heads.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match tls.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => break,
                    }
                }
                heads
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&head).into_owned());
                let _ = tls
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
                    )
                    .await;
            });
        }
    });
    server
}

/// With the admission policy of examples/connectors/admission-policy.yaml:
/// an identity that may create and edit Connectors but may not `get` the
/// namespace's token Secret is refused by kubectl — a new Connector naming
/// the Secret, and a new address for an existing one — with the policy's
/// message, and the operator never reaches its HTTPS server; the
/// documentation's example, as written, works for a user who may read the
/// Secret; the operator's own status writes pass. The role reads only the
/// Secrets Connectors name, by `get`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_editor_cannot_make_the_operator_send_a_secret_it_may_not_read() {
    use std::sync::atomic::Ordering;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let env = Env::start().await;
    ok(
        env.op(
            &[
                "apply",
                "-f",
                repo("examples/connectors/admission-policy.yaml")
                    .to_str()
                    .unwrap(),
            ],
            None,
        ),
        "the admission policy",
    );
    // alice owns the namespace's Connectors and their Secrets; mallory may
    // write Connectors and create Secrets, and read only her own CA Secret.
    ok(
        env.op(
            &["apply", "-f", "-"],
            Some(&format!(
                "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: connector-owner, namespace: {NS}}}
rules:
- {{apiGroups: [''], resources: [secrets], verbs: [get, create, update, patch]}}
- {{apiGroups: [connectors.alauda.io], resources: [connectors], verbs: [get, list, create, update, patch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: alice-owns-connectors, namespace: {NS}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: connector-owner}}
subjects: [{{kind: User, name: alice}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: connector-editor, namespace: {NS}}}
rules:
- {{apiGroups: [connectors.alauda.io], resources: [connectors], verbs: [get, list, create, update, patch]}}
- {{apiGroups: [''], resources: [secrets], verbs: [create]}}
- {{apiGroups: [''], resources: [secrets], resourceNames: [mallory-ca], verbs: [get]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: mallory-edits-connectors, namespace: {NS}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: connector-editor}}
subjects: [{{kind: User, name: mallory}}]
"
            )),
        ),
        "RBAC of alice and mallory",
    );
    let as_user = |name: &str| {
        let path = env.dir.path().join(format!("{name}.kubeconfig"));
        env.operator
            .write_kubeconfig(&path, &env.operator.token_for_user(name, &[]))
            .unwrap();
        path
    };
    let (alice, mallory) = (as_user("alice"), as_user("mallory"));
    let home = env.home();
    let run = |kubeconfig: &std::path::Path, args: &[&str], stdin: Option<&str>| {
        support::connectors::kubectl(kubeconfig, &home, args, stdin)
    };

    // The documentation's example as written, then with this test's token
    // and address: alice may read the Secret, so both are admitted.
    let example = repo("examples/connectors/k8s-connector.yaml");
    let created = ok(
        run(
            &alice,
            &["apply", "-n", NS, "-f", example.to_str().unwrap()],
            None,
        ),
        "the documentation's example, as alice",
    );
    assert!(
        created.contains("secret/k8s-secret created")
            && created.contains("connector.connectors.alauda.io/k8s-connector created"),
        "{created}"
    );
    ok(
        run(
            &alice,
            &["apply", "-n", NS, "-f", "-"],
            Some(&quick_start(&env.target_token, env.target.url())),
        ),
        "the quick start, as alice",
    );
    env.connector("Ready (its status written past the policy)", ready)
        .await;

    // mallory's own CA Secret, and her HTTPS server.
    let attacker = attacker_server().await;
    let ca_secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: mallory-ca, namespace: {NS}}}\nstringData:\n  ca.crt: |\n{}",
        attacker
            .ca_pem
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    );
    ok(
        run(&mallory, &["create", "-f", "-"], Some(&ca_secret)),
        "mallory's CA Secret",
    );
    let evil = env.kubeconfig_file(
        "evil-connector.yaml",
        &format!(
            "apiVersion: connectors.alauda.io/v1alpha1\nkind: Connector\nmetadata: {{name: evil, namespace: {NS}}}\nspec:\n  connectorClassName: k8s\n  address: https://{}\n  auth: {{name: bearerTokenAuth, secretRef: {{name: k8s-secret}}}}\n  caCertSecretRef: {{name: mallory-ca}}\n",
            attacker.addr
        ),
    );
    let evil = evil.to_str().unwrap();
    let policy = "ValidatingAdmissionPolicy 'tuna-operator-connectors-secret-access' with binding 'tuna-operator-connectors-secret-access' denied request: mallory may not get Secret k8s-secret (spec.auth.secretRef): a Connector may use only Secrets its author may read";
    let refused = fails(
        run(&mallory, &["apply", "-f", evil], None),
        "mallory's Connector naming the token Secret",
    );
    assert_eq!(
        refused.trim(),
        format!(
            "Error from server (Forbidden): error when creating \"{evil}\": connectors.connectors.alauda.io \"evil\" is forbidden: {policy}"
        )
    );
    // A new address (or CA) for alice's Connector: refused the same way.
    for patch in [
        format!("{{\"spec\":{{\"address\":\"https://{}\"}}}}", attacker.addr),
        "{\"spec\":{\"caCertSecretRef\":{\"name\":\"mallory-ca\"}}}".to_owned(),
    ] {
        let refused = fails(
            run(
                &mallory,
                &[
                    "-n",
                    NS,
                    "patch",
                    "connector",
                    "k8s-connector",
                    "--type",
                    "merge",
                    "-p",
                    &patch,
                ],
                None,
            ),
            "mallory's patch of alice's Connector",
        );
        assert_eq!(
            refused.trim(),
            format!(
                "Error from server (Forbidden): connectors.connectors.alauda.io \"k8s-connector\" is forbidden: {policy}"
            ),
            "{patch}"
        );
    }
    // Metadata sends no Secret anywhere: a label passes.
    ok(
        run(
            &mallory,
            &["-n", NS, "label", "connector", "k8s-connector", "team=a"],
            None,
        ),
        "a label by mallory",
    );

    // Two more reconciles of alice's Connector (each reads its Secret): by
    // then a probe of an admitted address would have gone out.
    let reads = |e: &kube_emulator::AuditEntry| {
        e.user == ROLE_SA && e.resource == "secrets" && e.name == "k8s-secret"
    };
    let before = env
        .operator
        .audit_entries()
        .iter()
        .filter(|e| reads(e))
        .count();
    env.operator.wait_for_audit_count(before + 2, reads).await;
    assert_eq!(
        attacker.connections.load(Ordering::SeqCst),
        0,
        "the operator reached mallory's server: {:?}",
        attacker.heads.lock().unwrap()
    );
    let c = env.connector("still Ready", ready).await;
    assert_eq!(
        c.spec.address,
        env.target.url(),
        "nothing mallory sent was stored"
    );

    // Item 8: the role reads Secrets only by `get` of a name a Connector (or
    // its own CA) names; it never lists or watches them.
    let secret_requests: Vec<(String, String)> = env
        .operator
        .audit_entries()
        .into_iter()
        .filter(|e| e.user == ROLE_SA && e.resource == "secrets")
        .map(|e| (e.verb, e.name))
        .collect();
    assert!(!secret_requests.is_empty());
    for (verb, name) in &secret_requests {
        // (A create names no object in its path: the role's CA Secret.)
        let named = ["k8s-secret", "tuna-operator-connectors-ca"].contains(&name.as_str());
        assert!(
            (verb == "get" && named) || (verb == "create" && name.is_empty()),
            "the role asked for {verb} secret {name:?}: {secret_requests:?}"
        );
    }
}
