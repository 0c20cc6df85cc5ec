//! Gateway API objects → what the proxy core serves, and the status each
//! object shows. Pure, like the rest of the plan; built on the pieces of
//! [`super::gateway`] (hostnames, attachment, ReferenceGrant).
//!
//! - A **GatewayClass** is ours when its `controllerName` is
//!   [`tuna_crds::gateway::CONTROLLER_NAME`]; it is then `Accepted`.
//! - A **Gateway** of one of our classes is `Accepted`; each listener of
//!   protocol HTTP or HTTPS serves HTTPRoutes (TLS is the edge's: the
//!   listener's `tls` and `certificateRefs` are not used, and said so in its
//!   conditions), TCP serves one TCPRoute on the TCPEndpoint alias the
//!   listener's name gives ([`super::tcproute`]), TLS and UDP are
//!   `UnsupportedProtocol`.
//! - An **HTTPRoute** attaches through each parentRef naming such a Gateway
//!   ([`super::gateway::attach`]); each match of each rule becomes one route
//!   spec ([`tuna_routing::Matcher::Gateway`]) on every concrete host it
//!   serves: an exact hostname as is, a wildcard (or no hostname) on every
//!   host reserved for the route's namespace that it covers — a Domain of the
//!   namespace, or an account host. A host that is not reserved is reported
//!   (`HostNotReserved`) and not served.
//! - **Host ownership** holds across Ingress, Tunnel and HTTPRoute: a host
//!   belongs to one namespace (its Domain's, else its first claimant's, as
//!   [`super::ingress::ClaimKey`] orders claims). A host that a Tunnel or an
//!   Ingress publishes is theirs: HTTPRoutes naming it are refused
//!   (`HostUsedByTunnel`, `HostUsedByIngress`); one host is never served by
//!   two kinds at once.
//! - Backends resolve through [`super::gateway::resolve_backend`]; a rule
//!   without a valid backend answers 500.
//! - **Route volume** is bounded: a namespace has at most
//!   [`MAX_SPECS_PER_HOSTNAME`] specs on one hostname and
//!   [`MAX_SPECS_PER_NAMESPACE`] in all; a route that would go beyond is not
//!   accepted (`TooManyRoutes`), its older ones keep theirs ([`over_limits`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tuna_crds::gateway::httproutes::{
    HttpRouteParentRefs, HttpRouteRules, HttpRouteRulesFilters, HttpRouteRulesFiltersType,
    HttpRouteRulesMatches, HttpRouteRulesMatchesHeadersType, HttpRouteRulesMatchesPathType,
    HttpRouteRulesMatchesQueryParamsType,
};
use tuna_crds::gateway::{CONTROLLER_NAME, Gateway, HttpRoute, ReferenceGrant};
use tuna_routing::{GatewayMatch, Matcher, Origin, PathType, RouteSpec, TieBreak};

use super::claims::{Claim, Strength, tcp_key};
use super::gateway::{GatewayAction, attach, hostname_matches, refers_to};
use super::gateway_model::{
    AddressListener, ClassStatus, Cond, GatewayInputs, GatewayOutcome, GatewayStatus, HostContext,
    ListenerStatus, ParentStatus, RouteStatus, created, labels_of, resolved_refs,
};
use super::model::{Backend, Backends, HostRoute, Kind, ObjectRef, Reason};
use super::rule_action::{action_of, parse_duration};
use super::service::{ServiceLookup, UpstreamPolicy, UpstreamScheme};

/// The Gateway API v1.6.1 `SupportedFeatures` this implementation serves
/// (`pkg/features` names), sorted as `GatewayClass.status.supportedFeatures`
/// must be. docs/gateway-api.md has the table, with what is not supported and why.
///
/// Only what the conformance suite passes is claimed (issue 41): the suite
/// selects its tests by this list. See [`NEEDS_OWN_ADDRESSES`].
pub const SUPPORTED_FEATURES: &[&str] = &[
    "Gateway",
    "HTTPRoute",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendTimeout",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteSchemeRedirect",
    "ReferenceGrant",
    "TCPRoute",
];

/// Features that hold only where each Gateway has an address of its own
/// ([`supported_features`]), not on the edge's shared ports 80 and 443:
///
/// - `HTTPRouteParentRefPort` and `GatewayPort8080`: their tests dial a
///   listener's own port (8080, 8090) on the Gateway's address;
///   `GatewayPort8080`'s claim also selects `HTTPRouteRedirectPortAndScheme`,
///   which sends TLS to an HTTPS-only Gateway's address (HTTPS listeners are
///   terminated in the cluster there);
/// - `GatewayHTTPListenerIsolation` (a host goes to its most specific
///   listener alone: [`tuna_routing::PortTable`]) and
///   `GatewayHTTPSListenerDetectMisdirectedRequests` (a request for another
///   listener's host than the SNI's is 421): on the shared ports every
///   Gateway's listeners are one set;
/// - `GatewayStaticAddresses`: `spec.addresses` asks the edge's pool for one
///   IP address (`Programmed=False, AddressNotUsable` when it cannot be
///   given; other address types are `Accepted=False, UnsupportedAddress`).
pub const NEEDS_OWN_ADDRESSES: &[&str] = &[
    "GatewayHTTPListenerIsolation",
    "GatewayHTTPSListenerDetectMisdirectedRequests",
    "GatewayPort8080",
    "GatewayStaticAddresses",
    "HTTPRouteParentRefPort",
];

/// The `supportedFeatures` of our GatewayClasses, sorted: with an address
/// per Gateway ([`super::PlanOptions::gateway_addresses`]) also the features
/// that need them ([`NEEDS_OWN_ADDRESSES`]).
pub fn supported_features(own_addresses: bool) -> Vec<&'static str> {
    let mut features = SUPPORTED_FEATURES.to_vec();
    if own_addresses {
        features.extend(NEEDS_OWN_ADDRESSES);
        features.sort_unstable();
    }
    features
}

/// A route's claim on a host not yet settled against the other kinds.
#[derive(Debug, Clone)]
pub(crate) struct HostClaim {
    /// Whether the route names the host itself (else: a wildcard or no
    /// hostname covers it, and losing it is not an error).
    strength: Strength,
    /// The route's `creationTimestamp` (Unix seconds).
    created: i64,
}

/// Most route specs (one match of one rule, on one hostname) the HTTPRoutes
/// of one namespace may have on one hostname (as the routes name it: a
/// host, a wildcard, or none). One host's specs on one path are a list a
/// request walks until a match's conditions hold, so this bounds the work of
/// every request on the host (a few microseconds at most) as well as the
/// compile of its table; it is 8 routes of the CRD's maximum of 128
/// matches, far beyond hand-written hosts.
pub const MAX_SPECS_PER_HOSTNAME: usize = 1024;

/// Most route specs the HTTPRoutes of one namespace may have in all: bounds
/// what one tenant adds to every plan of the shared agent (each sync plans
/// every route) — 4 full hosts of [`MAX_SPECS_PER_HOSTNAME`].
pub const MAX_SPECS_PER_NAMESPACE: usize = 4096;

/// The HTTPRoutes beyond the volume limits, with the message of their
/// refusal (`TooManyRoutes`). Only routes with a parentRef to one of
/// `gateways` (ours) count; oldest first (then by name), so that a new route
/// never evicts an older one. A route counts as (its matches, at least one a
/// rule) × (its hostnames, at least one) specs, against its namespace's
/// budget and the budget of each of its hostnames in the namespace; one that
/// does not fit is refused whole and costs nothing, so a later, smaller one
/// may still fit.
pub(crate) fn over_limits(
    routes: &[Arc<HttpRoute>],
    gateways: &[&Arc<Gateway>],
) -> BTreeMap<ObjectRef, String> {
    let mut ordered: Vec<(i64, &str, &str, &Arc<HttpRoute>)> = routes
        .iter()
        .filter_map(|r| {
            let ns = r.metadata.namespace.as_deref().unwrap_or("default");
            let ours = r
                .spec
                .parent_refs
                .iter()
                .flatten()
                .any(|p| gateways.iter().any(|g| refers_to(p, ns, g)));
            ours.then(|| {
                (
                    created(&r.metadata),
                    ns,
                    r.metadata.name.as_deref().unwrap_or(""),
                    r,
                )
            })
        })
        .collect();
    ordered.sort_unstable_by(|a, b| (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)));
    let mut per_namespace: BTreeMap<&str, usize> = BTreeMap::new();
    let mut per_hostname: std::collections::HashMap<(&str, String), usize> =
        std::collections::HashMap::new();
    let mut out = BTreeMap::new();
    for (_, ns, _, route) in ordered {
        let matches: usize = route
            .spec
            .rules
            .iter()
            .flatten()
            .map(|rule| rule.matches.as_ref().map_or(1, |m| m.len().max(1)))
            .sum();
        let mut hostnames: Vec<String> = route
            .spec
            .hostnames
            .iter()
            .flatten()
            .map(|h| h.to_ascii_lowercase())
            .collect();
        if hostnames.is_empty() {
            hostnames.push("*".to_owned());
        }
        hostnames.sort_unstable();
        hostnames.dedup();
        let total = matches.saturating_mul(hostnames.len());
        let used = per_namespace.get(ns).copied().unwrap_or(0);
        let object = ObjectRef::of(Kind::HttpRoute, &route.metadata);
        if used.saturating_add(total) > MAX_SPECS_PER_NAMESPACE {
            out.insert(
                object,
                format!(
                    "namespace {ns:?} would have {} route specs (one per match and hostname) with this route's {total}; at most {MAX_SPECS_PER_NAMESPACE} are served: remove routes or matches",
                    used.saturating_add(total)
                ),
            );
            continue;
        }
        let full = hostnames.iter().find_map(|h| {
            let on = per_hostname
                .get(&(ns, h.clone()))
                .copied()
                .unwrap_or(0)
                .saturating_add(matches);
            (on > MAX_SPECS_PER_HOSTNAME).then_some((h, on))
        });
        if let Some((h, on)) = full {
            out.insert(
                object,
                format!(
                    "hostname {h} would have {on} route specs of namespace {ns:?} with this route's {matches}; at most {MAX_SPECS_PER_HOSTNAME} are served per hostname: merge matches or remove routes"
                ),
            );
            continue;
        }
        per_namespace.insert(ns, used + total);
        for h in hostnames {
            *per_hostname.entry((ns, h)).or_default() += matches;
        }
    }
    out
}

