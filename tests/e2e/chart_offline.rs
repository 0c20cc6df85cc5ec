//! The Helm chart without a cluster: a real Helm 4 lints and renders it for
//! each credentials mode and the main value combinations; every render is
//! validated against the Kubernetes 1.32 schemas (kubernetes-validate
//! --strict) and compared with its golden file under `tests/golden/chart/`;
//! wrong combinations fail with their messages; README.md's values table is
//! generated from values.yaml's comments; the chart's examples pass the CRDs'
//! schemas and CEL rules in a real kube-apiserver.
//!
//! After an intended change: `UPDATE_GOLDEN=1 cargo test --test e2e chart_offline::`
//! rewrites the golden files and the README table; review the diff.

use crate::chart_support;
use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use chart_support::{chart_dir, documents, helm, root, template, text};
use serde_json::Value;

fn update() -> bool {
    std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v != "0")
}

/// Compares `actual` with the file, or rewrites it under UPDATE_GOLDEN.
fn golden(path: &Path, actual: &str) {
    if update() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_default();
    if expected != actual {
        let diff: Vec<String> = expected
            .lines()
            .zip(actual.lines())
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .take(5)
            .map(|(i, (a, b))| format!("line {}:\n  golden: {a}\n  now:    {b}", i + 1))
            .collect();
        panic!(
            "{} is stale ({} vs {} lines); first differences:\n{}\nIf the change is intended: UPDATE_GOLDEN=1 cargo test --test e2e chart_offline::, then review the diff.",
            path.display(),
            expected.lines().count(),
            actual.lines().count(),
            diff.join("\n")
        );
    }
}

