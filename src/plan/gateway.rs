//! Gateway API semantics the plan needs before any route is built, pure and
//! exactly as the specification (`sigs.k8s.io/gateway-api` v1.6.1,
//! `apis/v1/httproute_types.go`) defines them:
//!
//! - [`hostname_matches`]: an exact hostname, or a `*.` wildcard that stands
//!   for one *or more* labels (`*.example.com` matches `a.example.com` and
//!   `a.b.example.com`, never `example.com`);
//! - [`intersect_hostnames`]: the hostnames a route serves on a listener —
//!   route hostnames that do not match the listener's are ignored, and none
//!   left means the route is not accepted there
//!   (`NoMatchingListenerHostname`);
//! - [`MatchRank`]: the precedence of every match of every route attached to
//!   a listener (the hostname's non-wildcard characters, then its characters,
//!   an `Exact` path, the longest `PathPrefix`, a method, the most header
//!   matches, the most query matches, the oldest route, `namespace/name`, the
//!   first rule and match), a total order whose sort does not depend on the
//!   order the routes arrive in;
//! - [`path_prefix_matches`]: `PathPrefix` is element-wise (`/foo` matches
//!   `/foo` and `/foo/bar`, not `/foobar`).
//!
//! - [`attach`]: which listeners of a Gateway a route attaches to through
//!   one parentRef (`sectionName`, `port`, `allowedRoutes` namespaces — `Same`
//!   by default, `All`, `Selector` — and kinds, then hostnames), or the
//!   specification's reason it does not (`NoMatchingParent`,
//!   `NotAllowedByListeners`, `NoMatchingListenerHostname`).
//!
//! - [`resolve_backend`]: a backendRef to a core Service, across namespaces
//!   only with a ReferenceGrant of the Service's namespace, or the reason it
//!   does not resolve (`InvalidKind`, `RefNotPermitted`, `BackendNotFound`).
//!
//! Filters, the translation into the proxy core's routes and route status
//! build on these (issue 31).

use std::cmp::{Ordering, Reverse};