/// What is wrong with a rule that this proxy cannot honour, if anything.
fn unsupported(rule: &HttpRouteRules) -> Option<String> {
    for m in rule.matches.iter().flatten() {
        if let Some(p) = &m.path
            && p.r#type == Some(HttpRouteRulesMatchesPathType::RegularExpression)
        {
            return Some("path type RegularExpression is not supported".into());
        }
        if m.headers
            .iter()
            .flatten()
            .any(|h| h.r#type == Some(HttpRouteRulesMatchesHeadersType::RegularExpression))
        {
            return Some("header match type RegularExpression is not supported".into());
        }
        if m.query_params
            .iter()
            .flatten()
            .any(|q| q.r#type == Some(HttpRouteRulesMatchesQueryParamsType::RegularExpression))
        {
            return Some("query param match type RegularExpression is not supported".into());
        }
    }
    for f in rule.filters.iter().flatten() {
        match f.r#type {
            HttpRouteRulesFiltersType::RequestMirror => {
                return Some("filter RequestMirror is not supported".into());
            }
            HttpRouteRulesFiltersType::ExtensionRef => {
                return Some("filter ExtensionRef is not supported".into());
            }
            HttpRouteRulesFiltersType::Cors => {
                return Some("filter CORS is not supported".into());
            }
            _ => {}
        }
        if let Some(m) = protected_header_edit(f) {
            return Some(m);
        }
    }
    if rule
        .backend_refs
        .iter()
        .flatten()
        .any(|b| b.filters.as_ref().is_some_and(|f| !f.is_empty()))
    {
        return Some("backendRef filters are not supported".into());
    }
    if let Some(t) = &rule.timeouts {
        for d in [&t.request, &t.backend_request].into_iter().flatten() {
            if let Err(e) = parse_duration(d) {
                return Some(format!("timeouts: {e}"));
            }
        }
    }
    None
}

/// A header filter naming a header the proxy owns (framing, hop-by-hop,
/// `Host`, `X-Forwarded-*`, the request id: [`tuna_proxy::protected_header`])
/// is an unsupported value: the route could otherwise desynchronise the
/// upstream connection or forge the client's identity toward a backend.
fn protected_header_edit(f: &HttpRouteRulesFilters) -> Option<String> {
    let (kind, names): (&str, Vec<&str>) = match f.r#type {
        HttpRouteRulesFiltersType::RequestHeaderModifier => {
            let m = f.request_header_modifier.as_ref()?;
            let names = m.set.iter().flatten().map(|h| h.name.as_str());
            let added = m.add.iter().flatten().map(|h| h.name.as_str());
            let removed = m.remove.iter().flatten().map(String::as_str);
            (
                "RequestHeaderModifier",
                names.chain(added).chain(removed).collect(),
            )
        }
        HttpRouteRulesFiltersType::ResponseHeaderModifier => {
            let m = f.response_header_modifier.as_ref()?;
            let names = m.set.iter().flatten().map(|h| h.name.as_str());
            let added = m.add.iter().flatten().map(|h| h.name.as_str());
            let removed = m.remove.iter().flatten().map(String::as_str);
            (
                "ResponseHeaderModifier",
                names.chain(added).chain(removed).collect(),
            )
        }
        _ => return None,
    };
    let name = names
        .into_iter()
        .find(|n| tuna_proxy::protected_header(n))?;
    Some(format!(
        "filter {kind} may not change header {name:?}: the proxy sets framing, hop-by-hop, \
         Host, X-Forwarded-* and request-id headers itself (use URLRewrite for the host)"
    ))
}

/// The specs of one match, before a host is chosen.
fn match_spec(
    m: &HttpRouteRulesMatches,
    hostname: Option<&str>,
) -> (String, PathType, GatewayMatch) {
    let (path, path_type) = match &m.path {
        Some(p) => (
            p.value.clone().unwrap_or_else(|| "/".into()),
            match p.r#type {
                Some(HttpRouteRulesMatchesPathType::Exact) => PathType::Exact,
                _ => PathType::Prefix,
            },
        ),
        None => ("/".into(), PathType::Prefix),
    };
    let mut headers: Vec<(String, String)> = Vec::new();
    for h in m.headers.iter().flatten() {
        let name = h.name.to_ascii_lowercase();
        // Only the first entry of a name counts (the specification).
        if !headers.iter().any(|(n, _)| *n == name) {
            headers.push((name, h.value.clone()));
        }
    }
    let mut query: Vec<(String, String)> = Vec::new();
    for q in m.query_params.iter().flatten() {
        if !query.iter().any(|(n, _)| *n == q.name) {
            query.push((q.name.clone(), q.value.clone()));
        }
    }
    let method = m.method.as_ref().map(|m| {
        serde_json::to_value(m)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    });
    (
        path,
        path_type,
        GatewayMatch {
            hostname: hostname.filter(|h| *h != "*").map(str::to_owned),
            method,
            headers,
            query,
        },
    )
}

/// What the plan knows of hosts when Gateway API objects are first read.
pub(crate) struct PrepareContext<'a> {
    /// Host → namespace of the Domain reserving it.
    pub domains: &'a BTreeMap<String, String>,
    /// Hosts reserved on the account.
    pub account: &'a BTreeSet<String>,
    /// How backends resolve.
    pub backends: Backends,
    /// Upstream policy.
    pub policy: UpstreamPolicy,
    /// Which Gateways have an address of their own: the specs of each of
    /// their HTTP listeners are kept for it.
    pub addresses: &'a super::gateway_model::AddressModel,
}

/// A match of a route on a hostname pattern, before hosts are settled.
pub(crate) struct Candidate {
    pattern: String,
    spec: HostRoute,
    route: ObjectRef,
}

/// The Gateway API objects read, attached and expanded to the hosts they
/// claim, waiting for ownership to be settled over every kind
/// ([`super::claims`]) before [`finish`] gives them their hosts.
pub(crate) struct Prepared<'a> {
    inputs: GatewayInputs<'a>,
    out: GatewayOutcome,
    gateways: Vec<&'a Arc<Gateway>>,
    grants: Vec<&'a ReferenceGrant>,
    attached_count: BTreeMap<(usize, String), i32>,
    accepted_by: BTreeMap<(String, String), BTreeSet<usize>>,
    candidates: Vec<Candidate>,
    per_candidate: Vec<Vec<String>>,
    reported: BTreeSet<(ObjectRef, String)>,
    claims: BTreeMap<String, Vec<(HostClaim, ObjectRef)>>,
    /// (gateway index, listener name) → the specs of the routes attached
    /// to it, for the Gateway's own address (address mode only).
    on_listeners: BTreeMap<(usize, String), Vec<HostRoute>>,
}

impl Prepared<'_> {
    /// The claims of the routes on hosts (explicit hostnames, and the
    /// reserved hosts a wildcard or a missing hostname covers).
    pub(crate) fn host_claims(&self) -> Vec<Claim> {
        let mut out = Vec::new();
        for (host, list) in &self.claims {
            let mut seen = BTreeSet::new();
            for (claim, route) in list {
                if seen.insert((route, claim.strength)) {
                    out.push(Claim::new(
                        host.clone(),
                        route.namespace.clone(),
                        format!("HTTPRoute/{}", route.name),
                        claim.created,
                        claim.strength,
                    ));
                }
            }
        }
        out
    }

    /// The hosts the routes name or cover, with the route's namespace,
    /// reserved or not (see [`super::Plan::host_names`]).
    pub(crate) fn named_hosts(&self) -> Vec<(String, String)> {
        let explicit = self
            .candidates
            .iter()
            .filter(|c| !c.pattern.starts_with('*'))
            .map(|c| (c.pattern.clone(), c.route.namespace.clone()));
        let covered = self.claims.iter().flat_map(|(host, list)| {
            list.iter()
                .map(move |(_, route)| (host.clone(), route.namespace.clone()))
        });
        explicit.chain(covered).collect()
    }

    /// The claims of our Gateways' TCP listeners on the TCP endpoints their
    /// names give (by [`tcp_key`]: a listener named `30001` is port 30001).
    pub(crate) fn tcp_claims(&self) -> Vec<Claim> {
        self.gateways
            .iter()
            .flat_map(|g| {
                let ns = g
                    .metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into());
                let name = format!("Gateway/{}", g.metadata.name.as_deref().unwrap_or(""));
                let at = created(&g.metadata);
                g.spec
                    .listeners
                    .iter()
                    .filter(|l| l.protocol == "TCP")
                    .map(move |l| {
                        Claim::new(
                            tcp_key(&l.name),
                            ns.clone(),
                            name.clone(),
                            at,
                            Strength::Explicit,
                        )
                    })
            })
            .collect()
    }
}

