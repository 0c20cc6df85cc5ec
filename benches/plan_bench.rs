//! One full plan (`tuna_operator::plan::plan`, what the agent runs on every
//! Gateway API sync and `route explain` runs once) over n HTTPRoutes
//! (issue 37, G9): n/10 namespaces, each with a Service, 9 routes on hosts
//! of their own (`r{i}.ns{k}.example.com`, account hosts) and one route on
//! the wildcard `*.ns{k}.example.com`, all attached to one Gateway that
//! admits every namespace. Each route has 4 matches: `PathPrefix /`,
//! `PathPrefix /api` with a header condition, `Exact /health`, and
//! `PathPrefix /static` with a method, so each host holds 8 specs (its own
//! route's and the wildcard route's) and the wildcard is matched against
//! every account host. `plan/httproutes_exact` is the same without the
//! wildcard: the tenth route names a host of its own too.
//!
//! Run: `cargo bench -p tuna-operator --bench plan` (see benches/README.md).

use std::collections::BTreeSet;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tuna_crds::gateway::{Gateway, GatewayClass, HttpRoute};
use tuna_operator::plan::gateway_model::GatewayInputs;
use tuna_operator::plan::service::{ServiceIndex, ServiceInfo, ServicePortInfo};
use tuna_operator::plan::{Inputs, PlanOptions, plan};

const SIZES: [usize; 2] = [1_000, 10_000];

fn object<K: serde::de::DeserializeOwned>(yaml: &str) -> Arc<K> {
    Arc::new(serde_saphyr::from_str(yaml).expect("bench manifest"))
}

struct World {
    classes: Vec<Arc<GatewayClass>>,
    gateways: Vec<Arc<Gateway>>,
    routes: Vec<Arc<HttpRoute>>,
    services: ServiceIndex,
    options: PlanOptions,
}

fn world(n: usize, wildcards: bool) -> World {
    let namespaces = n / 10;
    let mut routes = Vec::with_capacity(n);
    let mut services = Vec::with_capacity(namespaces);
    let mut account = BTreeSet::new();
    let rules = "  rules:\n  - matches:\n    - {path: {type: PathPrefix, value: /}}\n    - {path: {type: PathPrefix, value: /api}, headers: [{name: x-env, value: canary}]}\n    - {path: {type: Exact, value: /health}}\n    - {path: {type: PathPrefix, value: /static}, method: GET}\n    backendRefs: [{name: web, port: 80}]\n";
    for k in 0..namespaces {
        let ns = format!("ns{k}");
        services.push(ServiceInfo {
            namespace: ns.clone(),
            name: "web".into(),
            external_name: None,
            cluster_ip: Some(format!("10.{}.{}.1", k / 250, k % 250)),
            ports: vec![ServicePortInfo {
                name: Some("http".into()),
                port: 80,
                target_port: None,
                app_protocol: None,
            }],
            headless: None,
        });
        for i in 0..10 {
            let created = format!(
                "2026-01-01T{:02}:{:02}:{:02}Z",
                k / 3600 % 24,
                k / 60 % 60,
                k % 60
            );
            let hostname = if i == 9 && wildcards {
                format!("'*.{ns}.example.com'")
            } else {
                let host = format!("r{i}.{ns}.example.com");
                account.insert(host.clone());
                host
            };
            routes.push(object::<HttpRoute>(&format!(
                "metadata: {{name: r{i}, namespace: {ns}, creationTimestamp: '{created}'}}\nspec:\n  parentRefs: [{{name: edge, namespace: infra}}]\n  hostnames: [{hostname}]\n{rules}"
            )));
        }
    }
    let mut options = PlanOptions::cluster("tuna.test");
    options.account_hosts = account;
    World {
        classes: vec![object(
            "metadata: {name: tuna}\nspec: {controllerName: k8s.tuna.am/gateway-controller}\n",
        )],
        gateways: vec![object(
            "metadata: {name: edge, namespace: infra}\nspec:\n  gatewayClassName: tuna\n  listeners:\n  - {name: http, protocol: HTTP, port: 80, allowedRoutes: {namespaces: {from: All}}}\n",
        )],
        routes,
        services: ServiceIndex::new(services),
        options,
    }
}

fn bench_plan(c: &mut Criterion) {
    for (name, wildcards) in [("plan/httproutes", true), ("plan/httproutes_exact", false)] {
        let mut group = c.benchmark_group(name);
        group.sample_size(10);
        for n in SIZES {
            let w = world(n, wildcards);
            let inputs = Inputs {
                gateway: GatewayInputs {
                    classes: &w.classes,
                    gateways: &w.gateways,
                    http_routes: &w.routes,
                    ..GatewayInputs::default()
                },
                ..Inputs::default()
            };
            // The plan serves what the shape says: every host, 8 specs each
            // with the wildcard routes, else 4 on each of the 10 hosts.
            let p = plan(&inputs, &w.services, &w.options);
            let (hosts, specs) = if wildcards { (9, 8) } else { (10, 4) };
            assert_eq!(p.hosts.len(), n / 10 * hosts, "hosts served");
            assert!(
                p.hosts.values().all(|h| h.routes.len() == specs),
                "{specs} specs a host"
            );
            group.bench_with_input(BenchmarkId::from_parameter(n), &inputs, |b, inputs| {
                b.iter(|| black_box(plan(black_box(inputs), &w.services, &w.options)))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
