//! The plan: the desired state of the whole system, provider-neutral and
//! pure (no I/O, no Kubernetes client; it must not know the reconcilers or
//! the edge client).
//!
//! [`plan`] takes the objects a provider sees — reflector stores in a cluster
//! (`Arc<K>`, as they hand them out: nothing is cloned per change), manifests
//! in standalone mode, or files and a cluster snapshot for `route explain` — plus
//! a [`ServiceLookup`], and returns what must be published: per-host route
//! tables, TCP bindings, the reservations to hold, the tunnels to run, and every
//! object (or rule, path, backend) that is refused, with a typed [`Reason`] and
//! the [`ObjectRef`] it comes from. The cross-kind rules live here and only here:
//!
//! - **Domains** reserve hosts; of two Domains with one host the oldest wins
//!   (then namespace, name), the others are `DuplicateDomain`.
//! - **TCPEndpoints** reserve aliases; the oldest wins, others `DuplicateAlias`.
//! - **Ownership** of hosts and TCP endpoints is settled once, over the claims
//!   of every kind ([`claims`]): a host belongs to one namespace — its
//!   Domain's, else the one the agent recorded as holding it, else its first
//!   claimant's (an explicit name beats a wildcard or a missing hostname; then
//!   the oldest object) — and so does a TCP endpoint (the TCPEndpoint's
//!   namespace for its alias and its port, else recorded, else first). An
//!   all-digit alias is a port everywhere. Objects of other namespaces are
//!   refused `HostOwnedByOtherNamespace` / `TcpEndpointOwnedByOtherNamespace`.
//!   Kinds never outrank namespaces; inside the holding namespace:
//! - **Tunnels**, oldest first: an http Tunnel serves its host; a younger
//!   Tunnel with the same host is `HostConflict`; two tcp Tunnels on one
//!   endpoint: the younger is `TcpEndpointInUse`. With
//!   [`PlanOptions::require_tcp_endpoint_objects`] (standalone: there is no
//!   account to hold other reservations) an alias no TCPEndpoint declares is
//!   `TcpEndpointNotFound`; otherwise it is left to the edge, which knows the
//!   account's reservations.
//! - **Ingresses** (of our class): hosts must be reserved (a Domain of
//!   the namespace or an account host), rules on a Tunnel's host are skipped
//!   (`HostUsedByTunnel`), backends are resolved against the Services, and the
//!   route table of each host is built here exactly as the proxy core will build
//!   it, so invalid paths and equal rules are reported now and only what routes
//!   is published.
//! - **HTTPRoutes and TCPRoutes** get what their namespace holds and its
//!   Tunnels and Ingresses do not publish ([`httproute`], [`tcproute`]).
//!
//! The same function feeds standalone mode, `route explain` and the agent, so
//! what `route explain` prints is what the agent serves.

pub mod claims;
pub mod domain;
pub mod gateway;
pub mod gateway_model;
pub mod gateway_status;
pub mod httproute;
pub mod ingress;
pub mod model;
pub mod rule_action;
pub mod service;
pub mod tcpendpoint;
pub mod tcproute;
pub mod tunnel;

pub use model::{Backend, Backends, HostRoute, Kind, ObjectRef, Reason, Refusal, TcpPlan};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tuna_crds::{Domain, TcpEndpoint, Tunnel};
use tuna_routing::{BuildIssue, Origin, PathType, RouteSpec, RouteTable, TieBreak};

use crate::plan::domain::{
    DesiredDomain, HostRefusal, HostReservations, desired_domain, reserved_routes,
};
use crate::plan::ingress::TranslateOptions;
use crate::plan::service::{
    ResolvedUpstream, ServiceLookup, UpstreamPolicy, UpstreamScheme, resolve_service,
};
use crate::plan::tcpendpoint::{AliasOwners, DesiredTcpEndpoint, desired_tcp_endpoint};
use crate::plan::tunnel::{
    DesiredTunnel, PortOrAlias, PublicEndpoint, TunnelOptions, TunnelReason, desired_tunnel,
};

/// The objects a plan is made from.
#[derive(Debug, Clone, Copy, Default)]
pub struct Inputs<'a> {
    /// Ingresses (of any class: the plan picks its own).
    pub ingresses: &'a [Arc<Ingress>],
    /// Tunnels.
    pub tunnels: &'a [Arc<Tunnel>],
    /// Domains.
    pub domains: &'a [Arc<Domain>],
    /// TCPEndpoints.
    pub tcp_endpoints: &'a [Arc<TcpEndpoint>],
    /// Gateway API objects.
    pub gateway: gateway_model::GatewayInputs<'a>,
    /// Who the agent recorded as holding which host and TCP endpoint
    /// ([`claims::ClaimBook`]); `None`: nothing recorded (files).
    pub claims: Option<&'a claims::ClaimBook>,
}

/// Settings of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanOptions {
    /// The edge's base domain (`subdomain: web` is `web.<base domain>`), lower case.
    pub base_domain: String,
    /// Which Ingresses are ours.
    pub ingress: TranslateOptions,
    /// What upstreams may point at.
    pub policy: UpstreamPolicy,
    /// Hosts reserved on the account outside Kubernetes: Ingresses of any
    /// namespace may publish them (the oldest claimant's namespace then owns them).
    pub account_hosts: BTreeSet<String>,
    /// A tcp Tunnel's alias must be declared by a TCPEndpoint (standalone).
    pub require_tcp_endpoint_objects: bool,
    /// The edge gives each Gateway an address of its own (a self-hosted
    /// edge with `--gateway-addresses`): a TCP listener serves on its own
    /// port of it ([`GatewayPlan::addresses`]), not on a TCP endpoint.
    pub gateway_addresses: bool,
    /// Resolve Ingress backends or keep them as named.
    pub backends: Backends,
}

impl PlanOptions {
    /// Options for a cluster: the given base domain, class `tuna`, Services of the
    /// object's own namespace only.
    pub fn cluster(base_domain: &str) -> Self {
        Self {
            base_domain: base_domain.to_ascii_lowercase(),
            ingress: TranslateOptions::default(),
            policy: UpstreamPolicy::cluster(),
            account_hosts: BTreeSet::new(),
            require_tcp_endpoint_objects: false,
            gateway_addresses: false,
            backends: Backends::Resolve,
        }
    }

    /// Options for standalone mode (see `crate::standalone`).
    pub fn standalone(base_domain: &str) -> Self {
        Self {
            policy: UpstreamPolicy::standalone(),
            require_tcp_endpoint_objects: true,
            ..Self::cluster(base_domain)
        }
    }
}

/// What publishes a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostSource {
    /// An http Tunnel (its one route is `Prefix /`).
    Tunnel(ObjectRef),
    /// Ingresses of one namespace (sorted, deduplicated).
    Ingresses(Vec<ObjectRef>),
    /// HTTPRoutes of one namespace (sorted, deduplicated).
    HttpRoutes(Vec<ObjectRef>),
}

/// A host to publish: one tunnel, one route table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPlan {
    /// The routes, in the order they were found (the route table decides matching).
    pub routes: Vec<HostRoute>,
    /// Routes the route table refused (equal to an older rule, invalid path):
    /// not published, kept so that `route explain` can show why they lost.
    pub refused: Vec<HostRoute>,
    /// Who publishes it.
    pub source: HostSource,
    /// The namespace that owns the host.
    pub namespace: String,
}

