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

fn gateway_examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gateway")
}

/// `route explain` on Gateway API manifests, with the pinned interface:
/// `-f DIR URL [--method M] [--header 'N: v']… [--account-domain H]… --output json`.
fn gateway_explain(dir: &Path, url: &str, extra: &[&str], accounts: &[&str]) -> Value {
    let mut args: Vec<String> = vec!["-f".into(), dir.display().to_string()];
    for a in accounts {
        args.extend(["--account-domain".into(), (*a).into()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
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

const EXAMPLE_HOSTS: &[&str] = &["shop.example.com", "old.example.com", "blog.example.com"];

fn backends(json: &Value) -> Vec<(String, String, i64)> {
    json["backends"]
        .as_array()
        .unwrap_or_else(|| panic!("backends in {json}"))
        .iter()
        .map(|b| {
            (
                b["namespace"].as_str().unwrap().to_owned(),
                b["service"].as_str().unwrap().to_owned(),
                b["weight"].as_i64().unwrap(),
            )
        })
        .collect()
}

fn route_of(json: &Value) -> (String, String, i64) {
    let r = &json["route"];
    (
        r["kind"].as_str().unwrap_or("").to_owned(),
        r["name"].as_str().unwrap_or("").to_owned(),
        r["rule"].as_i64().unwrap_or(-1),
    )
}

/// Every row of `examples/gateway/README.md`.
#[test]
fn answers_the_gateway_examples() {
    let dir = gateway_examples();
    let ask = |url: &str, extra: &[&str]| gateway_explain(&dir, url, extra, EXAMPLE_HOSTS);
    let shop = |ns: &str, s: &str, w: i64| (ns.to_owned(), s.to_owned(), w);

    let root = ask("https://shop.example.com/", &[]);
    assert_eq!(root["matched"], true);
    assert!(root.get("status").is_none(), "{root}");
    assert_eq!(route_of(&root), ("HTTPRoute".into(), "store".into(), 0));
    assert_eq!(
        backends(&root),
        [shop("shop", "web", 3), shop("shop", "web-canary", 1)]
    );

    let api = ask("https://shop.example.com/api/orders", &[]);
    assert_eq!(route_of(&api), ("HTTPRoute".into(), "store".into(), 1));
    assert_eq!(backends(&api), [shop("shop", "api", 1)]);
    assert_eq!(api["backends"][0]["port"], 8080);

    let v2 = ask(
        "https://shop.example.com/api/orders",
        &["--header", "x-api-version: 2"],
    );
    assert_eq!(route_of(&v2), ("HTTPRoute".into(), "store".into(), 2));
    let v3 = ask(
        "https://shop.example.com/api/orders",
        &["--header", "X-Api-Version: 3"],
    );
    assert_eq!(route_of(&v3), ("HTTPRoute".into(), "store".into(), 1));

    let login = ask("https://shop.example.com/login", &["--method", "POST"]);
    assert_eq!(route_of(&login), ("HTTPRoute".into(), "store".into(), 3));
    let get_login = ask("https://shop.example.com/login", &[]);
    assert_eq!(
        route_of(&get_login),
        ("HTTPRoute".into(), "store".into(), 0)
    );
    let lost: Vec<&Value> = get_login["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["rule"] == 3)
        .collect();
    assert_eq!(lost[0]["outcome"], "MethodDoesNotMatch", "{get_login}");

    let status = ask("https://shop.example.com/status", &[]);
    assert_eq!(route_of(&status), ("HTTPRoute".into(), "status".into(), 0));
    assert_eq!(backends(&status), [shop("infra", "status", 1)]);

    let old = ask("https://old.example.com/x", &[]);
    assert_eq!(route_of(&old), ("HTTPRoute".into(), "old-site".into(), 0));
    assert!(old.get("status").is_none(), "a redirect is answered: {old}");

    let blog = ask("https://blog.example.com/", &[]);
    assert_eq!(blog["matched"], true);
    assert_eq!(blog["status"], 500);
    assert_eq!(backends(&blog), []);
    assert_eq!(blog["invalidBackends"][0]["reason"], "RefNotPermitted");
    assert_eq!(blog["invalidBackends"][0]["service"], "status");

    let other = ask("https://other.example.com/", &[]);
    assert_eq!(other["matched"], false);
    assert_eq!(other["status"], 404);
    assert!(other.get("route").is_none());
}

/// A temporary directory of manifests, one file.
fn manifests(yaml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("nested")).unwrap();
    std::fs::write(dir.path().join("nested/all.yaml"), yaml).unwrap();
    dir
}

const CLASS_AND_GATEWAY: &str = "
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: tuna}
spec: {controllerName: k8s.tuna.am/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: default}
spec:
  gatewayClassName: tuna
  listeners:
  - {name: any, protocol: HTTP, port: 80}
  - {name: wild, protocol: HTTP, port: 81, hostname: '*.example.com'}
---
apiVersion: v1
kind: Service
metadata: {name: a, namespace: default}
spec: {ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: b, namespace: default}
spec: {ports: [{port: 80}]}
";

/// Across routes the specification's order decides: the more specific
/// hostname first, then the older route; a host that is an IP address
/// reaches only routes without a hostname; a wildcard serves only reserved
/// hosts; a missing Service is `BackendNotFound` (500).
#[test]
fn gateway_precedence_hosts_and_missing_backends() {
    let dir = manifests(&format!(
        "{CLASS_AND_GATEWAY}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: wild, namespace: default, creationTimestamp: '2026-01-01T00:00:00Z'}}
spec:
  parentRefs: [{{name: gw, sectionName: wild}}]
  rules: [{{backendRefs: [{{name: a, port: 80}}]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: exact, namespace: default, creationTimestamp: '2026-02-01T00:00:00Z'}}
spec:
  parentRefs: [{{name: gw, sectionName: wild}}]
  hostnames: [x.example.com]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /only}}}}]
    backendRefs: [{{name: b, port: 80}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: catch-all, namespace: default, creationTimestamp: '2026-03-01T00:00:00Z'}}
spec:
  parentRefs: [{{name: gw, sectionName: any}}]
  rules: [{{backendRefs: [{{name: gone, port: 80}}]}}]
"
    ));
    let ask = |url: &str, accounts: &[&str]| gateway_explain(dir.path(), url, &[], accounts);
    let hosts = &["x.example.com", "y.a.example.com"];
    // The exact hostname wins on its paths, even though the wildcard route is older…
    let only = ask("http://x.example.com:8080/only/1", hosts);
    assert_eq!(route_of(&only).1, "exact", "{only}");
    // …and elsewhere the wildcard's rule (more hostname characters than the catch-all) serves.
    let elsewhere = ask("http://x.example.com/other", hosts);
    assert_eq!(route_of(&elsewhere).1, "wild", "{elsewhere}");
    // A wildcard spans several labels.
    assert_eq!(route_of(&ask("http://y.a.example.com/", hosts)).1, "wild");
    // Not reserved: nothing serves it.
    let unreserved = ask("http://z.example.com/", hosts);
    assert_eq!(unreserved["status"], 404, "{unreserved}");
    // By IP address: only the hostname-less listener and route; its Service is missing.
    let ip = ask("http://192.0.2.7:8080/x", hosts);
    assert_eq!(route_of(&ip).1, "catch-all", "{ip}");
    assert_eq!(ip["status"], 500);
    assert_eq!(ip["invalidBackends"][0]["reason"], "BackendNotFound");
}