/// Reads the Gateway API objects: classes, Gateways, attachment, and the
/// hosts each route's matches would serve (see [`Prepared`]).
pub(crate) fn prepare<'a>(
    inputs: &GatewayInputs<'a>,
    services: &dyn ServiceLookup,
    ctx: &PrepareContext<'_>,
) -> Prepared<'a> {
    let mut out = GatewayOutcome::default();
    // Classes.
    let mut ours: BTreeSet<&str> = BTreeSet::new();
    for c in inputs.classes {
        if c.spec.controller_name != CONTROLLER_NAME {
            continue;
        }
        let name = c.metadata.name.clone().unwrap_or_default();
        let model = if super::gateway_model::class_shares_ports(c) {
            " on the edge's shared ports (k8s.tuna.am/addresses: shared)"
        } else if ctx.addresses.own_for_class(&name) {
            ", each on an address of its own"
        } else {
            ""
        };
        out.classes.push(ClassStatus {
            name: name.clone(),
            generation: c.metadata.generation,
            conditions: vec![Cond::yes(
                "Accepted",
                "Accepted",
                format!("tuna-operator serves Gateways of this class through its tunnels{model}"),
            )],
        });
        ours.insert(c.metadata.name.as_deref().unwrap_or(""));
    }
    let all_gateways: &'a [Arc<Gateway>] = inputs.gateways;
    let gateways: Vec<&'a Arc<Gateway>> = all_gateways
        .iter()
        .filter(|g| ours.contains(g.spec.gateway_class_name.as_str()))
        .collect();
    let all_grants: &'a [Arc<ReferenceGrant>] = inputs.grants;
    let grants: Vec<&'a ReferenceGrant> = all_grants.iter().map(|g| &**g).collect();

    // (gateway index, listener name) → attached route count.
    let mut attached_count: BTreeMap<(usize, String), i32> = BTreeMap::new();
    // (route namespace, route name) → the gateways that accepted it: only
    // those list its hosts in their status.addresses.
    let mut accepted_by: BTreeMap<(String, String), BTreeSet<usize>> = BTreeMap::new();
    // Candidate specs by hostname pattern (`*` for none).
    let mut candidates: Vec<Candidate> = Vec::new();
    let mut on_listeners: BTreeMap<(usize, String), Vec<HostRoute>> = BTreeMap::new();
    let too_many = over_limits(inputs.http_routes, &gateways);

    for route in inputs.http_routes {
        let meta = &route.metadata;
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
        let object = ObjectRef::of(Kind::HttpRoute, meta);
        let hostnames: Vec<String> = route.spec.hostnames.clone().unwrap_or_default();
        let labels = labels_of(inputs.namespaces, &namespace);
        let rules = route.spec.rules.clone().unwrap_or_default();
        let problem = rules
            .iter()
            .enumerate()
            .find_map(|(i, r)| unsupported(r).map(|m| format!("rule {i}: {m}")));
        let actions: Vec<Arc<GatewayAction>> = rules
            .iter()
            .map(|r| {
                Arc::new(action_of(
                    r,
                    "HTTPRoute",
                    UpstreamScheme::Http,
                    &namespace,
                    &grants,
                    services,
                    ctx.backends,
                    ctx.policy,
                ))
            })
            .collect();
        let resolved = resolved_refs(actions.iter().map(|a| &**a));
        let mut parents = Vec::new();
        let mut served: BTreeSet<(String, Option<String>)> = BTreeSet::new();
        // (gateway index, listener, hostnames) of each listener it attached to.
        let mut attached_to: Vec<(usize, String, Vec<String>)> = Vec::new();
        for parent in route.spec.parent_refs.iter().flatten() {
            let Some((gi, gateway)) = gateways
                .iter()
                .enumerate()
                .find(|(_, g)| refers_to(parent, &namespace, g))
            else {
                continue;
            };
            let accepted = if let Some(problem) = &problem {
                Cond::no("Accepted", "UnsupportedValue", problem.clone())
            } else if let Some(limit) = too_many.get(&object) {
                Cond::no("Accepted", "TooManyRoutes", limit.clone())
            } else {
                match attach(
                    gateway,
                    parent,
                    "HTTPRoute",
                    &namespace,
                    &labels,
                    &hostnames,
                    ctx.addresses.own(gateway),
                ) {
                    Err(r) => Cond::no("Accepted", r.reason(), refusal_message(r, parent)),
                    Ok(listeners) => {
                        accepted_by
                            .entry((namespace.clone(), object.name.clone()))
                            .or_default()
                            .insert(gi);
                        for a in &listeners {
                            // A listener an HTTPRoute cannot use (TCP) never gets here:
                            // its kinds do not admit HTTPRoute.
                            *attached_count.entry((gi, a.listener.clone())).or_default() += 1;
                            for h in &a.hostnames {
                                served.insert((h.clone(), None));
                            }
                            attached_to.push((gi, a.listener.clone(), a.hostnames.clone()));
                        }
                        Cond::yes("Accepted", "Accepted", "accepted by the Gateway")
                    }
                }
            };
            parents.push(ParentStatus {
                parent_ref: parent.clone(),
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
        if problem.is_some() || too_many.contains_key(&object) {
            continue;
        }
        let specs_on = |pattern: &str| route_specs(&rules, &actions, pattern, &object, meta);
        for (pattern, _) in &served {
            candidates.extend(specs_on(pattern).into_iter().map(|spec| Candidate {
                pattern: pattern.clone(),
                spec,
                route: object.clone(),
            }));
        }
        {
            // On a Gateway's own address no host is reserved: every
            // hostname the route serves through the listener is its own.
            for (gi, listener, hostnames) in attached_to {
                if !ctx.addresses.own(gateways[gi]) {
                    continue;
                }
                let slot = on_listeners.entry((gi, listener)).or_default();
                for h in &hostnames {
                    slot.extend(specs_on(h).into_iter().map(|mut spec| {
                        spec.host = h.clone();
                        spec
                    }));
                }
            }
        }
    }

    // Hosts each candidate would serve, and the claims on them.
    let reserved: BTreeSet<&String> = ctx.domains.keys().chain(ctx.account.iter()).collect();
    let mut claims: BTreeMap<String, Vec<(HostClaim, ObjectRef)>> = BTreeMap::new();
    let mut per_candidate: Vec<Vec<String>> = Vec::with_capacity(candidates.len());
    let mut reported: BTreeSet<(ObjectRef, String)> = BTreeSet::new();
    for c in &candidates {
        let ns = &c.route.namespace;
        let mut hosts = Vec::new();
        if c.pattern.starts_with('*') {
            for h in &reserved {
                let available = ctx.domains.get(*h).is_none_or(|d| d == ns);
                if available && (c.pattern == "*" || hostname_matches(&c.pattern, h)) {
                    hosts.push((*h).clone());
                }
            }
            if hosts.is_empty()
                && c.pattern != "*"
                && reported.insert((c.route.clone(), c.pattern.clone()))
            {
                out.refused_hosts.push((
                    c.route.clone(),
                    c.pattern.clone(),
                    Reason::HostNotReserved,
                    format!(
                        "wildcard {} covers no host reserved for namespace {ns:?} (a Domain there, or an account domain): nothing published for it",
                        c.pattern
                    ),
                ));
            }
            if c.pattern == "*" {
                let mut spec = c.spec.clone();
                spec.host = "*".into();
                out.catch_all.push(spec);
            }
        } else if let Some(owner) = ctx.domains.get(&c.pattern)
            && owner != ns
        {
            if reported.insert((c.route.clone(), c.pattern.clone())) {
                out.refused_hosts.push((
                    c.route.clone(),
                    c.pattern.clone(),
                    Reason::HostOwnedByOtherNamespace,
                    format!(
                        "host {} is reserved by a Domain of namespace {owner:?}",
                        c.pattern
                    ),
                ));
            }
        } else if reserved.contains(&c.pattern) {
            hosts.push(c.pattern.clone());
        } else if reported.insert((c.route.clone(), c.pattern.clone())) {
            out.refused_hosts.push((
                c.route.clone(),
                c.pattern.clone(),
                Reason::HostNotReserved,
                format!(
                    "host {} is not reserved: add a Domain for it in namespace {ns:?} (or reserve it on the account)",
                    c.pattern
                ),
            ));
        }
        for h in &hosts {
            claims.entry(h.clone()).or_default().push((
                HostClaim {
                    strength: if c.pattern.starts_with('*') {
                        Strength::Covering
                    } else {
                        Strength::Explicit
                    },
                    created: c.spec.tie_break.created,
                },
                c.route.clone(),
            ));
        }
        per_candidate.push(hosts);
    }
    Prepared {
        inputs: *inputs,
        out,
        gateways,
        grants,
        attached_count,
        accepted_by,
        candidates,
        per_candidate,
        reported,
        claims,
        on_listeners,
    }
}

/// The specs of a route's rules on one hostname pattern (as the route
/// serves it through a listener; `*` for none): one per match of each rule
/// (a rule without matches has the default one, `PathPrefix /`). Their
/// `host` is left empty for the caller.
fn route_specs(
    rules: &[HttpRouteRules],
    actions: &[Arc<GatewayAction>],
    pattern: &str,
    object: &ObjectRef,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Vec<HostRoute> {
    let mut out = Vec::new();
    for (ri, rule) in rules.iter().enumerate() {
        let default_match = [HttpRouteRulesMatches::default()];
        let matches: &[HttpRouteRulesMatches] = match rule.matches.as_deref() {
            Some(m) if !m.is_empty() => m,
            _ => &default_match,
        };
        for (mi, m) in matches.iter().enumerate() {
            let (path, path_type, matcher) = match_spec(m, Some(pattern));
            out.push(RouteSpec {
                host: String::new(),
                path,
                path_type,
                backend: Backend {
                    service: None,
                    url: None,
                    upstream: None,
                    gateway: Some(Arc::clone(&actions[ri])),
                },
                origin: Origin {
                    namespace: object.namespace.clone(),
                    name: object.name.clone(),
                    rule: ri,
                    path: mi,
                },
                tie_break: TieBreak {
                    created: created(meta),
                    namespace: object.namespace.clone(),
                    name: object.name.clone(),
                },
                matcher: Matcher::Gateway(Arc::new(matcher)),
            });
        }
    }
    out
}

/// Gives the prepared routes the hosts their namespace holds (`ctx.owners`)
/// and no Tunnel or Ingress publishes, plans the TCPRoutes, and writes the
/// Gateway statuses.
pub(crate) fn finish(
    prepared: Prepared<'_>,
    services: &dyn ServiceLookup,
    ctx: &HostContext<'_>,
) -> GatewayOutcome {
    let Prepared {
        inputs,
        mut out,
        gateways,
        grants,
        mut attached_count,
        accepted_by,
        candidates,
        per_candidate,
        mut reported,
        claims,
        mut on_listeners,
    } = prepared;
    let inputs = &inputs;
    // The holder of each host was settled over every kind's claims: a
    // route gets a host its namespace holds, unless a Tunnel or an Ingress
    // of that namespace publishes it (kinds rank inside a namespace only).
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for (host, list) in &claims {
        let Some(holder) = ctx.owners.get(host) else {
            continue;
        };
        for (claim, route) in list {
            if claim.strength != Strength::Explicit
                || route.namespace == holder.namespace
                || !reported.insert((route.clone(), host.clone()))
            {
                continue;
            }
            out.refused_hosts.push((
                route.clone(),
                host.clone(),
                Reason::HostOwnedByOtherNamespace,
                format!(
                    "host {host} belongs to namespace {:?}, {}",
                    holder.namespace,
                    holder.why()
                ),
            ));
        }
        if let Some((object, reason)) = ctx.taken.get(host) {
            for (claim, route) in list {
                if claim.strength == Strength::Explicit
                    && route.namespace == holder.namespace
                    && reported.insert((route.clone(), host.clone()))
                {
                    out.refused_hosts.push((
                        route.clone(),
                        host.clone(),
                        *reason,
                        format!("host {host} is published by {object}"),
                    ));
                }
            }
            continue;
        }
        owner.insert(host.clone(), holder.namespace.clone());
    }
    // Specs per host: the best-ranked hostname per (route, rule, match).
    let mut by_host: BTreeMap<String, BTreeMap<SpecKey, HostRoute>> = BTreeMap::new();
    for (c, hosts) in candidates.iter().zip(&per_candidate) {
        for h in hosts {
            if owner.get(h) != Some(&c.route.namespace) {
                continue;
            }
            let mut spec = c.spec.clone();
            spec.host = h.clone();
            let key = (
                c.route.namespace.clone(),
                c.route.name.clone(),
                spec.origin.rule,
                spec.origin.path,
            );
            let slot = by_host.entry(h.clone()).or_default();
            let better = slot
                .get(&key)
                .is_none_or(|old| hostname_rank(&spec) > hostname_rank(old));
            if better {
                slot.insert(key, spec);
            }
        }
    }
    out.hosts = by_host
        .into_iter()
        .map(|(h, specs)| (h, specs.into_values().collect()))
        .collect();

    let tcp_listeners = super::tcproute::reserve_listeners(&gateways, ctx);
    super::tcproute::plan_tcp_routes(
        inputs,
        &gateways,
        &grants,
        services,
        ctx,
        &tcp_listeners,
        &mut attached_count,
        &mut out,
    );
    // A Gateway's own address: each HTTP and HTTPS listener on its port,
    // but a conflicted one (a port serves one protocol); an HTTPS listener
    // is served with the certificate the agent found usable, else not at
    // all.
    for (gi, g) in gateways.iter().enumerate() {
        let object = ObjectRef::of(Kind::Gateway, &g.metadata);
        let Some(address) = out.addresses.get_mut(&object) else {
            continue;
        };
        let gateway_ns = g.metadata.namespace.as_deref().unwrap_or("default");
        let conflicted = super::gateway::conflicts(g, true);
        for l in &g.spec.listeners {
            let Ok(port) = u16::try_from(l.port) else {
                continue;
            };
            if conflicted.contains_key(&l.name) {
                continue;
            }
            let certificate = match l.protocol.as_str() {
                "HTTP" => None,
                "HTTPS" => {
                    match super::gateway_status::listener_certificate(
                        l,
                        gateway_ns,
                        &grants,
                        inputs.certificates,
                    ) {
                        Some(secret) => Some(secret),
                        None => continue,
                    }
                }
                _ => continue,
            };
            address.http.entry(port).or_default().push(AddressListener {
                name: l.name.clone(),
                hostname: l.hostname.clone().filter(|h| !h.is_empty()),
                specs: on_listeners
                    .remove(&(gi, l.name.clone()))
                    .unwrap_or_default(),
                certificate,
            });
        }
    }

    // Gateway statuses.
    for (gi, g) in gateways.iter().enumerate() {
        let object = ObjectRef::of(Kind::Gateway, &g.metadata);
        let mut listeners = Vec::new();
        let own_address = ctx.addresses.own(g);
        let conflicted = super::gateway::conflicts(g, own_address);
        for l in &g.spec.listeners {
            let attached = attached_count
                .get(&(gi, l.name.clone()))
                .copied()
                .unwrap_or(0);
            let (kinds, conditions): (Vec<&'static str>, Vec<Cond>) = match l.protocol.as_str() {
                "HTTP" | "HTTPS" => {
                    let tls_note = match (l.protocol.as_str(), own_address) {
                        ("HTTPS", true) => {
                            " on the Gateway's address (TLS is terminated in the cluster with the listener's certificateRefs; on the edge's shared port 443 with the edge's own certificates)"
                        }
                        ("HTTPS", false) => {
                            " (TLS is terminated by the edge with its own certificates; the listener's tls and certificateRefs are not used)"
                        }
                        _ => "",
                    };
                    (
                        vec!["HTTPRoute"],
                        vec![
                            Cond::yes(
                                "Accepted",
                                "Accepted",
                                format!("serves HTTPRoutes through the edge{tls_note}"),
                            ),
                            Cond::yes("Programmed", "Programmed", "routes are in the proxy"),
                            Cond::yes("ResolvedRefs", "ResolvedRefs", "nothing to resolve"),
                            Cond::no("Conflicted", "NoConflicts", "no conflict"),
                        ],
                    )
                }
                "TCP" => (
                    vec!["TCPRoute"],
                    super::tcproute::listener_conditions(
                        &l.name,
                        own_address.then_some(l.port),
                        tcp_listeners.get(&(gi, l.name.clone())),
                    ),
                ),
                other => (
                    Vec::new(),
                    vec![
                        Cond::no(
                            "Accepted",
                            "UnsupportedProtocol",
                            format!("protocol {other} is not supported (HTTP, HTTPS and TCP are)"),
                        ),
                        Cond::no("Programmed", "Invalid", "the listener is not accepted"),
                        Cond::yes("ResolvedRefs", "ResolvedRefs", "nothing to resolve"),
                        Cond::no("Conflicted", "NoConflicts", "no conflict"),
                    ],
                ),
            };
            let mut conditions = conditions;
            let (kinds, kinds_problem) = if kinds.is_empty() {
                (kinds, None)
            } else {
                super::gateway_status::listener_kinds(l)
            };
            let gateway_ns = g.metadata.namespace.as_deref().unwrap_or("default");
            let problem = kinds_problem.map(|m| ("InvalidRouteKinds", m)).or_else(|| {
                (l.protocol == "HTTPS")
                    .then(|| {
                        super::gateway_status::certificate_problem(
                            l,
                            gateway_ns,
                            &grants,
                            inputs.certificates,
                        )
                    })
                    .flatten()
            });
            if let Some((reason, message)) = problem {
                super::gateway_status::unresolved(&mut conditions, reason, message);
            }
            if let Some((reason, message)) = conflicted.get(&l.name) {
                super::gateway_status::conflicted(&mut conditions, reason, message);
            }
            if super::gateway::not_accepted(g).is_some() {
                super::gateway_status::gateway_not_accepted(&mut conditions);
            }
            listeners.push(ListenerStatus {
                name: l.name.clone(),
                attached_routes: attached,
                supported_kinds: kinds,
                conditions,
            });
        }
        let gateway_ns = object.namespace.clone();
        let mut addresses: BTreeSet<String> = BTreeSet::new();
        // Only routes this Gateway accepted put their hosts here (G8); the
        // set is built once (a scan per spec was quadratic in a host's specs).
        for (host, specs) in &out.hosts {
            let through_this = specs.iter().any(|s| {
                accepted_by
                    .get(&(s.origin.namespace.clone(), s.origin.name.clone()))
                    .is_some_and(|gws| gws.contains(&gi))
            });
            if through_this {
                addresses.insert(host.clone());
            }
        }
        let _ = gateway_ns;
        let tcp_routes: Vec<ObjectRef> = g
            .spec
            .listeners
            .iter()
            .filter(|l| {
                l.protocol == "TCP"
                    && matches!(tcp_listeners.get(&(gi, l.name.clone())), Some(Ok(())))
            })
            .filter_map(|l| {
                let alias = super::tunnel::PortOrAlias::parse(&l.name);
                out.tcp
                    .iter()
                    .find(|(_, t)| t.endpoint == alias)
                    .map(|(o, _)| o.clone())
            })
            .collect();
        let conditions = super::gateway_status::gateway_conditions(g, &listeners);
        out.gateways.push(GatewayStatus {
            object,
            generation: g.metadata.generation,
            conditions,
            addresses: addresses.into_iter().collect(),
            tcp_routes,
            listeners,
        });
    }
    out
}

/// One match of one rule of one route: namespace, name, rule, match.
type SpecKey = (String, String, usize, usize);

/// (non-wildcard characters, characters) of the spec's route hostname.
fn hostname_rank(spec: &HostRoute) -> (usize, usize) {
    match &spec.matcher {
        Matcher::Gateway(m) => match m.hostname.as_deref() {
            Some(h) if h.starts_with("*.") => (0, h.len()),
            Some(h) => (h.len(), h.len()),
            None => (0, 0),
        },
        Matcher::Ingress => (spec.host.len(), spec.host.len()),
    }
}

fn refusal_message(r: super::gateway::RouteRefusal, parent: &HttpRouteParentRefs) -> String {
    use super::gateway::RouteRefusal as R;
    match r {
        R::NoMatchingParent => format!(
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
        R::NotAllowedByListeners => format!(
            "no listener of Gateway {} allows HTTPRoutes of this namespace (allowedRoutes)",
            parent.name
        ),
        R::NoMatchingListenerHostname => format!(
            "no listener hostname of Gateway {} intersects this route's hostnames",
            parent.name
        ),
        R::GatewayNotAccepted => super::gateway::not_accepted_message(&parent.name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::service::{ServiceIndex, ServiceInfo};
    use crate::plan::{Inputs, Plan, PlanOptions, Reason, plan};
    use k8s_openapi::api::networking::v1::Ingress;
    use std::time::Duration;
    use tuna_crds::gateway::GatewayClass;
    use tuna_routing::action::{Filter, HeaderModifier, PathModifier, Rewrite};

    fn objects<K: serde::de::DeserializeOwned>(yaml: &str) -> Vec<Arc<K>> {
        yaml.split("\n---\n")
            .filter(|d| !d.trim().is_empty())
            .map(|d| Arc::new(serde_saphyr::from_str::<K>(d).expect("test manifest")))
            .collect()
    }

    const SERVICES: &str = "
metadata: {name: web, namespace: shop}
spec: {clusterIP: 10.0.0.1, ports: [{name: http, port: 80}]}
---
metadata: {name: api, namespace: shop}
spec: {clusterIP: 10.0.0.2, ports: [{port: 8080}]}
---
metadata: {name: shared, namespace: infra}
spec: {clusterIP: 10.0.1.1, ports: [{port: 80}]}
";

    const CLASS: &str = "
metadata: {name: tuna}
spec: {controllerName: k8s.tuna.am/gateway-controller}
---
metadata: {name: other}
spec: {controllerName: example.com/other}
";

    const GATEWAY: &str = "
metadata: {name: edge, namespace: shop, generation: 3}
spec:
  gatewayClassName: tuna
  listeners:
  - {name: http, protocol: HTTP, port: 80}
  - {name: wild, protocol: HTTP, port: 8080, hostname: '*.example.com'}
  - {name: tls, protocol: TLS, port: 443}
  - {name: all, protocol: HTTP, port: 8000, allowedRoutes: {namespaces: {from: All}}}
";

    struct World {
        routes: &'static str,
        grants: &'static str,
        ingresses: &'static str,
        account: &'static [&'static str],
    }

    fn run(w: &World) -> Plan {
        run_full(GATEWAY, w, None)
    }

    fn run_with(w: &World, book: Option<&crate::plan::claims::ClaimBook>) -> Plan {
        run_full(GATEWAY, w, book)
    }

    fn run_with_gateways(gateways: &str, w: &World) -> Plan {
        run_full(gateways, w, None)
    }

    fn run_full(gateways: &str, w: &World, book: Option<&crate::plan::claims::ClaimBook>) -> Plan {
        let classes = objects::<GatewayClass>(CLASS);
        let gateways = objects::<Gateway>(gateways);
        let routes = objects::<HttpRoute>(w.routes);
        let grants = objects::<ReferenceGrant>(w.grants);
        let ingresses = objects::<Ingress>(w.ingresses);
        let services = ServiceIndex::new(
            objects::<k8s_openapi::api::core::v1::Service>(SERVICES)
                .iter()
                .map(|s| ServiceInfo::from_service(s)),
        );
        let mut options = PlanOptions::cluster("tuna.test");
        options.account_hosts = w.account.iter().map(|h| h.to_string()).collect();
        let inputs = Inputs {
            ingresses: &ingresses,
            gateway: GatewayInputs {
                classes: &classes,
                gateways: &gateways,
                http_routes: &routes,
                tcp_routes: &[],
                grants: &grants,
                namespaces: &[],
                certificates: None,
            },
            claims: book,
            ..Inputs::default()
        };
        plan(&inputs, &services, &options)
    }

    fn world(routes: &'static str) -> World {
        World {
            routes,
            grants: "",
            ingresses: "",
            account: &["shop.example.com", "a.example.com", "b.other.net"],
        }
    }

    fn parent<'a>(p: &'a Plan, name: &str) -> &'a [ParentStatus] {
        &p.gateway
            .routes
            .iter()
            .find(|r| r.object.name == name)
            .expect("route status")
            .parents
    }

    fn cond<'a>(c: &'a [Cond], t: &str) -> &'a Cond {
        c.iter().find(|c| c.type_ == t).expect("condition")
    }

    /// An HTTPRoute of `matches` header matches on `/` (values distinct, and
    /// of this route only), on
    /// `hostnames`, through `parent`, created at second `created`.
    fn bulky_route(
        name: &str,
        namespace: &str,
        parent: &str,
        hostnames: &[&str],
        matches: usize,
        created: usize,
    ) -> String {
        let matches: Vec<String> = (0..matches)
            .map(|i| {
                format!(
                    "{{path: {{type: PathPrefix, value: /}}, headers: [{{name: x, value: '{name}-{i}'}}]}}"
                )
            })
            .collect();
        format!(
            "metadata: {{name: {name}, namespace: {namespace}, creationTimestamp: '2026-01-01T00:{:02}:{:02}Z'}}\nspec:\n  parentRefs: [{parent}]\n  hostnames: [{}]\n  rules: [{{matches: [{}], backendRefs: [{{name: web, port: 80, namespace: shop}}]}}]\n",
            created / 60,
            created % 60,
            hostnames.join(", "),
            matches.join(", ")
        )
    }

    /// Issue 37 item 6: a namespace has at most 1 024 specs on one hostname
    /// and 4 096 in all; the younger routes beyond are not accepted
    /// (`TooManyRoutes`), the older ones and other namespaces are served,
    /// and routes naming no Gateway of ours do not count.
    #[test]
    fn route_volume_is_bounded_per_hostname_and_per_namespace() {
        let mut docs = Vec::new();
        // 9 routes × 128 matches on one host: the 9th is one too many.
        for i in 0..9 {
            docs.push(bulky_route(
                &format!("r{i}"),
                "shop",
                "{name: edge, sectionName: http}",
                &["shop.example.com"],
                128,
                i,
            ));
        }
        // Not ours (no such Gateway): counts for nothing.
        docs.push(bulky_route(
            "elsewhere",
            "shop",
            "{name: theirs}",
            &["shop.example.com"],
            128,
            0,
        ));
        // 2 × (128 × 16 hostnames) = 4 096 more would exceed the namespace's
        // budget (1 024 used): the first fits (3 072), the second does not.
        let sixteen: Vec<String> = (0..16).map(|i| format!("h{i}.example.com")).collect();
        let sixteen: Vec<&str> = sixteen.iter().map(String::as_str).collect();
        for (i, name) in ["wide0", "wide1"].into_iter().enumerate() {
            docs.push(bulky_route(
                name,
                "shop",
                "{name: edge, sectionName: http}",
                &sixteen,
                128,
                20 + i,
            ));
        }
        // Another namespace, on another account host: untouched.
        docs.push(bulky_route(
            "b",
            "infra",
            "{name: edge, namespace: shop, sectionName: all}",
            &["b.other.net"],
            1,
            30,
        ));
        let routes: &'static str = Box::leak(docs.join("---\n").into_boxed_str());
        let p = run(&world(routes));
        let accepted = |name: &str| {
            let parents = parent(&p, name);
            let c = cond(&parents[0].conditions, "Accepted");
            (c.status, c.reason.clone())
        };
        for i in 0..8 {
            assert_eq!(
                accepted(&format!("r{i}")),
                (true, "Accepted".to_owned()),
                "r{i}"
            );
        }
        assert_eq!(accepted("r8"), (false, "TooManyRoutes".to_owned()));
        assert!(
            cond(&parent(&p, "r8")[0].conditions, "Accepted")
                .message
                .contains("hostname shop.example.com"),
            "{:?}",
            parent(&p, "r8")
        );
        assert_eq!(p.hosts["shop.example.com"].routes.len(), 1024);
        assert_eq!(accepted("wide0"), (true, "Accepted".to_owned()));
        assert_eq!(accepted("wide1"), (false, "TooManyRoutes".to_owned()));
        assert!(
            cond(&parent(&p, "wide1")[0].conditions, "Accepted")
                .message
                .contains("namespace \"shop\""),
            "{:?}",
            parent(&p, "wide1")
        );
        assert_eq!(accepted("b"), (true, "Accepted".to_owned()));
        assert_eq!(p.hosts["b.other.net"].routes.len(), 1);
    }

    /// An exact hostname that is reserved is served; one that is not is
    /// reported and not served; the route is still Accepted (it attached).
    #[test]
    fn exact_hostnames_need_a_reservation() {
        let p = run(&world(
            "
metadata: {name: web, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: http}]
  hostnames: [shop.example.com, nowhere.example.com]
  rules: [{backendRefs: [{name: web, port: 80}]}]
",
        ));
        assert!(p.hosts.contains_key("shop.example.com"));
        assert!(!p.hosts.contains_key("nowhere.example.com"));
        assert!(
            p.refusals
                .iter()
                .any(|r| r.reason == Reason::HostNotReserved && r.message.contains("nowhere"))
        );
        let parents = parent(&p, "web");
        assert_eq!(parents.len(), 1);
        assert!(cond(&parents[0].conditions, "Accepted").status);
        assert!(cond(&parents[0].conditions, "ResolvedRefs").status);
        let spec = &p.hosts["shop.example.com"].routes[0];
        let action = spec.backend.gateway.as_ref().unwrap();
        assert_eq!(action.backends.len(), 1);
        assert_eq!(
            action.backends[0].upstream.as_ref().unwrap().host,
            "10.0.0.1"
        );
    }

    /// A wildcard listener serves the reserved hosts it covers (one or more
    /// labels), never others; the route without hostnames takes the
    /// listener's.
    #[test]
    fn a_wildcard_listener_serves_the_reserved_hosts_it_covers() {
        let p = run(&world(
            "
metadata: {name: web, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: wild}]
  rules: [{backendRefs: [{name: web, port: 80}]}]
",
        ));
        let hosts: Vec<&String> = p.hosts.keys().collect();
        assert_eq!(hosts, ["a.example.com", "shop.example.com"]);
        let gw = &p.gateway.gateways[0];
        assert_eq!(gw.addresses, ["a.example.com", "shop.example.com"]);
        let wild = gw.listeners.iter().find(|l| l.name == "wild").unwrap();
        assert_eq!(wild.attached_routes, 1);
        let http = gw.listeners.iter().find(|l| l.name == "http").unwrap();
        assert_eq!(http.attached_routes, 0);
        let tls = gw.listeners.iter().find(|l| l.name == "tls").unwrap();
        assert_eq!(
            cond(&tls.conditions, "Accepted").reason,
            "UnsupportedProtocol"
        );
    }

    /// Issue 37 item 7 (G8): a Gateway's `status.addresses` lists only the
    /// hosts of routes it accepted; a parentRef that Gateway refused (here
    /// another namespace's Gateway whose listener allows its own namespace
    /// only) writes nothing into its status.
    #[test]
    fn a_refused_parent_ref_adds_no_address_to_that_gateway() {
        let gateways = format!(
            "{GATEWAY}---
metadata: {{name: gw, namespace: team-b}}
spec:
  gatewayClassName: tuna
  listeners: [{{name: http, protocol: HTTP, port: 80}}]
"
        );
        let p = run_with_gateways(
            &gateways,
            &world(
                "
metadata: {name: r, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: http}, {name: gw, namespace: team-b}]
  hostnames: [a.example.com]
  rules: [{backendRefs: [{name: web, port: 80}]}]
",
            ),
        );
        assert!(p.hosts.contains_key("a.example.com"));
        let parents = parent(&p, "r");
        let refused = cond(&parents[1].conditions, "Accepted");
        assert_eq!(refused.reason, "NotAllowedByListeners");
        let status = |ns: &str| {
            p.gateway
                .gateways
                .iter()
                .find(|g| g.object.namespace == ns)
                .expect("gateway status")
        };
        assert_eq!(status("shop").addresses, ["a.example.com"]);
        assert!(
            status("team-b").addresses.is_empty(),
            "{:?}",
            status("team-b").addresses
        );
    }

    /// A Gateway that is not accepted (a parametersRef, which never resolves
    /// here) takes no route: the route is refused `GatewayNotAccepted`, its
    /// host is not served, and the Gateway's listeners are not `Programmed`.
    /// Before, the route was served as on any Gateway.
    #[test]
    fn a_gateway_that_is_not_accepted_serves_no_route() {
        let gateways = format!(
            "{GATEWAY}---
metadata: {{name: params, namespace: shop}}
spec:
  gatewayClassName: tuna
  infrastructure: {{parametersRef: {{group: invalid.io, kind: InvalidParameters, name: invalid}}}}
  listeners: [{{name: http, protocol: HTTP, port: 80}}]
"
        );
        let p = run_with_gateways(
            &gateways,
            &world(
                "
metadata: {name: r, namespace: shop}
spec:
  parentRefs: [{name: params}]
  hostnames: [a.example.com]
  rules: [{backendRefs: [{name: web, port: 80}]}]
",
            ),
        );
        assert!(
            !p.hosts.contains_key("a.example.com"),
            "{:?}",
            p.hosts.keys()
        );
        let accepted = cond(&parent(&p, "r")[0].conditions, "Accepted");
        assert_eq!(
            (accepted.status, accepted.reason.as_str()),
            (false, "GatewayNotAccepted")
        );
        let gateway = p
            .gateway
            .gateways
            .iter()
            .find(|g| g.object.name == "params")
            .expect("gateway status");
        assert_eq!(
            cond(&gateway.conditions, "Accepted").reason,
            "InvalidParameters"
        );
        assert!(gateway.addresses.is_empty(), "{:?}", gateway.addresses);
        for l in &gateway.listeners {
            assert_eq!(l.attached_routes, 0, "{}", l.name);
            assert!(!cond(&l.conditions, "Programmed").status, "{}", l.name);
        }
    }

    /// A cross-namespace backendRef needs a ReferenceGrant of the Service's
    /// namespace for HTTPRoutes of the route's namespace.
    #[test]
    fn cross_namespace_backends_need_a_reference_grant() {
        const ROUTE: &str = "
metadata: {name: web, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: http}]
  hostnames: [shop.example.com]
  rules: [{backendRefs: [{name: shared, namespace: infra, port: 80}]}]
