//! Manifests → the desired state of a standalone process (pure).
//!
//! [`desired_state`] takes what [`crate::manifest`] loaded and returns what to
//! publish — HTTP hosts with their route tables, TCP endpoints, the tunnels whose
//! tokens must be held — plus every item it could not use, with a reason. The
//! rules are those of the provider-neutral [`crate::plan::plan`], which the
//! Kubernetes agent and `route explain` call too, with the standalone upstream
//! policy.
//!
//! Rules specific to standalone mode (documented for users in
//! `examples/standalone/README.md`):
//! - A `Domain` in the files reserves its host; a custom `domain:` is taken as
//!   verified (there is no DNS to check on a plain host).
//! - Ingress hosts must be reserved by a Domain of the Ingress's namespace, as in
//!   a cluster.
//! - An http Tunnel owns its host: Ingress rules for the same host are skipped
//!   (`HostUsedByTunnel`), and of two Tunnels with one host the oldest wins
//!   (then by namespace/name; objects read from files have no creation time, so
//!   that is namespace/name).
//! - A tcp Tunnel with an alias needs a `TCPEndpoint` with that alias in its
//!   namespace (there is no account to hold other reservations); a port number
//!   is used as given.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::networking::v1::Ingress;
use tuna_crds::gateway::{Gateway, GatewayClass, HttpRoute, ReferenceGrant, TcpRoute};
use tuna_crds::{Domain, TcpEndpoint, Tunnel};
use tuna_routing::RouteSpec;

use crate::edge::publisher::RouteBackend;
use crate::manifest::{Loaded, LoadedObject, Source};
use crate::plan::domain::DesiredDomain;
use crate::plan::ingress::{self, TranslateOptions};
use crate::plan::service::{ResolvedUpstream, ServiceIndex, ServiceInfo, UpstreamPolicy};
use crate::plan::tcpendpoint::DesiredTcpEndpoint;
use crate::plan::tunnel::{DesiredTunnel, PortOrAlias};
use crate::plan::{HostSource, Inputs, Kind, ObjectRef, PlanOptions, plan};

/// Settings of the translation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredOptions {
    /// Base domain of the (embedded) edge; `localhost` by default.
    pub base_domain: String,
    /// IngressClass served.
    pub ingress_class: String,
    /// Upstream policy; [`UpstreamPolicy::standalone`] by default.
    pub policy: UpstreamPolicy,
}

impl Default for DesiredOptions {
    fn default() -> Self {
        Self {
            base_domain: "localhost".to_owned(),
            ingress_class: ingress::DEFAULT_INGRESS_CLASS.to_owned(),
            policy: UpstreamPolicy::standalone(),
        }
    }
}

/// What published something: an Ingress or a Tunnel, by `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PublishedBy {
    /// An Ingress (one or more of the same namespace).
    Ingress(String),
    /// A Tunnel.
    Tunnel(String),
    /// An HTTPRoute (one or more of the same namespace).
    HttpRoute(String),
}

impl fmt::Display for PublishedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ingress(n) => write!(f, "Ingress {n}"),
            Self::Tunnel(n) => write!(f, "Tunnel {n}"),
            Self::HttpRoute(n) => write!(f, "HTTPRoute {n}"),
        }
    }
}

/// One HTTP route of a published host.
pub type HttpRouteSpec = RouteSpec<RouteBackend>;

/// A published HTTP host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedHost {
    /// Routes, in the order they were found (the route table decides matching).
    pub routes: Vec<HttpRouteSpec>,
    /// Who publishes it (sorted, deduplicated).
    pub publishers: Vec<PublishedBy>,
}

/// A published TCP endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedTcp {
    /// The endpoint, by port or alias.
    pub endpoint: PortOrAlias,
    /// Where the bytes go.
    pub upstream: ResolvedUpstream,
    /// Who publishes it: [`tcp_key`].
    pub tunnel: String,
}

/// The key of a published TCP endpoint: `namespace/name` for a tcp Tunnel,
/// `TCPRoute/namespace/name` for a TCPRoute (`TCPRoute` is no namespace
/// name, so the two never collide). It is also the tunnel's id: no spaces.
pub fn tcp_key(owner: &ObjectRef) -> String {
    match owner.kind {
        Kind::Tunnel => owner.key(),
        kind => format!("{}/{}", kind.as_str(), owner.key()),
    }
}

/// The object a [`tcp_key`] names, for messages: `Tunnel namespace/name` or
/// `TCPRoute namespace/name`.
pub fn tcp_owner(key: &str) -> String {
    match key.strip_prefix("TCPRoute/") {
        Some(rest) => format!("TCPRoute {rest}"),
        None => format!("Tunnel {key}"),
    }
}

