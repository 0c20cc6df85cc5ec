//! The Gateway API kinds tuna-operator reads (group
//! `gateway.networking.k8s.io`, version `v1`, standard channel of the
//! version pinned in `conformance/gateway-api/go.mod`): `GatewayClass`,
//! `Gateway`, `HTTPRoute` ([`HttpRoute`]), `ReferenceGrant` and `TCPRoute`
//! ([`TcpRoute`]).
//!
//! Generated from the upstream CRDs by `scripts/gen-gateway-types.sh`
//! (kopium); each file records the hash of the CRD it came from, and a test
//! fails when the pinned CRD changes under it. The chart does not install
//! these CRDs: clusters own them.

// Generated code: field docs live in the CRDs (`kubectl explain`).
#![allow(missing_docs)]

pub mod gatewayclasses;
pub mod gateways;
pub mod httproutes;
pub mod referencegrants;
pub mod tcproutes;

pub use gatewayclasses::GatewayClass;
pub use gateways::Gateway;
pub use httproutes::HttpRoute;
pub use referencegrants::ReferenceGrant;
pub use tcproutes::TcpRoute;

/// The controller name of tuna-operator's GatewayClass (`spec.controllerName`).
pub const CONTROLLER_NAME: &str = "k8s.tuna.am/gateway-controller";

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;
    use std::path::PathBuf;

    /// The pinned CRDs, as `conformance/gateway-api/crds.sh` (run by
    /// `scripts/setup.sh --k8s MINOR`) copies them.
    fn pinned_crds() -> PathBuf {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let go_mod = std::fs::read_to_string(root.join("conformance/gateway-api/go.mod")).unwrap();
        // `sigs.k8s.io/gateway-api v1.6.1`, maybe `// indirect` after it (the
        // suite's module requires it through its `conformance` module).
        let version = go_mod
            .lines()
            .find_map(|l| {
                let l = l.trim();
                l.strip_prefix("require sigs.k8s.io/gateway-api ")
                    .or_else(|| l.strip_prefix("sigs.k8s.io/gateway-api "))
            })
            .and_then(|rest| rest.split_whitespace().next())
            .expect("the pin in conformance/gateway-api/go.mod")
            .to_owned();
        let dir = root.join(format!(".tools/gateway-api-{version}"));
        assert!(
            dir.is_dir(),
            "{} is missing: run scripts/setup.sh --k8s 1.37 (or scripts/test.sh)",
            dir.display()
        );
        dir
    }

    fn sha256_hex(path: &std::path::Path) -> String {
        let out = std::process::Command::new("sha256sum")
            .arg(path)
            .output()
            .expect("sha256sum");
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()[..64].to_owned()
    }

    /// Each generated file names the CRD it came from and its hash: a pin
    /// moved without `scripts/gen-gateway-types.sh` fails here.
    #[test]
    fn the_generated_types_match_the_pinned_crds() {
        let crds = pinned_crds();
        for (file, source) in [
            ("gatewayclasses", include_str!("gatewayclasses.rs")),
            ("gateways", include_str!("gateways.rs")),
            ("httproutes", include_str!("httproutes.rs")),
            ("referencegrants", include_str!("referencegrants.rs")),
            ("tcproutes", include_str!("tcproutes.rs")),
        ] {
            let recorded = source
                .lines()
                .find_map(|l| l.strip_prefix("// CRD sha256: "))
                .unwrap_or_else(|| panic!("{file}.rs records no CRD hash"));
            let crd = crds.join(format!("gateway.networking.k8s.io_{file}.yaml"));
            assert_eq!(
                recorded,
                sha256_hex(&crd),
                "{file}.rs was generated from another {}: run scripts/gen-gateway-types.sh",
                crd.display()
            );
        }
    }

    /// Group, version, kind, plural and scope of each type are the CRD's.
    #[test]
    fn each_type_names_its_crd() {
        let crds = pinned_crds();
        fn check<K: Resource<DynamicType = ()>>(crds: &std::path::Path, namespaced: bool) {
            let plural = K::plural(&()).into_owned();
            let text = std::fs::read_to_string(
                crds.join(format!("gateway.networking.k8s.io_{plural}.yaml")),
            )
            .unwrap();
            let crd: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
            let spec = &crd["spec"];
            assert_eq!(spec["group"], K::group(&()).as_ref());
            assert_eq!(spec["names"]["kind"], K::kind(&()).as_ref());
            assert_eq!(spec["names"]["plural"], plural);
            assert_eq!(
                spec["scope"],
                if namespaced { "Namespaced" } else { "Cluster" }
            );
            let version = K::version(&()).into_owned();
            assert!(
                spec["versions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v["name"] == version && v["served"] == true),
                "{plural}: version {version} is served"
            );
        }
        check::<GatewayClass>(&crds, false);
        check::<Gateway>(&crds, true);
        check::<HttpRoute>(&crds, true);
        check::<ReferenceGrant>(&crds, true);
        check::<TcpRoute>(&crds, true);
    }

    /// An HTTPRoute as the specification's examples write it reads into the
    /// types and back without loss.
    #[test]
    fn an_httproute_round_trips() {
        let yaml = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: shop}
spec:
  parentRefs: [{name: tuna, sectionName: http}]
  hostnames: [shop.a.2na.am]
  rules:
  - matches:
    - path: {type: PathPrefix, value: /api}
      headers: [{name: x-canary, value: "true"}]
    backendRefs: [{name: api, port: 8080, weight: 90}, {name: api-next, port: 8080, weight: 10}]
"#;
        let route: HttpRoute = serde_saphyr::from_str(yaml).unwrap();
        assert_eq!(
            route.spec.hostnames.as_deref(),
            Some(&["shop.a.2na.am".to_owned()][..])
        );
        let rules = route.spec.rules.as_ref().unwrap();
        let backends = rules[0].backend_refs.as_ref().unwrap();
        assert_eq!(backends[1].weight, Some(10));
        let back: HttpRoute =
            serde_json::from_value(serde_json::to_value(&route).unwrap()).unwrap();
        assert_eq!(back, route);
    }
}