";
        let refused = run(&world(ROUTE));
        let rr = cond(&parent(&refused, "web")[0].conditions, "ResolvedRefs").clone();
        assert!(!rr.status);
        assert_eq!(rr.reason, "RefNotPermitted");
        let action = refused.hosts["shop.example.com"].routes[0]
            .backend
            .gateway
            .clone()
            .unwrap();
        assert!(action.backends.is_empty());
        assert_eq!(action.invalid[0].reason, "RefNotPermitted");

        // A grant for another kind, or from another namespace, is not enough.
        for grant in [
            "
metadata: {name: g, namespace: infra}
spec:
  from: [{group: gateway.networking.k8s.io, kind: GRPCRoute, namespace: shop}]
  to: [{group: '', kind: Service}]
",
            "
metadata: {name: g, namespace: infra}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: blog}]
  to: [{group: '', kind: Service}]
",
            "
metadata: {name: g, namespace: infra}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: shop}]
  to: [{group: '', kind: Service, name: other}]
",
        ] {
            let p = run(&World {
                grants: grant,
                ..world(ROUTE)
            });
            assert!(
                !cond(&parent(&p, "web")[0].conditions, "ResolvedRefs").status,
                "{grant}"
            );
        }
        let allowed = run(&World {
            grants: "
metadata: {name: g, namespace: infra}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: shop}]
  to: [{group: '', kind: Service, name: shared}]