impl HostPlan {
    /// The publishing objects.
    pub fn publishers(&self) -> Vec<ObjectRef> {
        match &self.source {
            HostSource::Tunnel(t) => vec![t.clone()],
            HostSource::Ingresses(list) | HostSource::HttpRoutes(list) => list.clone(),
        }
    }
}

/// Everything to publish, and everything refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Host (lower case) → its routes.
    pub hosts: BTreeMap<String, HostPlan>,
    /// tcp Tunnel or TCPRoute → its TCP endpoint (an endpoint is used by
    /// one of them: Tunnels are planned first and keep theirs).
    pub tcp: BTreeMap<ObjectRef, TcpPlan>,
    /// Domains whose reservation stands (duplicates removed).
    pub domains: Vec<DesiredDomain>,
    /// TCPEndpoints whose reservation stands.
    pub tcp_endpoints: Vec<DesiredTcpEndpoint>,
    /// Tunnels that are published (each gets a tunnel and a token).
    pub tunnels: BTreeMap<ObjectRef, DesiredTunnel>,
    /// What was refused, in input order where it has one.
    pub refusals: Vec<Refusal>,
    /// Gateway API statuses, and the routes of hostname-less listeners.
    pub gateway: GatewayPlan,
    /// The holder of every host some object claims ([`claims::settle`]).
    pub owners: BTreeMap<String, claims::Owner>,
    /// The holder of every TCP endpoint some object claims, by
    /// [`claims::tcp_key`].
    pub tcp_owners: BTreeMap<String, claims::Owner>,
    /// The namespaces whose objects name each host, reserved or not (a
    /// recorded holder that still names a host keeps its record even when
    /// its claim does not count for a moment).
    pub host_names: BTreeMap<String, BTreeSet<String>>,
    /// The same for TCP endpoints.
    pub tcp_names: BTreeMap<String, BTreeSet<String>>,
}

impl Plan {
    /// What the plan decided about ownership, for [`claims::ClaimBook::absorb`].
    pub fn decided(&self) -> claims::Decided<'_> {
        claims::Decided {
            host_owners: &self.owners,
            host_names: &self.host_names,
            tcp_owners: &self.tcp_owners,
            tcp_names: &self.tcp_names,
        }
    }
}

/// What the plan says of Gateway API objects besides their hosts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GatewayPlan {
    /// Our GatewayClasses.
    pub classes: Vec<gateway_model::ClassStatus>,
    /// Gateways of our classes.
    pub gateways: Vec<gateway_model::GatewayStatus>,
    /// Routes with a parentRef to one of those.
    pub routes: Vec<gateway_model::RouteStatus>,
    /// Specs that serve any host no route names (host `*`): what a request
    /// by IP address that reaches the proxy gets.
    pub catch_all: Vec<HostRoute>,
    /// With [`PlanOptions::gateway_addresses`]: every accepted Gateway of
    /// our classes → what its own address serves.
    pub addresses: BTreeMap<ObjectRef, gateway_model::AddressPlan>,
}

// The kopium types derive `PartialEq` only; every field here is plain data.
impl Eq for GatewayPlan {}

impl Plan {
    /// The refusals of one object.
    pub fn refusals_of<'a>(&'a self, object: &'a ObjectRef) -> impl Iterator<Item = &'a Refusal> {
        self.refusals.iter().filter(move |r| &r.object == object)
    }

    /// The hosts an object publishes routes on.
    pub fn hosts_of(&self, object: &ObjectRef) -> Vec<String> {
        self.hosts
            .iter()
            .filter(|(_, h)| h.publishers().contains(object))
            .map(|(host, _)| host.clone())
            .collect()
    }
}

fn created(meta: &ObjectMeta) -> i64 {
    meta.creation_timestamp
        .as_ref()
        .map_or(i64::MAX, |t| t.0.as_second())
}

/// The TCP endpoint key ([`claims::tcp_key`]) a tcp Tunnel names, if any.
pub fn tunnel_tcp_key(tunnel: &Tunnel) -> Option<String> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    if tunnel.spec.protocol != tuna_crds::TunnelProtocol::Tcp {
        return None;
    }
    match tunnel.spec.port_or_alias.as_ref()? {
        IntOrString::Int(n) => Some(n.to_string()),
        IntOrString::String(s) => Some(claims::tcp_key(s)),
    }
}

fn namespace_of(meta: &ObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or("default")
}

/// The refusal of an object whose host (or TCP endpoint) another namespace holds.
fn not_the_holder(object: ObjectRef, what: &str, owner: &claims::Owner, reason: Reason) -> Refusal {
    Refusal::new(
        object,
        reason,
        format!(
            "{what} belongs to namespace {:?}, {}",
            owner.namespace,
            owner.why()
        ),
    )
}

