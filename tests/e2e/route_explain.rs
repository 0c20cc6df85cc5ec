//! `tuna-operator route explain` end to end: the real binary on the shipped
//! examples and on temporary manifests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ingress")
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tuna-operator"))
        .args(["route", "explain"])
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run tuna-operator")
}

fn explain_json(files: &[&Path], url: &str) -> Value {
    let mut args: Vec<String> = Vec::new();
    for f in files {
        args.push("-f".into());
        args.push(f.display().to_string());
    }
    args.extend(["--output".into(), "json".into(), url.into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(&args);
    assert!(
        out.status.success(),
        "{url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{url}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// Every row of the Kubernetes documentation's path-matching table, answered
/// from `examples/ingress/path-matching.yaml` (see its README).
#[test]
fn answers_the_documentation_examples() {
    let rows: &[(&str, Option<&str>)] = &[
        ("http://prefix-root.example.com/", Some("root")),
        ("http://prefix-root.example.com/any/path", Some("root")),
        ("http://exact-foo.example.com/foo", Some("foo-exact")),
        ("http://exact-foo.example.com/bar", None),
        ("http://exact-foo.example.com/foo/", None),
        ("http://exact-foo-slash.example.com/foo", None),
        ("http://prefix-foo.example.com/foo", Some("foo-prefix")),
        ("http://prefix-foo.example.com/foo/", Some("foo-prefix")),
        (
            "http://prefix-foo-slash.example.com/foo",
            Some("foo-slash-prefix"),
        ),
        (
            "http://prefix-foo-slash.example.com/foo/",
            Some("foo-slash-prefix"),
        ),
        ("http://prefix-aaa-bb.example.com/aaa/bbb", None),
        ("http://prefix-aaa-bbb.example.com/aaa/bbb", Some("aaa-bbb")),
        (
            "http://prefix-aaa-bbb-slash.example.com/aaa/bbb",
            Some("aaa-bbb-slash"),
        ),
        (
            "http://prefix-aaa-bbb.example.com/aaa/bbb/",
            Some("aaa-bbb"),
        ),
        (
            "http://prefix-aaa-bbb.example.com/aaa/bbb/ccc",
            Some("aaa-bbb"),
        ),
        ("http://prefix-aaa-bbb.example.com/aaa/bbbxyz", None),
        ("http://prefix-two.example.com/aaa/ccc", Some("two-aaa")),
        (
            "http://prefix-three.example.com/aaa/bbb",
            Some("three-aaa-bbb"),
        ),
        ("http://prefix-three.example.com/ccc", Some("three-root")),
        ("http://prefix-aaa.example.com/ccc", None),
        ("http://mixed.example.com/foo", Some("foo-exact")),
    ];
    let dir = examples();
    for (url, want) in rows {
        let json = explain_json(&[&dir], url);
        assert_eq!(json["matched"], Value::Bool(want.is_some()), "{url}");
        assert_eq!(json["service"].as_str(), *want, "{url}");
        if want.is_none() {
            for key in ["namespace", "ingress", "host", "path", "pathType", "port"] {
                assert!(json[key].is_null(), "{url}: {key} should be null");
            }
        }
    }
}

#[test]
fn json_names_ingress_rule_and_service_port() {
    let json = explain_json(
        &[&examples()],
        "https://Shop.Example.com:443/api/orders?page=2",
    );
    assert_eq!(
        json,
        serde_json::json!({
            "matched": true,
            "namespace": "shop",
            "ingress": "shop-api",
            "host": "shop.example.com",
            "path": "/api",
            "pathType": "Prefix",
            "service": "api",
            "port": 8080,
            "skipped": [],
        })
    );
    // A named port stays a name.
    let json = explain_json(&[&examples()], "https://shop.example.com/apix");
    assert_eq!(json["service"], "web");
    assert_eq!(json["port"], "http");
}

#[test]
fn text_says_why_the_others_lost() {
    let out = run(&[
        "-f",
        examples().to_str().unwrap(),
        "https://shop.example.com/api/health",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("served by Ingress shop/shop-api rule 0 path 1 (Exact /api/health) -> Service shop/api-health:8081"), "{text}");
    assert!(text.contains("shop/shop-web rule 0 path 0: Prefix shop.example.com/ -> shop/web:http: a longer matching path wins"), "{text}");

    let out = run(&[
        "-f",
        examples().to_str().unwrap(),
        "http://exact-foo.example.com/foo/",
    ]);
    assert!(out.status.success(), "no match still exits 0");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("no route matches (no path of this host matches): a 404 would be served"),
        "{text}"
    );
    assert!(
        text.contains(
            "Exact exact-foo.example.com/foo -> default/foo-exact:80: path does not match"
        ),
        "{text}"
    );

    let out = run(&[
        "-f",
        examples().to_str().unwrap(),
        "http://unknown.example.com/",
    ]);
    assert!(out.status.success());
    assert!(
        String::from_utf8(out.stdout)
            .unwrap()
            .contains("a 404 would be served")
    );
}

const SKIPPING: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: older
  creationTimestamp: "2024-01-01T00:00:00Z"
spec:
  ingressClassName: tuna
  rules:
    - host: app.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: old-web, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: newer
  creationTimestamp: "2024-06-01T00:00:00Z"
spec:
  ingressClassName: tuna
  rules:
    - http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: nohost, port: {number: 80}}}}
    - host: "*.example.com"
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: wild, port: {number: 80}}}}
    - host: app.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: new-web, port: {number: 80}}}}
          - {path: /files, pathType: Prefix, backend: {resource: {kind: Bucket, name: files}}}
          - {path: /a//b, pathType: Exact, backend: {service: {name: bad, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: other-class
spec:
  ingressClassName: nginx
  rules:
    - host: app.example.com
      http:
        paths:
          - {path: /nginx, pathType: Prefix, backend: {service: {name: nginx, port: {number: 80}}}}
---
apiVersion: v1
kind: Service
metadata: {name: ignored}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Domain
metadata: {name: app}
spec: {domain: app.example.com}
"#;

#[test]
fn reports_skipped_items_and_conflicts() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("a/b");
    std::fs::create_dir_all(&nested).unwrap();
    std::fs::write(nested.join("app.yaml"), SKIPPING).unwrap();
    let json = explain_json(&[dir.path()], "http://app.example.com/nginx");
    assert_eq!(json["service"], "old-web", "{json}");
    let reasons: Vec<(&str, &str, &str)> = json["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["ingress"].as_str().unwrap(),
                s["kind"].as_str().unwrap(),
                s["reason"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        [
            ("newer", "Rule", "RuleWithoutHost"),
            ("newer", "Rule", "WildcardHost"),
            ("newer", "Backend", "ResourceBackend"),
            ("other-class", "Ingress", "OtherIngressClass"),
            ("newer", "Rule", "RouteConflict"),
            ("newer", "Rule", "PathRepeatedSlash"),
        ]
    );

    let out = run(&[
        "-f",
        dir.path().to_str().unwrap(),
        "http://app.example.com/x",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("same rule as default/older rule 0 path 0, which wins as the older object"),
        "{text}"
    );
    assert!(
        text.contains("default/newer rule 0: RuleWithoutHost"),
        "{text}"
    );

    // The class is a parameter.
    let json = {
        let out = run(&[
            "-f",
            dir.path().to_str().unwrap(),
            "--ingress-class",
            "nginx",
            "-o",
            "json",
            "http://app.example.com/nginx/x",
        ]);
        assert!(out.status.success());
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    assert_eq!(json["service"], "nginx");
}

#[test]
fn bad_input_fails_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: a}\n---\nspec: [unclosed\n").unwrap();
    let invalid = dir.path().join("invalid.yaml");
    std::fs::write(
        &invalid,
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: a}\nspec: {rules: 42}\n",
    )
    .unwrap();
    let missing = dir.path().join("missing.yaml");
    let examples = examples();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["-f", broken.to_str().unwrap(), "http://a.example.com/"],
            "document 1",
        ),
        (
            vec!["-f", invalid.to_str().unwrap(), "http://a.example.com/"],
            "invalid Ingress manifests",
        ),
        (
            vec!["-f", missing.to_str().unwrap(), "http://a.example.com/"],
            "cannot read",
        ),
        (
            vec!["-f", examples.to_str().unwrap(), "ftp://a.example.com/"],
            "only http and https",
        ),
        (
            vec![
                "-f",
                examples.to_str().unwrap(),
                "http://a.example.com:port/",
            ],
            "not a valid host",
        ),
        // Without -f the cluster of the current kubeconfig is read.
        (
            vec!["http://a.example.com/"],
            "no Kubernetes cluster to read",
        ),
    ];
    let no_cluster = dir.path().join("no-such-kubeconfig");
    for (args, message) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_tuna-operator"))
            .args(["route", "explain"])
            .args(&args)
            .env("RUST_LOG", "warn")
            .env("KUBECONFIG", &no_cluster)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .expect("run tuna-operator");
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}

