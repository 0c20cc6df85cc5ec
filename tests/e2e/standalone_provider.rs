//! The standalone file provider without network: manifests → published hosts,
//! TCP endpoints, tunnels and skipped items; diffs; file watching; the report.

use std::path::{Path, PathBuf};

use tuna_operator::edge::publisher::RouteBackend;
use tuna_operator::manifest::{load_paths, load_str};
use tuna_operator::plan::tunnel::PortOrAlias;
use tuna_operator::standalone::{
    Change, DesiredOptions, FileProvider, PublicAddresses, desired_state, diff, render,
};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/standalone")
}

fn state_of(yaml: &str) -> tuna_operator::standalone::DesiredState {
    desired_state(
        &load_str(yaml, "test.yaml".as_ref()),
        &DesiredOptions::default(),
    )
}

/// (public URL → upstream) pairs of a state, sorted.
fn published(state: &tuna_operator::standalone::DesiredState) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (host, p) in &state.hosts {
        for r in &p.routes {
            out.push((
                format!("{host}{} {}", r.path, r.path_type),
                match &r.backend {
                    RouteBackend::Upstream(u) => u.authority(),
                    gateway => gateway.to_string(),
                },
            ));
        }
    }
    for (tunnel, t) in &state.tcp {
        out.push((
            format!("tcp {tunnel} {}", t.endpoint),
            t.upstream.authority(),
        ));
    }
    out.sort();
    out
}

fn reasons(state: &tuna_operator::standalone::DesiredState) -> Vec<(String, String)> {
    state
        .skipped
        .iter()
        .map(|s| (s.object.clone(), s.reason.clone()))
        .collect()
}

#[test]
fn the_examples_publish_everything_and_skip_nothing() {
    let state = desired_state(&load_paths(&[examples()]), &DesiredOptions::default());
    assert_eq!(
        state.skipped,
        vec![],
        "{}",
        render(&state, &PublicAddresses::default())
    );
    assert_eq!(
        published(&state),
        vec![
            (
                "shop.localhost/ Prefix".to_owned(),
                "127.0.0.1:3000".to_owned()
            ),
            (
                "shop.localhost/api Prefix".to_owned(),
                "127.0.0.1:3001".to_owned()
            ),
            (
                "store.localhost/ Prefix".to_owned(),
                "Service default/web:80 (weight 1)".to_owned()
            ),
            (
                "store.localhost/api Prefix".to_owned(),
                "Service default/api:80 (weight 1)".to_owned()
            ),
            (
                "tcp default/echo alias echo".to_owned(),
                "127.0.0.1:7000".to_owned()
            ),
            (
                "web.localhost/ Prefix".to_owned(),
                "127.0.0.1:3000".to_owned()
            ),
        ]
    );
    assert_eq!(
        state.tunnels.keys().collect::<Vec<_>>(),
        ["default/echo", "default/web"]
    );
    let mut fqdns: Vec<&str> = state.domains.iter().map(|d| d.fqdn.as_str()).collect();
    fqdns.sort();
    assert_eq!(fqdns, ["shop.localhost", "store.localhost"]);
    assert_eq!(state.tcp_endpoints[0].alias, "echo");
}

const GOOD: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {type: ExternalName, externalName: 127.0.0.1, ports: [{name: http, port: 8080}]}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Domain
metadata: {name: shop}
spec: {subdomain: shop}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: shop}
spec:
  ingressClassName: tuna
  rules:
  - host: shop.localhost
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}}
"#;