/// Computes the plan (see the module docs).
pub fn plan(inputs: &Inputs<'_>, services: &dyn ServiceLookup, options: &PlanOptions) -> Plan {
    let mut out = Plan::default();

    // Domains → reservations.
    let mut domains = Vec::new();
    for d in inputs.domains {
        let object = ObjectRef::of(Kind::Domain, &d.metadata);
        match desired_domain(d, &options.base_domain) {
            Ok(dd) => domains.push(dd),
            Err(e) => out
                .refusals
                .push(Refusal::new(object, Reason::Domain(e.reason), e.message)),
        }
    }
    let (reservations, duplicates) =
        HostReservations::from_domains(&domains, options.account_hosts.clone());
    for (dd, e) in duplicates {
        domains.retain(|d| !(d.namespace == dd.namespace && d.name == dd.name));
        out.refusals.push(Refusal::new(
            ObjectRef::new(Kind::Domain, dd.namespace, dd.name),
            Reason::Domain(e.reason),
            e.message,
        ));
    }
    out.domains = domains;

    // TCPEndpoints → aliases.
    let mut endpoints = Vec::new();
    for e in inputs.tcp_endpoints {
        let object = ObjectRef::of(Kind::TcpEndpoint, &e.metadata);
        match desired_tcp_endpoint(e) {
            Ok(de) => endpoints.push(de),
            Err(err) => out.refusals.push(Refusal::new(
                object,
                Reason::TcpEndpoint(err.reason),
                err.message,
            )),
        }
    }
    let (aliases, duplicates) = AliasOwners::new(&endpoints);
    for (de, e) in duplicates {
        endpoints.retain(|d| !(d.namespace == de.namespace && d.name == de.name));
        out.refusals.push(Refusal::new(
            ObjectRef::new(Kind::TcpEndpoint, de.namespace, de.name),
            Reason::TcpEndpoint(e.reason),
            e.message,
        ));
    }
    out.tcp_endpoints = endpoints;

    // Every kind's claims, settled once ([`claims`]): a host or a TCP
    // endpoint belongs to one namespace, whatever kinds claim it.
    let empty = claims::ClaimBook::default();
    let book = inputs.claims.unwrap_or(&empty);
    let ingress_routes =
        ingress::translate_each(inputs.ingresses.iter().map(|i| &**i), &options.ingress);
    let reserved =
        |host: &str| reservations.domains.contains_key(host) || reservations.account.contains(host);
    let mut host_claims: Vec<claims::Claim> = inputs
        .tunnels
        .iter()
        .filter_map(|t| {
            let host = tunnel_host(t, &options.base_domain)?;
            Some(claims::Claim::new(
                host,
                namespace_of(&t.metadata),
                format!("Tunnel/{}", t.metadata.name.as_deref().unwrap_or("")),
                created(&t.metadata),
                claims::Strength::Explicit,
            ))
        })
        .collect();
    // Every Ingress rule names its host; only rules on reserved hosts claim.
    let ingress_claims = ingress::host_claims(&ingress_routes.specs);
    for c in ingress_claims.iter().chain(&host_claims) {
        out.host_names
            .entry(c.key.clone())
            .or_default()
            .insert(c.namespace.clone());
    }
    host_claims.extend(ingress_claims.into_iter().filter(|c| reserved(&c.key)));
    let address_model =
        gateway_model::AddressModel::new(options.gateway_addresses, inputs.gateway.classes);
    let gateway = (!inputs.gateway.is_empty()).then(|| {
        httproute::prepare(
            &inputs.gateway,
            services,
            &httproute::PrepareContext {
                domains: &reservations.domains,
                account: &reservations.account,
                backends: options.backends,
                policy: options.policy,
                addresses: &address_model,
            },
        )
    });
    if let Some(g) = &gateway {
        host_claims.extend(g.host_claims());
        for (host, ns) in g.named_hosts() {
            out.host_names.entry(host).or_default().insert(ns);
        }
    }
    out.owners = claims::settle(&host_claims, &reservations.domains, &book.hosts);

    let mut tcp_reserved: BTreeMap<String, String> = BTreeMap::new();
    for e in aliases.aliases.values() {
        tcp_reserved.insert(e.alias.clone(), e.namespace.clone());
        if let Some(port) = e.port {
            tcp_reserved.insert(port.to_string(), e.namespace.clone());
        }
    }
    let mut tcp_claims: Vec<claims::Claim> = inputs
        .tunnels
        .iter()
        .filter_map(|t| {
            Some(claims::Claim::new(
                tunnel_tcp_key(t)?,
                namespace_of(&t.metadata),
                format!("Tunnel/{}", t.metadata.name.as_deref().unwrap_or("")),
                created(&t.metadata),
                claims::Strength::Explicit,
            ))
        })
        .collect();
    if let Some(g) = &gateway {
        tcp_claims.extend(g.tcp_claims());
    }
    for c in &tcp_claims {
        out.tcp_names
            .entry(c.key.clone())
            .or_default()
            .insert(c.namespace.clone());
    }
    out.tcp_owners = claims::settle(&tcp_claims, &tcp_reserved, &book.tcp);

    // Tunnels, oldest first (inside the holding namespace: across
    // namespaces, the holder was settled above).
    let tunnel_options = TunnelOptions {
        base_domain: options.base_domain.clone(),
        policy: options.policy,
    };
    let mut tunnels: Vec<&Arc<Tunnel>> = inputs.tunnels.iter().collect();
    tunnels.sort_by_key(|t| {
        (
            created(&t.metadata),
            namespace_of(&t.metadata).to_owned(),
            t.metadata.name.clone(),
        )
    });
    let host_holder = |host: &str, object: &ObjectRef| -> Option<Refusal> {
        let owner = out.owners.get(host)?;
        (owner.namespace != object.namespace).then(|| {
            not_the_holder(
                object.clone(),
                &format!("host {host}"),
                owner,
                Reason::Tunnel(TunnelReason::HostOwnedByOtherNamespace),
            )
        })
    };
    let mut tunnel_hosts: BTreeMap<String, ObjectRef> = BTreeMap::new();
    let mut tcp_used: BTreeMap<String, ObjectRef> = BTreeMap::new();
    let mut refusals = Vec::new();
    let mut hosts = BTreeMap::new();
    let mut tcp = BTreeMap::new();
    let mut published = BTreeMap::new();
    for t in tunnels {
        let object = ObjectRef::of(Kind::Tunnel, &t.metadata);
        let desired = match desired_tunnel(t, services, &reservations, &aliases, &tunnel_options) {
            Ok(d) => d,
            Err(e) => {
                // Without Services to check, a Tunnel whose only fault may be its
                // Service still owns its host (as it would in a cluster).
                if options.backends != Backends::Resolve
                    && matches!(e.reason, TunnelReason::Upstream(r) if r.is_about_the_service())
                    && let Some(host) = tunnel_host(t, &options.base_domain)
                    && !tunnel_hosts.contains_key(&host)
                {
                    if let Some(refusal) = host_holder(&host, &object) {
                        refusals.push(refusal);
                        continue;
                    }
                    tunnel_hosts.insert(host.clone(), object.clone());
                    let route = tunnel_route(t, &host, None);
                    hosts.insert(
                        host,
                        HostPlan {
                            routes: vec![route],
                            refused: Vec::new(),
                            source: HostSource::Tunnel(object.clone()),
                            namespace: object.namespace.clone(),
                        },
                    );
                    continue;
                }
                refusals.push(Refusal::new(object, Reason::Tunnel(e.reason), e.message));
                continue;
            }
        };
        match &desired.public {
            PublicEndpoint::Http { host } => {
                if let Some(refusal) = host_holder(host, &object) {
                    refusals.push(refusal);
                    continue;
                }
                if let Some(first) = tunnel_hosts.get(host) {
                    refusals.push(Refusal::new(
                        object,
                        Reason::HostConflict,
                        format!("host {host} is already published by {first}, which is older"),
                    ));
                    continue;
                }
                tunnel_hosts.insert(host.clone(), object.clone());
                hosts.insert(
                    host.clone(),
                    HostPlan {
                        routes: vec![tunnel_route(t, host, Some(desired.upstream.clone()))],
                        refused: Vec::new(),
                        source: HostSource::Tunnel(object.clone()),
                        namespace: desired.namespace.clone(),
                    },
                );
            }
            PublicEndpoint::Tcp(endpoint) => {
                if let PortOrAlias::Alias(alias) = endpoint
                    && options.require_tcp_endpoint_objects
                    && aliases.get(alias).is_none()
                {
                    refusals.push(Refusal::new(
                        object,
                        Reason::TcpEndpointNotFound,
                        format!(
                            "no TCPEndpoint with alias {alias} in namespace {:?}; add one",
                            desired.namespace
                        ),
                    ));
                    continue;
                }
                let key = endpoint.key();
                if let Some(owner) = out.tcp_owners.get(&key)
                    && owner.namespace != desired.namespace
                {
                    refusals.push(not_the_holder(
                        object,
                        &endpoint.to_string(),
                        owner,
                        Reason::Tunnel(TunnelReason::TcpEndpointOwnedByOtherNamespace),
                    ));
                    continue;
                }
                if let Some(first) = tcp_used.get(&key) {
                    refusals.push(Refusal::new(
                        object,
                        Reason::TcpEndpointInUse,
                        format!("{endpoint} is already used by {first}, which is older"),
                    ));
                    continue;
                }
                tcp_used.insert(key, object.clone());
                tcp.insert(
                    object.clone(),
                    TcpPlan {
                        endpoint: endpoint.clone(),
                        upstream: desired.upstream.clone(),
                    },
                );
            }
        }
        published.insert(object, desired);
    }
    out.refusals.extend(refusals);
    out.hosts.extend(hosts);
    out.tcp.extend(tcp);
    out.tunnels.extend(published);

    let routes = ingress::keep_owned(ingress_routes, &out.owners);
    plan_ingresses(
        routes,
        services,
        options,
        &reservations,
        &tunnel_hosts,
        &mut out,
    );
    if let Some(prepared) = gateway {
        let tcp = TcpReservations {
            aliases: &aliases,
            taken: &tcp_used,
        };
        plan_http_routes(prepared, services, options, &address_model, &tcp, &mut out);
    }
    out
}

