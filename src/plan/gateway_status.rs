//! The conditions of a Gateway and of its listeners as the specification
//! (v1.6.1, `apis/v1/gateway_types.go`) names them and the conformance
//! suite reads them (pure):
//!
//! - a listener's `ResolvedRefs` is `False` with `InvalidRouteKinds` when
//!   `allowedRoutes.kinds` names a kind its protocol cannot carry here
//!   (`supportedKinds` then lists only the valid ones), with
//!   `RefNotPermitted` when a `certificateRefs` entry names a Secret of
//!   another namespace that no ReferenceGrant there opens to Gateways of
//!   this one, and with `InvalidCertificateRef` when an entry is not a core
//!   `Secret`, or (where Secrets are read: the agent) names no Secret or one
//!   without a PEM certificate and key in `tls.crt` / `tls.key`. Such a
//!   listener is still `Accepted` (routes attach to it and are counted) but
//!   not `Programmed`;
//! - the Gateway is `Accepted=False, InvalidParameters` when it has a
//!   `spec.infrastructure.parametersRef` (this implementation defines no
//!   parameters kind, so none resolves), `Accepted=False, ListenersNotValid`
//!   when no listener is accepted, `Accepted=True, ListenersNotValid` when
//!   some listener is not accepted or does not resolve its references.

use tuna_crds::gateway::ReferenceGrant;
use tuna_crds::gateway::gateways::{Gateway, GatewayListeners};

use super::gateway::GROUP;
use super::gateway_model::{CertificateSecret, Cond, ListenerStatus};

/// The route kinds a listener of `protocol` carries here.
pub fn protocol_kinds(protocol: &str) -> &'static [&'static str] {
    match protocol {
        "HTTP" | "HTTPS" => &["HTTPRoute"],
        "TCP" => &["TCPRoute"],
        _ => &[],
    }
}

/// The listener's `supportedKinds` (its protocol's kinds, or those of
/// `allowedRoutes.kinds` its protocol carries), and the message of an
/// `InvalidRouteKinds` when `allowedRoutes.kinds` names any other.
pub fn listener_kinds(listener: &GatewayListeners) -> (Vec<&'static str>, Option<String>) {
    let ours = protocol_kinds(&listener.protocol);
    let asked = listener
        .allowed_routes
        .as_ref()
        .and_then(|a| a.kinds.as_deref())
        .unwrap_or_default();
    if asked.is_empty() {
        return (ours.to_vec(), None);
    }
    let mut kinds = Vec::new();
    let mut invalid = Vec::new();
    for k in asked {
        let group = k.group.as_deref().unwrap_or(GROUP);
        match ours.iter().find(|o| group == GROUP && **o == k.kind) {
            Some(o) if !kinds.contains(o) => kinds.push(*o),
            Some(_) => {}
            None if group == GROUP => invalid.push(k.kind.clone()),
            None => invalid.push(format!("{group}/{}", k.kind)),
        }
    }
    let problem = (!invalid.is_empty()).then(|| {
        format!(
            "allowedRoutes.kinds names {} that a {} listener does not carry here (it carries {})",
            invalid.join(", "),
            listener.protocol,
            if ours.is_empty() {
                "none".to_owned()
            } else {
                ours.join(", ")
            }
        )
    });
    (kinds, problem)
}