/// Whether `host` (a concrete hostname, or itself a `*.` wildcard) is matched
/// by `pattern`. Case-insensitive (DNS names).
///
/// Allocation-free: it runs for every wildcard route against every reserved
/// host of a plan.
pub fn hostname_matches(pattern: &str, host: &str) -> bool {
    // Case-insensitive `ends_with` on bytes (ASCII case only, as DNS).
    fn ends_with(s: &str, suffix: &str) -> bool {
        s.len() >= suffix.len()
            && s.as_bytes()[s.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
    }
    match pattern.strip_prefix('*') {
        // `*.example.com` (suffix `.example.com`): one or more whole labels
        // before the suffix, or a wildcard at least as narrow.
        Some(suffix) => match host.strip_prefix('*') {
            Some(host_suffix) => ends_with(host_suffix, suffix),
            None => host.len() > suffix.len() && ends_with(host, suffix),
        },
        None => pattern.eq_ignore_ascii_case(host),
    }
}

/// The hostnames a route with `route` hostnames serves on a listener with
/// hostname `listener`, each the more specific of the two where both are
/// given; `None` when both give hostnames and none intersect (the route is
/// then not accepted on that listener). No hostname on either side is `*`.
pub fn intersect_hostnames(listener: Option<&str>, route: &[String]) -> Option<Vec<String>> {
    let listener = listener.filter(|l| !l.is_empty());
    if route.is_empty() {
        return Some(vec![listener.unwrap_or("*").to_ascii_lowercase()]);
    }
    let Some(listener) = listener else {
        return Some(route.iter().map(|h| h.to_ascii_lowercase()).collect());
    };
    let mut out: Vec<String> = Vec::new();
    for host in route {
        let served = if hostname_matches(listener, host) {
            // The route's is at least as specific.
            Some(host.to_ascii_lowercase())
        } else if hostname_matches(host, listener) {
            // A route wildcard covering the listener's hostname.
            Some(listener.to_ascii_lowercase())
        } else {
            None
        };
        if let Some(h) = served
            && !out.contains(&h)
        {
            out.push(h);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Whether request path `path` is matched by a `PathPrefix` of `prefix`,
/// element by element (a trailing `/` of the prefix is ignored).
pub fn path_prefix_matches(prefix: &str, path: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    if prefix.is_empty() {
        return path.starts_with('/');
    }
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The kind of path a match has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKind {
    /// `Exact`.
    Exact,
    /// `PathPrefix` (the default, `/`).
    Prefix,
}

/// What ranks one match of one rule of one route on one hostname. Sorting
/// ascending puts the match that wins first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatchRank {
    /// The hostname the route serves it on ([`intersect_hostnames`]).
    pub hostname: String,
    /// Path kind and value.
    pub path: (PathKind, String),
    /// The match names a method.
    pub method: bool,
    /// Header matches.
    pub headers: usize,
    /// Query parameter matches.
    pub query_params: usize,
    /// The route's `creationTimestamp`, seconds.
    pub created: i64,
    /// The route's namespace and name.
    pub route: (String, String),
    /// Rule index in the route, then match index in the rule.
    pub position: (usize, usize),
}

impl MatchRank {
    /// The tuple that orders ranks: larger counts first, older routes first.
    #[allow(clippy::type_complexity)]
    fn key(
        &self,
    ) -> (
        Reverse<usize>,
        Reverse<usize>,
        Reverse<bool>,
        Reverse<usize>,
        Reverse<bool>,
        Reverse<usize>,
        Reverse<usize>,
        i64,
        (&str, &str),
        (usize, usize),
    ) {
        let literal = self.hostname.trim_start_matches("*.");
        let non_wildcard = if self.hostname.starts_with("*.") {
            0
        } else {
            literal.len()
        };
        let (kind, value) = &self.path;
        (
            Reverse(non_wildcard),
            Reverse(self.hostname.len()),
            Reverse(*kind == PathKind::Exact),
            Reverse(if *kind == PathKind::Prefix {
                value.len()
            } else {
                0
            }),
            Reverse(self.method),
            Reverse(self.headers),
            Reverse(self.query_params),
            self.created,
            (self.route.0.as_str(), self.route.1.as_str()),
            self.position,
        )
    }
}

impl Ord for MatchRank {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

impl PartialOrd for MatchRank {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The Gateway API group.
pub const GROUP: &str = "gateway.networking.k8s.io";

/// Why a route is not accepted by a parent Gateway (the `Accepted=False`
/// reasons of the specification, `apis/v1/shared_types.go`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteRefusal {
    /// No listener has the `sectionName` and `port` the parentRef names.
    NoMatchingParent,
    /// No listener of those lets this route's namespace or kind attach.
    NotAllowedByListeners,
    /// No listener of those has a hostname that intersects the route's.
    NoMatchingListenerHostname,
    /// The Gateway itself is not accepted ([`not_accepted`]): nothing
    /// attaches to it. The specification lets a controller use a reason of
    /// its own here; none of its route reasons says this.
    GatewayNotAccepted,
}

impl RouteRefusal {
    /// The condition reason, as the specification spells it.
    pub fn reason(self) -> &'static str {
        match self {
            Self::NoMatchingParent => "NoMatchingParent",
            Self::NotAllowedByListeners => "NotAllowedByListeners",
            Self::NoMatchingListenerHostname => "NoMatchingListenerHostname",
            Self::GatewayNotAccepted => "GatewayNotAccepted",
        }
    }
}

/// A route attached to one listener: its name and the hostnames served there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attached {
    /// The listener's name.
    pub listener: String,
    /// [`intersect_hostnames`] of the listener and the route.
    pub hostnames: Vec<String>,
}

/// Whether `parent` (a parentRef of a route in `route_namespace`) names
/// `gateway` (group and kind default to the Gateway API's Gateway, the
/// namespace to the route's).
pub fn refers_to(
    parent: &tuna_crds::gateway::httproutes::HttpRouteParentRefs,
    route_namespace: &str,
    gateway: &tuna_crds::gateway::Gateway,
) -> bool {
    parent.group.as_deref().unwrap_or(GROUP) == GROUP
        && parent.kind.as_deref().unwrap_or("Gateway") == "Gateway"
        && Some(parent.name.as_str()) == gateway.metadata.name.as_deref()
        && parent.namespace.as_deref().unwrap_or(route_namespace)
            == gateway.metadata.namespace.as_deref().unwrap_or("default")
}

/// The route kinds a listener admits when `allowedRoutes.kinds` is empty:
/// those of its protocol.
fn default_kinds(protocol: &str) -> &'static [&'static str] {
    match protocol {
        "HTTP" | "HTTPS" => &["HTTPRoute", "GRPCRoute"],
        "TLS" => &["TLSRoute"],
        "TCP" => &["TCPRoute"],
        "UDP" => &["UDPRoute"],
        _ => &[],
    }
}

/// Whether a namespace with `labels` is selected by a label selector of
/// `allowedRoutes.namespaces.selector`.
fn selects(
    selector: &tuna_crds::gateway::gateways::GatewayListenersAllowedRoutesNamespacesSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            // An operator Kubernetes does not define selects nothing.
            _ => false,
        }
    });
    by_labels && by_expressions
}

