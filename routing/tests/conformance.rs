//! Runs the table-driven cases of `conformance/ingress/*.yaml` against the
//! compiled table and against the naive reference router.

mod support;

use std::path::{Path, PathBuf};

use serde::Deserialize;
use support::naive::naive_lookup;
use tuna_routing::{Origin, PathType, RouteSpec, RouteTable, TieBreak};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[allow(dead_code)]
    source: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    routes: Vec<Route>,
    requests: Vec<Request>,
    #[serde(default)]
    issues: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Route {
    #[serde(default = "default_host")]
    host: String,
    path: String,
    #[serde(rename = "type")]
    path_type: String,
    backend: String,
    #[serde(default = "default_ingress")]
    ingress: String,
    #[serde(default = "default_namespace")]
    namespace: String,
    #[serde(default)]
    created: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    #[serde(default = "default_host")]
    host: String,
    path: String,
    expect: Option<String>,
}

fn default_host() -> String {
    "example.com".into()
}
fn default_ingress() -> String {
    "ing".into()
}
fn default_namespace() -> String {
    "default".into()
}

fn case_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance/ingress");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn conformance_cases() {
    let files = case_files();
    assert!(files.len() >= 4, "expected the case files, found {files:?}");
    let mut requests = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let parsed: File =
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for case in parsed.cases {
            let specs: Vec<RouteSpec<u32>> = case
                .routes
                .iter()
                .enumerate()
                .map(|(i, r)| RouteSpec {
                    host: r.host.clone(),
                    path: r.path.clone(),
                    path_type: r.path_type.parse::<PathType>().unwrap(),
                    backend: i as u32,
                    origin: Origin {
                        namespace: r.namespace.clone(),
                        name: r.ingress.clone(),
                        rule: 0,
                        path: i,
                    },
                    tie_break: TieBreak {
                        created: r.created,
                        namespace: r.namespace.clone(),
                        name: r.ingress.clone(),
                    },
                    matcher: tuna_routing::Matcher::Ingress,
                })
                .collect();
            let (table, issues) = RouteTable::build(specs.clone()).unwrap();
            let reasons: Vec<&str> = issues.iter().map(|i| i.reason()).collect();
            assert_eq!(
                reasons,
                case.issues,
                "{}: {}: issues {issues:?}",
                file.display(),
                case.name
            );
            // The naive reference only takes valid specs.
            let invalid: Vec<usize> = issues
                .iter()
                .filter(|i| i.reason() != "RouteConflict")
                .map(|i| i.origin().path)
                .collect();
            let valid: Vec<RouteSpec<u32>> = specs
                .iter()
                .filter(|s| !invalid.contains(&(s.backend as usize)))
                .cloned()
                .collect();
            for req in &case.requests {
                let got = table
                    .lookup(&req.host, &req.path)
                    .map(|m| case.routes[*m.backend as usize].backend.clone());
                assert_eq!(
                    got,
                    req.expect,
                    "{}: {}: {} {}",
                    file.display(),
                    case.name,
                    req.host,
                    req.path
                );
                let reference = naive_lookup(&valid, &req.host, &req.path)
                    .map(|i| case.routes[valid[i].backend as usize].backend.clone());
                assert_eq!(
                    reference,
                    req.expect,
                    "reference: {}: {}: {} {}",
                    file.display(),
                    case.name,
                    req.host,
                    req.path
                );
                requests += 1;
            }
        }
    }
    assert!(requests > 50);
}