/// The first problem of the listener's `certificateRefs` in the Gateway's
/// namespace `gateway_namespace`, as (reason, message): the kind is checked
/// first, then the ReferenceGrant, then (when `certificates` is known) the
/// Secret itself, so that a Gateway cannot probe Secrets of a namespace
/// that did not open them to it.
pub fn certificate_problem(
    listener: &GatewayListeners,
    gateway_namespace: &str,
    grants: &[&ReferenceGrant],
    certificates: Option<&[CertificateSecret]>,
) -> Option<(&'static str, String)> {
    let refs = listener
        .tls
        .as_ref()
        .and_then(|t| t.certificate_refs.as_deref())
        .unwrap_or_default();
    for r in refs {
        let group = r.group.as_deref().unwrap_or("");
        let kind = r.kind.as_deref().unwrap_or("Secret");
        if !group.is_empty() || kind != "Secret" {
            let shown = if group.is_empty() {
                kind.to_owned()
            } else {
                format!("{group}/{kind}")
            };
            return Some((
                "InvalidCertificateRef",
                format!(
                    "certificateRef {} is a {shown}: only core Secrets hold certificates",
                    r.name
                ),
            ));
        }
        let namespace = r.namespace.as_deref().unwrap_or(gateway_namespace);
        if namespace != gateway_namespace
            && !secret_granted(grants, gateway_namespace, namespace, &r.name)
        {
            return Some((
                "RefNotPermitted",
                format!(
                    "certificateRef {namespace}/{}: no ReferenceGrant in namespace {namespace:?} lets Gateways of {gateway_namespace:?} refer to this Secret",
                    r.name
                ),
            ));
        }
        let Some(known) = certificates else {
            continue;
        };
        match known
            .iter()
            .find(|c| c.namespace == namespace && c.name == r.name)
        {
            None => {
                return Some((
                    "InvalidCertificateRef",
                    format!("certificateRef {namespace}/{}: no such Secret", r.name),
                ));
            }
            Some(CertificateSecret {
                problem: Some(p), ..
            }) => {
                return Some((
                    "InvalidCertificateRef",
                    format!("certificateRef {namespace}/{}: {p}", r.name),
                ));
            }
            Some(_) => {}
        }
    }
    None
}

/// The Secret (namespace, name) an HTTPS listener serves TLS with: its
/// first `certificateRef`, when every ref resolves
/// ([`certificate_problem`]) and the agent read the Secrets (`None` where
/// they are not read, or for a listener without a ref).
pub fn listener_certificate(
    listener: &GatewayListeners,
    gateway_namespace: &str,
    grants: &[&ReferenceGrant],
    certificates: Option<&[CertificateSecret]>,
) -> Option<(String, String)> {
    certificates?;
    if certificate_problem(listener, gateway_namespace, grants, certificates).is_some() {
        return None;
    }
    let first = listener
        .tls
        .as_ref()?
        .certificate_refs
        .as_deref()?
        .first()?;
    let namespace = first.namespace.as_deref().unwrap_or(gateway_namespace);
    Some((namespace.to_owned(), first.name.clone()))
}

/// Whether a ReferenceGrant in `secret_namespace` lets Gateways of
/// `gateway_namespace` refer to the Secret `name`.
pub fn secret_granted(
    grants: &[&ReferenceGrant],
    gateway_namespace: &str,
    secret_namespace: &str,
    name: &str,
) -> bool {
    grants
        .iter()
        .filter(|g| g.metadata.namespace.as_deref() == Some(secret_namespace))
        .any(|g| {
            g.spec.from.iter().any(|f| {
                f.group == GROUP && f.kind == "Gateway" && f.namespace == gateway_namespace
            }) && g.spec.to.iter().any(|t| {
                t.group.is_empty()
                    && t.kind == "Secret"
                    && t.name.as_deref().is_none_or(|n| n == name)
            })
        })
}

/// The Secrets the certificateRefs of `gateway`'s listeners may read, as
/// `(namespace, name)`: core Secrets of its namespace, or of another one
/// whose ReferenceGrant allows it (what the agent `get`s, nothing more).
pub fn certificate_secrets(gateway: &Gateway, grants: &[&ReferenceGrant]) -> Vec<(String, String)> {
    let own = gateway.metadata.namespace.as_deref().unwrap_or("default");
    gateway
        .spec
        .listeners
        .iter()
        .filter_map(|l| l.tls.as_ref()?.certificate_refs.as_ref())
        .flatten()
        .filter(|r| {
            r.group.as_deref().unwrap_or("").is_empty()
                && r.kind.as_deref().unwrap_or("Secret") == "Secret"
        })
        .map(|r| (r.namespace.as_deref().unwrap_or(own), r.name.as_str()))
        .filter(|(ns, name)| *ns == own || secret_granted(grants, own, ns, name))
        .map(|(ns, name)| (ns.to_owned(), name.to_owned()))
        .collect()
}

/// Puts a `ResolvedRefs=False` with `reason` into a listener's `conditions`
/// (from [`super::httproute`] or [`super::tcproute`]): the listener stays
/// as accepted as it was, and is not `Programmed`.
pub fn unresolved(conditions: &mut [Cond], reason: &str, message: String) {
    for c in conditions.iter_mut() {
        match c.type_ {
            "ResolvedRefs" => *c = Cond::no("ResolvedRefs", reason, message.clone()),
            "Programmed" if c.status => {
                *c = Cond::no(
                    "Programmed",
                    "Invalid",
                    "the listener has references that do not resolve (see ResolvedRefs)",
                )
            }
            _ => {}
        }
    }
}

