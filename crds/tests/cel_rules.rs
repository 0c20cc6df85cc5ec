//! The CEL `x-kubernetes-validations` of the generated CRDs, evaluated with
//! kube-cel (the evaluator kube-rs ships) against valid and invalid objects, as
//! the API server would on create and on update.

use kube::CustomResourceExt;
use kube_cel::Validator;
use serde_json::{Value, json};
use tuna_crds::{Domain, TcpEndpoint, Tunnel};

fn schema_of(
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Value {
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("generated CRD has a schema");
    serde_json::to_value(schema).expect("schema serializes")
}

/// Messages of the rules that fail, empty when the object is accepted.
fn failures(schema: &Value, object: Value, old: Option<Value>) -> Vec<String> {
    match Validator::new().validate(schema, &object, old.as_ref()) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.into_vec().into_iter().map(|e| e.message).collect(),
    }
}

fn object(spec: Value) -> Value {
    json!({"apiVersion": "k8s.tuna.am/v1alpha1", "metadata": {"name": "x", "namespace": "default"}, "spec": spec})
}

#[test]
fn tunnel_rules() {
    let schema = schema_of(Tunnel::crd());
    // (case, spec, expected failing message fragment or None when valid)
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        (
            "http with subdomain",
            json!({"protocol": "http", "subdomain": "web", "upstream": {"url": "http://web:80"}}),
            None,
        ),
        (
            "https upstream",
            json!({"protocol": "http", "subdomain": "web", "upstream": {"url": "https://web:8443"}}),
            None,
        ),
        (
            "protocol defaults to http",
            json!({"subdomain": "web", "upstream": {"url": "http://web:80"}}),
            None,
        ),
        (
            "default protocol still needs http upstream",
            json!({"subdomain": "web", "upstream": {"url": "tcp://db:5432"}}),
            Some("http:// or https://"),
        ),
        (
            "tcp with alias",
            json!({"protocol": "tcp", "portOrAlias": "postgres", "upstream": {"url": "tcp://db:5432"}}),
            None,
        ),
        (
            "tcp with port",
            json!({"protocol": "tcp", "portOrAlias": 30001, "upstream": {"url": "tcp://db:5432"}}),
            None,
        ),
        (
            "tcp without portOrAlias",
            json!({"protocol": "tcp", "upstream": {"url": "tcp://db:5432"}}),
            Some("needs spec.portOrAlias"),
        ),
        (
            "tcp with http upstream",
            json!({"protocol": "tcp", "portOrAlias": "pg", "upstream": {"url": "http://db:5432"}}),
            Some("tcp:// upstream"),
        ),
        (
            "http with tcp upstream",
            json!({"protocol": "http", "subdomain": "web", "upstream": {"url": "tcp://web:80"}}),
            Some("http:// or https://"),
        ),
        (
            "http without subdomain",
            json!({"protocol": "http", "upstream": {"url": "http://web:80"}}),
            Some("needs spec.subdomain"),
        ),
        (
            "http with portOrAlias",
            json!({"protocol": "http", "subdomain": "web", "portOrAlias": 1, "upstream": {"url": "http://web:80"}}),
            Some("tcp Tunnels only"),
        ),
        (
            "tcp with subdomain",
            json!({"protocol": "tcp", "subdomain": "w", "portOrAlias": 1, "upstream": {"url": "tcp://db:1"}}),
            Some("http Tunnels only"),
        ),
    ];
    for (name, spec, expected) in cases {
        let got = failures(&schema, object(spec), None);
        match expected {
            None => assert!(got.is_empty(), "{name}: expected valid, got {got:?}"),
            Some(fragment) => assert!(
                got.iter().any(|m| m.contains(fragment)),
                "{name}: expected a failure containing {fragment:?}, got {got:?}"
            ),
        }
    }
}

#[test]
fn domain_rules_on_create() {
    let schema = schema_of(Domain::crd());
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        ("subdomain", json!({"subdomain": "shop"}), None),
        (
            "custom domain",
            json!({"domain": "shop.example.com", "reclaimPolicy": "Retain"}),
            None,
        ),
        (
            "both",
            json!({"subdomain": "shop", "domain": "shop.example.com"}),
            Some("exactly one"),
        ),
        ("neither", json!({}), Some("exactly one")),
    ];
    for (name, spec, expected) in cases {
        let got = failures(&schema, object(spec), None);
        match expected {
            None => assert!(got.is_empty(), "{name}: expected valid, got {got:?}"),
            Some(fragment) => assert!(
                got.iter().any(|m| m.contains(fragment)),
                "{name}: expected a failure containing {fragment:?}, got {got:?}"
            ),
        }
    }
}