/// Why `gateway` is not accepted whatever its listeners say, if it is not:
/// its status says `Accepted=False` with this (reason, message), and no
/// route attaches to it.
///
/// - `InvalidParameters`: a `spec.infrastructure.parametersRef`, which
///   never resolves here (this implementation defines no parameters kind);
/// - `UnsupportedAddress`: a `spec.addresses` entry of a type other than
///   `IPAddress` (`Hostname`, `NamedAddress` or an implementation's own):
///   the only addresses given here are the edge's IP addresses.
pub fn not_accepted(gateway: &tuna_crds::gateway::Gateway) -> Option<(&'static str, String)> {
    if let Some(p) = gateway
        .spec
        .infrastructure
        .as_ref()
        .and_then(|i| i.parameters_ref.as_ref())
    {
        return Some((
            "InvalidParameters",
            format!(
                "spec.infrastructure.parametersRef names {}/{} {:?}, which does not resolve: tuna-operator takes no parameters (remove the reference)",
                p.group, p.kind, p.name
            ),
        ));
    }
    let unsupported = gateway
        .spec
        .addresses
        .iter()
        .flatten()
        .find(|a| a.r#type.as_deref().is_some_and(|t| t != "IPAddress"))?;
    Some((
        "UnsupportedAddress",
        format!(
            "spec.addresses asks for {:?} of type {:?}: tuna-operator gives Gateways IP addresses only (type IPAddress)",
            unsupported.value.as_deref().unwrap_or_default(),
            unsupported.r#type.as_deref().unwrap_or_default()
        ),
    ))
}

/// The message of a route refused by a Gateway that is [`not_accepted`].
pub fn not_accepted_message(gateway: &str) -> String {
    format!(
        "Gateway {gateway} is not accepted (see its Accepted condition): no route attaches to it"
    )
}

/// The listeners of `gateway` that conflict (by name): (reason, message).
/// None of a conflicting set is served or takes a route, as the
/// specification says ("MUST NOT pick one conflicting Listener as the
/// winner"); the others are.
///
/// - `HostnameConflict`: HTTP or HTTPS listeners of one protocol with one
///   port and one hostname (case and a trailing dot aside; none is one
///   hostname too).
/// - `ProtocolConflict`, on a Gateway's own address (`own_addresses`)
///   only: listeners of different protocols on one port (HTTP, HTTPS and
///   TCP cannot share a port of an address). On the edge's shared ports a
///   listener's port is not opened, so its protocol conflicts with none.
pub fn conflicts(
    gateway: &tuna_crds::gateway::Gateway,
    own_addresses: bool,
) -> std::collections::BTreeMap<String, (&'static str, String)> {
    let listeners = &gateway.spec.listeners;
    let mut out = std::collections::BTreeMap::new();
    if own_addresses {
        let mut by_port: std::collections::BTreeMap<i32, std::collections::BTreeSet<&str>> =
            std::collections::BTreeMap::new();
        for l in listeners
            .iter()
            .filter(|l| matches!(l.protocol.as_str(), "HTTP" | "HTTPS" | "TCP"))
        {
            by_port.entry(l.port).or_default().insert(&l.protocol);
        }
        for l in listeners {
            if let Some(protocols) = by_port.get(&l.port).filter(|p| p.len() > 1)
                && protocols.contains(l.protocol.as_str())
            {
                let shown: Vec<&str> = protocols.iter().copied().collect();
                out.insert(
                    l.name.clone(),
                    (
                        "ProtocolConflict",
                        format!(
                            "port {} has listeners of protocols {}: one port of the Gateway's address serves one protocol, so none of them is served",
                            l.port,
                            shown.join(", ")
                        ),
                    ),
                );
            }
        }
    }
    let hostname = |l: &tuna_crds::gateway::gateways::GatewayListeners| {
        let h = l.hostname.as_deref().unwrap_or("");
        h.strip_suffix('.').unwrap_or(h).to_ascii_lowercase()
    };
    let mut by_key: std::collections::BTreeMap<(&str, i32, String), Vec<&str>> =
        std::collections::BTreeMap::new();
    for l in listeners
        .iter()
        .filter(|l| matches!(l.protocol.as_str(), "HTTP" | "HTTPS"))
    {
        by_key
            .entry((l.protocol.as_str(), l.port, hostname(l)))
            .or_default()
            .push(&l.name);
    }
    for ((protocol, port, host), names) in by_key.into_iter().filter(|(_, n)| n.len() > 1) {
        let shown = if host.is_empty() {
            "no hostname".to_owned()
        } else {
            format!("hostname {host}")
        };
        for name in &names {
            out.entry((*name).to_owned()).or_insert_with(|| {
                (
                    "HostnameConflict",
                    format!(
                        "listeners {} are all {protocol} on port {port} with {shown}: none of them is served (rename a hostname or change a port)",
                        names.join(", ")
                    ),
                )
            });
        }
    }
    out
}

/// Attaches a route of `kind` (`HTTPRoute`, `TCPRoute`) in namespace
/// `route_namespace` (with `namespace_labels`) and with `hostnames`, through
/// `parent` (already known to name `gateway`, see [`refers_to`]), to the
/// listeners of `gateway` it may attach to, as the specification decides:
/// the listeners the parentRef's `sectionName` and `port` name (none:
/// `NoMatchingParent`), of those the ones whose `allowedRoutes` admit the
/// route's namespace (`Same` by default, `All`, or `Selector`) and kind (the
/// listener protocol's kinds by default) (none: `NotAllowedByListeners`),
/// and of those the ones whose hostname intersects the route's (none:
/// `NoMatchingListenerHostname`). TCP routes have no hostnames. A Gateway
/// that is [`not_accepted`] takes no route (`GatewayNotAccepted`).
pub fn attach(
    gateway: &tuna_crds::gateway::Gateway,
    parent: &tuna_crds::gateway::httproutes::HttpRouteParentRefs,
    kind: &str,
    route_namespace: &str,
    namespace_labels: &std::collections::BTreeMap<String, String>,
    hostnames: &[String],
    own_addresses: bool,
) -> Result<Vec<Attached>, RouteRefusal> {
    use tuna_crds::gateway::gateways::GatewayListenersAllowedRoutesNamespacesFrom as From;
    if not_accepted(gateway).is_some() {
        return Err(RouteRefusal::GatewayNotAccepted);
    }
    let gateway_namespace = gateway.metadata.namespace.as_deref().unwrap_or("default");
    // A conflicted listener is not accepted: no route attaches to it.
    let conflicted = conflicts(gateway, own_addresses);
    let named: Vec<_> = gateway
        .spec
        .listeners
        .iter()
        .filter(|l| !conflicted.contains_key(&l.name))
        .filter(|l| parent.section_name.as_ref().is_none_or(|s| *s == l.name))
        .filter(|l| parent.port.is_none_or(|p| p == l.port))
        .collect();
    if named.is_empty() {
        return Err(RouteRefusal::NoMatchingParent);
    }
    let allowed: Vec<_> = named
        .into_iter()
        .filter(|l| {
            let allowed = l.allowed_routes.as_ref();
            let namespaces = allowed.and_then(|a| a.namespaces.as_ref());
            let namespace_ok = match namespaces.and_then(|n| n.from.as_ref()) {
                None | Some(From::Same) => route_namespace == gateway_namespace,
                Some(From::All) => true,
                Some(From::Selector) => namespaces
                    .and_then(|n| n.selector.as_ref())
                    .is_some_and(|s| selects(s, namespace_labels)),
            };
            let kind_ok = match allowed.and_then(|a| a.kinds.as_ref()) {
                Some(kinds) if !kinds.is_empty() => kinds
                    .iter()
                    .any(|k| k.group.as_deref().unwrap_or(GROUP) == GROUP && k.kind == kind),
                _ => default_kinds(&l.protocol).contains(&kind),
            };
            namespace_ok && kind_ok
        })
        .collect();
    if allowed.is_empty() {
        return Err(RouteRefusal::NotAllowedByListeners);
    }
    let attached: Vec<Attached> = allowed
        .into_iter()
        .filter_map(|l| {
            let hostnames = if kind == "HTTPRoute" {
                intersect_hostnames(l.hostname.as_deref(), hostnames)?
            } else {
                Vec::new()
            };
            Some(Attached {
                listener: l.name.clone(),
                hostnames,
            })
        })
        .collect();
    if attached.is_empty() {
        return Err(RouteRefusal::NoMatchingListenerHostname);
    }
    Ok(attached)
}

/// Why a backendRef does not resolve (the `ResolvedRefs=False` reasons of
/// the specification); its requests then answer 500.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefRefusal {
    /// Not a core `Service`.
    InvalidKind,
    /// A Service of another namespace that no ReferenceGrant there opens to
    /// this route's namespace and kind.
    RefNotPermitted,
    /// No such Service.
    BackendNotFound,
}

