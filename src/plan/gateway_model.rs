//! What every step of a Gateway API plan shares, below all of them: the
//! objects a plan reads ([`GatewayInputs`]), the statuses and conditions it
//! produces ([`GatewayOutcome`] and the status types), what it knows of
//! hosts once ownership is settled ([`HostContext`]), and the small helpers
//! HTTPRoutes and TCPRoutes both use. Pure data and pure functions: it
//! imports none of `httproute`, `tcproute` or `gateway_status`, which all
//! import it.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use tuna_crds::gateway::httproutes::HttpRouteParentRefs;
use tuna_crds::gateway::{Gateway, GatewayClass, HttpRoute, ReferenceGrant, TcpRoute};

use super::claims::Owner;
use super::gateway::GatewayAction;
use super::model::{Backends, HostRoute, ObjectRef, Reason, TcpPlan};
use super::service::UpstreamPolicy;

/// The Gateway API objects a plan reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct GatewayInputs<'a> {
    /// GatewayClasses (of any controller: the plan picks its own).
    pub classes: &'a [Arc<GatewayClass>],
    /// Gateways.
    pub gateways: &'a [Arc<Gateway>],
    /// HTTPRoutes.
    pub http_routes: &'a [Arc<HttpRoute>],
    /// TCPRoutes.
    pub tcp_routes: &'a [Arc<TcpRoute>],
    /// ReferenceGrants.
    pub grants: &'a [Arc<ReferenceGrant>],
    /// Namespaces, for `allowedRoutes.namespaces.selector` (labels).
    pub namespaces: &'a [Arc<Namespace>],
    /// The Secrets listeners' `certificateRefs` name, as the agent found
    /// them; `None` where Secrets are not read (`route explain`, the file
    /// provider): then only their kinds and ReferenceGrants are checked.
    pub certificates: Option<&'a [CertificateSecret]>,
}

/// What the agent found of a Secret a listener's `certificateRefs` names
/// (never its data: only whether it holds a usable certificate and key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateSecret {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Why it cannot serve TLS (`None`: a PEM certificate chain and private
    /// key are in `tls.crt` and `tls.key`).
    pub problem: Option<String>,
}

impl GatewayInputs<'_> {
    /// Whether there is any Gateway API object at all.
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
            && self.gateways.is_empty()
            && self.http_routes.is_empty()
            && self.tcp_routes.is_empty()
    }
}

/// One condition a status shows (`lastTransitionTime` is the writer's).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Cond {
    /// `Accepted`, `Programmed`, `ResolvedRefs`, …
    #[serde(rename = "type")]
    pub type_: &'static str,
    /// `True` or `False`.
    pub status: bool,
    /// The reason, as the specification spells it.
    pub reason: String,
    /// For a human.
    pub message: String,
}

impl Cond {
    pub(crate) fn yes(type_: &'static str, reason: &str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: true,
            reason: reason.into(),
            message: message.into(),
        }
    }

    pub(crate) fn no(type_: &'static str, reason: &str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: false,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// The status of one of our GatewayClasses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassStatus {
    /// Its name.
    pub name: String,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// Its conditions.
    pub conditions: Vec<Cond>,
}

/// The status of one listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerStatus {
    /// The listener's name.
    pub name: String,
    /// Routes attached to it (accepted through it).
    pub attached_routes: i32,
    /// `HTTPRoute` for HTTP(S), `TCPRoute` for TCP, none otherwise.
    pub supported_kinds: Vec<&'static str>,
    /// Its conditions.
    pub conditions: Vec<Cond>,
}

/// The status of one Gateway of our classes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayStatus {
    /// The Gateway.
    pub object: ObjectRef,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// Its conditions.
    pub conditions: Vec<Cond>,
    /// The public hosts its routes are served on (`status.addresses`,
    /// type `Hostname`).
    pub addresses: Vec<String>,
    /// The TCPRoutes published through its TCP listeners (their public
    /// `host:port` is known once their tunnel is bound).
    pub tcp_routes: Vec<ObjectRef>,
    /// Per listener, in spec order.
    pub listeners: Vec<ListenerStatus>,
}

