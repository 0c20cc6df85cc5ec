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
        (vec!["http://a.example.com/"], "--filename"),
    ];
    for (args, message) in cases {
        let out = run(&args);
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}