/// What TCP routes may use: the TCPEndpoints' aliases, less the endpoints
/// tcp Tunnels publish (by [`claims::tcp_key`]).
struct TcpReservations<'a> {
    aliases: &'a AliasOwners,
    taken: &'a BTreeMap<String, ObjectRef>,
}

/// HTTPRoutes on the hosts their namespace holds and no Tunnel or Ingress of
/// it publishes, TCPRoutes on the endpoints their namespace holds and no tcp
/// Tunnel uses (see [`httproute`], [`tcproute`]).
fn plan_http_routes(
    prepared: httproute::Prepared<'_>,
    services: &dyn ServiceLookup,
    options: &PlanOptions,
    address_model: &gateway_model::AddressModel,
    tcp: &TcpReservations<'_>,
    out: &mut Plan,
) {
    let taken: BTreeMap<String, (ObjectRef, Reason)> = out
        .hosts
        .iter()
        .map(|(host, plan)| {
            let (by, reason) = match &plan.source {
                HostSource::Tunnel(t) => (t.clone(), Reason::HostUsedByTunnel),
                HostSource::Ingresses(list) | HostSource::HttpRoutes(list) => {
                    (list[0].clone(), Reason::HostUsedByIngress)
                }
            };
            (host.clone(), (by, reason))
        })
        .collect();
    let ctx = gateway_model::HostContext {
        owners: &out.owners,
        taken: &taken,
        backends: options.backends,
        policy: options.policy,
        aliases: tcp.aliases,
        require_tcp_endpoint_objects: options.require_tcp_endpoint_objects,
        addresses: address_model,
        tcp_taken: tcp.taken,
        tcp_owners: &out.tcp_owners,
    };
    let outcome = httproute::finish(prepared, services, &ctx);
    for (object, reason, message) in outcome.tcp_refusals {
        out.refusals.push(Refusal::new(object, reason, message));
    }
    out.tcp.extend(outcome.tcp);
    for (object, _host, reason, message) in outcome.refused_hosts {
        out.refusals.push(Refusal::new(object, reason, message));
    }
    settle_hosts(outcome.hosts, Kind::HttpRoute, HostSource::HttpRoutes, out);
    out.gateway = GatewayPlan {
        classes: outcome.classes,
        gateways: outcome.gateways,
        routes: outcome.routes,
        catch_all: outcome.catch_all,
        addresses: outcome.addresses,
    };
}

fn plan_ingresses(
    routes: ingress::IngressRoutes,
    services: &dyn ServiceLookup,
    options: &PlanOptions,
    reservations: &HostReservations,
    tunnel_hosts: &BTreeMap<String, ObjectRef>,
    out: &mut Plan,
) {
    // Ingresses of other classes come back as `OtherIngressClass` refusals; a
    // cluster provider does not report those (they belong to other controllers).
    let ingress_ref = |namespace: &str, name: &str| ObjectRef::new(Kind::Ingress, namespace, name);
    let (routes, unreserved) = reserved_routes(routes, reservations);
    for s in &routes.skipped {
        out.refusals.push(Refusal {
            object: ingress_ref(&s.namespace, &s.ingress),
            rule: s.rule,
            path: s.path,
            reason: Reason::Ingress(s.reason),
            message: s.message.clone(),
        });
    }
    for u in unreserved {
        let reason = match u.refusal {
            HostRefusal::NotReserved => Reason::HostNotReserved,
            HostRefusal::OtherNamespace { .. } => Reason::HostOwnedByOtherNamespace,
        };
        let o = &u.spec.origin;
        out.refusals.push(Refusal::at(
            ingress_ref(&o.namespace, &o.name),
            o,
            reason,
            u.refusal.message(&u.spec.host),
        ));
    }
    let mut by_host: BTreeMap<String, Vec<HostRoute>> = BTreeMap::new();
    for spec in routes.specs {
        let host = spec.host.to_ascii_lowercase();
        let object = ingress_ref(&spec.origin.namespace, &spec.origin.name);
        if let Some(tunnel) = tunnel_hosts.get(&host) {
            out.refusals.push(Refusal::at(
                object,
                &spec.origin,
                Reason::HostUsedByTunnel,
                format!("host {host} is published by {tunnel}"),
            ));
            continue;
        }
        let upstream = match options.backends {
            Backends::Unchecked | Backends::Declared => None,
            Backends::Resolve => match resolve_service(
                &spec.backend,
                &spec.origin.namespace,
                UpstreamScheme::Http,
                services,
                &options.policy,
            ) {
                Ok(u) => Some(u),
                Err(e) => {
                    out.refusals.push(Refusal::at(
                        object,
                        &spec.origin,
                        Reason::Backend(e.reason),
                        e.message,
                    ));
                    continue;
                }
            },
        };
        by_host.entry(host.clone()).or_default().push(RouteSpec {
            host,
            path: spec.path,
            path_type: spec.path_type,
            backend: Backend {
                service: Some(spec.backend),
                url: None,
                upstream,
                gateway: None,
            },
            origin: spec.origin,
            tie_break: spec.tie_break,
            matcher: spec.matcher,
        });
    }
    settle_hosts(by_host, Kind::Ingress, HostSource::Ingresses, out);
}

/// Builds each host's table exactly as the proxy core will, so that invalid
/// paths and equal rules are reported now (against the objects of `kind`
/// they come from) and only what routes is published; a host is published
/// by `source` of its objects, in the namespace of its specs.
fn settle_hosts(
    by_host: BTreeMap<String, Vec<HostRoute>>,
    kind: Kind,
    source: fn(Vec<ObjectRef>) -> HostSource,
    out: &mut Plan,
) {
    let object_ref = |namespace: &str, name: &str| ObjectRef::new(kind, namespace, name);
    for (host, specs) in by_host {
        let issues = match RouteTable::build(specs.clone()) {
            Ok((_, issues)) => issues,
            Err(e) => {
                for name in specs
                    .iter()
                    .map(|s| (&s.origin.namespace, &s.origin.name))
                    .collect::<BTreeSet<_>>()
                {
                    out.refusals.push(Refusal::new(
                        object_ref(name.0, name.1),
                        Reason::TooManyRoutes,
                        format!("host {host}: {e}"),
                    ));
                }
                continue;
            }
        };
        let (mut kept, mut refused) = (specs, Vec::new());
        for issue in &issues {
            let origin = issue.origin();
            let (lost, rest): (Vec<_>, Vec<_>) =
                kept.into_iter().partition(|s| &s.origin == origin);
            kept = rest;
            refused.extend(lost);
            out.refusals.push(Refusal::at(
                object_ref(&origin.namespace, &origin.name),
                origin,
                Reason::Route(issue.reason()),
                issue_message(issue),
            ));
        }
        let Some(first) = kept.first() else {
            continue;
        };
        let namespace = first.origin.namespace.clone();
        let mut publishers: Vec<ObjectRef> = kept
            .iter()
            .map(|s| object_ref(&s.origin.namespace, &s.origin.name))
            .collect();
        publishers.sort();
        publishers.dedup();
        out.hosts.insert(
            host,
            HostPlan {
                routes: kept,
                refused,
                source: source(publishers),
                namespace,
            },
        );
    }
}