/// The status of a route for one parentRef that names one of our Gateways.
#[derive(Debug, Clone, PartialEq)]
pub struct ParentStatus {
    /// The parentRef as the route gives it (a TCPRoute's, which has the
    /// same fields, converted: see [`super::tcproute::parent_ref`]).
    pub parent_ref: HttpRouteParentRefs,
    /// `Accepted` and `ResolvedRefs`.
    pub conditions: Vec<Cond>,
}

/// The status of one route.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteStatus {
    /// The route (`Kind::HttpRoute` or `Kind::TcpRoute`).
    pub object: ObjectRef,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// One entry per parentRef naming one of our Gateways.
    pub parents: Vec<ParentStatus>,
}

/// What the Gateway API objects make of the hosts, before they meet the
/// Tunnels and Ingresses (see [`super::plan`]).
#[derive(Debug, Clone, Default)]
pub struct GatewayOutcome {
    /// Concrete host → route specs, owned by one namespace.
    pub hosts: BTreeMap<String, Vec<HostRoute>>,
    /// Specs of listeners and routes without any hostname: they serve any
    /// request host that reaches the proxy and no route names (an IP
    /// address), `host` is `*`.
    pub catch_all: Vec<HostRoute>,
    /// Host refusals of routes: (route, host, reason, message).
    pub refused_hosts: Vec<(ObjectRef, String, Reason, String)>,
    /// GatewayClass statuses (ours only).
    pub classes: Vec<ClassStatus>,
    /// Gateway statuses (of our classes only).
    pub gateways: Vec<GatewayStatus>,
    /// Route statuses (routes with a parentRef to one of our Gateways).
    pub routes: Vec<RouteStatus>,
    /// TCPRoute → the TCP endpoint it is published on.
    pub tcp: BTreeMap<ObjectRef, TcpPlan>,
    /// Refusals of TCPRoutes: (route, reason, message).
    pub tcp_refusals: Vec<(ObjectRef, Reason, String)>,
    /// Gateway → what its own address serves (address mode only).
    pub addresses: BTreeMap<ObjectRef, AddressPlan>,
}

/// What one Gateway's own address serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressPlan {
    /// The address its `spec.addresses` asks for (its one entry of type
    /// `IPAddress`, or without a type), if any.
    pub requested: Option<std::net::IpAddr>,
    /// Why the addresses `spec.addresses` asks for cannot be given, if so
    /// (more than one: a Gateway has one address here; a value that is not
    /// an IP address): the Gateway gets none and is
    /// `Programmed=False, AddressNotUsable`.
    pub unusable: Option<String>,
    /// TCP listener port → the rule of the TCPRoute it serves (its
    /// backends by weight; a backendRef that does not resolve keeps its
    /// weight, and its share of connections is closed).
    pub tcp: BTreeMap<u16, Arc<super::gateway::GatewayAction>>,
    /// HTTP listener port → its listeners, in the Gateway's order, each
    /// with the specs of the HTTPRoutes attached to it: the port routes any
    /// `Host` by these alone ([`tuna_routing::PortTable`]).
    pub http: BTreeMap<u16, Vec<AddressListener>>,
}

/// One HTTP listener on a Gateway's own address.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AddressListener {
    /// The listener's name.
    pub name: String,
    /// Its hostname (`None`: every host).
    pub hostname: Option<String>,
    /// The specs of its routes, one per (route hostname ∩ listener
    /// hostname, rule, match), matched through their
    /// `GatewayMatch::hostname`; `host` is that hostname (`*` for none).
    pub specs: Vec<HostRoute>,
    /// An HTTPS listener's certificate: the Secret (namespace, name) of its
    /// first `certificateRef`, which the agent found usable. The port then
    /// terminates TLS in the cluster with it; `None` on an HTTP listener.
    pub certificate: Option<(String, String)>,
}

// The kopium types inside a spec's Gateway action derive `PartialEq` only.
impl Eq for AddressListener {}

pub(super) fn labels_of(namespaces: &[Arc<Namespace>], name: &str) -> BTreeMap<String, String> {
    let mut labels = namespaces
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(name))
        .and_then(|n| n.metadata.labels.clone())
        .unwrap_or_default();
    // Every namespace carries this label (set by the API server since 1.22).
    labels
        .entry("kubernetes.io/metadata.name".into())
        .or_insert_with(|| name.to_owned());
    labels
}

