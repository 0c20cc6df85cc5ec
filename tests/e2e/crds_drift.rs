//! The CRDs checked into the chart are exactly what `tuna-operator crdgen`
//! generates from the Rust types; regenerate with `cargo run -- crdgen`.

use std::path::Path;

use tuna_operator::crdgen::{self, Drift, Family};

#[test]
fn chart_crds_match_the_rust_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(crdgen::DEFAULT_OUT_DIR);
    let drift = crdgen::drift(&dir).expect("chart CRD folder is readable");
    assert!(
        drift.is_empty(),
        "chart CRDs are out of date, run `cargo run -- crdgen`:\n{}",
        drift
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The connector family's CRDs and the built-in ConnectorClass are checked
/// in the same way.
#[test]
fn connector_crds_and_builtin_classes_match_the_rust_types() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (family, dir) in [
        (Family::Connectors, crdgen::CONNECTORS_OUT_DIR),
        (Family::BuiltinClasses, crdgen::BUILTIN_CLASSES_OUT_DIR),
    ] {
        let drift = crdgen::drift_of(family, &root.join(dir)).expect("folder is readable");
        assert!(
            drift.is_empty(),
            "{dir} is out of date, run `cargo run -- crdgen`:\n{}",
            drift
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

#[test]
fn check_reports_changed_missing_and_stale_files() {
    let dir = tempfile::tempdir().unwrap();
    let written = crdgen::write(dir.path()).unwrap();
    assert_eq!(
        written.len(),
        5,
        "three k8s.tuna.am CRDs and the connector family's two"
    );
    assert!(crdgen::drift(dir.path()).unwrap().is_empty());

    std::fs::write(&written[0], "# edited by hand\n").unwrap();
    std::fs::remove_file(&written[1]).unwrap();
    let stale = dir.path().join("old.k8s.tuna.am.yaml");
    std::fs::write(&stale, "kind: CustomResourceDefinition\n").unwrap();
    std::fs::write(dir.path().join("README.md"), "not a CRD").unwrap();

    let drift = crdgen::drift(dir.path()).unwrap();
    assert_eq!(
        drift,
        vec![
            Drift::Changed(written[0].clone()),
            Drift::Missing(written[1].clone()),
            Drift::Stale(stale.clone())
        ]
    );

    crdgen::write(dir.path()).unwrap();
    assert!(crdgen::drift(dir.path()).unwrap().is_empty());
    assert!(!stale.exists(), "write removes stale generated files");
}