/// kubernetes-validate --strict against 1.32; Err(its report) on failure.
fn validate(yaml: &str) -> Result<String, String> {
    use std::io::Write;
    let mut child = Command::new(chart_support::kubernetes_validate_bin())
        .args(["--strict", "-k", "1.32", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubernetes-validate runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(text(&out))
    } else {
        Err(text(&out))
    }
}

/// The value combinations whose renders are validated and kept as golden files.
const CASES: &[(&str, &str)] = &[
    // The documentation's install: --set credentials.apiKey=<key>.
    ("api-key", "credentials:\n  apiKey: test-api-key\n"),
    (
        "existing-secret",
        "credentials:\n  existingSecret: tuna-api-key\n",
    ),
    // The documentation's Bank-Vaults example, verbatim.
    (
        "extra-env-vault",
        "podAnnotations:\n  vault.security.banzaicloud.io/vault-addr: https://vault.vault.svc:8200\n  vault.security.banzaicloud.io/vault-role: tuna-operator\nextraEnv:\n  - name: TUNA_API_KEY\n    value: vault:secret/data/tuna#api-key\n",
    ),
    (
        "extra-env-value-from",
        "extraEnv:\n  - name: TUNA_API_KEY\n    valueFrom:\n      secretKeyRef: {name: injected, key: token}\n  - name: HTTPS_PROXY\n    value: http://proxy.internal:3128\n",
    ),
    (
        "self-hosted-edge-ha",
        r#"credentials: {apiKey: test-api-key}
edge:
  apiUrl: https://edge.example.com:7444
  agentAddress: edge.example.com:7443
  agentServerName: agent.edge.example.com
  ca:
    pem: |
      -----BEGIN CERTIFICATE-----
      MIIBfake
      -----END CERTIFICATE-----
image: {tag: "0.1.0-rc1", pullPolicy: Always}
imagePullSecrets: [{name: regcred}]
logging: {level: "debug,kube=info", format: text}
metrics:
  serviceMonitor: {enabled: true, interval: 30s, labels: {release: prometheus}}
ingressClass: {default: true}
podLabels: {team: platform}
controller:
  replicas: 3
  leaderElection: {leaseDuration: 30s}
  podDisruptionBudget: {minAvailable: 2}
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: [{key: dedicated, operator: Equal, value: infra, effect: NoSchedule}]
  affinity:
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm:
            topologyKey: kubernetes.io/hostname
            labelSelector: {matchLabels: {app.kubernetes.io/component: controller}}
  priorityClassName: system-cluster-critical
  podAnnotations: {example.com/owner: platform}
agentManager:
  allowExternalUpstreams: true
  clusterId: prod-eu-1
  priorityClassName: system-cluster-critical
  serviceAccount: {annotations: {example.com/role: tunnels}}
"#,
    ),
    // The README's connector install: --set connectors.enabled=true.
    (
        "connectors",
        "credentials:\n  apiKey: test-api-key\nconnectors:\n  enabled: true\n",
    ),
    (
        "minimal-without-rbac",
        r#"credentials: {existingSecret: tuna-api-key}
edge: {ca: {existingConfigMap: corporate-ca, key: ca.crt}}
rbac: {create: false}
ingressClass: {create: false}
metrics: {service: {enabled: false}}
controller:
  leaderElection: {enabled: false}
  podDisruptionBudget: {enabled: false}
"#,
    ),
];

fn golden_path(case: &str) -> PathBuf {
    root().join(format!("tests/golden/chart/{case}.yaml"))
}

#[test]
fn renders_validate_against_kubernetes_1_32_and_match_the_golden_files() {
    let home = tempfile::tempdir().unwrap();
    for (case, values) in CASES {
        let rendered = template(home.path(), values, &[])
            .unwrap_or_else(|e| panic!("{case}: helm template failed: {e}"));
        if let Err(report) = validate(&rendered) {
            panic!("{case}: the render does not validate against Kubernetes 1.32:\n{report}");
        }
        golden(&golden_path(case), &rendered);
    }
    // With the CRDs, as `helm install` sends them.
    let with_crds = template(home.path(), CASES[0].1, &["--include-crds"]).unwrap();
    let kinds: Vec<String> = documents(&with_crds)
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| *k == "CustomResourceDefinition")
            .count(),
        5,
        "three k8s.tuna.am CRDs and the connector family's two"
    );
    validate(&with_crds).unwrap_or_else(|e| panic!("with CRDs: {e}"));
    // The validator is no rubber stamp: a misspelt field fails.
    let broken = CASES[0].1.to_owned();
    let typo = template(home.path(), &broken, &[])
        .unwrap()
        .replace("readOnlyRootFilesystem", "readOnlyRootFileSystem");
    assert!(validate(&typo).is_err(), "a misspelt field must fail");
}

fn by_kind_name(docs: &[Value]) -> BTreeMap<(String, String), Value> {
    docs.iter()
        .map(|d| {
            (
                (
                    d["kind"].as_str().unwrap().to_owned(),
                    d["metadata"]["name"].as_str().unwrap().to_owned(),
                ),
                d.clone(),
            )
        })
        .collect()
}

fn container(deploy: &Value) -> &Value {
    &deploy["spec"]["template"]["spec"]["containers"][0]
}