/// The public host of an http Tunnel with a valid subdomain (`base_domain` in
/// lower case, as [`PlanOptions`] holds it).
pub fn tunnel_host(tunnel: &Tunnel, base_domain: &str) -> Option<String> {
    if tunnel.spec.protocol != tuna_crds::TunnelProtocol::Http {
        return None;
    }
    let sub = tunnel.spec.subdomain.as_deref()?;
    crate::plan::domain::is_dns_label(sub).then(|| format!("{sub}.{base_domain}"))
}

/// The one route of an http Tunnel: `Prefix /` on its host.
fn tunnel_route(tunnel: &Tunnel, host: &str, upstream: Option<ResolvedUpstream>) -> HostRoute {
    let object = ObjectRef::of(Kind::Tunnel, &tunnel.metadata);
    RouteSpec {
        host: host.to_owned(),
        path: "/".into(),
        path_type: PathType::Prefix,
        backend: Backend {
            service: None,
            url: Some(tunnel.spec.upstream.url.clone()),
            upstream,
            gateway: None,
        },
        origin: Origin {
            namespace: object.namespace.clone(),
            name: object.name.clone(),
            rule: 0,
            path: 0,
        },
        tie_break: TieBreak {
            created: created(&tunnel.metadata),
            namespace: object.namespace,
            name: object.name,
        },
        matcher: tuna_routing::Matcher::Ingress,
    }
}

/// A route table issue as a sentence, without the location (a [`Refusal`] has it).
fn issue_message(issue: &BuildIssue) -> String {
    match issue {
        BuildIssue::InvalidHost { host, reason, .. } => format!("host {host:?}: {reason}"),
        BuildIssue::InvalidPath { path, reason, .. } => format!("path {path:?}: {reason}"),
        BuildIssue::Conflict {
            winner,
            host,
            path,
            path_type,
            ..
        } => format!(
            "{path_type} {host}{path} is also defined by {winner}, which wins (older, then by namespace/name, then by rule and path order)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::service::{ServiceIndex, ServiceInfo};

    fn objects<K: serde::de::DeserializeOwned>(yaml: &str) -> Vec<Arc<K>> {
        yaml.split("\n---\n")
            .filter(|d| !d.trim().is_empty())
            .map(|d| Arc::new(serde_saphyr::from_str::<K>(d).expect("test manifest")))
            .collect()
    }

    fn services(yaml: &str) -> ServiceIndex {
        ServiceIndex::new(
            objects::<k8s_openapi::api::core::v1::Service>(yaml)
                .iter()
                .map(|s| ServiceInfo::from_service(s)),
        )
    }

    const SERVICES: &str = "
metadata: {name: web, namespace: shop}
spec: {clusterIP: 10.0.0.1, ports: [{name: http, port: 80}]}
---
metadata: {name: api, namespace: shop}
spec: {clusterIP: 10.0.0.2, ports: [{port: 8080}]}
---
metadata: {name: web, namespace: blog}
spec: {clusterIP: 10.0.1.1, ports: [{port: 80}]}
";

    fn reasons(plan: &Plan) -> Vec<(String, &'static str)> {
        plan.refusals
            .iter()
            .map(|r| (r.location(), r.reason.as_str()))
            .collect()
    }

    /// Tunnel conflicts go to the oldest object, whatever the names say.
    #[test]
    fn tunnel_host_conflicts_go_to_the_oldest() {
        let tunnels = objects::<Tunnel>(
            "
metadata: {name: a-young, namespace: shop, creationTimestamp: '2026-01-02T00:00:00Z'}
spec: {subdomain: web, upstream: {url: 'http://web:80'}}
---
metadata: {name: z-old, namespace: shop, creationTimestamp: '2026-01-01T00:00:00Z'}
spec: {subdomain: web, upstream: {url: 'http://web:80'}}
",
        );
        let inputs = Inputs {
            tunnels: &tunnels,
            ..Inputs::default()
        };
        let plan = plan(
            &inputs,
            &services(SERVICES),
            &PlanOptions::cluster("tuna.test"),
        );
        let host = &plan.hosts["web.tuna.test"];
        assert_eq!(
            host.source,
            HostSource::Tunnel(ObjectRef::new(Kind::Tunnel, "shop", "z-old"))
        );
        assert_eq!(
            reasons(&plan),
            vec![("Tunnel shop/a-young".to_owned(), "HostConflict")]
        );
        assert_eq!(
            host.routes[0].backend.upstream.as_ref().unwrap().host,
            "10.0.0.1"
        );
    }

    /// A host on the account that no Domain reserves belongs to the namespace of
    /// its oldest claimant, Tunnel or Ingress: a younger Tunnel of another
    /// namespace cannot take it from an Ingress (issue 19, item 5), nor a
    /// younger Ingress from a Tunnel; in one namespace the Tunnel still wins.
    #[test]
    fn account_hosts_belong_to_the_oldest_claimant_across_kinds() {
        let ingress = |ns: &str, created: &str| {
            objects::<Ingress>(&format!(
                "
metadata: {{name: site, namespace: {ns}, creationTimestamp: '{created}'}}
spec:
  ingressClassName: tuna
  rules:
  - host: web.tuna.test
    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}]}}
"
            ))
        };
        let tunnel = |ns: &str, created: &str| {
            objects::<Tunnel>(&format!(
                "metadata: {{name: takeover, namespace: {ns}, creationTimestamp: '{created}'}}\nspec: {{subdomain: web, upstream: {{url: 'http://web:80'}}}}"
            ))
        };
        let mut options = PlanOptions::cluster("tuna.test");
        options.account_hosts.insert("web.tuna.test".into());
        let plan_with =
            |options: &PlanOptions, ingresses: &[Arc<Ingress>], tunnels: &[Arc<Tunnel>]| {
                let inputs = Inputs {
                    ingresses,
                    tunnels,
                    ..Inputs::default()
                };
                plan(&inputs, &services(SERVICES), options)
            };
        let run = |ingresses: &[Arc<Ingress>], tunnels: &[Arc<Tunnel>]| {
            plan_with(&options, ingresses, tunnels)
        };
        let (old, young) = ("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z");

        // The older Ingress of blog keeps the host; the Tunnel of shop is refused.
        let p = run(&ingress("blog", old), &tunnel("shop", young));
        let host = &p.hosts["web.tuna.test"];
        assert_eq!(
            host.source,
            HostSource::Ingresses(vec![ObjectRef::new(Kind::Ingress, "blog", "site")])
        );
        assert_eq!(
            reasons(&p),
            vec![(
                "Tunnel shop/takeover".to_owned(),
                "HostOwnedByOtherNamespace"
            )]
        );
        assert!(
            p.refusals[0]
                .message
                .contains(r#"belongs to namespace "blog", whose claim is the oldest"#),
            "{p:?}"
        );
        assert!(p.tunnels.is_empty());

        // The older Tunnel keeps the host against a younger Ingress of another namespace.
        let p = run(&ingress("blog", young), &tunnel("shop", old));
        assert_eq!(
            p.hosts["web.tuna.test"].source,
            HostSource::Tunnel(ObjectRef::new(Kind::Tunnel, "shop", "takeover"))
        );
        assert_eq!(
            reasons(&p),
            vec![(
                "Ingress blog/site rule 0 path 0".to_owned(),
                "HostOwnedByOtherNamespace"
            )]
        );

        // One namespace: the Tunnel publishes the host whatever the ages.
        let p = run(&ingress("shop", old), &tunnel("shop", young));
        assert_eq!(
            reasons(&p),
            vec![(
                "Ingress shop/site rule 0 path 0".to_owned(),
                "HostUsedByTunnel"
            )]
        );

        // A host the account does not hold: the Ingress cannot serve it, so it
        // does not keep the Tunnel out.
        let p = plan_with(
            &PlanOptions::cluster("tuna.test"),
            &ingress("blog", old),
            &tunnel("shop", young),
        );
        assert!(p.tunnels.len() == 1, "{:?}", reasons(&p));
    }

    /// A Service `web` in each namespace the claim tests use.
    const WEB: &str = "