#[test]
fn broken_manifests_are_reported_and_everything_else_is_served() {
    let yaml = format!(
        "{GOOD}{}",
        r#"---
apiVersion: apps/v1
kind: Deployment
metadata: {name: app}
---
this: is: not yaml
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: data}
spec: {clusterIP: 127.0.0.2, ports: [{port: 5432}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: broken}
spec:
  ingressClassName: tuna
  rules:
  - host: shop.localhost
    http:
      paths:
      - {path: /a//b, pathType: Prefix, backend: {service: {name: web, port: {number: 8080}}}}
      - {path: /missing, pathType: Prefix, backend: {service: {name: nope, port: {number: 80}}}}
      - {path: /badport, pathType: Prefix, backend: {service: {name: web, port: {number: 81}}}}
      - {path: /weird, pathType: Regex, backend: {service: {name: web, port: {number: 8080}}}}
  - host: unreserved.localhost
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 8080}}}}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Tunnel
metadata: {name: steal-db}
spec: {protocol: tcp, portOrAlias: 30001, upstream: {url: "tcp://db.data:5432"}}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Tunnel
metadata: {name: no-endpoint}
spec: {protocol: tcp, portOrAlias: pg, upstream: {url: "tcp://web:8080"}}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Tunnel
metadata: {name: wrong-scheme}
spec: {protocol: http, subdomain: x, upstream: {url: "tcp://web:8080"}}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Tunnel
metadata: {name: typo}
spec: {protocol: htp, subdomain: x, upstream: {url: "http://web:8080"}}
"#
    );
    let state = state_of(&yaml);
    assert_eq!(
        published(&state),
        vec![(
            "shop.localhost/ Prefix".to_owned(),
            "127.0.0.1:8080".to_owned()
        )]
    );
    let got = reasons(&state);
    let expect = [
        ("test.yaml (document 4)", "InvalidManifest"),
        ("Deployment default/app", "UnsupportedKind"),
        ("Tunnel default/typo", "InvalidObject"),
        ("Tunnel default/no-endpoint", "TcpEndpointNotFound"),
        ("Tunnel default/steal-db", "OtherNamespaceService"),
        ("Tunnel default/wrong-scheme", "SchemeMismatch"),
        ("Ingress default/broken rule 0 path 3", "InvalidPathType"),
        ("Ingress default/broken rule 1 path 0", "HostNotReserved"),
        ("Ingress default/broken rule 0 path 1", "ServiceNotFound"),
        (
            "Ingress default/broken rule 0 path 2",
            "ServicePortNotFound",
        ),
        ("Ingress default/broken rule 0 path 0", "PathRepeatedSlash"),
    ];
    for (object, reason) in expect {
        assert!(
            got.iter().any(|(o, r)| o == object && r == reason),
            "expected {object}: {reason} in\n{}",
            render(&state, &PublicAddresses::default())
        );
    }
    assert_eq!(got.len(), expect.len(), "{got:?}");
    // The broken YAML document is named by file and document index.
    let broken = state
        .skipped
        .iter()
        .find(|s| s.reason == "InvalidManifest")
        .unwrap();
    assert_eq!(broken.source.as_ref().unwrap().doc_index, Some(4));
    // Messages say what to do.
    let ns = state
        .skipped
        .iter()
        .find(|s| s.reason == "OtherNamespaceService")
        .unwrap();
    assert!(
        ns.message.contains("data/db") && ns.message.contains("own namespace"),
        "{}",
        ns.message
    );
}

#[test]
fn host_ownership_and_tunnel_hosts() {
    let yaml = format!(
        "{GOOD}{}",
        r#"---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: other}
spec: {type: ExternalName, externalName: 127.0.0.1, ports: [{port: 9000}]}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: hijack, namespace: other}
spec:
  ingressClassName: tuna
  rules:
  - host: shop.localhost
    http:
      paths:
      - {path: /admin, pathType: Prefix, backend: {service: {name: web, port: {number: 9000}}}}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Domain
metadata: {name: shop-again, namespace: other}
spec: {subdomain: shop}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Tunnel
metadata: {name: shop, namespace: other}
spec: {subdomain: shop, upstream: {url: "http://web:9000"}}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Tunnel
metadata: {name: direct}
spec: {subdomain: direct, upstream: {url: "http://127.0.0.1:4000"}}
---
apiVersion: k8s.tuna.am/v1alpha1
kind: Domain
metadata: {name: direct}
spec: {subdomain: direct}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: direct}
spec:
  ingressClassName: tuna
  rules:
  - host: direct.localhost
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 8080}}}}
"#
    );
    let state = state_of(&yaml);
    assert_eq!(
        published(&state),
        vec![
            (
                "direct.localhost/ Prefix".to_owned(),
                "127.0.0.1:4000".to_owned()
            ),
            (
                "shop.localhost/ Prefix".to_owned(),
                "127.0.0.1:8080".to_owned()
            ),
        ]
    );
    let got = reasons(&state);
    for (object, reason) in [
        ("Domain other/shop-again", "DuplicateDomain"),
        ("Tunnel other/shop", "HostOwnedByOtherNamespace"),
        (
            "Ingress other/hijack rule 0 path 0",
            "HostOwnedByOtherNamespace",
        ),
        ("Ingress default/direct rule 0 path 0", "HostUsedByTunnel"),
    ] {
        assert!(
            got.iter().any(|(o, r)| o == object && r == reason),
            "expected {object}: {reason} in {got:?}"
        );
    }
}

