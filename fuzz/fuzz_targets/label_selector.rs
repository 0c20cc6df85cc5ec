//! The label-selector parser of `GET /v1/tokens?selector=…` (reached
//! through `ControlPlane::list_tokens`, its public entry) must never panic;
//! a selector either is refused or selects a subset of the caller's tokens.

#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tuna_protocol::api::{CreateToken, Scope};
use tuna_edge::control::{Caller, ControlConfig, ControlPlane};

struct Fixture {
    plane: ControlPlane,
    caller: Caller,
    _dir: tempfile::TempDir,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let plane =
            ControlPlane::open(ControlConfig::new(dir.path(), "tuna.test", "edge.tuna.test"))
                .unwrap();
        let caller = Caller {
            key_id: "fuzz".into(),
            account: "default".into(),
            scopes: vec![Scope::Full],
        };
        let labels = BTreeMap::from([
            ("app".to_string(), "web".to_string()),
            ("k8s.tuna.am/namespace".to_string(), "team-a".to_string()),
        ]);
        plane
            .create_token(
                &caller,
                &CreateToken {
                    labels,
                    bindings: Default::default(),
                    ttl_seconds: None,
                },
            )
            .unwrap();
        Fixture {
            plane,
            caller,
            _dir: dir,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(selector) = std::str::from_utf8(data) else {
        return;
    };
    let f = fixture();
    if let Ok(tokens) = f.plane.list_tokens(&f.caller, selector) {
        assert!(tokens.len() <= 1);
    }
});