metadata: {name: web, namespace: team-a}
spec: {clusterIP: 10.0.2.1, ports: [{port: 80}]}
---
metadata: {name: web, namespace: team-b}
spec: {clusterIP: 10.0.2.2, ports: [{port: 80}]}
---
metadata: {name: web, namespace: a}
spec: {clusterIP: 10.0.2.3, ports: [{port: 80}]}
---
metadata: {name: web, namespace: b}
spec: {clusterIP: 10.0.2.4, ports: [{port: 80}]}
";

    /// A claim book holding `H` for `namespace`.
    fn held(host: &str, namespace: &str) -> claims::ClaimBook {
        let mut book = claims::ClaimBook::default();
        book.hosts.insert(
            host.into(),
            claims::ClaimBook::held(namespace, 1_750_000_000),
        );
        book
    }

    /// Issue 30, item 2, and issue 37, items 1 and 2: a host stays with the
    /// namespace the agent recorded as holding it, not with the oldest
    /// object: adding the host to an older Ingress or Tunnel of another
    /// namespace does not move it, whatever the kinds; a tenant's annotation
    /// is not a record.
    #[test]
    fn a_host_stays_with_its_recorded_holder_not_the_oldest_object() {
        const H: &str = "shop.a.2na.am";
        let forged = format!(
            ", annotations: {{k8s.tuna.am/hosts-claimed-at: '{{\"{H}\":\"2000-01-01T00:00:00Z\"}}'}}"
        );
        let ingress = |ns: &str, created: &str, extra: &str| {
            objects::<Ingress>(&format!(
                "
metadata: {{name: site, namespace: {ns}, creationTimestamp: '{created}'{extra}}}
spec:
  ingressClassName: tuna
  rules:
  - host: {H}
    http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}]}}