#[test]
fn diff_touches_only_what_changed() {
    let before = desired_state(&load_paths(&[examples()]), &DesiredOptions::default());
    assert_eq!(diff(&before, &before), vec![]);

    // Same files, but the Ingress gains a path and the tcp Tunnel is gone.
    let shop = std::fs::read_to_string(examples().join("shop.yaml"))
        .unwrap()
        .replace("path: /api", "path: /v2");
    let mut all = String::new();
    for f in ["services.yaml", "tunnel-http.yaml", "gateway.yaml"] {
        all.push_str(&std::fs::read_to_string(examples().join(f)).unwrap());
        all.push_str("\n---\n");
    }
    all.push_str(&shop);
    let after = state_of(&all);
    let changes = diff(&before, &after);
    let summary: Vec<String> = changes
        .iter()
        .map(|c| match c {
            Change::HostSet { host, routes } => format!(
                "set {host} {}",
                routes
                    .iter()
                    .map(|r| r.path.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Change::HostRemoved { host } => format!("remove {host}"),
            Change::TcpSet { tunnel, .. } => format!("tcp set {tunnel}"),
            Change::TcpRemoved { tunnel, previous } => {
                format!("tcp remove {tunnel} {}", previous.endpoint)
            }
        })
        .collect();
    assert_eq!(
        summary,
        [
            "tcp remove default/echo alias echo",
            "set shop.localhost /v2,/"
        ]
    );
    let back = diff(&after, &before);
    assert!(back.iter().any(|c| matches!(c, Change::TcpSet { tcp, previous: None, .. } if tcp.endpoint == PortOrAlias::Alias("echo".into()))));
}

#[test]
fn provider_reloads_settled_changes_only() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.yaml");
    std::fs::write(&file, GOOD).unwrap();
    std::fs::write(
        dir.path().join("notes.txt"),
        "ignored: not a manifest extension",
    )
    .unwrap();
    let mut provider = FileProvider::new(vec![dir.path().to_owned()], DesiredOptions::default());
    assert_eq!(provider.state().hosts.len(), 1);
    assert_eq!(provider.poll(), None, "nothing changed");

    // Rewriting identical bytes is no change.
    std::fs::write(&file, GOOD).unwrap();
    assert_eq!(provider.poll(), None);
    // Neither is a file the loader ignores.
    std::fs::write(dir.path().join("notes.txt"), "changed").unwrap();
    assert_eq!(provider.poll(), None);

    // A real change is applied once it has settled for one poll.
    std::fs::write(&file, GOOD.replace("path: /,", "path: /shop,")).unwrap();
    assert_eq!(
        provider.poll(),
        None,
        "first sighting only arms the debounce"
    );
    let changes = provider.poll().expect("settled change is applied");
    assert!(
        matches!(&changes[..], [Change::HostSet { host, routes }] if host == "shop.localhost" && routes[0].path == "/shop"),
        "{changes:?}"
    );
    assert_eq!(provider.poll(), None);

    // A new file in the directory is picked up; a broken one is reported, never fatal.
    std::fs::write(dir.path().join("broken.yaml"), "kind: [\n").unwrap();
    assert_eq!(provider.poll(), None);
    assert_eq!(provider.poll(), Some(vec![]));
    assert_eq!(provider.state().hosts.len(), 1);
    assert_eq!(provider.state().skipped.len(), 1);
    assert!(
        provider.state().skipped[0]
            .object
            .contains("broken.yaml (document 0)"),
        "{:?}",
        provider.state().skipped
    );

    // Removing everything unpublishes the host.
    std::fs::remove_file(&file).unwrap();
    let changes = provider.reload();
    assert_eq!(
        changes,
        vec![Change::HostRemoved {
            host: "shop.localhost".into()
        }]
    );
}

#[test]
fn report_lists_public_urls_and_skipped_reasons() {
    let mut state = desired_state(&load_paths(&[examples()]), &DesiredOptions::default());
    let mut addresses = PublicAddresses {
        http_port: Some(8080),
        ..Default::default()
    };
    addresses
        .tcp
        .insert("default/echo".into(), "127.0.0.1:30001".parse().unwrap());
    let text = render(&state, &addresses);
    assert!(text.contains("Published (6):"), "{text}");
    assert!(
        text.contains("http://store.localhost:8080/api  Service default/api:80 (weight 1)"),
        "{text}"
    );
    assert!(text.contains("http://shop.localhost:8080/api"), "{text}");
    assert!(
        text.contains("http://127.0.0.1:3001 via Service default/api"),
        "{text}"
    );
    assert!(text.contains("tcp://127.0.0.1:30001"), "{text}");
    assert!(!text.contains("Skipped"), "{text}");

    state.skipped.push(tuna_operator::standalone::SkippedItem {
        source: None,
        object: "Tunnel default/x".into(),
        reason: "ServiceNotFound".into(),
        message: "Service default/x not found".into(),
    });
    let text = render(&state, &addresses);
    assert!(text.contains("Skipped (1):"), "{text}");
    assert!(
        text.lines().any(|l| l.contains("Tunnel default/x")
            && l.contains("ServiceNotFound")
            && l.contains("not found")),
        "{text}"
    );
}