impl RefRefusal {
    /// The condition reason, as the specification spells it.
    pub fn reason(self) -> &'static str {
        match self {
            Self::InvalidKind => "InvalidKind",
            Self::RefNotPermitted => "RefNotPermitted",
            Self::BackendNotFound => "BackendNotFound",
        }
    }
}

/// Resolves a backendRef of a route of `route_kind` in `route_namespace` to
/// the Service `(namespace, name)` it names: only core Services are
/// backends (`InvalidKind`); a Service of another namespace needs a
/// ReferenceGrant in that namespace whose `from` names the route's kind and
/// namespace and whose `to` names Services (all, or this one by name)
/// (`RefNotPermitted`); `service_exists` says whether it exists
/// (`BackendNotFound`). The kind is checked first, then the grant, so that a
/// route cannot probe another namespace's Services.
pub fn resolve_backend<'a>(
    backend: &'a tuna_crds::gateway::httproutes::HttpRouteRulesBackendRefs,
    route_kind: &str,
    route_namespace: &'a str,
    grants: &[&tuna_crds::gateway::ReferenceGrant],
    service_exists: impl Fn(&str, &str) -> bool,
) -> Result<(&'a str, &'a str), RefRefusal> {
    if !backend.group.as_deref().unwrap_or("").is_empty()
        || backend.kind.as_deref().unwrap_or("Service") != "Service"
    {
        return Err(RefRefusal::InvalidKind);
    }
    let namespace = backend.namespace.as_deref().unwrap_or(route_namespace);
    let name = backend.name.as_str();
    if namespace != route_namespace {
        let granted = grants
            .iter()
            .filter(|g| g.metadata.namespace.as_deref() == Some(namespace))
            .any(|g| {
                g.spec.from.iter().any(|f| {
                    f.group == GROUP && f.kind == route_kind && f.namespace == route_namespace
                }) && g.spec.to.iter().any(|t| {
                    t.group.is_empty()
                        && t.kind == "Service"
                        && t.name.as_deref().is_none_or(|n| n == name)
                })
            });
        if !granted {
            return Err(RefRefusal::RefNotPermitted);
        }
    }
    // A name that cannot be a Service is not one (and is never read).
    if !super::service::is_service_name(name) || !service_exists(namespace, name) {
        return Err(RefRefusal::BackendNotFound);
    }
    Ok((namespace, name))
}