/// A failure is one readable message that names its cause once: the
/// library's messages carry their cause, and kube's errors quote theirs, so a
/// chain printer would repeat the kubeconfig's path three times and the OS
/// error four.
#[test]
fn a_failure_names_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-kubeconfig");
    let out = Command::new(env!("CARGO_BIN_EXE_tuna-operator"))
        .args(["route", "explain", "http://a.example.com/"])
        .env("RUST_LOG", "warn")
        .env("KUBECONFIG", &missing)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("run tuna-operator");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(
            "Error: no Kubernetes cluster to read (set KUBECONFIG, or give manifests with -f): "
        ),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches(missing.to_str().unwrap()).count(),
        1,
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );
}

/// `route explain` builds what the agent serves: a host belongs to the
/// namespace of its Domain even when another namespace's Ingress is older, an
/// unreserved host is not published (unless `--account-domain` names it), and
/// a Tunnel's host is not available to Ingresses.
#[test]
fn hosts_are_owned_and_reserved_as_the_agent_sees_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("all.yaml"),
        r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: old-thief, namespace: blog, creationTimestamp: "2020-01-01T00:00:00Z"}
spec:
  ingressClassName: tuna
  rules:
    - host: shop.example.com
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: blog, port: {number: 80}}}}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: shop, namespace: shop, creationTimestamp: "2024-01-01T00:00:00Z"}
spec:
  ingressClassName: tuna
  rules:
    - host: shop.example.com
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
    - host: free.example.com
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: free, port: {number: 80}}}}]}
    - host: web.tuna.test
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Domain
metadata: {name: shop, namespace: shop}
spec: {domain: shop.example.com}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Domain
metadata: {name: web, namespace: shop}
spec: {subdomain: web}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Tunnel
metadata: {name: web, namespace: shop}
spec: {subdomain: web, upstream: {url: "http://web:80"}}
"#,
    )
    .unwrap();
    let f = dir.path().to_str().unwrap();
    let out = run(&[
        "-f",
        f,
        "--base-domain",
        "tuna.test",
        "-o",
        "json",
        "https://shop.example.com/",
    ]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["namespace"], "shop", "{json}");
    let skipped: Vec<(String, String)> = json["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                format!(
                    "{}/{}",
                    s["namespace"].as_str().unwrap(),
                    s["ingress"].as_str().unwrap()
                ),
                s["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for expected in [
        ("blog/old-thief", "HostOwnedByOtherNamespace"),
        ("shop/shop", "HostNotReserved"),
        ("shop/shop", "HostUsedByTunnel"),
    ] {
        assert!(
            skipped.contains(&(expected.0.to_owned(), expected.1.to_owned())),
            "{expected:?} in {skipped:?}"
        );
    }
    assert_eq!(
        explain_json(&[dir.path()], "https://free.example.com/")["matched"],
        false
    );
    let out = run(&[
        "-f",
        f,
        "--account-domain",
        "free.example.com",
        "-o",
        "json",
        "https://free.example.com/",
    ]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["service"], "free", "{json}");
    // The Tunnel's host is served by the Tunnel (with --base-domain for subdomains).
    let out = run(&[
        "-f",
        f,
        "--base-domain",
        "tuna.test",
        "https://web.tuna.test/",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("served by Tunnel shop/web"), "{text}");
}
