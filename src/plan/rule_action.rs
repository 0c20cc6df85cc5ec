//! What one HTTPRoute rule does, as data for the proxy: its filters, its
//! timeouts (GEP-2257 durations) and its weighted backends resolved to
//! Services (across namespaces only through a ReferenceGrant). Used by
//! HTTPRoutes and, for their backends, by TCPRoutes; pure.

use std::time::Duration;

use tuna_crds::gateway::ReferenceGrant;
use tuna_crds::gateway::httproutes::{
    HttpRouteRules, HttpRouteRulesFilters, HttpRouteRulesFiltersType,
};
use tuna_routing::action::{Filter, HeaderModifier, PathModifier, Redirect, Rewrite, Timeouts};

use super::gateway::{GatewayAction, InvalidBackend, RefRefusal, WeightedBackend, resolve_backend};
use super::ingress::{ServicePort, ServiceRef};
use super::model::Backends;
use super::service::{
    ServiceLookup, UpstreamPolicy, UpstreamReason, UpstreamScheme, resolve_service,
};

/// Parses a Gateway API duration (GEP-2257: `1h`, `30s`, `500ms`, `1m30s`);
/// `0s` means no timeout.
pub fn parse_duration(text: &str) -> Result<Option<Duration>, String> {
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return Err(format!(
                "{text:?} is not a duration like 10s, 1m30s or 500ms"
            ));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| "bad number".to_string())?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(n), 2)
        } else if rest.starts_with('h') {
            (Duration::from_secs(n * 3600), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(n * 60), 1)
        } else if rest.starts_with('s') {
            (Duration::from_secs(n), 1)
        } else {
            return Err(format!(
                "{text:?} is not a duration like 10s, 1m30s or 500ms"
            ));
        };
        total += unit;
        rest = &rest[len..];
    }
    Ok((!total.is_zero()).then_some(total))
}

fn modifier(
    set: impl Iterator<Item = (String, String)>,
    add: impl Iterator<Item = (String, String)>,
    remove: Option<&Vec<String>>,
) -> HeaderModifier {
    HeaderModifier {
        set: set.map(|(n, v)| (n.to_ascii_lowercase(), v)).collect(),
        add: add.map(|(n, v)| (n.to_ascii_lowercase(), v)).collect(),
        remove: remove
            .into_iter()
            .flatten()
            .map(|n| n.to_ascii_lowercase())
            .collect(),
    }
}

fn filter_of(f: &HttpRouteRulesFilters) -> Option<Filter> {
    use tuna_crds::gateway::httproutes::{
        HttpRouteRulesFiltersRequestRedirectPathType as RedirectPath,
        HttpRouteRulesFiltersRequestRedirectScheme as Scheme,
        HttpRouteRulesFiltersUrlRewritePathType as RewritePath,
    };
    match f.r#type {
        HttpRouteRulesFiltersType::RequestHeaderModifier => {
            let m = f.request_header_modifier.as_ref()?;
            Some(Filter::RequestHeaderModifier(modifier(
                m.set
                    .iter()
                    .flatten()
                    .map(|h| (h.name.clone(), h.value.clone())),
                m.add
                    .iter()
                    .flatten()
                    .map(|h| (h.name.clone(), h.value.clone())),
                m.remove.as_ref(),
            )))
        }
        HttpRouteRulesFiltersType::ResponseHeaderModifier => {
            let m = f.response_header_modifier.as_ref()?;
            Some(Filter::ResponseHeaderModifier(modifier(
                m.set
                    .iter()
                    .flatten()
                    .map(|h| (h.name.clone(), h.value.clone())),
                m.add
                    .iter()
                    .flatten()
                    .map(|h| (h.name.clone(), h.value.clone())),
                m.remove.as_ref(),
            )))
        }
        HttpRouteRulesFiltersType::RequestRedirect => {
            let r = f.request_redirect.as_ref()?;
            let path = r.path.as_ref().and_then(|p| match p.r#type {
                RedirectPath::ReplaceFullPath => p
                    .replace_full_path
                    .clone()
                    .map(PathModifier::ReplaceFullPath),
                RedirectPath::ReplacePrefixMatch => p
                    .replace_prefix_match
                    .clone()
                    .map(PathModifier::ReplacePrefixMatch),
            });
            Some(Filter::RequestRedirect(Redirect {
                scheme: r.scheme.as_ref().map(|s| match s {
                    Scheme::Http => "http".to_owned(),
                    Scheme::Https => "https".to_owned(),
                }),
                hostname: r.hostname.clone(),
                path,
                port: r.port.and_then(|p| u16::try_from(p).ok()),
                status_code: r
                    .status_code
                    .and_then(|c| u16::try_from(c).ok())
                    .unwrap_or(302),
            }))
        }
        HttpRouteRulesFiltersType::UrlRewrite => {
            let r = f.url_rewrite.as_ref()?;
            let path = r.path.as_ref().and_then(|p| match p.r#type {
                RewritePath::ReplaceFullPath => p
                    .replace_full_path
                    .clone()
                    .map(PathModifier::ReplaceFullPath),
                RewritePath::ReplacePrefixMatch => p
                    .replace_prefix_match
                    .clone()
                    .map(PathModifier::ReplacePrefixMatch),
            });
            Some(Filter::UrlRewrite(Rewrite {
                hostname: r.hostname.clone(),
                path,
            }))
        }
        _ => None,
    }
}