",
            ..world(ROUTE)
        });
        assert!(cond(&parent(&allowed, "web")[0].conditions, "ResolvedRefs").status);
        let action = allowed.hosts["shop.example.com"].routes[0]
            .backend
            .gateway
            .clone()
            .unwrap();
        assert_eq!(
            action.backends[0].upstream.as_ref().unwrap().host,
            "10.0.1.1"
        );
    }

    /// Missing Services and non-Service kinds are refused with their reasons.
    #[test]
    fn missing_and_foreign_backends_are_refused_with_their_reason() {
        let p = run(&world(
            "
metadata: {name: web, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: http}]
  hostnames: [shop.example.com]
  rules:
  - backendRefs: [{name: gone, port: 80}]
  - backendRefs: [{group: example.com, kind: Bucket, name: b}]
    matches: [{path: {type: PathPrefix, value: /b}}]
",
        ));
        let rr = cond(&parent(&p, "web")[0].conditions, "ResolvedRefs");
        assert_eq!(rr.reason, "BackendNotFound");
        let routes = &p.hosts["shop.example.com"].routes;
        let reasons: Vec<&str> = routes
            .iter()
            .map(|r| {
                r.backend.gateway.as_ref().unwrap().invalid[0]
                    .reason
                    .as_str()
            })
            .collect();
        assert!(reasons.contains(&"BackendNotFound") && reasons.contains(&"InvalidKind"));
    }

    /// Unsupported features refuse the route with UnsupportedValue and
    /// publish nothing of it.
    #[test]
    fn unsupported_features_refuse_the_route() {
        let p = run(&world(
            "
metadata: {name: web, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: http}]
  hostnames: [shop.example.com]
  rules:
  - matches: [{path: {type: RegularExpression, value: '/a.*'}}]
    backendRefs: [{name: web, port: 80}]
",
        ));
        let accepted = cond(&parent(&p, "web")[0].conditions, "Accepted");
        assert!(!accepted.status);
        assert_eq!(accepted.reason, "UnsupportedValue");
        assert!(p.hosts.is_empty());
    }

    /// Issue 37 item 7 (G10): a header filter on a header the proxy owns
    /// (framing, hop-by-hop, Host, X-Forwarded-*, the request id) makes the
    /// route Accepted=False, UnsupportedValue, and nothing of it is served;
    /// other names pass.
    #[test]
    fn header_filters_on_proxy_owned_headers_are_unsupported_values() {
        let route = |filter: &str| {
            format!(
                "
metadata: {{name: web, namespace: shop}}
spec:
  parentRefs: [{{name: edge, sectionName: http}}]
  hostnames: [shop.example.com]
  rules:
  - filters: [{filter}]
    backendRefs: [{{name: web, port: 80}}]
"
            )
        };
        let refused = [
            "{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: Transfer-Encoding, value: chunked}]}}",
            "{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: Host, value: evil}]}}",
            "{type: RequestHeaderModifier, requestHeaderModifier: {add: [{name: X-Forwarded-For, value: 10.0.0.1}]}}",
            "{type: RequestHeaderModifier, requestHeaderModifier: {remove: [x-request-id]}}",
            "{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: Proxy-Authorization, value: x}]}}",
            "{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: content-length, value: '0'}]}}",
            "{type: RequestHeaderModifier, requestHeaderModifier: {add: [{name: TE, value: trailers}]}}",
            "{type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: Connection, value: close}]}}",
            "{type: ResponseHeaderModifier, responseHeaderModifier: {remove: [Keep-Alive, Upgrade, Trailer]}}",
        ];
        for filter in refused {
            let yaml: &'static str = Box::leak(route(filter).into_boxed_str());
            let p = run(&world(yaml));
            let accepted = cond(&parent(&p, "web")[0].conditions, "Accepted");
            assert!(!accepted.status, "{filter}");
            assert_eq!(accepted.reason, "UnsupportedValue", "{filter}");
            assert!(p.hosts.is_empty(), "{filter}");
        }
        let fine = "{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-Custom, value: v}], remove: [X-Forwarded]}}";
        let yaml: &'static str = Box::leak(route(fine).into_boxed_str());
        let p = run(&world(yaml));
        assert!(cond(&parent(&p, "web")[0].conditions, "Accepted").status);
        assert!(p.hosts.contains_key("shop.example.com"));
    }

    /// Attachment failures carry the specification's reasons.
    #[test]
    fn attachment_failures_have_the_specifications_reasons() {
        let p = run(&world(
            "
metadata: {name: a, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: nope}]
---
metadata: {name: b, namespace: blog}
spec:
  parentRefs: [{name: edge, namespace: shop, sectionName: http}]
---
metadata: {name: c, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: wild}]
  hostnames: [b.other.net]
---
metadata: {name: d, namespace: shop}
spec:
  parentRefs: [{name: elsewhere}]
",
        ));
        let reason = |n| {
            cond(&parent(&p, n)[0].conditions, "Accepted")
                .reason
                .clone()
        };
        assert_eq!(reason("a"), "NoMatchingParent");
        assert_eq!(reason("b"), "NotAllowedByListeners");
        assert_eq!(reason("c"), "NoMatchingListenerHostname");
        // A parentRef to a Gateway that is not ours gets no entry from us.
        assert!(p.gateway.routes.iter().all(|r| r.object.name != "d"));
    }

    /// A host an Ingress publishes stays the Ingress's; the HTTPRoute naming it
    /// is told so.
    #[test]
    fn a_host_is_served_by_one_kind() {
        let p = run(&World {
            ingresses: "
metadata: {name: old, namespace: shop}
spec:
  ingressClassName: tuna
  rules:
  - host: shop.example.com
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
",
            ..world(
                "
metadata: {name: web, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: http}]
  hostnames: [shop.example.com]
  rules: [{backendRefs: [{name: api, port: 8080}]}]
",
            )
        });
        assert!(matches!(
            p.hosts["shop.example.com"].source,
            crate::plan::HostSource::Ingresses(_)
        ));
        assert!(
            p.refusals
                .iter()
                .any(|r| r.object.kind == Kind::HttpRoute && r.reason == Reason::HostUsedByIngress)
        );
    }

    /// Of two namespaces naming one account host, the first claimant (the
    /// older route) owns it, whatever the names.
    #[test]
    fn an_account_host_belongs_to_the_first_claimant_namespace() {
        const ROUTES: &str = "
metadata: {name: a-blog, namespace: blog, creationTimestamp: 'BLOG'}
spec:
  parentRefs: [{name: edge, namespace: shop, sectionName: all}]
  hostnames: [shop.example.com]
  rules: [{backendRefs: [{name: web, port: 80}]}]
---
metadata: {name: z-shop, namespace: shop, creationTimestamp: 'SHOP'}
spec:
  parentRefs: [{name: edge, sectionName: all}]
  hostnames: [shop.example.com]
  rules: [{backendRefs: [{name: web, port: 80}]}]
";
        for (blog, shop, owner) in [
            ("2026-02-01T00:00:00Z", "2026-01-01T00:00:00Z", "shop"),
            ("2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", "blog"),
        ] {
            let routes: &'static str = Box::leak(
                ROUTES
                    .replace("BLOG", blog)
                    .replace("SHOP", shop)
                    .into_boxed_str(),
            );
            let p = run(&world(routes));
            assert_eq!(p.hosts["shop.example.com"].namespace, owner);
            let loser = if owner == "shop" { "a-blog" } else { "z-shop" };
            assert!(
                p.refusals.iter().any(
                    |r| r.object.name == loser && r.reason == Reason::HostOwnedByOtherNamespace
                ),
                "{:?}",
                p.refusals
            );
        }
    }

    /// Issue 37, items 1 and 2: none of the ways a route of namespace
    /// `blog` used to take `shop.example.com` from `shop` moves it. Each
    /// row failed on the code before the one ownership settlement.
    #[test]
    fn no_route_or_ingress_of_another_namespace_moves_a_held_host() {
        use crate::plan::claims::ClaimBook;
        const H: &str = "shop.example.com";
        let shop_route = |created: &str| {
            format!(
                "
metadata: {{name: shop, namespace: shop, creationTimestamp: '{created}'}}
spec:
  parentRefs: [{{name: edge, sectionName: all}}]
  hostnames: [{H}]
  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]
"
            )
        };
        let blog_route = |created: &str, extra: &str, hostnames: &str| {
            format!(
                "
metadata: {{name: steal, namespace: blog, creationTimestamp: '{created}'{extra}}}
spec:
  parentRefs: [{{name: edge, namespace: shop, sectionName: all}}]
  {hostnames}
  rules: [{{backendRefs: [{{name: shared, namespace: infra, port: 80}}]}}]
"
            )
        };
        let forged = format!(
            ", annotations: {{k8s.tuna.am/hosts-claimed-at: '{{\"{H}\":\"2000-01-01T00:00:00Z\"}}'}}"
        );
        let (old, new) = ("2025-01-01T00:00:00Z", "2026-01-01T00:00:00Z");
        let mut shop_holds = ClaimBook::default();
        shop_holds
            .hosts
            .insert(H.into(), ClaimBook::held("shop", 1_767_300_000));
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        let mut blog_holds = ClaimBook::default();
        blog_holds
            .hosts
            .insert(H.into(), ClaimBook::held("blog", 1));
        let named = format!("hostnames: [{H}]");
        // (case, routes, ingresses, book)
        let cases: Vec<(&str, String, &str, Option<&ClaimBook>)> = vec![
            (
                "(a) a younger route with a forged record",
                format!("{}---{}", shop_route(old), blog_route(new, &forged, &named)),
                "",
                None,
            ),
            (
                "(b) an older route that adds the hostname later",
                format!("{}---{}", shop_route(new), blog_route(old, "", &named)),
                "",
                Some(&shop_holds),
            ),
            (
                "(c) an older route without hostnames",
                format!("{}---{}", shop_route(new), blog_route(old, "", "")),
                "",
                None,
            ),
            (
                "(c) and recorded for it before the explicit claim came",
                format!("{}---{}", shop_route(new), blog_route(old, "", "")),
                "",
                Some(&blog_holds),
            ),
            (
                "(2) a new Ingress of another namespace",
                shop_route(new),
                leak(format!(
                    "
metadata: {{name: steal, namespace: blog, creationTimestamp: '{old}'}}
spec:
  ingressClassName: tuna
  rules:
  - host: {H}
    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: shared, port: {{number: 80}}}}}}}}]}}