/// Something in the files that is not served, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedItem {
    /// File and document, when known.
    pub source: Option<Source>,
    /// `Kind namespace/name` (or the file for broken documents).
    pub object: String,
    /// Machine-readable reason, e.g. `ServiceNotFound`.
    pub reason: String,
    /// What happened and what to do.
    pub message: String,
}

impl fmt::Display for SkippedItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.object, self.reason, self.message)?;
        if let Some(source) = &self.source {
            write!(f, " [{source}]")?;
        }
        Ok(())
    }
}

/// Everything a standalone process should serve.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DesiredState {
    /// Host → its routes.
    pub hosts: BTreeMap<String, PublishedHost>,
    /// tcp Tunnel or TCPRoute ([`tcp_key`]) → TCP endpoint.
    pub tcp: BTreeMap<String, PublishedTcp>,
    /// Domains reserved.
    pub domains: Vec<DesiredDomain>,
    /// TCP endpoints reserved.
    pub tcp_endpoints: Vec<DesiredTcpEndpoint>,
    /// Tunnels published (each holds a token at the edge), by `namespace/name`.
    pub tunnels: BTreeMap<String, DesiredTunnel>,
    /// What was not used, in file order where it has one.
    pub skipped: Vec<SkippedItem>,
}

const KINDS: &[(&str, &str)] = &[
    ("", "Service"),
    ("networking.k8s.io", "Ingress"),
    (tuna_crds::GROUP, "Tunnel"),
    (tuna_crds::GROUP, "Domain"),
    (tuna_crds::GROUP, "TCPEndpoint"),
    (crate::plan::gateway::GROUP, "GatewayClass"),
    (crate::plan::gateway::GROUP, "Gateway"),
    (crate::plan::gateway::GROUP, "HTTPRoute"),
    (crate::plan::gateway::GROUP, "TCPRoute"),
    (crate::plan::gateway::GROUP, "ReferenceGrant"),
    ("", "Namespace"),
];

fn object_label(o: &LoadedObject) -> String {
    format!("{} {}/{}", o.kind, o.namespace, o.name)
}

fn parse<K: serde::de::DeserializeOwned>(
    o: &LoadedObject,
    skipped: &mut Vec<SkippedItem>,
) -> Option<K> {
    match o.parse::<K>() {
        Ok(k) => Some(k),
        Err(e) => {
            skipped.push(SkippedItem {
                source: Some(o.source.clone()),
                object: object_label(o),
                reason: "InvalidObject".into(),
                message: e.message,
            });
            None
        }
    }
}