/// The action of one rule of a route of `route_kind` (`HTTPRoute`, or a
/// `TCPRoute` whose rule is converted, `tcp://` upstreams): its backends
/// resolved, its filters and timeouts.
#[allow(clippy::too_many_arguments)]
pub(super) fn action_of(
    rule: &HttpRouteRules,
    route_kind: &str,
    scheme: UpstreamScheme,
    route_namespace: &str,
    grants: &[&ReferenceGrant],
    services: &dyn ServiceLookup,
    backends_mode: Backends,
    policy: UpstreamPolicy,
) -> GatewayAction {
    let mut action = GatewayAction {
        filters: rule
            .filters
            .iter()
            .flatten()
            .filter_map(filter_of)
            .collect(),
        ..GatewayAction::default()
    };
    if let Some(t) = &rule.timeouts {
        action.timeouts = Timeouts {
            request: t
                .request
                .as_deref()
                .and_then(|d| parse_duration(d).ok().flatten()),
            backend_request: t
                .backend_request
                .as_deref()
                .and_then(|d| parse_duration(d).ok().flatten()),
        };
    }
    for b in rule.backend_refs.iter().flatten() {
        let namespace = b
            .namespace
            .clone()
            .unwrap_or_else(|| route_namespace.into());
        let kind = match b.group.as_deref().unwrap_or("") {
            "" => b.kind.clone().unwrap_or_else(|| "Service".into()),
            g => format!("{g}/{}", b.kind.as_deref().unwrap_or("Service")),
        };
        let weight = b.weight.unwrap_or(1).max(0) as u32;
        let invalid = |reason: &str, message: String| InvalidBackend {
            namespace: namespace.clone(),
            name: b.name.clone(),
            kind: kind.clone(),
            port: b.port,
            weight,
            reason: reason.into(),
            message,
        };
        let exists = |ns: &str, name: &str| {
            backends_mode == Backends::Unchecked || services.service(ns, name).is_some()
        };
        match resolve_backend(b, route_kind, route_namespace, grants, exists) {
            Err(r) => {
                let message = match r {
                    RefRefusal::InvalidKind => {
                        format!("{kind} {namespace}/{} is not a core Service", b.name)
                    }
                    RefRefusal::RefNotPermitted => format!(
                        "Service {namespace}/{} is in another namespace and no ReferenceGrant in {namespace:?} allows {route_kind}s of {route_namespace:?} to use it",
                        b.name
                    ),
                    RefRefusal::BackendNotFound => {
                        format!("Service {namespace}/{} does not exist", b.name)
                    }
                };
                action.invalid.push(invalid(r.reason(), message));
            }
            Ok((ns, name)) => {
                let Some(port) = b.port else {
                    action.invalid.push(invalid(
                        "UnsupportedValue",
                        format!("backendRef to Service {ns}/{name} has no port; a Service backendRef needs one"),
                    ));
                    continue;
                };
                let upstream = match backends_mode {
                    Backends::Unchecked => None,
                    Backends::Declared => {
                        let ports = services.service(ns, name).map(|i| &i.ports);
                        if let Some(ports) = ports
                            && !ports.is_empty()
                            && !ports.iter().any(|p| i32::from(p.port) == port)
                        {
                            action.invalid.push(invalid(
                                "ServicePortNotFound",
                                format!("Service {ns}/{name} has no port {port}"),
                            ));
                            continue;
                        }
                        None
                    }
                    Backends::Resolve => {
                        let service = ServiceRef {
                            namespace: ns.to_owned(),
                            name: name.to_owned(),
                            port: ServicePort::Number(port),
                        };
                        // The ReferenceGrant (checked above) is what allows
                        // another namespace's Service.
                        match resolve_service(&service, ns, scheme, services, &policy) {
                            Ok(u) => Some(u),
                            // The Service exists but has no ready address
                            // yet (a headless one before its endpoints are
                            // ready): the reference resolves, as the
                            // specification reads `ResolvedRefs`; its share
                            // answers 500 until an endpoint is ready (the
                            // agent reads it again soon).
                            Err(e) if e.reason == UpstreamReason::ServiceWithoutAddress => None,
                            Err(e) => {
                                action
                                    .invalid
                                    .push(invalid(e.reason.as_str(), e.message.clone()));
                                continue;
                            }
                        }
                    }
                };
                if weight > 0 {
                    action.backends.push(WeightedBackend {
                        namespace: ns.to_owned(),
                        service: name.to_owned(),
                        port: Some(port),
                        weight,
                        upstream,
                    });
                }
            }
        }
    }
    action
}