/// Marks a conflicted listener ([`super::gateway::conflicts`]): not accepted, not
/// programmed, and `Conflicted=True`, each with the conflict's reason.
pub fn conflicted(conditions: &mut Vec<Cond>, reason: &'static str, message: &str) {
    conditions.retain(|c| !matches!(c.type_, "Accepted" | "Programmed" | "Conflicted"));
    conditions.insert(0, Cond::no("Accepted", reason, message.to_owned()));
    conditions.insert(
        1,
        Cond::no(
            "Programmed",
            reason,
            "the listener conflicts with another (see Accepted)",
        ),
    );
    conditions.push(Cond::yes("Conflicted", reason, message.to_owned()));
}

/// Puts `Programmed=False` into the conditions of a listener of a Gateway
/// that is [`super::gateway::not_accepted`]: nothing of it is published.
pub fn gateway_not_accepted(conditions: &mut [Cond]) {
    for c in conditions.iter_mut().filter(|c| c.type_ == "Programmed") {
        *c = Cond::no(
            "Programmed",
            "Invalid",
            "the Gateway is not accepted (see its Accepted condition)",
        );
    }
}

fn holds(l: &ListenerStatus, type_: &str) -> bool {
    l.conditions.iter().any(|c| c.type_ == type_ && c.status)
}