fn env_of(deploy: &Value) -> BTreeMap<String, Value> {
    container(deploy)["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_owned(), e.clone()))
        .collect()
}

/// What the issue asks of the rendered objects, checked field by field (the
/// golden files show the rest).
#[test]
fn the_rendered_objects_have_the_documented_shape() {
    let home = tempfile::tempdir().unwrap();
    let docs = by_kind_name(&documents(&template(home.path(), CASES[0].1, &[]).unwrap()));
    let controller = &docs[&("Deployment".into(), "tuna-operator-controller".into())];
    let agent = &docs[&("Deployment".into(), "tuna-operator-agent".into())];
    assert_eq!(controller["spec"]["strategy"]["type"], "RollingUpdate");
    assert_eq!(agent["spec"]["strategy"]["type"], "Recreate");
    assert_eq!(agent["spec"]["replicas"], 1);
    for (deploy, sa) in [
        (controller, "tuna-operator-controller"),
        (agent, "tuna-operator-agent"),
    ] {
        let pod = &deploy["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], sa);
        assert!(docs.contains_key(&("ServiceAccount".into(), sa.into())));
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(pod["securityContext"]["runAsUser"], 65532);
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        let c = container(deploy);
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
        assert_eq!(
            c["securityContext"]["capabilities"]["drop"],
            serde_json::json!(["ALL"])
        );
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert!(c["resources"]["requests"]["memory"].is_string());
        assert!(pod.get("volumes").is_none(), "nothing to mount by default");
        let annotations = &deploy["spec"]["template"]["metadata"]["annotations"];
        for a in ["checksum/credentials", "checksum/rbac"] {
            assert_eq!(annotations[a].as_str().unwrap().len(), 64, "{a}");
        }
        let env = env_of(deploy);
        assert_eq!(
            env["TUNA_API_KEY"]["valueFrom"]["secretKeyRef"],
            serde_json::json!({"name": "tuna-operator-credentials", "key": "api-key"})
        );
        assert!(env.contains_key("POD_NAME"));
    }
    assert!(env_of(controller).contains_key("POD_NAMESPACE"));
    let secret = &docs[&("Secret".into(), "tuna-operator-credentials".into())];
    assert_eq!(secret["data"]["api-key"], "dGVzdC1hcGkta2V5");
    let class = &docs[&("IngressClass".into(), "tuna".into())];
    assert_eq!(
        class["spec"]["controller"],
        "k8s.tuna.am/ingress-controller"
    );
    assert!(docs.contains_key(&(
        "PodDisruptionBudget".into(),
        "tuna-operator-controller".into()
    )));
    // RBAC: the controller has no rule on Secrets; the agent reads Secrets and
    // Services with get only; the Lease rules are namespaced.
    let rules = |kind: &str, name: &str| docs[&(kind.into(), name.into())]["rules"].clone();
    let controller_rules = rules("ClusterRole", "tuna-operator-controller").to_string();
    assert!(!controller_rules.contains("secrets"), "{controller_rules}");
    for r in rules("ClusterRole", "tuna-operator-agent")
        .as_array()
        .unwrap()
    {
        let resources = r["resources"].to_string();
        if resources.contains("secrets") || resources.contains("services") {
            assert_eq!(r["verbs"], serde_json::json!(["get"]), "{r}");
        }
    }
    let lease = &docs[&(
        "Role".into(),
        "tuna-operator-controller-leader-election".into(),
    )];
    assert_eq!(lease["metadata"]["namespace"], "tuna-system");
    assert!(lease["rules"].to_string().contains("leases"));

    // A change of the key or of the RBAC restarts the pods.
    let annotation = |values: &str, deploy: &str, key: &str| {
        let docs = by_kind_name(&documents(&template(home.path(), values, &[]).unwrap()));
        docs[&("Deployment".into(), deploy.into())]["spec"]["template"]["metadata"]["annotations"]
            [key]
            .clone()
    };
    let base = CASES[0].1;
    assert_ne!(
        annotation(base, "tuna-operator-agent", "checksum/credentials"),
        annotation(
            "credentials: {apiKey: another-key}",
            "tuna-operator-agent",
            "checksum/credentials"
        )
    );
    assert_ne!(
        annotation(base, "tuna-operator-agent", "checksum/rbac"),
        annotation(
            "credentials: {apiKey: test-api-key}\nagentManager: {clusterId: x}",
            "tuna-operator-agent",
            "checksum/rbac"
        )
    );

    // extraEnv: value and valueFrom render as real EnvVars.
    let docs = by_kind_name(&documents(&template(home.path(), CASES[3].1, &[]).unwrap()));
    let env = env_of(&docs[&("Deployment".into(), "tuna-operator-agent".into())]);
    assert_eq!(
        env["TUNA_API_KEY"],
        serde_json::json!({"name": "TUNA_API_KEY", "valueFrom": {"secretKeyRef": {"name": "injected", "key": "token"}}})
    );
    assert_eq!(env["HTTPS_PROXY"]["value"], "http://proxy.internal:3128");
    assert!(!docs.keys().any(|(k, _)| k == "Secret"));
}

/// `connectors.enabled`: the role with its proxy Service, the CSIDriver and
/// the node DaemonSet (one container: the plugin registers itself with
/// kubelet), privileges kept to what writing
/// into kubelet's volume directories needs; nothing of it by default.
#[test]
fn connectors_render_when_enabled_with_the_least_privileges() {
    let home = tempfile::tempdir().unwrap();
    let off = by_kind_name(&documents(&template(home.path(), CASES[0].1, &[]).unwrap()));
    assert!(
        !off.keys()
            .any(|(_, name)| name.contains("connectors") || name.contains("csi")),
        "off by default: {:?}",
        off.keys().collect::<Vec<_>>()
    );
    let case = CASES.iter().find(|(n, _)| *n == "connectors").unwrap().1;
    let docs = by_kind_name(&documents(&template(home.path(), case, &[]).unwrap()));
    let role = &docs[&("Deployment".into(), "tuna-operator-connectors".into())];
    let args = container(role)["args"].to_string();
    for flag in [
        "\"connectors\"",
        "--proxy-listen=0.0.0.0:3128",
        "--proxy-service=tuna-operator-connectors",
        "--ca-secret=tuna-operator-connectors-ca",
    ] {
        assert!(args.contains(flag), "{flag} in {args}");
    }
    assert!(
        !env_of(role).contains_key("TUNA_API_KEY"),
        "the role needs no API key"
    );
    let service = &docs[&("Service".into(), "tuna-operator-connectors".into())];
    assert_eq!(service["spec"]["ports"][0]["port"], 80);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "proxy");
    let driver = &docs[&("CSIDriver".into(), "connectors-csi".into())];
    assert_eq!(
        driver["spec"],
        serde_json::json!({"attachRequired": false, "podInfoOnMount": true,
            "volumeLifecycleModes": ["Ephemeral"], "requiresRepublish": true, "fsGroupPolicy": "File",
            "tokenRequests": [{"audience": "connectors.alauda.io", "expirationSeconds": 1800}]})
    );
    // kubelet's tokens are for the audience the proxy's TokenReview accepts.
    assert!(
        args.contains(&format!(
            "--token-audience={}",
            driver["spec"]["tokenRequests"][0]["audience"]
                .as_str()
                .unwrap()
        )),
        "{args}"
    );
    let ds = &docs[&("DaemonSet".into(), "tuna-operator-csi".into())];
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "tuna-operator-csi");
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(
        containers.len(),
        1,
        "the plugin alone: no registrar sidecar"
    );
    let plugin_args = containers[0]["args"].to_string();
    for flag in [
        "--registration-socket=/registration/connectors-csi-reg.sock",
        "--kubelet-endpoint=/var/lib/kubelet/plugins/connectors-csi/csi.sock",
    ] {
        assert!(plugin_args.contains(flag), "{flag} in {plugin_args}");
    }
    assert!(
        containers[0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "registration-dir" && m["mountPath"] == "/registration"),
        "kubelet's registration directory is mounted"
    );
    for c in containers {
        let sc = &c["securityContext"];
        assert_eq!(sc["privileged"], false, "{}", c["name"]);
        assert_eq!(sc["allowPrivilegeEscalation"], false);
        assert_eq!(sc["readOnlyRootFilesystem"], true);
        assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
        for m in c["volumeMounts"].as_array().unwrap() {
            assert_ne!(m["mountPropagation"], "Bidirectional", "nothing is mounted");
        }
    }
    assert_eq!(
        containers[0]["securityContext"]["capabilities"]["add"],
        serde_json::json!(["CHOWN"])
    );
    assert!(
        containers[0]["args"]
            .to_string()
            .contains("--endpoint=unix:///csi/csi.sock")
    );
    let rules = docs[&("ClusterRole".into(), "tuna-operator-csi".into())]["rules"].clone();
    assert_eq!(
        rules,
        serde_json::json!([
            {"apiGroups": ["connectors.alauda.io"], "resources": ["connectors"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
        ])
    );
    assert!(
        !containers[0]["args"].to_string().contains("rotate"),
        "kubelet renews the tokens"
    );
    // Paths are values.
    let moved = by_kind_name(&documents(
        &template(
            home.path(),
            &format!("{case}  csi: {{kubeletDir: /data/kubelet}}\n"),
            &[],
        )
        .unwrap(),
    ));
    let ds = moved[&("DaemonSet".into(), "tuna-operator-csi".into())].to_string();
    assert!(
        ds.contains("/data/kubelet/pods") && ds.contains("/data/kubelet/plugins_registry"),
        "{ds}"
    );
}

/// Wrong values fail, each with a message that says what to change.
#[test]
fn wrong_values_fail_with_their_messages() {
    let home = tempfile::tempdir().unwrap();
    let key = "credentials: {apiKey: k}\n";
    let cases: Vec<(String, &str)> = vec![
        ("{}".into(), "No Tuna API key: set credentials.apiKey=<key>"),
        (
            "credentials: {apiKey: k, existingSecret: s}".into(),
            "The Tuna API key is given more than once",
        ),
        (
            "credentials: {apiKey: k}\nextraEnv: [{name: TUNA_API_KEY, value: x}]".into(),
            "The Tuna API key is given more than once",
        ),
        (
            "credentials: {apikey: k}".into(),
            "at '/credentials': additional properties 'apikey' not allowed",
        ),
        (
            format!("{key}controller: {{replicas: two}}"),
            "at '/controller/replicas': got string, want integer",
        ),
        (
            format!("{key}controller: {{replicas: 2, leaderElection: {{enabled: false}}}}"),
            "controller.replicas > 1 needs controller.leaderElection.enabled=true",
        ),
        (
            format!(
                "{key}metrics: {{service: {{enabled: false}}, serviceMonitor: {{enabled: true}}}}"
            ),
            "metrics.serviceMonitor.enabled=true needs metrics.service.enabled=true",
        ),
        (
            format!("{key}extraEnv: [{{value: x}}]"),
            "at '/extraEnv/0': missing property 'name'",
        ),
        (
            format!("{key}logging: {{format: yaml}}"),
            "at '/logging/format'",
        ),
        (
            format!("{key}edge: {{apiUrl: ''}}"),
            "edge.apiUrl is empty: set it",
        ),
        (
            format!("{key}edge: {{agentAddress: edge.example.com}}"),
            "at '/edge/agentAddress'",
        ),
        (
            format!("{key}controller: {{resyncInterval: 5 minutes}}"),
            "at '/controller/resyncInterval'",
        ),
        (
            format!("{key}agentManager: {{allowExternalUpstreams: 'yes'}}"),
            "at '/agentManager/allowExternalUpstreams': got string, want boolean",
        ),
        (
            format!("{key}agentManager: {{replicas: 2}}"),
            "additional properties 'replicas' not allowed",
        ),
    ];
    for (values, message) in &cases {
        match template(home.path(), values, &[]) {
            Ok(_) => panic!("{values:?} rendered; expected {message:?}"),
            Err(e) => assert!(e.contains(message), "{values:?}: {e}"),
        }
    }
}

#[test]
fn helm_lint_strict_passes_for_each_credentials_mode() {
    let home = tempfile::tempdir().unwrap();
    let chart = chart_dir();
    for (case, values) in &CASES[..4] {
        let file = home.path().join(format!("{case}.yaml"));
        std::fs::write(&file, values).unwrap();
        let out = helm(
            home.path(),
            &[
                "lint",
                "--strict",
                "--kube-version",
                "1.32.0",
                chart.to_str().unwrap(),
                "-f",
                file.to_str().unwrap(),
            ],
            None,
        );
        assert!(out.status.success(), "{case}: {}", text(&out));
    }
}

#[test]
fn chart_metadata_matches_the_binary() {
    let chart: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(chart["apiVersion"], "v2");
    assert_eq!(chart["name"], "tuna-k8s-operator");
    assert_eq!(chart["kubeVersion"], ">=1.32.0-0");
    assert_eq!(
        chart["appVersion"],
        env!("CARGO_PKG_VERSION"),
        "appVersion is the tuna-operator version"
    );
}

// ---- values table ----

/// One documented key of values.yaml.
struct ValueDoc {
    path: String,
    description: String,
}

/// Every key of values.yaml with the comment lines right above it; Err lists
/// the keys without one.
fn value_docs(text: &str) -> Result<Vec<ValueDoc>, Vec<String>> {
    let mut out = Vec::new();
    let mut missing = Vec::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut comment: Vec<String> = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.is_empty() {
            comment.clear();
            continue;
        }
        if let Some(c) = trimmed.strip_prefix('#') {
            comment.push(c.trim().to_owned());
            continue;
        }
        if trimmed.starts_with('-') {
            comment.clear();
            continue; // an item of a list default
        }
        let Some((key, _)) = trimmed.split_once(':') else {
            continue;
        };
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let path = stack
            .iter()
            .map(|(_, k)| k.as_str())
            .chain([key])
            .collect::<Vec<_>>()
            .join(".");
        if comment.is_empty() {
            missing.push(path.clone());
        }
        out.push(ValueDoc {
            path: path.clone(),
            description: comment.join(" "),
        });
        comment.clear();
        stack.push((indent, key.to_owned()));
    }
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(missing)
    }
}