#[test]
fn domain_transition_rules() {
    let schema = schema_of(Domain::crd());
    let sub = |s: &str| object(json!({"subdomain": s}));
    let custom = |d: &str| object(json!({"domain": d}));
    let cases: Vec<(&str, Value, Value, Option<&str>)> = vec![
        ("unchanged subdomain", sub("shop"), sub("shop"), None),
        (
            "reclaim policy may change",
            sub("shop"),
            object(json!({"subdomain": "shop", "reclaimPolicy": "Retain"})),
            None,
        ),
        (
            "subdomain to domain",
            sub("shop"),
            custom("shop.example.com"),
            Some("cannot switch"),
        ),
        (
            "domain to subdomain",
            custom("shop.example.com"),
            sub("shop"),
            Some("cannot switch"),
        ),
        (
            "renamed subdomain",
            sub("shop"),
            sub("store"),
            Some("spec.subdomain is immutable"),
        ),
        (
            "renamed domain",
            custom("a.example.com"),
            custom("b.example.com"),
            Some("spec.domain is immutable"),
        ),
    ];
    for (name, old, new, expected) in cases {
        let got = failures(&schema, new, Some(old));
        match expected {
            None => assert!(got.is_empty(), "{name}: expected valid, got {got:?}"),
            Some(fragment) => assert!(
                got.iter().any(|m| m.contains(fragment)),
                "{name}: expected a failure containing {fragment:?}, got {got:?}"
            ),
        }
    }
}

#[test]
fn tcpendpoint_alias_is_immutable() {
    let schema = schema_of(TcpEndpoint::crd());
    let ep = |a: &str| object(json!({"alias": a}));
    assert!(failures(&schema, ep("pg"), None).is_empty());
    assert!(failures(&schema, ep("pg"), Some(ep("pg"))).is_empty());
    let got = failures(&schema, ep("db"), Some(ep("pg")));
    assert!(
        got.iter().any(|m| m.contains("alias is immutable")),
        "{got:?}"
    );
}

#[test]
fn crd_names_and_columns() {
    let names: Vec<(String, Vec<String>)> = tuna_crds::crds()
        .into_iter()
        .map(|c| {
            (
                c.metadata.name.unwrap(),
                c.spec.names.short_names.unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        names,
        vec![
            ("tunnels.k8s.tuna.am".to_owned(), vec!["tun".to_owned()]),
            ("domains.k8s.tuna.am".to_owned(), vec!["tdom".to_owned()]),
            (
                "tcpendpoints.k8s.tuna.am".to_owned(),
                vec!["tcpe".to_owned()]
            ),
        ]
    );
    // Short names of kubectl's built-in kinds (kubectl api-resources, v1.32): ours must not shadow them.
    let builtin = [
        "cs", "cm", "ep", "ev", "limits", "ns", "no", "pvc", "pv", "po", "rc", "quota", "sa",
        "svc", "crd", "crds", "ds", "deploy", "rs", "sts", "hpa", "cj", "csr", "ing", "netpol",
        "pdb", "pc", "sc", "ingclass",
    ];
    for (_, shorts) in &names {
        for s in shorts {
            assert!(
                !builtin.contains(&s.as_str()),
                "short name {s} clashes with a built-in kind"
            );
        }
    }
    let columns: Vec<Vec<String>> = tuna_crds::crds()
        .into_iter()
        .map(|c| {
            c.spec.versions[0]
                .additional_printer_columns
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|col| col.name)
                .collect()
        })
        .collect();
    assert_eq!(columns[0], ["Protocol", "URL", "Ready", "Age"]);
    assert_eq!(columns[1], ["FQDN", "Ready", "Adopted", "Age"]);
    assert_eq!(columns[2], ["Alias", "Address", "Ready", "Age"]);
}

#[test]
fn typed_round_trip_through_yaml() {
    let yaml = r#"
apiVersion: k8s.tuna.am/v1alpha1
kind: Tunnel
metadata: {name: db, namespace: default}
spec:
  protocol: tcp
  portOrAlias: postgres
  upstream: {url: "tcp://postgres:5432"}
  apiKeySecretRef: {name: tuna-key}
"#;
    let tunnel: Tunnel = serde_saphyr::from_str(yaml).unwrap();
    assert_eq!(tunnel.spec.protocol, tuna_crds::TunnelProtocol::Tcp);
    assert_eq!(
        tunnel
            .spec
            .api_key_secret_ref
            .as_ref()
            .unwrap()
            .key_or_default(),
        "api-key"
    );
    let again: Tunnel = serde_saphyr::from_str(&serde_saphyr::to_string(&tunnel).unwrap()).unwrap();
    assert_eq!(again, tunnel);
}