/// The Gateway's `Accepted` and `Programmed`, from its listeners'.
pub fn gateway_conditions(gateway: &Gateway, listeners: &[ListenerStatus]) -> Vec<Cond> {
    if let Some((reason, message)) = super::gateway::not_accepted(gateway) {
        return vec![
            Cond::no("Accepted", reason, message),
            Cond::no(
                "Programmed",
                "Invalid",
                "the Gateway is not accepted: no route attaches to it and nothing is published",
            ),
        ];
    }
    let not_valid: Vec<&str> = listeners
        .iter()
        .filter(|l| !holds(l, "Accepted") || !holds(l, "ResolvedRefs"))
        .map(|l| l.name.as_str())
        .collect();
    let accepted = if !listeners.iter().any(|l| holds(l, "Accepted")) {
        Cond::no(
            "Accepted",
            "ListenersNotValid",
            "no listener is accepted (see each listener's conditions)",
        )
    } else if not_valid.is_empty() {
        Cond::yes("Accepted", "Accepted", "accepted by tuna-operator")
    } else {
        Cond::yes(
            "Accepted",
            "ListenersNotValid",
            format!(
                "accepted; listeners {} are not valid (see their conditions)",
                not_valid.join(", ")
            ),
        )
    };
    let programmed = if listeners.iter().any(|l| holds(l, "Programmed")) {
        Cond::yes(
            "Programmed",
            "Programmed",
            "its routes are published through the edge's tunnels",
        )
    } else {
        Cond::no("Programmed", "Invalid", "no listener is programmed")
    };
    vec![accepted, programmed]
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tuna_crds::gateway::{Gateway, GatewayClass, ReferenceGrant};

    use super::CertificateSecret;
    use crate::plan::gateway_model::{Cond, GatewayInputs, GatewayStatus};
    use crate::plan::service::ServiceIndex;
    use crate::plan::{Inputs, PlanOptions, plan};

    fn objects<K: serde::de::DeserializeOwned>(yaml: &str) -> Vec<Arc<K>> {
        yaml.split("\n---\n")
            .filter(|d| !d.trim().is_empty())
            .map(|d| Arc::new(serde_saphyr::from_str::<K>(d).expect("test manifest")))
            .collect()
    }

    const CLASS: &str =
        "metadata: {name: tuna}\nspec: {controllerName: k8s.tuna.am/gateway-controller}\n";

    /// The status of the one Gateway `listeners` (YAML flow list items)
    /// make in namespace `infra`, with `extra` spec fields, the ReferenceGrants
    /// `grants` and the Secrets the agent found.
    fn status(
        listeners: &[&str],
        extra: &str,
        grants: &str,
        certificates: Option<&[CertificateSecret]>,
    ) -> GatewayStatus {
        status_in(listeners, extra, grants, certificates, false)
    }

    /// [`status`], with an address per Gateway or on the shared ports.
    fn status_in(
        listeners: &[&str],
        extra: &str,
        grants: &str,
        certificates: Option<&[CertificateSecret]>,
        own_addresses: bool,
    ) -> GatewayStatus {
        let gateway = format!(
            "metadata: {{name: gw, namespace: infra, generation: 2}}\nspec:\n  gatewayClassName: tuna\n{extra}  listeners:\n{}",
            listeners
                .iter()
                .map(|l| format!("  - {l}\n"))
                .collect::<String>()
        );
        let classes = objects::<GatewayClass>(CLASS);
        let gateways = objects::<Gateway>(&gateway);
        let grants = objects::<ReferenceGrant>(grants);
        let inputs = Inputs {
            gateway: GatewayInputs {
                classes: &classes,
                gateways: &gateways,
                grants: &grants,
                certificates,
                ..Default::default()
            },
            ..Inputs::default()
        };
        let mut options = PlanOptions::cluster("tuna.test");
        options.gateway_addresses = own_addresses;
        let p = plan(&inputs, &ServiceIndex::default(), &options);
        p.gateway
            .gateways
            .into_iter()
            .next()
            .expect("the Gateway's status")
    }

    fn cond<'a>(c: &'a [Cond], t: &str) -> (bool, &'a str) {
        let c = c.iter().find(|c| c.type_ == t).expect("condition");
        (c.status, c.reason.as_str())
    }

    fn valid(name: &str) -> CertificateSecret {
        CertificateSecret {
            namespace: "infra".into(),
            name: name.into(),
            problem: None,
        }
    }

    const HTTPS: &str = "{name: https, protocol: HTTPS, port: 443, tls: {certificateRefs: [CERT]}}";

    /// Indistinct listeners are all conflicted, none wins (the
    /// specification's "Handling indistinct Listeners"): HTTP or HTTPS
    /// listeners with one port and hostname in both models, and listeners of
    /// different protocols on one port of a Gateway's own address.
    #[test]
    fn conflicting_listeners_are_all_conflicted_and_the_others_served() {
        let listeners = [
            "{name: a, protocol: HTTP, port: 80, hostname: shop.example}",
            "{name: b, protocol: HTTP, port: 80, hostname: SHOP.example.}",
            "{name: c, protocol: HTTP, port: 80, hostname: other.example}",
            "{name: d, protocol: HTTP, port: 8080}",
            "{name: e, protocol: HTTP, port: 8080}",
            "{name: f, protocol: HTTP, port: 8081}",
            "{name: g, protocol: TCP, port: 8081}",
            "{name: h, protocol: HTTPS, port: 8443, tls: {certificateRefs: [{name: tls}]}}",
            "{name: i, protocol: HTTP, port: 8443}",
        ];
        let found = [valid("tls")];
        // (listener, conflict reason on the shared ports, on own addresses)
        let expected: [(&str, Option<&str>, Option<&str>); 9] = [
            ("a", Some("HostnameConflict"), Some("HostnameConflict")),
            ("b", Some("HostnameConflict"), Some("HostnameConflict")),
            ("c", None, None),
            ("d", Some("HostnameConflict"), Some("HostnameConflict")),
            ("e", Some("HostnameConflict"), Some("HostnameConflict")),
            ("f", None, Some("ProtocolConflict")),
            ("g", None, Some("ProtocolConflict")),
            ("h", None, Some("ProtocolConflict")),
            ("i", None, Some("ProtocolConflict")),
        ];
        for own in [false, true] {
            let s = status_in(&listeners, "", "", Some(&found), own);
            for (name, shared, address) in expected {
                let l = s.listeners.iter().find(|l| l.name == name).unwrap();
                let want = if own { address } else { shared };
                match want {
                    Some(reason) => {
                        assert_eq!(
                            cond(&l.conditions, "Accepted"),
                            (false, reason),
                            "{name} own={own}"
                        );
                        assert_eq!(cond(&l.conditions, "Programmed"), (false, reason), "{name}");
                        assert_eq!(cond(&l.conditions, "Conflicted"), (true, reason), "{name}");
                    }
                    None => {
                        assert!(cond(&l.conditions, "Accepted").0, "{name} own={own}: {l:?}");
                        assert_eq!(
                            cond(&l.conditions, "Conflicted"),
                            (false, "NoConflicts"),
                            "{name}"
                        );
                    }
                }
            }
            // Some listeners are valid: the Gateway is accepted and says
            // which are not.
            let accepted = s.conditions.iter().find(|c| c.type_ == "Accepted").unwrap();
            assert_eq!(
                (accepted.status, accepted.reason.as_str()),
                (true, "ListenersNotValid")
            );
            assert!(accepted.message.contains("a, b"), "{accepted:?}");
        }
        // Only conflicted listeners: not accepted.
        let s = status_in(&listeners[..2], "", "", Some(&found), true);
        assert_eq!(
            cond(&s.conditions, "Accepted"),
            (false, "ListenersNotValid")
        );
    }

    /// Each listener `ResolvedRefs` reason the specification gives, as the
    /// conformance tests GatewayInvalidTLSConfiguration,
    /// GatewaySecret{Invalid,Missing}ReferenceGrant,
    /// GatewaySecretReferenceGrant{AllInNamespace,Specific},
    /// GatewayInvalidRouteKind and GatewayWithAttachedRoutes expect it.
    #[test]
    fn listener_references_resolve_or_say_why_as_the_specification_names_it() {
        let grant_all = "metadata: {name: g, namespace: certs}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: infra}]\n  to: [{group: '', kind: Secret}]\n";
        let grant_other_name = "metadata: {name: g, namespace: certs}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: infra}]\n  to: [{group: '', kind: Secret, name: other}]\n";
        let grant_other_ns = "metadata: {name: g, namespace: certs}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: elsewhere}]\n  to: [{group: '', kind: Secret}]\n";
        let in_certs = CertificateSecret {
            namespace: "certs".into(),
            name: "tls".into(),
            problem: None,
        };
        let found = [
            valid("tls"),
            CertificateSecret {
                problem: Some("tls.crt holds no PEM certificate".into()),
                ..valid("malformed")
            },
            in_certs,
        ];
        // (case, certificateRef, grants, (ResolvedRefs, reason), Programmed)
        type Case<'a> = (&'a str, &'a str, &'a str, (bool, &'a str), bool);
        let cases: &[Case] = &[
            (
                "a valid Secret",
                "{name: tls}",
                "",
                (true, "ResolvedRefs"),
                true,
            ),
            (
                "no such Secret",
                "{name: nonexistent}",
                "",
                (false, "InvalidCertificateRef"),
                false,
            ),
            (
                "a malformed Secret",
                "{name: malformed}",
                "",
                (false, "InvalidCertificateRef"),
                false,
            ),
            (
                "another group",
                "{group: wrong.group.company.io, kind: Secret, name: tls}",
                "",
                (false, "InvalidCertificateRef"),
                false,
            ),
            (
                "another kind",
                "{group: '', kind: WrongKind, name: tls}",
                "",
                (false, "InvalidCertificateRef"),
                false,
            ),
            (
                "another namespace, no grant",
                "{name: tls, namespace: certs}",
                "",
                (false, "RefNotPermitted"),
                false,
            ),
            (
                "a grant for Gateways of another namespace",
                "{name: tls, namespace: certs}",
                grant_other_ns,
                (false, "RefNotPermitted"),
                false,
            ),
            (
                "a grant for another Secret",
                "{name: tls, namespace: certs}",
                grant_other_name,
                (false, "RefNotPermitted"),
                false,
            ),
            (
                "a grant for all Secrets there",
                "{name: tls, namespace: certs}",
                grant_all,
                (true, "ResolvedRefs"),
                true,
            ),
            (
                "not permitted beats not found",
                "{name: nonexistent, namespace: certs}",
                "",
                (false, "RefNotPermitted"),
                false,
            ),
        ];
        for (case, cert, grants, resolved, programmed) in cases {
            let listener = HTTPS.replace("CERT", cert);
            let s = status(&[&listener], "", grants, Some(&found));
            let l = &s.listeners[0];
            assert_eq!(cond(&l.conditions, "ResolvedRefs"), *resolved, "{case}");
            assert_eq!(cond(&l.conditions, "Programmed").0, *programmed, "{case}");
            // Still accepted: routes attach to it and are counted.
            assert!(cond(&l.conditions, "Accepted").0, "{case}");
            assert_eq!(l.supported_kinds, ["HTTPRoute"], "{case}");
            let gateway = cond(&s.conditions, "Accepted");
            if resolved.0 {
                assert_eq!(gateway, (true, "Accepted"), "{case}");
            } else {
                assert_eq!(gateway, (true, "ListenersNotValid"), "{case}");
            }
        }
        // Where Secrets are not read (route explain, the file provider),
        // only the kind and the grant are checked.
        let s = status(
            &[&HTTPS.replace("CERT", "{name: nonexistent}")],
            "",
            "",
            None,
        );
        assert_eq!(
            cond(&s.listeners[0].conditions, "ResolvedRefs"),
            (true, "ResolvedRefs")
        );
    }

    #[test]
    fn listener_route_kinds_keep_the_supported_ones_and_say_invalid_route_kinds() {
        // (case, listener, supportedKinds, ResolvedRefs)
        type Case<'a> = (&'a str, &'a str, &'a [&'a str], (bool, &'a str));
        let cases: &[Case] = &[
            (
                "no kinds: the protocol's",
                "{name: http, protocol: HTTP, port: 80}",
                &["HTTPRoute"],
                (true, "ResolvedRefs"),
            ),
            (
                "only an invalid kind",
                "{name: http, protocol: HTTP, port: 80, allowedRoutes: {kinds: [{kind: InvalidRoute}]}}",
                &[],
                (false, "InvalidRouteKinds"),
            ),
            (
                "an invalid and a valid kind",
                "{name: http, protocol: HTTP, port: 80, allowedRoutes: {kinds: [{kind: InvalidRoute}, {kind: HTTPRoute}]}}",
                &["HTTPRoute"],
                (false, "InvalidRouteKinds"),
            ),
            (
                "a kind of another group",
                "{name: http, protocol: HTTP, port: 80, allowedRoutes: {kinds: [{group: example.com, kind: HTTPRoute}]}}",
                &[],
                (false, "InvalidRouteKinds"),
            ),
            (
                "a kind of another protocol",
                "{name: tcp, protocol: TCP, port: 9000, allowedRoutes: {kinds: [{kind: HTTPRoute}]}}",
                &[],
                (false, "InvalidRouteKinds"),
            ),
            (
                "the valid kind, explicitly",
                "{name: http, protocol: HTTP, port: 80, allowedRoutes: {kinds: [{group: gateway.networking.k8s.io, kind: HTTPRoute}]}}",
                &["HTTPRoute"],
                (true, "ResolvedRefs"),
            ),
        ];
        for (case, listener, kinds, resolved) in cases {
            let s = status(&[listener], "", "", Some(&[]));
            let l = &s.listeners[0];
            assert_eq!(l.supported_kinds, *kinds, "{case}");
            assert_eq!(cond(&l.conditions, "ResolvedRefs"), *resolved, "{case}");
        }
    }

    /// GatewayListenerUnsupportedProtocol and GatewayInvalidParametersRef.
    #[test]
    fn gateway_acceptance_follows_its_listeners_and_parameters() {
        let http = "{name: http, protocol: HTTP, port: 80}";
        let invalid = "{name: invalid, protocol: INVALID, port: 1111}";
        // (case, listeners, extra spec, Accepted, Programmed)
        type Case<'a> = (&'a str, &'a [&'a str], &'a str, (bool, &'a str), bool);
        let cases: &[Case] = &[
            (
                "every listener valid",
                &[http],
                "",
                (true, "Accepted"),
                true,
            ),
            (
                "some listener invalid",
                &[http, invalid],
                "",
                (true, "ListenersNotValid"),
                true,
            ),
            (
                "no listener valid",
                &[invalid],
                "",
                (false, "ListenersNotValid"),
                false,
            ),
            (
                "a parametersRef that does not resolve",
                &[http],
                "  infrastructure: {parametersRef: {group: invalid.io, kind: InvalidParameters, name: invalid}}\n",
                (false, "InvalidParameters"),
                false,
            ),
        ];
        for (case, listeners, extra, accepted, programmed) in cases {
            let s = status(listeners, extra, "", Some(&[]));
            assert_eq!(cond(&s.conditions, "Accepted"), *accepted, "{case}");
            assert_eq!(cond(&s.conditions, "Programmed").0, *programmed, "{case}");
            assert_eq!(s.generation, Some(2), "{case}");
        }
        let s = status(&[http, invalid], "", "", Some(&[]));
        assert_eq!(
            cond(&s.listeners[1].conditions, "Accepted"),
            (false, "UnsupportedProtocol")
        );
        assert!(s.listeners[1].supported_kinds.is_empty());
    }
}