fn lookup<'a>(values: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(values, |v, k| &v[k])
}

/// The README's table: one row per leaf (or empty map/list) of values.yaml.
fn values_table(text: &str) -> String {
    let docs = value_docs(text).unwrap_or_else(|missing| {
        panic!("values.yaml keys without a comment: {missing:?}");
    });
    let values: Value = serde_saphyr::from_str(text).unwrap();
    let mut table = String::from("| key | type | default | description |\n|---|---|---|---|\n");
    for doc in docs {
        let value = lookup(&values, &doc.path);
        if value.as_object().is_some_and(|o| !o.is_empty()) {
            continue;
        }
        let kind = match value {
            Value::String(_) => "string",
            Value::Bool(_) => "bool",
            Value::Number(n) if n.is_i64() || n.is_u64() => "int",
            Value::Number(_) => "number",
            Value::Array(_) => "list",
            Value::Object(_) => "object",
            Value::Null => "null",
        };
        table.push_str(&format!(
            "| `{}` | {kind} | `{}` | {} |\n",
            doc.path,
            value.to_string().replace('|', "\\|"),
            doc.description.replace('|', "\\|")
        ));
    }
    table
}

#[test]
fn readme_values_table_is_generated_from_values_yaml() {
    let values = std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap();
    let readme_path = chart_dir().join("README.md");
    let readme = std::fs::read_to_string(&readme_path).unwrap();
    let (begin, end) = ("<!-- values-table:begin -->\n", "<!-- values-table:end -->");
    let start = readme.find(begin).expect("begin marker") + begin.len();
    let stop = readme.find(end).expect("end marker");
    let expected = format!(
        "{}{}{}",
        &readme[..start],
        values_table(&values),
        &readme[stop..]
    );
    golden(&readme_path, &expected);
    // Every key of the schema's top level is documented, and the other way round.
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let parsed: Value = serde_saphyr::from_str(&values).unwrap();
    let in_values: Vec<&String> = parsed.as_object().unwrap().keys().collect();
    for k in &in_values {
        assert!(
            schema["properties"].get(k.as_str()).is_some(),
            "{k} is not in values.schema.json"
        );
    }
}

