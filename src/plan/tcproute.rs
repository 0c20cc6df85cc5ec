//! TCPRoutes (Gateway API v1, standard channel) → TCP endpoints, and the
//! statuses that say so. Pure; part of [`super::httproute::finish`].
//!
//! - A Gateway listener of protocol `TCP` names its reservation by its
//!   **name**: the alias of a TCPEndpoint of the Gateway's namespace. The
//!   listener's `port` is not used (the edge assigns the public port). With
//!   [`super::PlanOptions::require_tcp_endpoint_objects`] (standalone) the
//!   TCPEndpoint must exist; in a cluster an alias no TCPEndpoint declares is
//!   left to the edge, as for tcp Tunnels. A TCPEndpoint of another namespace,
//!   an alias a tcp Tunnel publishes (Tunnels are planned first and keep their
//!   endpoint) or an older Gateway's listener uses: the listener is
//!   `Accepted=False`, `PortUnavailable`.
//! - A TCPRoute attaches through its parentRefs ([`super::gateway::attach`],
//!   kind `TCPRoute`). One TCPRoute is served per listener: the oldest (then
//!   namespace/name); the others are `Accepted=False`, `TcpEndpointInUse`,
//!   naming the winner. A TCPRoute is published on one endpoint: the first
//!   listener it wins.
//! - Its first rule's backendRefs resolve as an HTTPRoute's do (ReferenceGrant
//!   `from.kind: TCPRoute`); the upstream is the first valid backend with
//!   weight > 0: weights are not split.
//! - With [`super::PlanOptions::gateway_addresses`] (the edge gives each
//!   Gateway an address of its own) none of the above reservations apply: a
//!   TCP listener is its own **port** on its Gateway's address, so every TCP
//!   listener of an accepted Gateway is usable, listener names are only
//!   names, and a TCPRoute is served on every listener it wins
//!   ([`super::gateway_model::AddressPlan::tcp`]), never on a TCP endpoint.

use std::collections::BTreeMap;
use std::sync::Arc;

use tuna_crds::gateway::httproutes::{
    HttpRouteParentRefs, HttpRouteRules, HttpRouteRulesBackendRefs,
};
use tuna_crds::gateway::tcproutes::{TcpRouteParentRefs, TcpRouteRulesBackendRefs};
use tuna_crds::gateway::{Gateway, ReferenceGrant};

use super::claims::tcp_key;
use super::gateway::{attach, refers_to};
use super::gateway_model::{
    AddressPlan, Cond, GatewayInputs, GatewayOutcome, HostContext, ParentStatus, RouteStatus,
    created, labels_of, ref_reason, resolved_refs,
};
use super::model::{Backends, Kind, ObjectRef, Reason, TcpPlan};
use super::rule_action::action_of;
use super::service::{ServiceLookup, UpstreamScheme};
use super::tunnel::{PortOrAlias, TunnelReason};

/// A TCPRoute's parentRef as the HTTPRoute type (the same fields), so that
/// attachment and status share one shape.
pub fn parent_ref(p: &TcpRouteParentRefs) -> HttpRouteParentRefs {
    HttpRouteParentRefs {
        group: p.group.clone(),
        kind: p.kind.clone(),
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        port: p.port,
        section_name: p.section_name.clone(),
    }
}

fn backend_ref(b: &TcpRouteRulesBackendRefs) -> HttpRouteRulesBackendRefs {
    HttpRouteRulesBackendRefs {
        filters: None,
        group: b.group.clone(),
        kind: b.kind.clone(),
        name: b.name.clone(),
        namespace: b.namespace.clone(),
        port: b.port,
        weight: b.weight,
    }
}

/// Why a TCP listener's reservation cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unavailable {
    /// What a route attaching through it is refused with.
    pub reason: Reason,
    /// For a human.
    pub message: String,
}

/// The TCP listeners of `gateways`, (gateway index, listener name) → their
/// alias usable or not (see the module docs).
pub(crate) fn reserve_listeners(
    gateways: &[&Arc<Gateway>],
    ctx: &HostContext<'_>,
) -> BTreeMap<(usize, String), Result<(), Unavailable>> {
    let mut order: Vec<usize> = (0..gateways.len()).collect();
    order.sort_by_key(|&i| {
        let m = &gateways[i].metadata;
        (created(m), m.namespace.clone(), m.name.clone())
    });
    let mut used: BTreeMap<String, ObjectRef> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for gi in order {
        let g = gateways[gi];
        // A Gateway that is not accepted takes no route, so it holds no
        // alias either.
        if super::gateway::not_accepted(g).is_some() {
            continue;
        }
        if ctx.addresses.own(g) {
            // Its own address: each TCP listener is a port of it (but one
            // that shares its port with another protocol: conflicted).
            let conflicted = super::gateway::conflicts(g, true);
            for l in g
                .spec
                .listeners
                .iter()
                .filter(|l| l.protocol == "TCP" && !conflicted.contains_key(&l.name))
            {
                out.insert((gi, l.name.clone()), Ok(()));
            }
            continue;
        }
        let object = ObjectRef::of(Kind::Gateway, &g.metadata);
        for l in g.spec.listeners.iter().filter(|l| l.protocol == "TCP") {
            let alias = l.name.as_str();
            // An all-digit name is a port, as everywhere (one key).
            let key = tcp_key(alias);
            let endpoint = PortOrAlias::parse(alias);
            let verdict = if let Some(e) = ctx.aliases.get(alias)
                && e.namespace != object.namespace
            {
                Err(Unavailable {
                    reason: Reason::Tunnel(TunnelReason::TcpEndpointOwnedByOtherNamespace),
                    message: format!(
                        "alias {alias} is declared by TCPEndpoint {}/{}; a Gateway uses the TCPEndpoints of its own namespace {:?}",
                        e.namespace, e.name, object.namespace
                    ),
                })
            } else if let Some(holder) = ctx.tcp_owners.get(&key)
                && holder.namespace != object.namespace
            {
                Err(Unavailable {
                    reason: Reason::Tunnel(TunnelReason::TcpEndpointOwnedByOtherNamespace),
                    message: format!(
                        "{endpoint} belongs to namespace {:?}, {}",
                        holder.namespace,
                        holder.why()
                    ),
                })
            } else if matches!(endpoint, PortOrAlias::Alias(_))
                && ctx.aliases.get(alias).is_none()
                && ctx.require_tcp_endpoint_objects
            {
                Err(Unavailable {
                    reason: Reason::TcpEndpointNotFound,
                    message: format!(
                        "no TCPEndpoint with alias {alias} in namespace {:?}: the listener's name is the alias of its TCP endpoint; add a TCPEndpoint with spec.alias: {alias}",
                        object.namespace
                    ),
                })
            } else if let Some(t) = ctx.tcp_taken.get(&key) {
                Err(Unavailable {
                    reason: Reason::TcpEndpointInUse,
                    message: format!("{endpoint} is published by {t}, which keeps it"),
                })
            } else if let Some(first) = used.get(&key) {
                Err(Unavailable {
                    reason: Reason::TcpEndpointInUse,
                    message: format!("{endpoint} is used by a listener of {first}, which is older"),
                })
            } else {
                used.insert(key, object.clone());
                Ok(())
            };
            out.insert((gi, l.name.clone()), verdict);
        }
    }
    out
}