/// Computes the desired state (see the module docs): reads the manifests, then
/// asks the provider-neutral [`crate::plan::plan`] what to publish.
pub fn desired_state(loaded: &Loaded, options: &DesiredOptions) -> DesiredState {
    let mut state = DesiredState::default();
    for e in &loaded.errors {
        state.skipped.push(SkippedItem {
            source: Some(e.source.clone()),
            object: e.source.to_string(),
            reason: "InvalidManifest".into(),
            message: e.message.clone(),
        });
    }

    let mut services = Vec::new();
    let mut ingresses: Vec<Arc<Ingress>> = Vec::new();
    let mut tunnels: Vec<Arc<Tunnel>> = Vec::new();
    let mut domains: Vec<Arc<Domain>> = Vec::new();
    let mut endpoints: Vec<Arc<TcpEndpoint>> = Vec::new();
    let mut gateway_classes: Vec<Arc<GatewayClass>> = Vec::new();
    let mut gateways: Vec<Arc<Gateway>> = Vec::new();
    let mut http_routes: Vec<Arc<HttpRoute>> = Vec::new();
    let mut tcp_routes: Vec<Arc<TcpRoute>> = Vec::new();
    let mut grants: Vec<Arc<ReferenceGrant>> = Vec::new();
    let mut namespaces: Vec<Arc<Namespace>> = Vec::new();
    let mut sources: BTreeMap<ObjectRef, Source> = BTreeMap::new();
    let mut seen: BTreeSet<(String, String, String)> = BTreeSet::new();
    for o in &loaded.objects {
        let known = KINDS.iter().find(|(g, k)| o.is(g, k));
        let Some((_, kind)) = known else {
            state.skipped.push(SkippedItem {
                source: Some(o.source.clone()),
                object: object_label(o),
                reason: "UnsupportedKind".into(),
                message: format!(
                    "{} {} is not served in standalone mode (Service, Ingress, Tunnel, Domain, TCPEndpoint, GatewayClass, Gateway, HTTPRoute, TCPRoute, ReferenceGrant and Namespace are)",
                    o.api_version, o.kind
                ),
            });
            continue;
        };
        if !seen.insert((o.kind.clone(), o.namespace.clone(), o.name.clone())) {
            state.skipped.push(SkippedItem {
                source: Some(o.source.clone()),
                object: object_label(o),
                reason: "DuplicateObject".into(),
                message: "an object of this kind, namespace and name was already read; the first one is used".into(),
            });
            continue;
        }
        let mut remember = |kind: Kind| {
            sources.insert(
                ObjectRef::new(kind, o.namespace.clone(), o.name.clone()),
                o.source.clone(),
            );
        };
        match *kind {
            "Service" => {
                if let Some(s) = parse::<Service>(o, &mut state.skipped) {
                    services.push(ServiceInfo::from_service(&s));
                }
            }
            "Ingress" => {
                if let Some(i) = parse::<Ingress>(o, &mut state.skipped) {
                    remember(Kind::Ingress);
                    ingresses.push(Arc::new(i));
                }
            }
            "Tunnel" => {
                if let Some(t) = parse::<Tunnel>(o, &mut state.skipped) {
                    remember(Kind::Tunnel);
                    tunnels.push(Arc::new(t));
                }
            }
            "Domain" => {
                if let Some(d) = parse::<Domain>(o, &mut state.skipped) {
                    remember(Kind::Domain);
                    domains.push(Arc::new(d));
                }
            }
            "TCPEndpoint" => {
                if let Some(e) = parse::<TcpEndpoint>(o, &mut state.skipped) {
                    remember(Kind::TcpEndpoint);
                    endpoints.push(Arc::new(e));
                }
            }
            "GatewayClass" => {
                if let Some(c) = parse::<GatewayClass>(o, &mut state.skipped) {
                    remember(Kind::GatewayClass);
                    gateway_classes.push(Arc::new(c));
                }
            }
            "Gateway" => {
                if let Some(g) = parse::<Gateway>(o, &mut state.skipped) {
                    remember(Kind::Gateway);
                    gateways.push(Arc::new(g));
                }
            }
            "HTTPRoute" => {
                if let Some(r) = parse::<HttpRoute>(o, &mut state.skipped) {
                    remember(Kind::HttpRoute);
                    http_routes.push(Arc::new(r));
                }
            }
            "TCPRoute" => {
                if let Some(r) = parse::<TcpRoute>(o, &mut state.skipped) {
                    remember(Kind::TcpRoute);
                    tcp_routes.push(Arc::new(r));
                }
            }
            "ReferenceGrant" => {
                if let Some(g) = parse::<ReferenceGrant>(o, &mut state.skipped) {
                    grants.push(Arc::new(g));
                }
            }
            _ => {
                if let Some(n) = parse::<Namespace>(o, &mut state.skipped) {
                    namespaces.push(Arc::new(n));
                }
            }
        }
    }
    let services = ServiceIndex::new(services);
    let inputs = Inputs {
        ingresses: &ingresses,
        tunnels: &tunnels,
        domains: &domains,
        tcp_endpoints: &endpoints,
        gateway: crate::plan::gateway_model::GatewayInputs {
            classes: &gateway_classes,
            gateways: &gateways,
            http_routes: &http_routes,
            tcp_routes: &tcp_routes,
            grants: &grants,
            namespaces: &namespaces,
            certificates: None,
        },
        // Files have one author: nothing is recorded, so `route explain -f`
        // on the same files decides as standalone does.
        claims: None,
    };
    let mut plan_options = PlanOptions::standalone(&options.base_domain);
    plan_options.ingress = TranslateOptions::for_class(options.ingress_class.clone());
    plan_options.policy = options.policy;
    let plan = plan(&inputs, &services, &plan_options);

    for r in &plan.refusals {
        state.skipped.push(SkippedItem {
            source: sources.get(&r.object).cloned(),
            object: r.location(),
            reason: r.reason.as_str().into(),
            message: r.message.clone(),
        });
    }
    for (host, h) in plan.hosts {
        let routes = h
            .routes
            .into_iter()
            .map(|r| {
                let backend =
                    RouteBackend::of(&r.backend).expect("standalone plans resolve every backend");
                r.map_backend(|_| backend)
            })
            .collect();
        let publishers = match h.source {
            HostSource::Tunnel(t) => vec![PublishedBy::Tunnel(t.key())],
            HostSource::Ingresses(list) => list
                .into_iter()
                .map(|i| PublishedBy::Ingress(i.key()))
                .collect(),
            HostSource::HttpRoutes(list) => list
                .into_iter()
                .map(|r| PublishedBy::HttpRoute(r.key()))
                .collect(),
        };
        state
            .hosts
            .insert(host, PublishedHost { routes, publishers });
    }
    for (owner, t) in plan.tcp {
        let key = tcp_key(&owner);
        state.tcp.insert(
            key.clone(),
            PublishedTcp {
                endpoint: t.endpoint,
                upstream: t.upstream,
                tunnel: key,
            },
        );
    }
    state.domains = plan.domains;
    state.tcp_endpoints = plan.tcp_endpoints;
    state.tunnels = plan
        .tunnels
        .into_iter()
        .map(|(k, t)| (k.key(), t))
        .collect();
    state
}