#[test]
fn the_values_table_generator_requires_a_comment_on_every_key() {
    let missing = value_docs("# a\na: 1\nb:\n  # c\n  c: 2\n").err().unwrap();
    assert_eq!(missing, ["b"]);
    let table = values_table("# Key a.\na: 1\n# Map b.\nb:\n  # Key c | d.\n  c: [x]\n");
    assert_eq!(
        table,
        "| key | type | default | description |\n|---|---|---|---|\n| `a` | int | `1` | Key a. |\n| `b.c` | list | `[\"x\"]` | Key c \\| d. |\n"
    );
}

// ---- examples ----

/// The chart's examples pass the CRDs' schemas and CEL rules (a real
/// kube-apiserver validates them), and a broken one fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_pass_the_crd_schemas_and_cel_rules() {
    let cluster = support::Cluster::start().await;
    let examples = chart_dir().join("examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&examples)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "api-key-secret-ref.yaml",
            "custom-domain.yaml",
            "domain-ingress.yaml",
            "tcp-endpoint.yaml",
            "tunnel.yaml"
        ]
    );
    for f in &files {
        let out = cluster.kubectl_ok(&[
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            f.to_str().unwrap(),
        ]);
        assert!(out.contains("(server dry run)"), "{}: {out}", f.display());
    }
    let broken = std::fs::read_to_string(examples.join("tcp-endpoint.yaml"))
        .unwrap()
        .replace("url: tcp://postgres:5432", "url: http://postgres:5432");
    let out = cluster.kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], Some(&broken));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a tcp Tunnel needs a tcp:// upstream URL"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `connectors.enabled`: the chart installs the admission policy of