/// The conditions of a TCP listener named `alias`, on `port` of its
/// Gateway's own address when it has one.
pub(crate) fn listener_conditions(
    alias: &str,
    own_port: Option<i32>,
    verdict: Option<&Result<(), Unavailable>>,
) -> Vec<Cond> {
    if let (Some(port), None | Some(Ok(()))) = (own_port, verdict) {
        return vec![
            Cond::yes(
                "Accepted",
                "Accepted",
                format!("serves one TCPRoute on port {port} of the Gateway's address"),
            ),
            Cond::yes(
                "Programmed",
                "Programmed",
                "its TCPRoute is published through the edge",
            ),
            Cond::yes("ResolvedRefs", "ResolvedRefs", "nothing to resolve"),
            Cond::no("Conflicted", "NoConflicts", "no conflict"),
        ];
    }
    match verdict {
        Some(Err(u)) => vec![
            Cond::no("Accepted", "PortUnavailable", u.message.clone()),
            Cond::no("Programmed", "Invalid", "the listener is not accepted"),
            Cond::yes("ResolvedRefs", "ResolvedRefs", "nothing to resolve"),
            Cond::no("Conflicted", "NoConflicts", "no conflict"),
        ],
        _ => vec![
            Cond::yes(
                "Accepted",
                "Accepted",
                format!(
                    "serves one TCPRoute on the TCP endpoint with alias {alias} (the edge assigns the public port; the listener's port is not used)"
                ),
            ),
            Cond::yes(
                "Programmed",
                "Programmed",
                "its TCPRoute is published through the edge",
            ),
            Cond::yes("ResolvedRefs", "ResolvedRefs", "nothing to resolve"),
            Cond::no("Conflicted", "NoConflicts", "no conflict"),
        ],
    }
}

/// Plans the TCPRoutes of `inputs` on the TCP listeners of `gateways`: route
/// statuses, attached counts, [`GatewayOutcome::tcp`] and its refusals.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_tcp_routes(
    inputs: &GatewayInputs<'_>,
    gateways: &[&Arc<Gateway>],
    grants: &[&ReferenceGrant],
    services: &dyn ServiceLookup,
    ctx: &HostContext<'_>,
    listeners: &BTreeMap<(usize, String), Result<(), Unavailable>>,
    attached_count: &mut BTreeMap<(usize, String), i32>,
    out: &mut GatewayOutcome,
) {
    // Routes oldest first, so that the first claimant of a listener wins.
    let mut routes: Vec<&Arc<tuna_crds::gateway::TcpRoute>> = inputs.tcp_routes.iter().collect();
    routes.sort_by_key(|r| {
        let m = &r.metadata;
        (
            created(m),
            m.namespace.clone().unwrap_or_else(|| "default".into()),
            m.name.clone(),
        )
    });
    let mut winners: BTreeMap<(usize, String), ObjectRef> = BTreeMap::new();
    {
        // TCP, HTTP and HTTPS listeners are served on a Gateway's own
        // address (HTTPS terminated in the cluster with its certificateRefs).
        for g in gateways.iter().filter(|g| ctx.addresses.own(g)) {
            let served = g
                .spec
                .listeners
                .iter()
                .any(|l| matches!(l.protocol.as_str(), "TCP" | "HTTP" | "HTTPS"));
            if served && super::gateway::not_accepted(g).is_none() {
                out.addresses.insert(
                    ObjectRef::of(Kind::Gateway, &g.metadata),
                    match requested_address(g) {
                        Ok(requested) => AddressPlan {
                            requested,
                            ..AddressPlan::default()
                        },
                        Err(why) => AddressPlan {
                            unusable: Some(why),
                            ..AddressPlan::default()
                        },
                    },
                );
            }
        }
    }
    for route in routes {
        let meta = &route.metadata;
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
        let object = ObjectRef::of(Kind::TcpRoute, meta);
        let labels = labels_of(inputs.namespaces, &namespace);
        let rule = HttpRouteRules {
            backend_refs: route
                .spec
                .rules
                .first()
                .map(|r| r.backend_refs.iter().map(backend_ref).collect()),
            ..HttpRouteRules::default()
        };
        let action = action_of(
            &rule,
            "TCPRoute",
            UpstreamScheme::Tcp,
            &namespace,
            grants,
            services,
            ctx.backends,
            ctx.policy,
        );
        let resolved = resolved_refs([&action]);
        let mut parents = Vec::new();
        // Listeners this route won, (gateway index, listener name), in
        // parentRef then listener order.
        let mut won_at: Vec<(usize, String)> = Vec::new();
        for parent in route.spec.parent_refs.iter().flatten().map(parent_ref) {
            let Some((gi, gateway)) = gateways
                .iter()
                .enumerate()
                .find(|(_, g)| refers_to(&parent, &namespace, g))
            else {
                continue;
            };
            let accepted = match attach(
                gateway,
                &parent,
                "TCPRoute",
                &namespace,
                &labels,
                &[],
                ctx.addresses.own(gateway),
            ) {
                Err(r) => Cond::no("Accepted", r.reason(), refusal_message(r, &parent)),
                Ok(attached) => {
                    let mut refusal: Option<Cond> = None;
                    let mut any = false;
                    // Listeners an older TCPRoute holds (address mode).
                    let mut behind: Vec<String> = Vec::new();
                    for a in attached {
                        let key = (gi, a.listener.clone());
                        let older = winners.get(&key).filter(|w| **w != object).cloned();
                        let lost = match listeners.get(&key) {
                            Some(Err(u)) => Some(Cond::no(
                                "Accepted",
                                u.reason.as_str(),
                                format!("listener {}: {}", a.listener, u.message),
                            )),
                            // On a Gateway's own address the route attaches
                            // (the specification's conflict rule: the oldest
                            // gets the connections); on a shared TCP
                            // endpoint it is refused.
                            _ if ctx.addresses.own(gateway) => None,
                            _ => older.as_ref().map(|w| {
                                Cond::no(
                                    "Accepted",
                                    "TcpEndpointInUse",
                                    format!(
                                        "listener {} serves {w}, which is older: one TCPRoute per TCP listener",
                                        a.listener
                                    ),
                                )
                            }),
                        };
                        match (lost, older) {
                            (Some(c), _) => {
                                refusal.get_or_insert(c);
                            }
                            (None, Some(w)) => {
                                any = true;
                                *attached_count.entry(key).or_default() += 1;
                                behind.push(format!(
                                    "listener {} serves {w}, which is older: only the oldest TCPRoute of a listener gets its connections",
                                    a.listener
                                ));
                            }
                            (None, None) => {
                                any = true;
                                if winners.insert(key.clone(), object.clone()).is_none() {
                                    *attached_count.entry(key).or_default() += 1;
                                }
                                won_at.push((gi, a.listener));
                            }
                        }
                    }
                    if !behind.is_empty() {
                        out.tcp_refusals.push((
                            object.clone(),
                            Reason::TcpEndpointInUse,
                            behind.join("; "),
                        ));
                    }
                    match refusal {
                        Some(c) if !any => c,
                        _ if !behind.is_empty() => Cond::yes(
                            "Accepted",
                            "Accepted",
                            format!("accepted by the Gateway; not served: {}", behind.join("; ")),
                        ),
                        _ => Cond::yes("Accepted", "Accepted", "accepted by the Gateway"),
                    }
                }
            };
            if !accepted.status {
                out.tcp_refusals.push((
                    object.clone(),
                    match accepted.reason.as_str() {
                        "TcpEndpointInUse" => Reason::TcpEndpointInUse,
                        "TcpEndpointNotFound" => Reason::TcpEndpointNotFound,
                        r => Reason::Route(static_reason(r)),
                    },
                    accepted.message.clone(),
                ));
            }
            parents.push(ParentStatus {
                parent_ref: parent,
                conditions: vec![accepted, resolved.clone()],
            });
        }
        if !parents.is_empty() {
            out.routes.push(RouteStatus {
                object: object.clone(),
                generation: meta.generation,
                parents,
            });
        }
        // The listeners of Gateways with an address of their own are ports
        // of it; those of Gateways on the shared ports are TCP endpoints by
        // alias (a route may have both).
        let (at_address, at_alias): (Vec<_>, Vec<_>) = won_at
            .into_iter()
            .partition(|(gi, _)| ctx.addresses.own(gateways[*gi]));
        if !at_address.is_empty() && ctx.backends == Backends::Resolve {
            serve_on_addresses(gateways, &at_address, &action, object.clone(), out);
        }
        let won: Vec<String> = at_alias.into_iter().map(|(_, l)| l).collect();
        let Some(alias) = won.first() else {
            continue;
        };
        if won.len() > 1 {
            out.tcp_refusals.push((
                object.clone(),
                Reason::TcpEndpointInUse,
                format!(
                    "attached to listeners {}: a TCPRoute is published on one endpoint, alias {alias}; name one listener with sectionName",
                    won.join(", ")
                ),
            ));
        }
        // Without resolved upstreams (route explain) there is nothing to publish.
        if ctx.backends != Backends::Resolve {
            continue;
        }
        match action.backends.iter().find_map(|b| b.upstream.clone()) {
            Some(upstream) => {
                out.tcp.insert(
                    object,
                    TcpPlan {
                        endpoint: PortOrAlias::parse(alias),
                        upstream,
                    },
                );
            }
            None => {
                let (reason, message) = no_upstream(&action);
                out.tcp_refusals.push((
                    object,
                    Reason::Route(reason),
                    format!("{message}: alias {alias} is not published"),
                ));
            }
        }
    }
}