"
                )),
                Some(&shop_holds),
            ),
        ];
        for (case, routes, ingresses, book) in cases {
            let w = World {
                routes: leak(routes),
                ingresses,
                ..world("")
            };
            let p = run_with(&w, book);
            assert_eq!(p.owners[H].namespace, "shop", "{case}: {:?}", p.refusals);
            let host = p
                .hosts
                .get(H)
                .unwrap_or_else(|| panic!("{case}: {H} not served"));
            assert_eq!(host.namespace, "shop", "{case}");
            assert!(
                host.routes.iter().all(|r| r.origin.namespace == "shop"),
                "{case}"
            );
            let explicit = !routes_without_hostnames(case);
            if explicit {
                assert!(
                    p.refusals.iter().any(|r| r.object.namespace == "blog"
                        && r.reason.as_str() == "HostOwnedByOtherNamespace"),
                    "{case}: {:?}",
                    p.refusals
                );
            }
        }

        // (c) A route without hostnames still serves the account hosts
        // nobody names; it just never beats an explicit claim.
        let w = World {
            routes: leak(format!("{}---{}", shop_route(new), blog_route(old, "", ""))),
            ..world("")
        };
        let p = run_with(&w, None);
        assert_eq!(p.hosts["a.example.com"].namespace, "blog");

        // (d) shop's Ingress is briefly not serving (its Service is gone): it
        // still names the host, which stays shop's; blog's route is refused.
        let w = World {
            routes: leak(blog_route(old, "", &named)),
            ingresses: "
metadata: {name: site, namespace: shop, creationTimestamp: '2026-01-01T00:00:00Z'}
spec:
  ingressClassName: tuna
  rules:
  - host: shop.example.com
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: gone, port: {number: 80}}}}]}
",
            ..world("")
        };
        let p = run_with(&w, Some(&shop_holds));
        assert!(!p.hosts.contains_key(H), "{:?}", p.hosts[H]);
        assert!(
            p.refusals
                .iter()
                .any(|r| r.object.name == "steal"
                    && r.reason.as_str() == "HostOwnedByOtherNamespace"),
            "{:?}",
            p.refusals
        );
    }

    fn routes_without_hostnames(case: &str) -> bool {
        case.starts_with("(c)")
    }

    /// Filters and timeouts become plain data, in order.
    #[test]
    fn filters_and_timeouts_are_translated() {
        let p = run(&world(
            "
metadata: {name: web, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: http}]
  hostnames: [shop.example.com]
  rules:
  - backendRefs: [{name: web, port: 80, weight: 3}, {name: api, port: 8080, weight: 0}]
    timeouts: {request: 1m30s, backendRequest: 500ms}
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: X-A, value: '1'}], remove: [X-B]}
    - type: URLRewrite
      urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}