/// examples/connectors/admission-policy.yaml (what tests/e2e/connector.rs
/// proves), named for the release; `connectors.admissionPolicy.enabled=false`
/// leaves it out.
#[test]
fn the_connectors_admission_policy_is_the_examples() {
    let home = tempfile::tempdir().unwrap();
    let case = CASES.iter().find(|(n, _)| *n == "connectors").unwrap().1;
    let docs = by_kind_name(&documents(&template(home.path(), case, &[]).unwrap()));
    let example = by_kind_name(&documents(
        &std::fs::read_to_string(root().join("examples/connectors/admission-policy.yaml")).unwrap(),
    ));
    let name = "tuna-operator-connectors-secret-access";
    for kind in [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        let key = (kind.to_owned(), name.to_owned());
        assert_eq!(docs[&key]["spec"], example[&key]["spec"], "{kind}");
    }
    let off = by_kind_name(&documents(
        &template(
            home.path(),
            &format!("{case}  admissionPolicy: {{enabled: false}}\n"),
            &[],
        )
        .unwrap(),
    ));
    assert!(
        !off.keys()
            .any(|(k, n)| k.starts_with("ValidatingAdmissionPolicy") && n == name),
        "{:?}",
        off.keys().collect::<Vec<_>>()
    );
}

/// `helm upgrade --reuse-values` (the documented upgrade) renders the new
/// templates with the *old* release's values, not the new chart's defaults:
/// a value added since must not be required. Shown with the chart's own
/// values.yaml stripped of `agentManager.claimsPolicy` (what a release
/// installed before it has): the render succeeds and keeps the policy on.
/// Before, it failed with a nil pointer (reproduced with a real
/// `helm upgrade --reuse-values` from the chart of c0e5582).
#[test]
fn a_reused_values_file_from_before_the_claims_policy_still_renders_it() {
    let home = tempfile::tempdir().unwrap();
    let chart = home.path().join("tuna-k8s-operator");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(chart_dir())
        .arg(&chart)
        .status()
        .unwrap();
    assert!(copied.success());
    let values = std::fs::read_to_string(chart.join("values.yaml")).unwrap();
    let start = values
        .find("  # Who may write the legacy host-claim records.\n")
        .expect("the block");
    let end =
        start + values[start..].find("    enabled: true\n").unwrap() + "    enabled: true\n".len();
    std::fs::write(
        chart.join("values.yaml"),
        format!("{}{}", &values[..start], &values[end..]),
    )
    .unwrap();
    let out = helm(
        home.path(),
        &[
            "template",
            "tuna-operator",
            chart.to_str().unwrap(),
            "--namespace",
            "tuna-system",
            "--set",
            "credentials.apiKey=k",
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out));
    let rendered = String::from_utf8(out.stdout).unwrap();
    assert!(
        rendered.contains("name: tuna-operator-agent-host-claims"),
        "{rendered}"
    );
}