/// Why a TCPRoute's rule has no upstream: its first invalid backendRef,
/// else none with a weight.
fn no_upstream(action: &super::gateway::GatewayAction) -> (&'static str, String) {
    match action.invalid.first() {
        Some(bad) => (ref_reason(&bad.reason), bad.message.clone()),
        None => (
            "BackendNotFound",
            "no backendRef with weight > 0".to_owned(),
        ),
    }
}

/// The address a Gateway's `spec.addresses` asks for: its one entry of
/// type `IPAddress` (the default type), if any; more than one, or a value
/// that is not an IP address, cannot be given (other types make the
/// Gateway not accepted: [`super::gateway::not_accepted`]).
fn requested_address(g: &Gateway) -> Result<Option<std::net::IpAddr>, String> {
    let asked: Vec<&str> = g
        .spec
        .addresses
        .iter()
        .flatten()
        .filter(|a| a.r#type.as_deref().is_none_or(|t| t == "IPAddress"))
        .map(|a| a.value.as_deref().unwrap_or_default())
        .collect();
    match asked.as_slice() {
        [] => Ok(None),
        [one] => one
            .parse()
            .map(Some)
            .map_err(|_| format!("spec.addresses asks for {one:?}, which is not an IP address")),
        more => Err(format!(
            "spec.addresses asks for {} addresses ({}): a Gateway has one address here",
            more.len(),
            more.join(", ")
        )),
    }
}

/// Serves a TCPRoute's upstream on each listener it won, each a port of its
/// Gateway's own address.
fn serve_on_addresses(
    gateways: &[&Arc<Gateway>],
    won: &[(usize, String)],
    action: &super::gateway::GatewayAction,
    object: ObjectRef,
    out: &mut GatewayOutcome,
) {
    if !action.backends.iter().any(|b| b.upstream.is_some()) {
        let (reason, message) = no_upstream(action);
        out.tcp_refusals.push((
            object,
            Reason::Route(reason),
            format!("{message}: not published"),
        ));
        return;
    }
    let rule = Arc::new(action.clone());
    for (gi, listener) in won {
        let g = gateways[*gi];
        let Some(port) = g
            .spec
            .listeners
            .iter()
            .find(|l| &l.name == listener)
            .and_then(|l| u16::try_from(l.port).ok())
        else {
            continue;
        };
        if let Some(plan) = out
            .addresses
            .get_mut(&ObjectRef::of(Kind::Gateway, &g.metadata))
        {
            plan.tcp.insert(port, Arc::clone(&rule));
        }
    }
}

fn static_reason(reason: &str) -> &'static str {
    use super::gateway::RouteRefusal as R;
    [
        R::NoMatchingParent,
        R::NotAllowedByListeners,
        R::NoMatchingListenerHostname,
        R::GatewayNotAccepted,
    ]
    .into_iter()
    .map(R::reason)
    .chain(["TcpEndpointOwnedByOtherNamespace"])
    .find(|r| *r == reason)
    .unwrap_or("NotAccepted")
}