pub(super) fn created(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> i64 {
    meta.creation_timestamp
        .as_ref()
        .map_or(i64::MAX, |t| t.0.as_second())
}

/// The `ResolvedRefs` condition of a route with these rule actions: the
/// first backendRef that does not resolve says why.
pub(super) fn resolved_refs<'a>(actions: impl IntoIterator<Item = &'a GatewayAction>) -> Cond {
    actions
        .into_iter()
        .flat_map(|a| a.invalid.iter())
        .next()
        .map_or_else(
            || Cond::yes("ResolvedRefs", "ResolvedRefs", "every backendRef resolves"),
            |bad| Cond::no("ResolvedRefs", ref_reason(&bad.reason), bad.message.clone()),
        )
}

/// The specification's `ResolvedRefs` reason of an invalid backend.
pub(super) fn ref_reason(reason: &str) -> &'static str {
    match reason {
        "InvalidKind" => "InvalidKind",
        "RefNotPermitted" => "RefNotPermitted",
        _ => "BackendNotFound",
    }
}

/// The annotation of a GatewayClass that chooses the model of its
/// Gateways on an edge with a Gateway address pool: `shared` keeps them on
/// the edge's shared ports (reserved hosts, TCP endpoints by alias), as on
/// an edge without a pool; `own` (the default) gives each an address of its
/// own.
pub const ADDRESSES_ANNOTATION: &str = "k8s.tuna.am/addresses";

/// Which Gateways have an address of their own: every Gateway, when the
/// edge has a pool ([`super::PlanOptions::gateway_addresses`]), but those of
/// a class annotated [`ADDRESSES_ANNOTATION`]`: shared`.
#[derive(Debug, Clone, Default)]
pub struct AddressModel {
    pool: bool,
    shared_classes: std::collections::BTreeSet<String>,
}

impl AddressModel {
    /// The model of an edge with (`pool`) or without a pool, for `classes`.
    pub fn new(pool: bool, classes: &[Arc<GatewayClass>]) -> Self {
        Self {
            pool,
            shared_classes: classes
                .iter()
                .filter(|c| class_shares_ports(c))
                .filter_map(|c| c.metadata.name.clone())
                .collect(),
        }
    }

    /// Whether `gateway` has an address of its own.
    pub fn own(&self, gateway: &Gateway) -> bool {
        self.pool
            && !self
                .shared_classes
                .contains(&gateway.spec.gateway_class_name)
    }

    /// Whether the Gateways of `class` have addresses of their own.
    pub fn own_for_class(&self, class: &str) -> bool {
        self.pool && !self.shared_classes.contains(class)
    }
}

/// Whether a GatewayClass asks for the shared ports
/// ([`ADDRESSES_ANNOTATION`]`: shared`).
pub fn class_shares_ports(class: &GatewayClass) -> bool {
    class
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ADDRESSES_ANNOTATION))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("shared"))
}

/// What the plan knows of hosts once ownership is settled.
pub(crate) struct HostContext<'a> {
    /// The holder of each claimed host ([`super::claims::settle`]).
    pub owners: &'a BTreeMap<String, Owner>,
    /// Hosts already published by Tunnels (→ the Tunnel) and Ingresses.
    pub taken: &'a BTreeMap<String, (ObjectRef, Reason)>,
    /// How backends resolve.
    pub backends: Backends,
    /// Upstream policy.
    pub policy: UpstreamPolicy,
    /// TCPEndpoint aliases.
    pub aliases: &'a super::tcpendpoint::AliasOwners,
    /// A TCP listener's alias must be declared by a TCPEndpoint (standalone).
    pub require_tcp_endpoint_objects: bool,
    /// Which Gateways have an address of their own.
    pub addresses: &'a AddressModel,
    /// TCP endpoints tcp Tunnels publish, by [`tcp_key`] (→ the Tunnel): they keep them.
    pub tcp_taken: &'a BTreeMap<String, ObjectRef>,
    /// The holder of each claimed TCP endpoint, by [`tcp_key`].
    pub tcp_owners: &'a BTreeMap<String, Owner>,
}