/// The agent's host-claims policy (tests/e2e/chart.rs proves it on a real API
/// server) exempts exactly the agent's ServiceAccount of the release;
/// `agentManager.claimsPolicy.enabled=false` leaves it out.
#[test]
fn the_host_claims_policy_exempts_the_agent_and_can_be_left_out() {
    let home = tempfile::tempdir().unwrap();
    let case = CASES.iter().find(|(n, _)| *n == "api-key").unwrap().1;
    let name = "tuna-operator-agent-host-claims";
    let policy = |values: &str| {
        let docs = by_kind_name(&documents(&template(home.path(), values, &[]).unwrap()));
        let key = ("ValidatingAdmissionPolicy".to_owned(), name.to_owned());
        let binding = (
            "ValidatingAdmissionPolicyBinding".to_owned(),
            name.to_owned(),
        );
        assert_eq!(docs.contains_key(&key), docs.contains_key(&binding));
        docs.get(&key).cloned()
    };
    let on = policy(case).expect("the policy is on by default");
    assert_eq!(
        on["spec"]["matchConditions"][0]["expression"],
        "request.userInfo.username != 'system:serviceaccount:tuna-system:tuna-operator-agent'"
    );
    let off = policy(&format!(
        "{case}agentManager: {{claimsPolicy: {{enabled: false}}}}\n"
    ));
    assert!(off.is_none());
}