/// What a matched HTTPRoute rule does: forward to one of its valid
/// backends (chosen by weight), after its filters, within its timeouts — or
/// answer 500 when it has none (every backendRef refused, or all weights 0),
/// as the specification says.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct GatewayAction {
    /// The rule's backendRefs that resolve, with weight > 0.
    pub backends: Vec<WeightedBackend>,
    /// The rule's backendRefs that do not resolve, and why.
    pub invalid: Vec<InvalidBackend>,
    /// The rule's filters, in order.
    pub filters: Vec<tuna_routing::action::Filter>,
    /// The rule's timeouts.
    pub timeouts: tuna_routing::action::Timeouts,
}

/// A backendRef that resolves.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WeightedBackend {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub service: String,
    /// The port as the backendRef gives it.
    pub port: Option<i32>,
    /// Its weight (1 when omitted), > 0.
    pub weight: u32,
    /// What the proxy dials; `None` only when Services are not checked
    /// (`route explain` on files without Services).
    pub upstream: Option<crate::plan::service::ResolvedUpstream>,
}

/// A backendRef that does not resolve.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InvalidBackend {
    /// The namespace it names (the route's when omitted).
    pub namespace: String,
    /// The name it names.
    pub name: String,
    /// `group/kind` as given (`Service` for core).
    pub kind: String,
    /// The port as given.
    pub port: Option<i32>,
    /// Its weight (1 when omitted): its share of requests answers 500.
    pub weight: u32,
    /// `InvalidKind`, `RefNotPermitted`, `BackendNotFound`, or a Service
    /// problem (no such port, …).
    pub reason: String,
    /// What is wrong and what to do.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(h: &[&str]) -> Vec<String> {
        h.iter().map(|s| s.to_string()).collect()
    }

    /// The specification's own examples (`HTTPRouteSpec.Hostnames`).
    #[test]
    fn hostnames_match_and_intersect_as_the_specification_says() {
        assert!(hostname_matches("*.example.com", "test.example.com"));
        assert!(hostname_matches("*.example.com", "foo.test.example.com"));
        assert!(hostname_matches("*.example.com", "*.test.example.com"));
        assert!(hostname_matches("*.example.com", "*.example.com"));
        assert!(!hostname_matches("*.example.com", "example.com"));
        assert!(!hostname_matches("*.example.com", "test.example.net"));
        assert!(!hostname_matches("*.example.com", "testexample.com"));
        assert!(hostname_matches("Test.Example.com", "test.example.COM"));
        assert!(!hostname_matches("test.example.com", "*.example.com"));

        // A listener `test.example.com`: routes with no hostnames, with
        // `test.example.com` or with `*.example.com`.
        let l = Some("test.example.com");
        assert_eq!(
            intersect_hostnames(l, &[]),
            Some(hosts(&["test.example.com"]))
        );
        assert_eq!(
            intersect_hostnames(l, &hosts(&["*.example.com"])),
            Some(hosts(&["test.example.com"]))
        );
        assert_eq!(intersect_hostnames(l, &hosts(&["other.example.com"])), None);
        // A listener `*.example.com`: the route's matching hostnames; the
        // others are ignored; none left, not accepted.
        let l = Some("*.example.com");
        assert_eq!(
            intersect_hostnames(l, &hosts(&["test.example.com", "test.example.net"])),
            Some(hosts(&["test.example.com"]))
        );
        assert_eq!(
            intersect_hostnames(l, &hosts(&["*.example.com", "foo.test.example.com"])),
            Some(hosts(&["*.example.com", "foo.test.example.com"]))
        );
        assert_eq!(
            intersect_hostnames(l, &hosts(&["example.com", "test.example.net"])),
            None
        );
        // No listener hostname: the route's; neither: any.
        assert_eq!(
            intersect_hostnames(None, &hosts(&["A.example.com"])),
            Some(hosts(&["a.example.com"]))
        );
        assert_eq!(intersect_hostnames(None, &[]), Some(hosts(&["*"])));
    }

    #[test]
    fn path_prefixes_match_whole_elements() {
        assert!(path_prefix_matches("/foo", "/foo"));
        assert!(path_prefix_matches("/foo", "/foo/bar"));
        assert!(path_prefix_matches("/foo/", "/foo"));
        assert!(path_prefix_matches("/foo/", "/foo/bar"));
        assert!(!path_prefix_matches("/foo", "/foobar"));
        assert!(path_prefix_matches("/", "/anything"));
    }

    fn rank(host: &str, path: (PathKind, &str), created: i64, name: &str) -> MatchRank {
        MatchRank {
            hostname: host.into(),
            path: (path.0, path.1.into()),
            method: false,
            headers: 0,
            query_params: 0,
            created,
            route: ("ns".into(), name.into()),
            position: (0, 0),
        }
    }

    /// Every criterion of the specification, each deciding between two
    /// matches equal on the criteria before it; listed winner first.
    fn ladder() -> Vec<MatchRank> {
        let base = |host: &str| rank(host, (PathKind::Prefix, "/"), 100, "r");
        let mut v = vec![
            base("shop.example.com"),
            // Fewer non-wildcard characters.
            base("*.shop.example.com"),
            base("*.example.com"),
        ];
        let with = |f: &dyn Fn(&mut MatchRank)| {
            let mut r = base("*.e.com");
            f(&mut r);
            r
        };
        v.extend([
            with(&|r| r.path = (PathKind::Exact, "/a".into())),
            with(&|r| r.path = (PathKind::Prefix, "/longer".into())),
            with(&|r| r.path = (PathKind::Prefix, "/abc".into())),
            with(&|r| {
                r.path = (PathKind::Prefix, "/ab".into());
                r.method = true;
            }),
            with(&|r| {
                r.path = (PathKind::Prefix, "/ab".into());
                r.headers = 2;
            }),
            with(&|r| {
                r.path = (PathKind::Prefix, "/ab".into());
                r.headers = 1;
                r.query_params = 3;
            }),
            with(&|r| {
                r.path = (PathKind::Prefix, "/ab".into());
                r.headers = 1;
                r.query_params = 1;
                r.created = 50;
            }),
            with(&|r| {
                r.path = (PathKind::Prefix, "/ab".into());
                r.headers = 1;
                r.query_params = 1;
                r.route.1 = "a".into();
            }),
            with(&|r| {
                r.path = (PathKind::Prefix, "/ab".into());
                r.headers = 1;
                r.query_params = 1;
                r.route.1 = "b".into();
            }),
            with(&|r| {
                r.path = (PathKind::Prefix, "/ab".into());
                r.headers = 1;
                r.query_params = 1;
                r.route.1 = "b".into();
                r.position = (1, 0);
            }),
        ]);
        v
    }

    #[test]
    fn precedence_follows_the_specification_criterion_by_criterion() {
        let ladder = ladder();
        for pair in ladder.windows(2) {
            assert!(pair[0] < pair[1], "{:?}\nbefore\n{:?}", pair[0], pair[1]);
        }
    }

    /// The order does not depend on the order the routes arrive in: every
    /// rotation and reversal of the ladder sorts back into it.
    #[test]
    fn precedence_does_not_depend_on_arrival_order() {
        let ladder = ladder();
        for k in 0..ladder.len() {
            for reversed in [false, true] {
                let mut shuffled = ladder.clone();
                shuffled.rotate_left(k);
                if reversed {
                    shuffled.reverse();
                }
                shuffled.sort();
                assert_eq!(shuffled, ladder, "rotation {k}, reversed {reversed}");
            }
        }
    }

    fn gateway(yaml: &str) -> tuna_crds::gateway::Gateway {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn parent(yaml: &str) -> tuna_crds::gateway::httproutes::HttpRouteParentRefs {
        serde_saphyr::from_str(yaml).unwrap()
    }

    const GATEWAY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: tuna, namespace: infra}