",
        ));
        let a = p.hosts["shop.example.com"].routes[0]
            .backend
            .gateway
            .clone()
            .unwrap();
        assert_eq!(a.backends.len(), 1, "weight 0 is not a backend");
        assert_eq!(a.backends[0].weight, 3);
        assert_eq!(a.timeouts.request, Some(Duration::from_secs(90)));
        assert_eq!(a.timeouts.backend_request, Some(Duration::from_millis(500)));
        assert_eq!(
            a.filters,
            vec![
                Filter::RequestHeaderModifier(HeaderModifier {
                    set: vec![("x-a".into(), "1".into())],
                    add: vec![],
                    remove: vec!["x-b".into()],
                }),
                Filter::UrlRewrite(Rewrite {
                    hostname: None,
                    path: Some(PathModifier::ReplacePrefixMatch("/v2".into())),
                }),
            ]
        );
    }

    /// `supportedFeatures` must be sorted and name only v1.6.1 features.
    #[test]
    fn supported_features_are_sorted_and_known() {
        let mut sorted = SUPPORTED_FEATURES.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted, SUPPORTED_FEATURES);
        let docs = include_str!("../../docs/gateway-api.md");
        for f in SUPPORTED_FEATURES {
            assert!(
                docs.contains(&format!("`{f}`")),
                "{f} is not in docs/gateway-api.md"
            );
        }
    }

    /// A claim selects the suite's tests for it: features whose tests dial
    /// listener ports are claimed only where listeners have their own ports
    /// (the first run of the suite, issue 41: `HTTPRouteListenerPortMatching`
    /// and `HTTPRouteRedirectPortAndScheme` dial 8080/8090 and failed on the
    /// shared ports).
    #[test]
    fn listener_port_features_are_claimed_only_with_own_addresses() {
        let shared = supported_features(false);
        let own = supported_features(true);
        for f in NEEDS_OWN_ADDRESSES {
            assert!(!shared.contains(f), "{f} claimed on shared ports");
            assert!(own.contains(f), "{f} not claimed with own addresses");
        }
        let mut sorted = own.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted, own);
        assert_eq!(
            own.len(),
            SUPPORTED_FEATURES.len() + NEEDS_OWN_ADDRESSES.len()
        );
    }

    #[test]
    fn durations_parse_as_gep_2257_says() {
        assert_eq!(parse_duration("1h"), Ok(Some(Duration::from_secs(3600))));
        assert_eq!(parse_duration("1m30s"), Ok(Some(Duration::from_secs(90))));
        assert_eq!(
            parse_duration("250ms"),
            Ok(Some(Duration::from_millis(250)))
        );
        assert_eq!(parse_duration("0s"), Ok(None));
        assert!(parse_duration("1.5s").is_err());
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("").is_err());
    }

    /// Each match becomes one spec carrying its conditions; no match is
    /// `PathPrefix /`.
    #[test]
    fn matches_carry_their_conditions() {
        let p = run(&world(
            "
metadata: {name: web, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: http}]
  hostnames: [Shop.Example.com]
  rules:
  - matches:
    - path: {type: Exact, value: /login}
      method: POST
      headers: [{name: X-Version, value: '2'}, {name: x-version, value: '3'}]
      queryParams: [{name: debug, value: '1'}]
    - {}
    backendRefs: [{name: web, port: 80}]
",
        ));
        let routes = &p.hosts["shop.example.com"].routes;
        assert_eq!(routes.len(), 2);
        let Matcher::Gateway(m) = &routes[0].matcher else {
            panic!("a gateway spec")
        };
        assert_eq!(
            (routes[0].path.as_str(), routes[0].path_type),
            ("/login", PathType::Exact)
        );
        assert_eq!(m.method.as_deref(), Some("POST"));
        assert_eq!(m.headers, vec![("x-version".to_owned(), "2".to_owned())]);
        assert_eq!(m.query, vec![("debug".to_owned(), "1".to_owned())]);
        assert_eq!(m.hostname.as_deref(), Some("shop.example.com"));
        assert_eq!(
            (routes[1].path.as_str(), routes[1].path_type),
            ("/", PathType::Prefix)
        );
    }
}