/// The GatewayClass renders only where the cluster serves the Gateway API
/// (`.Capabilities`, here `--api-versions`), named by
/// `gatewayAPI.gatewayClass.name`, and not at all with `create: false`; a
/// values file from before `gatewayAPI` (`helm upgrade --reuse-values`)
/// renders it with the defaults.
#[test]
fn the_gateway_class_renders_only_where_the_gateway_api_is_installed() {
    let home = tempfile::tempdir().unwrap();
    let case = CASES.iter().find(|(n, _)| *n == "api-key").unwrap().1;
    let with_crds = [
        "--api-versions",
        "gateway.networking.k8s.io/v1/GatewayClass",
    ];
    let classes = |values: &str, extra: &[&str]| -> Vec<Value> {
        documents(&template(home.path(), values, extra).unwrap())
            .into_iter()
            .filter(|d| d["kind"] == "GatewayClass")
            .collect()
    };
    assert!(classes(case, &[]).is_empty());
    // `case` has no gatewayAPI key: what a reused older values file gives.
    let class = classes(case, &with_crds);
    assert_eq!(class.len(), 1);
    assert_eq!(class[0]["apiVersion"], "gateway.networking.k8s.io/v1");
    assert_eq!(class[0]["metadata"]["name"], "tuna");
    assert_eq!(
        class[0]["spec"]["controllerName"],
        "k8s.tuna.am/gateway-controller"
    );
    // The CRD's limit (a real API server refused a longer one).
    assert!(class[0]["spec"]["description"].as_str().unwrap().len() <= 64);
    let renamed = classes(
        &format!("{case}gatewayAPI: {{gatewayClass: {{name: edge}}}}\n"),
        &with_crds,
    );
    assert_eq!(renamed[0]["metadata"]["name"], "edge");
    let off = classes(
        &format!("{case}gatewayAPI: {{gatewayClass: {{create: false}}}}\n"),
        &with_crds,
    );
    assert!(off.is_empty());
}