spec:
  gatewayClassName: tuna
  listeners:
  - {name: shop, protocol: HTTP, port: 80, hostname: "*.shop.example.com",
     allowedRoutes: {namespaces: {from: Selector, selector: {matchLabels: {team: shop}}}}}
  - {name: any, protocol: HTTP, port: 8080, allowedRoutes: {namespaces: {from: All}}}
  - {name: local, protocol: HTTP, port: 8081}
  - {name: db, protocol: TCP, port: 5432, allowedRoutes: {namespaces: {from: All}}}
  - {name: only-tcp, protocol: HTTP, port: 8082,
     allowedRoutes: {namespaces: {from: All}, kinds: [{kind: TCPRoute}]}}
"#;

    /// Attachment and its refusals as the specification words them: the
    /// listeners a parentRef names, those that admit the route's namespace
    /// and kind, and those whose hostname meets the route's.
    #[test]
    fn routes_attach_to_the_listeners_the_specification_allows() {
        use std::collections::BTreeMap;
        let gw = gateway(GATEWAY);
        let shop_labels = BTreeMap::from([("team".to_owned(), "shop".to_owned())]);
        let none = BTreeMap::new();
        let http = |p: &str, ns: &str, labels: &BTreeMap<String, String>, h: &[&str]| {
            attach(&gw, &parent(p), "HTTPRoute", ns, labels, &hosts(h), false)
        };
        assert!(refers_to(
            &parent("{name: tuna, namespace: infra}"),
            "shop",
            &gw
        ));
        assert!(refers_to(&parent("{name: tuna}"), "infra", &gw));
        assert!(!refers_to(&parent("{name: tuna}"), "shop", &gw));
        assert!(!refers_to(
            &parent("{name: tuna, namespace: infra, kind: Service, group: ''}"),
            "shop",
            &gw
        ));

        // By section: the Selector listener admits a labelled namespace, and
        // serves the intersected hostnames.
        assert_eq!(
            http(
                "{name: tuna, sectionName: shop}",
                "shop",
                &shop_labels,
                &["a.shop.example.com", "b.example.com"]
            ),
            Ok(vec![Attached {
                listener: "shop".into(),
                hostnames: hosts(&["a.shop.example.com"])
            }])
        );
        assert_eq!(
            http(
                "{name: tuna, sectionName: shop}",
                "shop",
                &shop_labels,
                &["b.example.com"]
            ),
            Err(RouteRefusal::NoMatchingListenerHostname)
        );
        assert_eq!(
            http("{name: tuna, sectionName: shop}", "blog", &none, &[]),
            Err(RouteRefusal::NotAllowedByListeners)
        );
        assert_eq!(
            http("{name: tuna, sectionName: nope}", "shop", &shop_labels, &[]),
            Err(RouteRefusal::NoMatchingParent)
        );
        assert_eq!(
            http(
                "{name: tuna, sectionName: shop, port: 8080}",
                "shop",
                &shop_labels,
                &[]
            ),
            Err(RouteRefusal::NoMatchingParent)
        );
        // `Same` by default: only the Gateway's namespace.
        assert_eq!(
            http("{name: tuna, port: 8081}", "shop", &shop_labels, &[]),
            Err(RouteRefusal::NotAllowedByListeners)
        );
        assert_eq!(
            http("{name: tuna, port: 8081}", "infra", &none, &[]).map(|a| a.len()),
            Ok(1)
        );
        // No section or port: every listener that admits it; the TCP one
        // and the TCPRoute-only one do not admit an HTTPRoute.
        let all = http(
            "{name: tuna}",
            "shop",
            &shop_labels,
            &["x.shop.example.com"],
        )
        .unwrap();
        let names: Vec<&str> = all.iter().map(|a| a.listener.as_str()).collect();
        assert_eq!(names, ["shop", "any"]);
        assert_eq!(
            attach(
                &gw,
                &parent("{name: tuna, sectionName: db}"),
                "TCPRoute",
                "shop",
                &none,
                &[],
                false
            ),
            Ok(vec![Attached {
                listener: "db".into(),
                hostnames: vec![]
            }])
        );
        assert_eq!(
            http("{name: tuna, sectionName: only-tcp}", "shop", &none, &[]),
            Err(RouteRefusal::NotAllowedByListeners)
        );
    }

    #[test]
    fn namespace_selectors_use_labels_and_expressions() {
        use std::collections::BTreeMap;
        let selector: tuna_crds::gateway::gateways::GatewayListenersAllowedRoutesNamespacesSelector =
            serde_saphyr::from_str(
                "{matchLabels: {team: shop}, matchExpressions: [{key: env, operator: In, values: [prod, stage]}, {key: frozen, operator: DoesNotExist}]}",
            )
            .unwrap();
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(selects(
            &selector,
            &labels(&[("team", "shop"), ("env", "prod")])
        ));
        assert!(!selects(
            &selector,
            &labels(&[("team", "shop"), ("env", "dev")])
        ));
        assert!(!selects(
            &selector,
            &labels(&[("team", "blog"), ("env", "prod")])
        ));
        assert!(!selects(
            &selector,
            &labels(&[("team", "shop"), ("env", "prod"), ("frozen", "yes")])
        ));
    }

    /// ReferenceGrant as the specification defines it: the grant lives in
    /// the Service's namespace, names the route's kind and namespace in
    /// `from` and Services (all, or one by name) in `to`.
    #[test]
    fn cross_namespace_backends_need_a_reference_grant() {
        use tuna_crds::gateway::ReferenceGrant;
        use tuna_crds::gateway::httproutes::HttpRouteRulesBackendRefs;
        let grant = |yaml: &str| -> ReferenceGrant { serde_saphyr::from_str(yaml).unwrap() };
        let to_db = grant(
            "{apiVersion: gateway.networking.k8s.io/v1, kind: ReferenceGrant, metadata: {name: g, namespace: data},
              spec: {from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: shop}],
                     to: [{group: '', kind: Service, name: db}]}}",
        );
        let wrong_ns = grant(
            "{apiVersion: gateway.networking.k8s.io/v1, kind: ReferenceGrant, metadata: {name: g, namespace: other},
              spec: {from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: shop}],
                     to: [{group: '', kind: Service}]}}",
        );
        let backend =
            |yaml: &str| -> HttpRouteRulesBackendRefs { serde_saphyr::from_str(yaml).unwrap() };
        let exists = |ns: &str, name: &str| (ns, name) != ("data", "gone");
        let resolve = |b: &HttpRouteRulesBackendRefs, kind: &str, grants: &[&ReferenceGrant]| {
            resolve_backend(b, kind, "shop", grants, exists).map(|(n, s)| format!("{n}/{s}"))
        };
        // The route's own namespace needs no grant.
        assert_eq!(
            resolve(&backend("{name: web, port: 80}"), "HTTPRoute", &[]),
            Ok("shop/web".into())
        );
        let db = backend("{name: db, namespace: data, port: 5432}");
        assert_eq!(
            resolve(&db, "HTTPRoute", &[]),
            Err(RefRefusal::RefNotPermitted)
        );
        assert_eq!(
            resolve(&db, "HTTPRoute", &[&wrong_ns]),
            Err(RefRefusal::RefNotPermitted)
        );
        assert_eq!(resolve(&db, "HTTPRoute", &[&to_db]), Ok("data/db".into()));
        // Another route kind, another Service name: not granted.
        assert_eq!(
            resolve(&db, "TCPRoute", &[&to_db]),
            Err(RefRefusal::RefNotPermitted)
        );
        assert_eq!(
            resolve(
                &backend("{name: cache, namespace: data}"),
                "HTTPRoute",
                &[&to_db]
            ),
            Err(RefRefusal::RefNotPermitted)
        );
        // Not a Service; a granted Service that does not exist.
        assert_eq!(
            resolve(
                &backend("{name: b, group: example.com, kind: Bucket}"),
                "HTTPRoute",
                &[]
            ),
            Err(RefRefusal::InvalidKind)
        );
        let all_services = grant(
            "{apiVersion: gateway.networking.k8s.io/v1, kind: ReferenceGrant, metadata: {name: all, namespace: data},
              spec: {from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: shop}],
                     to: [{group: '', kind: Service}]}}",
        );
        assert_eq!(
            resolve(
                &backend("{name: gone, namespace: data}"),
                "HTTPRoute",
                &[&all_services]
            ),
            Err(RefRefusal::BackendNotFound)
        );
        assert_eq!(RefRefusal::RefNotPermitted.reason(), "RefNotPermitted");
    }
}