"
            ))
            .remove(0)
        };
        let tunnel = |ns: &str, created: &str| {
            objects::<Tunnel>(&format!(
                "metadata: {{name: tun, namespace: {ns}, creationTimestamp: '{created}'}}\nspec: {{subdomain: shop, upstream: {{url: 'http://web:80'}}}}"
            ))
            .remove(0)
        };
        let mut options = PlanOptions::cluster("a.2na.am");
        options.account_hosts.insert(H.into());
        let run = |ingresses: Vec<Arc<Ingress>>,
                   tunnels: Vec<Arc<Tunnel>>,
                   book: Option<&claims::ClaimBook>| {
            let inputs = Inputs {
                ingresses: &ingresses,
                tunnels: &tunnels,
                claims: book,
                ..Inputs::default()
            };
            plan(&inputs, &services(WEB), &options)
        };
        let owner = |p: &Plan| p.hosts.get(H).map(|h| h.namespace.clone());
        let (y2023, y2025) = ("2023-01-01T00:00:00Z", "2025-01-01T00:00:00Z");
        let b = held(H, "team-b");

        // Ingress vs Ingress: team-b holds H; team-a's 2023 Ingress adds H
        // (with a forged record): team-b keeps it, team-a is refused.
        let p = run(
            vec![
                ingress("team-a", y2023, &forged),
                ingress("team-b", y2025, ""),
            ],
            vec![],
            Some(&b),
        );
        assert_eq!(owner(&p).as_deref(), Some("team-b"));
        assert_eq!(
            reasons(&p),
            vec![(
                "Ingress team-a/site rule 0 path 0".to_owned(),
                "HostOwnedByOtherNamespace"
            )]
        );
        assert_eq!(p.owners[H].held, claims::Held::Recorded(1_750_000_000));
        // The forged annotation alone, nothing recorded: the older object.
        let p = run(
            vec![
                ingress("team-a", y2025, &forged),
                ingress("team-b", y2023, ""),
            ],
            vec![],
            None,
        );
        assert_eq!(owner(&p).as_deref(), Some("team-b"));
        // The holder's objects gone: the record is void, the host is free.
        let p = run(vec![ingress("team-a", y2023, "")], vec![], Some(&b));
        assert_eq!(owner(&p).as_deref(), Some("team-a"));

        // An older Tunnel of team-a taking the subdomain of team-b's Ingress.
        let p = run(
            vec![ingress("team-b", y2025, "")],
            vec![tunnel("team-a", y2023)],
            Some(&b),
        );
        assert_eq!(owner(&p).as_deref(), Some("team-b"));
        assert_eq!(
            reasons(&p),
            vec![("Tunnel team-a/tun".to_owned(), "HostOwnedByOtherNamespace")]
        );
        // An older Ingress of team-a adding the host of team-b's Tunnel.
        let p = run(
            vec![ingress("team-a", y2023, "")],
            vec![tunnel("team-b", y2025)],
            Some(&b),
        );
        assert_eq!(owner(&p).as_deref(), Some("team-b"));
        assert_eq!(
            reasons(&p),
            vec![(
                "Ingress team-a/site rule 0 path 0".to_owned(),
                "HostOwnedByOtherNamespace"
            )]
        );
        // An older Tunnel of team-a switching to the subdomain of team-b's Tunnel.
        let p = run(
            vec![],
            vec![tunnel("team-a", y2023), tunnel("team-b", y2025)],
            Some(&b),
        );
        assert_eq!(owner(&p).as_deref(), Some("team-b"));
        assert_eq!(
            reasons(&p),
            vec![("Tunnel team-a/tun".to_owned(), "HostOwnedByOtherNamespace")]
        );
        // Issue 37, item 1(d): team-b's Ingress does not serve right now (its
        // Service is gone for a redeploy); it still names the host, so
        // team-a's older Tunnel does not get it.
        let p = plan(
            &Inputs {
                ingresses: &[ingress("team-b", y2025, "")],
                tunnels: &[tunnel("team-a", y2023)],
                claims: Some(&b),
                ..Inputs::default()
            },
            &services(
                "metadata: {name: web, namespace: team-a}\nspec: {clusterIP: 10.0.2.1, ports: [{port: 80}]}",
            ),
            &options,
        );
        assert!(!p.hosts.contains_key(H), "{:?}", p.hosts.keys());
        assert!(p.tunnels.is_empty(), "{:?}", reasons(&p));
        assert_eq!(p.owners[H].namespace, "team-b");

        // First claims in one plan (nothing recorded, e.g. at an upgrade): the
        // older object, then namespace and name.
        let p = run(
            vec![ingress("team-a", y2025, ""), ingress("team-b", y2023, "")],
            vec![],
            None,
        );
        assert_eq!(owner(&p).as_deref(), Some("team-b"));
        let p = run(
            vec![ingress("team-b", y2023, ""), ingress("team-a", y2023, "")],
            vec![],
            None,
        );
        assert_eq!(owner(&p).as_deref(), Some("team-a"));
        let p = run(
            vec![ingress("team-b", y2023, "")],
            vec![tunnel("team-a", y2023)],
            None,
        );
        assert_eq!(owner(&p).as_deref(), Some("team-a"));
    }

    /// The rule as a property, over every combination of two claimants of
    /// one host in two namespaces (kinds, ages, the recorded holder): a
    /// recorded holder keeps the host against any claim; otherwise the older
    /// object, then the namespace. The loser is always refused.
    #[test]
    fn a_recorded_holder_is_never_displaced_by_a_later_claim() {
        const H: &str = "shop.a.2na.am";
        let created = ["2023-01-01T00:00:00Z", "2025-01-01T00:00:00Z"];
        let meta = |ns: &str, c: &str| ObjectMeta {
            name: Some("x".into()),
            namespace: Some(ns.into()),
            creation_timestamp: Some(serde_json::from_value(serde_json::json!(c)).unwrap()),
            ..ObjectMeta::default()
        };
        let mut options = PlanOptions::cluster("a.2na.am");
        options.account_hosts.insert(H.into());
        let rule = serde_json::json!({"ingressClassName": "tuna", "rules": [{"host": H, "http": {"paths": [
            {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]});
        let mut cases = 0;
        for a_is_tunnel in [false, true] {
            for b_is_tunnel in [false, true] {
                for holder in [None, Some("a"), Some("b")] {
                    for (a_c, b_c) in created
                        .iter()
                        .flat_map(|a| created.iter().map(move |b| (a, b)))
                    {
                        let (mut ingresses, mut tunnels) = (Vec::new(), Vec::new());
                        for (ns, is_tunnel, c) in [("a", a_is_tunnel, a_c), ("b", b_is_tunnel, b_c)]
                        {
                            let m = meta(ns, c);
                            if is_tunnel {
                                let mut t: Tunnel = serde_json::from_value(serde_json::json!({
                                    "metadata": {},
                                    "spec": {"subdomain": "shop", "upstream": {"url": "http://web:80"}}
                                }))
                                .unwrap();
                                t.metadata = m;
                                tunnels.push(Arc::new(t));
                            } else {
                                let mut i: Ingress = serde_json::from_value(
                                    serde_json::json!({ "metadata": {}, "spec": rule }),
                                )
                                .unwrap();
                                i.metadata = m;
                                ingresses.push(Arc::new(i));
                            }
                        }
                        let book = holder.map(|ns| held(H, ns));
                        let inputs = Inputs {
                            ingresses: &ingresses,
                            tunnels: &tunnels,
                            claims: book.as_ref(),
                            ..Inputs::default()
                        };
                        let p = plan(&inputs, &services(WEB), &options);
                        let owner = p.hosts.get(H).map(|h| h.namespace.as_str());
                        let expected = holder.unwrap_or(if a_c <= b_c { "a" } else { "b" });
                        assert_eq!(
                            owner,
                            Some(expected),
                            "a: tunnel={a_is_tunnel} created={a_c}; b: tunnel={b_is_tunnel} created={b_c}; holder {holder:?}; {:?}",
                            reasons(&p)
                        );
                        let loser = if expected == "a" { "b" } else { "a" };
                        assert!(
                            p.refusals.iter().any(|r| r.object.namespace == loser
                                && r.reason.as_str() == "HostOwnedByOtherNamespace"),
                            "{:?}",
                            reasons(&p)
                        );
                        cases += 1;
                    }
                }
            }
        }
        assert_eq!(cases, 4 * 3 * 4);
    }

    /// Issue 37, item 3: a TCP endpoint belongs to one namespace whether it
    /// is named by alias, by port number, by the same digits as a string or
    /// by a Gateway TCP listener's name; an alias no TCPEndpoint declares is
    /// held like a host (recorded, not by age).
    #[test]
    fn a_tcp_endpoint_is_taken_by_no_name_of_it() {
        let endpoints = objects::<TcpEndpoint>(
            "
metadata: {name: pg, namespace: team-b, creationTimestamp: '2026-01-01T00:00:00Z'}
spec: {alias: pg}
status: {port: 30001}
",
        );
        let tunnel = |ns: &str, name: &str, created: &str, poa: &str| {
            format!(
                "metadata: {{name: {name}, namespace: {ns}, creationTimestamp: '{created}'}}\nspec: {{protocol: tcp, portOrAlias: {poa}, upstream: {{url: 'tcp://web:80'}}}}"
            )
        };
        let (old, new) = ("2025-01-01T00:00:00Z", "2026-02-01T00:00:00Z");
        let classes = objects::<tuna_crds::gateway::GatewayClass>(
            "metadata: {name: tuna}\nspec: {controllerName: k8s.tuna.am/gateway-controller}",
        );
        let gateways = objects::<tuna_crds::gateway::Gateway>(&format!(
            "
metadata: {{name: grab, namespace: team-a, creationTimestamp: '{old}'}}
spec:
  gatewayClassName: tuna
  listeners: [{{name: '30001', protocol: TCP, port: 5432}}]
"
        ));
        let mut b_holds_mqtt = claims::ClaimBook::default();
        b_holds_mqtt.tcp.insert(
            "mqtt".into(),
            claims::ClaimBook::held("team-b", 1_767_300_000),
        );
        let mut b_holds_port = claims::ClaimBook::default();
        b_holds_port.tcp.insert(
            "30002".into(),
            claims::ClaimBook::held("team-b", 1_767_300_000),
        );
        // (case, tunnels, with the Gateway, book, the key, the refused team-a object)
        #[allow(clippy::type_complexity)]
        let cases: Vec<(&str, String, bool, Option<&claims::ClaimBook>, &str, &str)> = vec![
            (
                "the port of team-b's TCPEndpoint, as a number",
                [
                    tunnel("team-b", "db", new, "pg"),
                    tunnel("team-a", "grab", old, "30001"),
                ]
                .join("\n---\n"),
                false,
                None,
                "30001",
                "Tunnel team-a/grab",
            ),
            (
                "the same port as a string",
                [
                    tunnel("team-b", "db", new, "pg"),
                    tunnel("team-a", "grab", old, "'30001'"),
                ]
                .join("\n---\n"),
                false,
                None,
                "30001",
                "Tunnel team-a/grab",
            ),
            (
                "a Gateway TCP listener named with its digits",
                tunnel("team-b", "db", new, "pg"),
                true,
                None,
                "30001",
                "Gateway team-a/grab",
            ),
            (
                "int against string, the holder recorded",
                [
                    tunnel("team-b", "db", new, "30002"),
                    tunnel("team-a", "grab", old, "'30002'"),
                ]
                .join("\n---\n"),
                false,
                Some(&b_holds_port),
                "30002",
                "Tunnel team-a/grab",
            ),
            (
                "an undeclared alias held by team-b, an older Tunnel edited to it (T2)",
                [
                    tunnel("team-b", "db", new, "mqtt"),
                    tunnel("team-a", "grab", old, "mqtt"),
                ]
                .join("\n---\n"),
                false,
                Some(&b_holds_mqtt),
                "mqtt",
                "Tunnel team-a/grab",
            ),
        ];
        for (case, tunnels, with_gateway, book, key, refused) in cases {
            let tunnels = objects::<Tunnel>(&tunnels);
            let gateway = if with_gateway {
                gateway_model::GatewayInputs {
                    classes: &classes,
                    gateways: &gateways,
                    ..Default::default()
                }
            } else {
                Default::default()
            };
            let inputs = Inputs {
                tunnels: &tunnels,
                tcp_endpoints: &endpoints,
                gateway,
                claims: book,
                ..Inputs::default()
            };
            let svc = services(WEB);
            let p = plan(&inputs, &svc, &PlanOptions::cluster("a.2na.am"));
            assert_eq!(p.tcp_owners[key].namespace, "team-b", "{case}");
            assert!(
                p.tcp.keys().all(|o| o.namespace == "team-b"),
                "{case}: {:?}",
                p.tcp
            );
            if with_gateway {
                let listener = &p.gateway.gateways[0].listeners[0];
                assert!(
                    !listener.conditions[0].status
                        && listener.conditions[0]
                            .message
                            .contains("belongs to namespace \"team-b\""),
                    "{case}: {listener:?}"
                );
            } else {
                assert!(
                    reasons(&p).contains(&(refused.to_owned(), "TcpEndpointOwnedByOtherNamespace")),
                    "{case}: {:?}",
                    reasons(&p)
                );
                assert!(p.tcp.keys().any(|o| o.namespace == "team-b"), "{case}");
            }
        }
    }

    /// The table of refusals for Ingresses: every cross-kind rule, each named
    /// by the object, rule and path it comes from.
    #[test]
    fn ingress_rules_are_refused_with_their_origin() {
        let ingresses = objects::<Ingress>(
            "
metadata: {name: shop, namespace: shop, creationTimestamp: '2026-01-01T00:00:00Z'}
spec:
  ingressClassName: tuna
  rules:
  - host: shop.tuna.test
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}},
                   {path: /api, pathType: Prefix, backend: {service: {name: api, port: {number: 8080}}}},
                   {path: /gone, pathType: Prefix, backend: {service: {name: missing, port: {number: 80}}}}]}
  - host: free.tuna.test
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
  - host: web.tuna.test
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
---
metadata: {name: thief, namespace: blog, creationTimestamp: '2025-01-01T00:00:00Z'}
spec:
  ingressClassName: tuna
  rules:
  - host: shop.tuna.test
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
---
metadata: {name: other, namespace: shop}
spec:
  ingressClassName: nginx
",
        );
        let domains = objects::<Domain>(
            "
metadata: {name: shop, namespace: shop}
spec: {subdomain: shop}
---
metadata: {name: web, namespace: shop}
spec: {subdomain: web}
",
        );
        let tunnels = objects::<Tunnel>(
            "
metadata: {name: web, namespace: shop}
spec: {subdomain: web, upstream: {url: 'http://web:80'}}
",
        );
        let inputs = Inputs {
            ingresses: &ingresses,
            tunnels: &tunnels,
            domains: &domains,
            ..Inputs::default()
        };
        let plan = plan(
            &inputs,
            &services(SERVICES),
            &PlanOptions::cluster("tuna.test"),
        );
        let mut got = reasons(&plan);
        got.sort();
        assert_eq!(
            got,
            vec![
                (
                    "Ingress blog/thief rule 0 path 0".to_owned(),
                    "HostOwnedByOtherNamespace"
                ),
                ("Ingress shop/other".to_owned(), "OtherIngressClass"),
                (
                    "Ingress shop/shop rule 0 path 2".to_owned(),
                    "ServiceNotFound"
                ),
                (
                    "Ingress shop/shop rule 1 path 0".to_owned(),
                    "HostNotReserved"
                ),
                (
                    "Ingress shop/shop rule 2 path 0".to_owned(),
                    "HostUsedByTunnel"
                ),
            ]
        );
        let shop = &plan.hosts["shop.tuna.test"];
        assert_eq!(shop.routes.len(), 2);
        assert_eq!(shop.namespace, "shop");
        assert_eq!(
            plan.hosts_of(&ObjectRef::new(Kind::Ingress, "shop", "shop")),
            vec!["shop.tuna.test".to_owned()]
        );
        let ingress_events: BTreeSet<&str> = plan
            .refusals
            .iter()
            .map(|r| r.reason.ingress_event())
            .collect();
        assert_eq!(
            ingress_events,
            BTreeSet::from(["BackendSkipped", "RuleSkipped"])
        );
    }

    /// Account hosts need no Domain; the default class takes class-less
    /// Ingresses; unchecked backends keep the Service as named.
    #[test]
    fn account_hosts_default_class_and_unchecked_backends() {
        let ingresses = objects::<Ingress>(
            "
metadata: {name: plain, namespace: shop}
spec:
  rules:
  - host: app.example.com
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: nowhere, port: {number: 80}}}}]}
",
        );
        let inputs = Inputs {
            ingresses: &ingresses,
            ..Inputs::default()
        };
        let mut options = PlanOptions::cluster("tuna.test");
        options.account_hosts.insert("app.example.com".into());
        let not_default = plan(&inputs, &services(""), &options);
        assert!(not_default.hosts.is_empty());
        options.ingress.is_default_class = true;
        options.backends = Backends::Unchecked;
        let unchecked = plan(&inputs, &services(""), &options);
        let route = &unchecked.hosts["app.example.com"].routes[0];
        assert_eq!(route.backend.to_string(), "shop/nowhere:80");
        assert!(route.backend.upstream.is_none());
        options.backends = Backends::Resolve;
        let resolved = plan(&inputs, &services(""), &options);
        assert_eq!(
            reasons(&resolved),
            vec![(
                "Ingress shop/plain rule 0 path 0".to_owned(),
                "ServiceNotFound"
            )]
        );
    }

    /// tcp Tunnels: own-namespace TCPEndpoints only, one Tunnel per endpoint
    /// (oldest wins), undeclared aliases left to the edge unless required.
    #[test]
    fn tcp_tunnels_and_endpoints() {
        let endpoints = objects::<TcpEndpoint>(
            "
metadata: {name: pg, namespace: shop}
spec: {alias: postgres}
---
metadata: {name: other, namespace: blog}
spec: {alias: redis}
",
        );
        let tunnels = objects::<Tunnel>(
            "
metadata: {name: pg, namespace: shop, creationTimestamp: '2026-01-01T00:00:00Z'}
spec: {protocol: tcp, portOrAlias: postgres, upstream: {url: 'tcp://api:8080'}}
---
metadata: {name: pg2, namespace: shop, creationTimestamp: '2026-01-02T00:00:00Z'}
spec: {protocol: tcp, portOrAlias: postgres, upstream: {url: 'tcp://api:8080'}}
---
metadata: {name: steal, namespace: shop}
spec: {protocol: tcp, portOrAlias: redis, upstream: {url: 'tcp://api:8080'}}
---
metadata: {name: account, namespace: shop}
spec: {protocol: tcp, portOrAlias: mqtt, upstream: {url: 'tcp://api:8080'}}
",
        );
        let inputs = Inputs {
            tunnels: &tunnels,
            tcp_endpoints: &endpoints,
            ..Inputs::default()
        };
        let mut options = PlanOptions::cluster("tuna.test");
        let cluster = plan(&inputs, &services(SERVICES), &options);
        let mut got = reasons(&cluster);
        got.sort();
        assert_eq!(
            got,
            vec![
                ("Tunnel shop/pg2".to_owned(), "TcpEndpointInUse"),
                (
                    "Tunnel shop/steal".to_owned(),
                    "TcpEndpointOwnedByOtherNamespace"
                ),
            ]
        );
        assert_eq!(cluster.tcp.len(), 2);
        options.require_tcp_endpoint_objects = true;
        let standalone = plan(&inputs, &services(SERVICES), &options);
        assert!(
            reasons(&standalone)
                .contains(&("Tunnel shop/account".to_owned(), "TcpEndpointNotFound"))
        );
    }
}