fn refusal_message(r: super::gateway::RouteRefusal, parent: &HttpRouteParentRefs) -> String {
    use super::gateway::RouteRefusal as R;
    match r {
        R::NotAllowedByListeners => format!(
            "no listener of Gateway {} allows TCPRoutes of this namespace (allowedRoutes, or a protocol other than TCP)",
            parent.name
        ),
        R::GatewayNotAccepted => super::gateway::not_accepted_message(&parent.name),
        _ => format!(
            "Gateway {} has no listener{}{}",
            parent.name,
            parent
                .section_name
                .as_ref()
                .map(|s| format!(" named {s:?}"))
                .unwrap_or_default(),
            parent
                .port
                .map(|p| format!(" on port {p}"))
                .unwrap_or_default()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::gateway_model::{CertificateSecret, GatewayInputs};
    use crate::plan::service::{ServiceIndex, ServiceInfo};
    use crate::plan::{Inputs, Plan, PlanOptions, plan};
    use tuna_crds::gateway::{GatewayClass, HttpRoute, TcpRoute};
    use tuna_crds::{TcpEndpoint, Tunnel};

    fn objects<K: serde::de::DeserializeOwned>(yaml: &str) -> Vec<Arc<K>> {
        yaml.split("\n---\n")
            .filter(|d| !d.trim().is_empty())
            .map(|d| Arc::new(serde_saphyr::from_str::<K>(d).expect("test manifest")))
            .collect()
    }

    const SERVICES: &str = "
metadata: {name: db, namespace: shop}
spec: {clusterIP: 10.0.0.1, ports: [{name: pg, port: 5432}]}
---
metadata: {name: cache, namespace: shop}
spec: {clusterIP: 10.0.0.2, ports: [{port: 6379}]}
---
metadata: {name: shared, namespace: infra}
spec: {clusterIP: 10.0.1.1, ports: [{port: 5432}]}
";

    const CLASS: &str = "
metadata: {name: tuna}
spec: {controllerName: k8s.tuna.am/gateway-controller}
";

    const GATEWAY: &str = "
metadata: {name: edge, namespace: shop}
spec:
  gatewayClassName: tuna
  listeners:
  - {name: pg, protocol: TCP, port: 5432}
  - {name: web, protocol: HTTP, port: 80}
  - {name: redis, protocol: TCP, port: 6379, allowedRoutes: {namespaces: {from: All}}}
";

    /// One TCPRoute per listener named by `sectionName`.
    fn route(name: &str, ns: &str, created: &str, section: &str, backends: &str) -> String {
        format!(
            "
metadata: {{name: {name}, namespace: {ns}, creationTimestamp: '{created}'}}
spec:
  parentRefs: [{{name: edge, namespace: shop, sectionName: {section}}}]
  rules: [{{backendRefs: {backends}}}]
"
        )
    }

    struct World<'a> {
        gateways: &'a str,
        routes: Vec<String>,
        endpoints: &'a str,
        tunnels: &'a str,
        grants: &'a str,
        http_routes: &'a str,
        standalone: bool,
        own_addresses: bool,
        /// The listeners' Secrets as the agent found them (`None`: not read).
        certificates: Option<&'a [CertificateSecret]>,
        /// The GatewayClasses.
        classes: &'a str,
    }

    impl Default for World<'_> {
        fn default() -> Self {
            Self {
                gateways: GATEWAY,
                routes: Vec::new(),
                endpoints: "
metadata: {name: pg, namespace: shop}
spec: {alias: pg}
---
metadata: {name: redis, namespace: shop}
spec: {alias: redis}
",
                tunnels: "",
                grants: "",
                http_routes: "",
                standalone: true,
                own_addresses: false,
                certificates: None,
                classes: CLASS,
            }
        }
    }

    fn run(w: &World<'_>) -> Plan {
        let classes = objects::<GatewayClass>(w.classes);
        let gateways = objects::<Gateway>(w.gateways);
        let routes = objects::<TcpRoute>(&w.routes.join("\n---\n"));
        let http_routes = objects::<HttpRoute>(w.http_routes);
        let grants = objects::<ReferenceGrant>(w.grants);
        let endpoints = objects::<TcpEndpoint>(w.endpoints);
        let tunnels = objects::<Tunnel>(w.tunnels);
        let services = ServiceIndex::new(
            objects::<k8s_openapi::api::core::v1::Service>(SERVICES)
                .iter()
                .map(|s| ServiceInfo::from_service(s)),
        );
        let mut options = PlanOptions::cluster("tuna.test");
        options.require_tcp_endpoint_objects = w.standalone;
        options.gateway_addresses = w.own_addresses;
        let inputs = Inputs {
            tunnels: &tunnels,
            tcp_endpoints: &endpoints,
            gateway: GatewayInputs {
                classes: &classes,
                gateways: &gateways,
                http_routes: &http_routes,
                tcp_routes: &routes,
                grants: &grants,
                namespaces: &[],
                certificates: w.certificates,
            },
            ..Inputs::default()
        };
        plan(&inputs, &services, &options)
    }

    /// Two Gateways whose TCP listeners share names and ports, in a
    /// namespace without TCPEndpoints.
    const TWO_GATEWAYS: &str = "
metadata: {name: edge, namespace: shop, creationTimestamp: '2026-01-01T00:00:00Z'}
spec:
  gatewayClassName: tuna
  addresses: [{value: 127.0.100.9}]
  listeners:
  - {name: pg, protocol: TCP, port: 5432}
  - {name: redis, protocol: TCP, port: 6379}
---
metadata: {name: other, namespace: shop, creationTimestamp: '2026-01-02T00:00:00Z'}
spec:
  gatewayClassName: tuna
  listeners:
  - {name: pg, protocol: TCP, port: 5432}
---
metadata: {name: web, namespace: shop, creationTimestamp: '2026-01-02T00:00:00Z'}
spec:
  gatewayClassName: tuna
  listeners:
  - {name: http, protocol: HTTP, port: 80}
";

    #[test]
    fn with_own_addresses_each_tcp_listener_is_a_port_of_its_gateway() {
        let other = "
metadata: {name: second, namespace: shop, creationTimestamp: '2026-01-03T00:00:00Z'}
spec:
  parentRefs: [{name: other, namespace: shop, sectionName: pg}]
  rules: [{backendRefs: [{name: cache, port: 6379}]}]
";
        let world = World {
            gateways: TWO_GATEWAYS,
            routes: vec![
                route(
                    "first",
                    "shop",
                    "2026-01-03T00:00:00Z",
                    "pg",
                    "[{name: db, port: 5432}]",
                ),
                other.to_owned(),
            ],
            endpoints: "",
            own_addresses: true,
            ..World::default()
        };
        let p = run(&world);
        // No TCP endpoint anywhere: nothing is reserved or published on one.
        assert!(p.tcp.is_empty(), "{:?}", p.tcp);
        assert!(p.refusals.is_empty(), "{:?}", p.refusals);
        let edge = &p.gateway.addresses[&ObjectRef::new(Kind::Gateway, "shop", "edge")];
        let other = &p.gateway.addresses[&ObjectRef::new(Kind::Gateway, "shop", "other")];
        // spec.addresses: its IPAddress (a value without a type is one).
        assert_eq!(edge.requested, Some("127.0.100.9".parse().unwrap()));
        assert_eq!(other.requested, None);
        // A Gateway with only an HTTP listener has one too, with its port.
        let web = &p.gateway.addresses[&ObjectRef::new(Kind::Gateway, "shop", "web")];
        assert!(web.tcp.is_empty());
        assert_eq!(web.http.keys().collect::<Vec<_>>(), [&80]);
        assert!(edge.http.is_empty() && other.http.is_empty());
        let ports = |a: &AddressPlan| {
            a.tcp
                .iter()
                .map(|(port, rule)| {
                    let u = rule.backends[0].upstream.as_ref().unwrap();
                    (*port, format!("{}:{}", u.host, u.port))
                })
                .collect::<Vec<_>>()
        };
        // The same listener name and port on two Gateways: both serve.
        assert_eq!(ports(edge), vec![(5432, "10.0.0.1:5432".to_owned())]);
        assert_eq!(ports(other), vec![(5432, "10.0.0.2:6379".to_owned())]);
        for gateway in ["edge", "other"] {
            let l = p
                .gateway
                .gateways
                .iter()
                .find(|g| g.object.name == gateway)
                .unwrap()
                .listeners
                .iter()
                .find(|l| l.name == "pg")
                .unwrap();
            assert_eq!(l.attached_routes, 1, "{l:?}");
            let accepted = cond(&l.conditions, "Accepted");
            assert!(accepted.status, "{accepted:?}");
            assert!(
                accepted
                    .message
                    .contains("port 5432 of the Gateway's address"),
                "{accepted:?}"
            );
        }
        // Without an address per Gateway, the same objects conflict on the
        // alias and need their TCPEndpoint: today's shared model is intact.
        let shared = run(&World {
            own_addresses: false,
            ..world
        });
        assert!(shared.gateway.addresses.is_empty());
        assert!(!shared.refusals.is_empty());
    }

    #[test]
    fn with_own_addresses_a_gateway_that_is_not_accepted_gets_no_address() {
        let gateways = TWO_GATEWAYS;
        let bad = "
metadata: {name: bad, namespace: shop}
spec:
  gatewayClassName: tuna
  infrastructure: {parametersRef: {group: example.com, kind: Params, name: p}}
  listeners:
  - {name: pg, protocol: TCP, port: 5432}
";
        // GatewayStaticAddresses: an address type other than IPAddress is
        // not accepted; two IP addresses cannot be given (one per Gateway).
        let hostname = "
metadata: {name: hostname, namespace: shop}
spec:
  gatewayClassName: tuna
  addresses: [{type: test/fake-invalid-type, value: 'fake address'}, {value: 127.0.100.9}]
  listeners:
  - {name: http, protocol: HTTP, port: 8080}
---
metadata: {name: two, namespace: shop}
spec:
  gatewayClassName: tuna
  addresses: [{value: 127.0.101.1}, {type: IPAddress, value: 127.0.100.10}]
  listeners:
  - {name: http, protocol: HTTP, port: 8080}
";
        let p = run(&World {
            gateways: &format!("{gateways}\n---\n{bad}\n---\n{hostname}"),
            endpoints: "",
            own_addresses: true,
            ..World::default()
        });
        let address = |name| {
            p.gateway
                .addresses
                .get(&ObjectRef::new(Kind::Gateway, "shop", name))
        };
        assert!(address("edge").is_some());
        assert!(address("bad").is_none());
        assert!(address("hostname").is_none());
        let accepted = |name: &str| {
            let g = p
                .gateway
                .gateways
                .iter()
                .find(|g| g.object.name == name)
                .expect("gateway status");
            let c = g.conditions.iter().find(|c| c.type_ == "Accepted").unwrap();
            (c.status, c.reason.to_string())
        };
        assert_eq!(accepted("bad"), (false, "InvalidParameters".into()));
        assert_eq!(accepted("hostname"), (false, "UnsupportedAddress".into()));
        assert_eq!(accepted("two"), (true, "Accepted".into()));
        let two = address("two").expect("an address plan");
        assert_eq!(two.requested, None);
        assert_eq!(
            two.unusable.as_deref(),
            Some(
                "spec.addresses asks for 2 addresses (127.0.101.1, 127.0.100.10): a Gateway has one address here"
            )
        );
    }

    /// On a Gateway's own address, two TCPRoutes on one listener are both
    /// accepted and counted (the specification's conflict rule, as the
    /// conformance suite's `TCPRouteMultipleRoutesAttachment` reads it); the
    /// older gets the connections, the younger says why it gets none.
    #[test]
    fn with_own_addresses_a_younger_tcproute_attaches_but_the_oldest_is_served() {
        let world = World {
            gateways: TWO_GATEWAYS,
            routes: vec![
                route("older", "shop", "2026-01-03T00:00:00Z", "pg", DB),
                route(
                    "newer",
                    "shop",
                    "2026-01-04T00:00:00Z",
                    "pg",
                    "[{name: cache, port: 6379}]",
                ),
            ],
            endpoints: "",
            own_addresses: true,
            ..World::default()
        };
        let p = run(&world);
        let edge = &p.gateway.addresses[&ObjectRef::new(Kind::Gateway, "shop", "edge")];
        let served = &edge.tcp[&5432].backends;
        assert_eq!(served.len(), 1);
        assert_eq!(
            served[0].upstream.as_ref().unwrap().host,
            "10.0.0.1",
            "the older route's db"
        );
        for name in ["older", "newer"] {
            let accepted = cond(parent_conds(&p, name), "Accepted");
            assert!(accepted.status, "{name}: {accepted:?}");
        }
        assert!(
            cond(parent_conds(&p, "newer"), "Accepted")
                .message
                .contains("TCPRoute shop/older, which is older"),
        );
        let l = &p
            .gateway
            .gateways
            .iter()
            .find(|g| g.object.name == "edge")
            .unwrap()
            .listeners;
        let pg = l.iter().find(|l| l.name == "pg").unwrap();
        assert_eq!(pg.attached_routes, 2, "{pg:?}");
        let newer = tcp_route("shop", "newer");
        let refused: Vec<_> = p.refusals_of(&newer).collect();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(p.refusals_of(&tcp_route("shop", "older")).next().is_none());
        // On a shared TCP endpoint the younger is refused, as before.
        let shared = run(&World {
            own_addresses: false,
            gateways: GATEWAY,
            endpoints: World::default().endpoints,
            ..world
        });
        let accepted = cond(parent_conds(&shared, "newer"), "Accepted");
        assert!(
            !accepted.status && accepted.reason == "TcpEndpointInUse",
            "{accepted:?}"
        );
    }

    /// On a Gateway's own address, each HTTP listener is on its port with
    /// the specs of the routes attached to it, on the hostnames they serve
    /// through it, whether or not any host is reserved (HTTPS listeners:
    /// see the next test), and a TCP listener keeps its port.
    #[test]
    fn with_own_addresses_http_listeners_take_their_routes_to_their_port() {
        let gateway = "
metadata: {name: edge, namespace: shop}
spec:
  gatewayClassName: tuna
  listeners:
  - {name: any, protocol: HTTP, port: 80}
  - {name: bar, protocol: HTTP, port: 80, hostname: '*.bar.com'}
  - {name: alt, protocol: HTTP, port: 8080}
  - {name: secure, protocol: HTTPS, port: 443, hostname: secure.bar.com, tls: {certificateRefs: [{name: cert}]}}
  - {name: pg, protocol: TCP, port: 5432}
";
        let http_routes = "
metadata: {name: r1, namespace: shop, creationTimestamp: '2026-01-01T00:00:00Z'}
spec:
  parentRefs: [{name: edge, sectionName: bar}]
  hostnames: [foo.bar.com, other.org]
  rules: [{matches: [{path: {type: PathPrefix, value: /one}}], backendRefs: [{name: cache, port: 6379}]}]
---
metadata: {name: r2, namespace: shop, creationTimestamp: '2026-01-02T00:00:00Z'}
spec:
  parentRefs: [{name: edge, sectionName: any}]
  rules: [{backendRefs: [{name: cache, port: 6379}]}]
---
metadata: {name: r3, namespace: shop, creationTimestamp: '2026-01-03T00:00:00Z'}
spec:
  parentRefs: [{name: edge}]
  rules: [{matches: [{path: {type: PathPrefix, value: /three}}], backendRefs: [{name: cache, port: 6379}]}]
";
        let world = World {
            gateways: gateway,
            routes: vec![route("tcp", "shop", "2026-01-01T00:00:00Z", "pg", DB)],
            endpoints: "",
            http_routes,
            own_addresses: true,
            ..World::default()
        };
        let p = run(&world);
        let edge = &p.gateway.addresses[&ObjectRef::new(Kind::Gateway, "shop", "edge")];
        assert_eq!(edge.tcp.keys().collect::<Vec<_>>(), [&5432]);
        // Listener → [(route, hostname it serves through, path)].
        let on = |port: u16| {
            edge.http[&port]
                .iter()
                .map(|l| {
                    let specs: Vec<(String, Option<String>, String)> = l
                        .specs
                        .iter()
                        .map(|s| {
                            let tuna_routing::Matcher::Gateway(m) = &s.matcher else {
                                panic!("a Gateway spec");
                            };
                            (s.origin.name.clone(), m.hostname.clone(), s.path.clone())
                        })
                        .collect();
                    (l.name.clone(), l.hostname.clone(), specs)
                })
                .collect::<Vec<_>>()
        };
        let h = |s: &str| Some(s.to_owned());
        assert_eq!(edge.http.keys().collect::<Vec<_>>(), [&80, &8080]);
        assert_eq!(
            on(80),
            vec![
                (
                    "any".to_owned(),
                    None,
                    vec![
                        ("r2".to_owned(), None, "/".to_owned()),
                        ("r3".to_owned(), None, "/three".to_owned()),
                    ]
                ),
                (
                    "bar".to_owned(),
                    h("*.bar.com"),
                    vec![
                        // other.org does not meet the listener's hostname.
                        ("r1".to_owned(), h("foo.bar.com"), "/one".to_owned()),
                        ("r3".to_owned(), h("*.bar.com"), "/three".to_owned()),
                    ]
                ),
            ]
        );
        assert_eq!(
            on(8080),
            vec![(
                "alt".to_owned(),
                None,
                vec![("r3".to_owned(), None, "/three".to_owned())]
            )]
        );
        // Nothing of it is reserved on the shared ports: no host is served
        // there (the routes are refused HostNotReserved on them as before),
        // while the address serves them.
        assert!(p.hosts.is_empty(), "{:?}", p.hosts.keys());
        // Without an address per Gateway: no address, the shared model.
        let shared = run(&World {
            own_addresses: false,
            endpoints: "
metadata: {name: pg, namespace: shop}
spec: {alias: pg}
",
            ..world
        });
        assert!(shared.gateway.addresses.is_empty());
    }

    /// An HTTPS listener is on its Gateway's address, with the Secret of
    /// its first certificateRef, only when every ref resolves to a usable
    /// Secret the agent read; HTTP and HTTPS on one port conflict, and
    /// neither is served; a Gateway with only HTTPS listeners gets an
    /// address too.
    #[test]
    fn with_own_addresses_https_listeners_take_their_port_with_their_certificate() {
        let gateways = "
metadata: {name: edge, namespace: shop}
spec:
  gatewayClassName: tuna
  listeners:
  - {name: web, protocol: HTTP, port: 80}
  - {name: secure, protocol: HTTPS, port: 443, hostname: secure.bar.com, tls: {certificateRefs: [{name: cert}]}}
  - {name: foreign, protocol: HTTPS, port: 443, hostname: '*.bar.com', tls: {certificateRefs: [{name: cert, namespace: other}]}}
  - {name: broken, protocol: HTTPS, port: 443, hostname: broken.bar.com, tls: {certificateRefs: [{name: broken}]}}
  - {name: missing, protocol: HTTPS, port: 443, hostname: missing.bar.com, tls: {certificateRefs: [{name: nowhere}]}}
  - {name: alt, protocol: HTTPS, port: 8443, tls: {certificateRefs: [{name: cert}, {name: second}]}}
  - {name: clash, protocol: HTTPS, port: 9443, tls: {certificateRefs: [{name: cert}]}}
  - {name: plain, protocol: HTTP, port: 9443, hostname: plain.bar.com}
---
metadata: {name: tls-only, namespace: shop}
spec:
  gatewayClassName: tuna
  listeners:
  - {name: secure, protocol: HTTPS, port: 443, tls: {certificateRefs: [{name: cert}]}}
";
        let http_routes = "
metadata: {name: r1, namespace: shop, creationTimestamp: '2026-01-01T00:00:00Z'}
spec:
  parentRefs: [{name: edge}, {name: tls-only}]
  rules: [{backendRefs: [{name: cache, port: 6379}]}]
";
        let found = |namespace: &str, name: &str, problem: Option<&str>| CertificateSecret {
            namespace: namespace.into(),
            name: name.into(),
            problem: problem.map(str::to_owned),
        };
        let certificates = [
            found("shop", "cert", None),
            found("shop", "second", None),
            found("other", "cert", None),
            found("shop", "broken", Some("tls.key holds no PEM private key")),
        ];
        let world = World {
            gateways,
            endpoints: "",
            http_routes,
            own_addresses: true,
            certificates: Some(&certificates),
            ..World::default()
        };
        let p = run(&world);
        let address =
            |name: &str| &p.gateway.addresses[&ObjectRef::new(Kind::Gateway, "shop", name)];
        // Port → [(listener, its certificate's Secret)].
        let ports = |a: &AddressPlan| {
            a.http
                .iter()
                .map(|(port, ls)| {
                    let ls: Vec<_> = ls
                        .iter()
                        .map(|l| (l.name.clone(), l.certificate.clone()))
                        .collect();
                    (*port, ls)
                })
                .collect::<Vec<_>>()
        };
        let cert = |name: &str| Some(("shop".to_owned(), name.to_owned()));
        // `foreign` has no ReferenceGrant, `broken` an unusable Secret,
        // `missing` none at all, `clash` and `plain` share a port with two
        // protocols: none of them is on the address.
        assert_eq!(
            ports(address("edge")),
            vec![
                (80, vec![("web".to_owned(), None)]),
                (443, vec![("secure".to_owned(), cert("cert"))]),
                (8443, vec![("alt".to_owned(), cert("cert"))]),
            ]
        );
        assert_eq!(
            ports(address("tls-only")),
            vec![(443, vec![("secure".to_owned(), cert("cert"))])]
        );
        // The HTTPS listeners' routes are on their ports.
        assert_eq!(address("edge").http[&443][0].specs.len(), 1);
        // Where Secrets are not read (route explain), no HTTPS listener is
        // served on an address.
        let unread = run(&World {
            certificates: None,
            ..world
        });
        assert_eq!(
            unread.gateway.addresses[&ObjectRef::new(Kind::Gateway, "shop", "edge")]
                .http
                .keys()
                .collect::<Vec<_>>(),
            [&80]
        );
    }

    /// Tenants on a Gateway's own address: a listener's `allowedRoutes`
    /// decide which namespaces' routes it serves there, and a route of
    /// another namespace reaches only the listeners that admit it, on their
    /// hostnames alone.
    #[test]
    fn with_own_addresses_another_namespace_is_served_only_where_a_listener_admits_it() {
        let gateways = "
metadata: {name: edge, namespace: shop}
spec:
  gatewayClassName: tuna
  listeners:
  - {name: same, protocol: HTTP, port: 80, hostname: a.example}
  - {name: all, protocol: HTTP, port: 80, hostname: b.example, allowedRoutes: {namespaces: {from: All}}}
";
        let http_routes = "
metadata: {name: tenant, namespace: other, creationTimestamp: '2026-01-01T00:00:00Z'}
spec:
  parentRefs: [{name: edge, namespace: shop}]
  hostnames: [a.example, b.example]
  rules: [{backendRefs: [{name: cache, port: 6379}]}]
---
metadata: {name: pinned, namespace: other, creationTimestamp: '2026-01-02T00:00:00Z'}
spec:
  parentRefs: [{name: edge, namespace: shop, sectionName: same}]
  rules: [{backendRefs: [{name: cache, port: 6379}]}]
";
        let p = run(&World {
            gateways,
            endpoints: "",
            http_routes,
            own_addresses: true,
            ..World::default()
        });
        let edge = &p.gateway.addresses[&ObjectRef::new(Kind::Gateway, "shop", "edge")];
        let served: Vec<_> = edge.http[&80]
            .iter()
            .map(|l| {
                let specs: Vec<(String, Option<String>)> = l
                    .specs
                    .iter()
                    .map(|s| {
                        let tuna_routing::Matcher::Gateway(m) = &s.matcher else {
                            panic!("a Gateway spec");
                        };
                        (s.origin.name.clone(), m.hostname.clone())
                    })
                    .collect();
                (l.name.clone(), specs)
            })
            .collect();
        assert_eq!(
            served,
            vec![
                ("same".to_owned(), vec![]),
                (
                    "all".to_owned(),
                    vec![("tenant".to_owned(), Some("b.example".to_owned()))]
                ),
            ]
        );
        // The route naming the `Same` listener is refused, and says so.
        let conds = parent_conds(&p, "pinned");
        let accepted = conds.iter().find(|c| c.type_ == "Accepted").unwrap();
        assert_eq!(
            (accepted.status, accepted.reason.to_string()),
            (false, "NotAllowedByListeners".to_owned())
        );
    }

    /// On an edge with a pool, a GatewayClass annotated
    /// `k8s.tuna.am/addresses: shared` keeps its Gateways on the shared
    /// ports: no address, its TCP listeners on their TCPEndpoint alias. The
    /// other class's Gateways have addresses. A TCPRoute attached to one
    /// of each is served both ways, and an HTTPRoute of the shared one is
    /// served by its reserved host alone.
    #[test]
    fn with_own_addresses_a_class_may_ask_for_the_shared_ports() {
        let classes = "
metadata: {name: tuna}
spec: {controllerName: k8s.tuna.am/gateway-controller}
---
metadata: {name: tuna-shared, annotations: {k8s.tuna.am/addresses: shared}}
spec: {controllerName: k8s.tuna.am/gateway-controller}
";
        let gateways = "
metadata: {name: own, namespace: shop, creationTimestamp: '2026-01-01T00:00:00Z'}
spec:
  gatewayClassName: tuna
  listeners:
  - {name: pg, protocol: TCP, port: 5432}
  - {name: web, protocol: HTTP, port: 80}
---
metadata: {name: shared, namespace: shop, creationTimestamp: '2026-01-02T00:00:00Z'}
spec:
  gatewayClassName: tuna-shared
  listeners:
  - {name: pg, protocol: TCP, port: 5432}
  - {name: web, protocol: HTTP, port: 80}
  - {name: web-tls, protocol: HTTPS, port: 80, tls: {certificateRefs: [{name: cert}]}}
";
        let tcp = "
metadata: {name: both, namespace: shop, creationTimestamp: '2026-01-03T00:00:00Z'}
spec:
  parentRefs: [{name: own, sectionName: pg}, {name: shared, sectionName: pg}]
  rules: [{backendRefs: [{name: db, port: 5432}]}]
";
        let http_routes = "
metadata: {name: site, namespace: shop, creationTimestamp: '2026-01-01T00:00:00Z'}
spec:
  parentRefs: [{name: own, sectionName: web}, {name: shared, sectionName: web}]
  rules: [{backendRefs: [{name: cache, port: 6379}]}]
";
        let p = run(&World {
            classes,
            gateways,
            routes: vec![tcp.to_owned()],
            http_routes,
            own_addresses: true,
            ..World::default()
        });
        let gateway = |name| ObjectRef::new(Kind::Gateway, "shop", name);
        // Only the Gateway of the default class has an address.
        assert_eq!(
            p.gateway.addresses.keys().collect::<Vec<_>>(),
            [&gateway("own")]
        );
        let own = &p.gateway.addresses[&gateway("own")];
        assert_eq!(own.tcp.keys().collect::<Vec<_>>(), [&5432]);
        assert_eq!(own.http[&80][0].specs.len(), 1);
        // The shared class's listener is a TCP endpoint by its alias.
        let on_alias = &p.tcp[&tcp_route("shop", "both")];
        assert_eq!(on_alias.endpoint, PortOrAlias::parse("pg"));
        // HTTP and HTTPS on one port conflict only on an address: on the
        // shared ports they do not.
        let shared = p
            .gateway
            .gateways
            .iter()
            .find(|g| g.object.name == "shared")
            .unwrap();
        for l in &shared.listeners {
            let conflicted = l
                .conditions
                .iter()
                .find(|c| c.type_ == "Conflicted")
                .unwrap();
            assert!(!conflicted.status, "{l:?}");
        }
        // The classes say which model they have.
        let class = |name: &str| {
            let c = p.gateway.classes.iter().find(|c| c.name == name).unwrap();
            c.conditions[0].message.clone()
        };
        assert!(
            class("tuna").ends_with("each on an address of its own"),
            "{}",
            class("tuna")
        );
        assert!(
            class("tuna-shared").contains("shared ports"),
            "{}",
            class("tuna-shared")
        );
    }

    fn tcp_route(ns: &str, name: &str) -> ObjectRef {
        ObjectRef::new(Kind::TcpRoute, ns, name)
    }

    /// (listener) → (Accepted, reason, attachedRoutes, supportedKinds).
    fn listener<'a>(p: &'a Plan, name: &str) -> &'a super::super::gateway_model::ListenerStatus {
        p.gateway.gateways[0]
            .listeners
            .iter()
            .find(|l| l.name == name)
            .expect("listener")
    }

    /// The conditions of a route's first parent.
    fn parent_conds<'a>(p: &'a Plan, name: &str) -> &'a [Cond] {
        &p.gateway
            .routes
            .iter()
            .find(|r| r.object.name == name)
            .expect("route status")
            .parents[0]
            .conditions
    }

    fn cond<'a>(c: &'a [Cond], t: &str) -> &'a Cond {
        c.iter().find(|c| c.type_ == t).expect("condition")
    }

    const DB: &str = "[{name: db, port: 5432}]";

    /// A TCP listener serves the oldest TCPRoute on the alias its name gives;
    /// the younger is refused naming the winner; attachedRoutes counts one.
    #[test]
    fn the_oldest_tcproute_of_a_listener_is_published_on_its_alias() {
        let p = run(&World {
            routes: vec![
                route("young", "shop", "2026-02-01T00:00:00Z", "pg", DB),
                route("old", "shop", "2026-01-01T00:00:00Z", "pg", DB),
            ],
            ..World::default()
        });
        let published = &p.tcp[&tcp_route("shop", "old")];
        assert_eq!(published.endpoint, PortOrAlias::Alias("pg".into()));
        assert_eq!(published.upstream.scheme, UpstreamScheme::Tcp);
        assert_eq!(published.upstream.authority(), "10.0.0.1:5432");
        assert!(!p.tcp.contains_key(&tcp_route("shop", "young")));
        let young = cond(parent_conds(&p, "young"), "Accepted");
        assert_eq!(
            (young.status, young.reason.as_str()),
            (false, "TcpEndpointInUse")
        );
        assert!(young.message.contains("TCPRoute shop/old"), "{young:?}");
        assert!(cond(parent_conds(&p, "old"), "Accepted").status);
        let pg = listener(&p, "pg");
        assert_eq!(pg.supported_kinds, ["TCPRoute"]);
        assert_eq!(pg.attached_routes, 1);
        assert!(cond(&pg.conditions, "Accepted").status);
        assert_eq!(p.gateway.gateways[0].tcp_routes, [tcp_route("shop", "old")]);
        assert!(p.refusals.iter().any(
            |r| r.object == tcp_route("shop", "young") && r.reason == Reason::TcpEndpointInUse
        ));
    }

    /// The listener's reservation: a TCPEndpoint of the Gateway's namespace
    /// (required in standalone, else left to the edge), not a Tunnel's alias.
    #[test]
    fn a_tcp_listener_needs_its_reservation() {
        let cases: &[(&str, &str, &str, bool, Option<&str>)] = &[
            // (case, endpoints, tunnels, standalone, listener refusal)
            ("declared", World::default().endpoints, "", true, None),
            (
                "missing in standalone",
                "",
                "",
                true,
                Some("no TCPEndpoint with alias pg in namespace \"shop\""),
            ),
            ("missing in a cluster: the edge's", "", "", false, None),
            (
                "another namespace's",
                "metadata: {name: pg, namespace: blog}\nspec: {alias: pg}",
                "",
                false,
                Some("declared by TCPEndpoint blog/pg"),
            ),
            (
                "a tcp Tunnel's",
                World::default().endpoints,
                "metadata: {name: tun, namespace: shop}\nspec: {protocol: tcp, portOrAlias: pg, upstream: {url: 'tcp://db:5432'}}",
                true,
                Some("published by Tunnel shop/tun"),
            ),
        ];
        for (case, endpoints, tunnels, standalone, refusal) in cases {
            let p = run(&World {
                routes: vec![route("r", "shop", "2026-01-01T00:00:00Z", "pg", DB)],
                endpoints,
                tunnels,
                standalone: *standalone,
                ..World::default()
            });
            let pg = listener(&p, "pg");
            let accepted = cond(&pg.conditions, "Accepted");
            let route = cond(parent_conds(&p, "r"), "Accepted");
            match refusal {
                None => {
                    assert!(accepted.status, "{case}: {accepted:?}");
                    assert!(route.status, "{case}: {route:?}");
                    assert!(p.tcp.contains_key(&tcp_route("shop", "r")), "{case}");
                }
                Some(m) => {
                    assert_eq!(accepted.reason, "PortUnavailable", "{case}");
                    assert!(accepted.message.contains(m), "{case}: {accepted:?}");
                    assert!(!route.status, "{case}: {route:?}");
                    assert!(route.message.contains(m), "{case}: {route:?}");
                    assert!(!p.tcp.contains_key(&tcp_route("shop", "r")), "{case}");
                    assert_eq!(pg.attached_routes, 0, "{case}");
                }
            }
            if !tunnels.is_empty() {
                assert!(
                    p.tcp
                        .contains_key(&ObjectRef::new(Kind::Tunnel, "shop", "tun")),
                    "{case}: the Tunnel keeps its endpoint"
                );
            }
        }
    }

    /// Backends resolve as an HTTPRoute's, with a ReferenceGrant for
    /// TCPRoutes; the upstream is the first valid backend with weight > 0.
    #[test]
    fn tcp_backends_resolve_like_http_ones() {
        let grant = |kind: &str| {
            format!(
                "
metadata: {{name: g, namespace: infra}}
spec:
  from: [{{group: gateway.networking.k8s.io, kind: {kind}, namespace: web}}]
  to: [{{group: '', kind: Service}}]
"
            )
        };
        let shared = "[{name: shared, namespace: infra, port: 5432}]";
        let tcp_grant = grant("TCPRoute");
        let http_grant = grant("HTTPRoute");
        let cases: &[(&str, &str, &str, Result<&str, &str>)] = &[
            // (case, backendRefs, grants, upstream or ResolvedRefs reason)
            ("own namespace", DB, "", Ok("10.0.0.1:5432")),
            (
                "weight 0 skipped",
                "[{name: db, port: 5432, weight: 0}, {name: cache, port: 6379}]",
                "",
                Ok("10.0.0.2:6379"),
            ),
            (
                "weights are not split",
                "[{name: cache, port: 6379, weight: 1}, {name: db, port: 5432, weight: 99}]",
                "",
                Ok("10.0.0.2:6379"),
            ),
            (
                "an invalid backend before a valid one",
                "[{name: gone, port: 1}, {name: db, port: 5432}]",
                "",
                Ok("10.0.0.1:5432"),
            ),
            ("no grant", shared, "", Err("RefNotPermitted")),
            (
                "an HTTPRoute grant",
                shared,
                &http_grant,
                Err("RefNotPermitted"),
            ),
            ("a TCPRoute grant", shared, &tcp_grant, Ok("10.0.1.1:5432")),
            (
                "missing",
                "[{name: gone, port: 1}]",
                "",
                Err("BackendNotFound"),
            ),
            (
                "not a Service",
                "[{name: x, kind: Bucket, group: example.com, port: 1}]",
                "",
                Err("InvalidKind"),
            ),
        ];
        for (case, backends, grants, want) in cases {
            // Namespace `web` may attach to listener redis (from: All).
            let r = route("r", "web", "2026-01-01T00:00:00Z", "redis", backends);
            let r = if backends.contains("infra") {
                r
            } else {
                r.replace("namespace: web", "namespace: shop")
            };
            let p = run(&World {
                routes: vec![r],
                grants,
                ..World::default()
            });
            let ns = if backends.contains("infra") {
                "web"
            } else {
                "shop"
            };
            let published = p.tcp.get(&tcp_route(ns, "r"));
            let resolved = cond(parent_conds(&p, "r"), "ResolvedRefs");
            match want {
                Ok(authority) => {
                    assert_eq!(
                        published.map(|t| t.upstream.authority()).as_deref(),
                        Some(*authority),
                        "{case}"
                    );
                }
                Err(reason) => {
                    assert!(published.is_none(), "{case}");
                    assert_eq!(
                        (resolved.status, resolved.reason.as_str()),
                        (false, *reason),
                        "{case}"
                    );
                    assert!(
                        p.refusals
                            .iter()
                            .any(|x| x.object.name == "r" && x.reason.as_str() == *reason),
                        "{case}: {:?}",
                        p.refusals
                    );
                }
            }
        }
    }

    /// Kinds stay on their listeners: a TCPRoute does not attach to an HTTP
    /// listener, nor an HTTPRoute to a TCP one.
    #[test]
    fn kinds_stay_on_their_listeners() {
        let p = run(&World {
            routes: vec![route("r", "shop", "2026-01-01T00:00:00Z", "web", DB)],
            http_routes: "
metadata: {name: h, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: pg}]
  rules: [{backendRefs: [{name: db, port: 5432}]}]
",
            ..World::default()
        });
        for name in ["r", "h"] {
            let accepted = cond(parent_conds(&p, name), "Accepted");
            assert_eq!(
                (accepted.status, accepted.reason.as_str()),
                (false, "NotAllowedByListeners"),
                "{name}"
            );
        }
        assert!(p.tcp.is_empty());
        assert_eq!(listener(&p, "pg").attached_routes, 0);
        assert_eq!(listener(&p, "web").attached_routes, 0);
    }
    /// A Gateway that is not accepted (a parametersRef, which never resolves
    /// here) publishes no TCPRoute: the route is refused
    /// `GatewayNotAccepted` and the listener is not `Programmed`. Before,
    /// the route was published on the listener's alias.
    #[test]
    fn a_gateway_that_is_not_accepted_publishes_no_tcproute() {
        let gateways = GATEWAY.replace(
            "spec:\n",
            "spec:\n  infrastructure: {parametersRef: {group: invalid.io, kind: InvalidParameters, name: invalid}}\n",
        );
        let p = run(&World {
            gateways: &gateways,
            routes: vec![route("r", "shop", "2026-01-01T00:00:00Z", "pg", DB)],
            ..World::default()
        });
        assert!(p.tcp.is_empty(), "{:?}", p.tcp.keys());
        let accepted = cond(parent_conds(&p, "r"), "Accepted");
        assert_eq!(
            (accepted.status, accepted.reason.as_str()),
            (false, "GatewayNotAccepted")
        );
        assert_eq!(listener(&p, "pg").attached_routes, 0);
        assert!(!cond(&listener(&p, "pg").conditions, "Programmed").status);
    }
    /// A Gateway that is not accepted holds no alias either: a younger
    /// Gateway's listener on the same alias serves its TCPRoute. Before, the
    /// older Gateway's listener kept the alias (`TcpEndpointInUse`).
    #[test]
    fn a_gateway_that_is_not_accepted_holds_no_alias() {
        let gateways = "
metadata: {name: edge, namespace: shop, creationTimestamp: '2026-01-01T00:00:00Z'}
spec:
  gatewayClassName: tuna
  infrastructure: {parametersRef: {group: invalid.io, kind: InvalidParameters, name: invalid}}
  listeners: [{name: pg, protocol: TCP, port: 5432}]
---
metadata: {name: late, namespace: shop, creationTimestamp: '2026-02-01T00:00:00Z'}
spec:
  gatewayClassName: tuna
  listeners: [{name: pg, protocol: TCP, port: 5432}]
";
        let p = run(&World {
            gateways,
            routes: vec![
                "
metadata: {name: r, namespace: shop, creationTimestamp: '2026-03-01T00:00:00Z'}
spec:
  parentRefs: [{name: late, sectionName: pg}]
  rules: [{backendRefs: [{name: db, port: 5432}]}]
"
                .into(),
            ],
            ..World::default()
        });
        assert!(
            p.tcp.contains_key(&tcp_route("shop", "r")),
            "{:?}",
            p.refusals
        );
    }
}
