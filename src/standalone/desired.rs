//! Manifests → the desired state of a standalone process (pure).
//!
//! [`desired_state`] takes what [`crate::manifest`] loaded and returns what to
//! publish — HTTP hosts with their route tables, TCP endpoints, the tunnels whose
//! tokens must be held — plus every item it could not use, with a reason. It
//! calls the same translation functions as the Kubernetes reconcilers
//! (`crate::translate`), with the standalone upstream policy.
//!
//! Rules specific to standalone mode (documented for users in
//! `examples/standalone/README.md`):
//! - A `Domain` in the files reserves its host; a custom `domain:` is taken as
//!   verified (there is no DNS to check on a plain host).
//! - Ingress hosts must be reserved by a Domain of the Ingress's namespace, as in
//!   a cluster.
//! - An http Tunnel owns its host: Ingress rules for the same host are skipped
//!   (`HostUsedByTunnel`), and of two Tunnels with one host the first (by
//!   namespace/name) wins.
//! - A tcp Tunnel with an alias needs a `TCPEndpoint` with that alias in its
//!   namespace (there is no account to hold other reservations); a port number
//!   is used as given.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::Ingress;
use tuna_crds::{Domain, TcpEndpoint, Tunnel};
use tuna_routing::{PathType, RouteSpec, RouteTable};

use crate::manifest::{Loaded, LoadedObject, Source};
use crate::translate::domain::{DesiredDomain, HostReservations, desired_domain, reserved_routes};
use crate::translate::ingress::{self, TranslateOptions};
use crate::translate::service::{
    ResolvedUpstream, ServiceIndex, ServiceInfo, UpstreamPolicy, UpstreamScheme, resolve_service,
};
use crate::translate::tcpendpoint::{AliasOwners, DesiredTcpEndpoint, desired_tcp_endpoint};
use crate::translate::tunnel::{
    DesiredTunnel, PortOrAlias, PublicEndpoint, TunnelOptions, desired_tunnel,
};

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
pub enum Publisher {
    /// An Ingress (one or more of the same namespace).
    Ingress(String),
    /// A Tunnel.
    Tunnel(String),
}

impl fmt::Display for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ingress(n) => write!(f, "Ingress {n}"),
            Self::Tunnel(n) => write!(f, "Tunnel {n}"),
        }
    }
}

/// One HTTP route of a published host.
pub type HttpRouteSpec = RouteSpec<ResolvedUpstream>;

/// A published HTTP host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedHost {
    /// Routes, in the order they were found (the route table decides matching).
    pub routes: Vec<HttpRouteSpec>,
    /// Who publishes it (sorted, deduplicated).
    pub publishers: Vec<Publisher>,
}

/// A published TCP endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedTcp {
    /// The endpoint, by port or alias.
    pub endpoint: PortOrAlias,
    /// Where the bytes go.
    pub upstream: ResolvedUpstream,
    /// The Tunnel, `namespace/name`.
    pub tunnel: String,
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
    /// Tunnel (`namespace/name`) → TCP endpoint.
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

/// Computes the desired state (see the module docs).
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
    let mut ingresses: Vec<(Ingress, Source)> = Vec::new();
    let mut tunnels: Vec<(Tunnel, Source)> = Vec::new();
    let mut domains = Vec::new();
    let mut endpoints = Vec::new();
    let mut seen: BTreeSet<(String, String, String)> = BTreeSet::new();
    for o in &loaded.objects {
        let known = KINDS.iter().find(|(g, k)| o.is(g, k));
        let Some((_, kind)) = known else {
            state.skipped.push(SkippedItem {
                source: Some(o.source.clone()),
                object: object_label(o),
                reason: "UnsupportedKind".into(),
                message: format!(
                    "{} {} is not served in standalone mode (Service, Ingress, Tunnel, Domain and TCPEndpoint are)",
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
        match *kind {
            "Service" => {
                if let Some(s) = parse::<Service>(o, &mut state.skipped) {
                    services.push(ServiceInfo::from_service(&s));
                }
            }
            "Ingress" => {
                if let Some(i) = parse::<Ingress>(o, &mut state.skipped) {
                    ingresses.push((i, o.source.clone()));
                }
            }
            "Tunnel" => {
                if let Some(t) = parse::<Tunnel>(o, &mut state.skipped) {
                    tunnels.push((t, o.source.clone()));
                }
            }
            "Domain" => {
                if let Some(d) = parse::<Domain>(o, &mut state.skipped) {
                    domains.push((d, o.source.clone()));
                }
            }
            _ => {
                if let Some(e) = parse::<TcpEndpoint>(o, &mut state.skipped) {
                    endpoints.push((e, o.source.clone()));
                }
            }
        }
    }
    let services = ServiceIndex::new(services);

    // Domains → reservations.
    let mut domain_sources = BTreeMap::new();
    let mut desired_domains = Vec::new();
    for (d, source) in &domains {
        let label = format!(
            "Domain {}/{}",
            d.metadata.namespace.as_deref().unwrap_or("default"),
            d.metadata.name.as_deref().unwrap_or("")
        );
        match desired_domain(d, &options.base_domain) {
            Ok(dd) => {
                domain_sources.insert((dd.namespace.clone(), dd.name.clone()), source.clone());
                desired_domains.push(dd);
            }
            Err(e) => state.skipped.push(SkippedItem {
                source: Some(source.clone()),
                object: label,
                reason: e.reason.as_str().into(),
                message: e.message,
            }),
        }
    }
    let (reservations, duplicates) =
        HostReservations::from_domains(&desired_domains, BTreeSet::new());
    for (dd, e) in duplicates {
        state.skipped.push(SkippedItem {
            source: domain_sources
                .get(&(dd.namespace.clone(), dd.name.clone()))
                .cloned(),
            object: format!("Domain {}/{}", dd.namespace, dd.name),
            reason: e.reason.as_str().into(),
            message: e.message,
        });
        desired_domains.retain(|d| !(d.namespace == dd.namespace && d.name == dd.name));
    }
    state.domains = desired_domains;

    // TCPEndpoints → aliases.
    let mut desired_endpoints = Vec::new();
    let mut endpoint_sources = BTreeMap::new();
    for (e, source) in &endpoints {
        let label = format!(
            "TCPEndpoint {}/{}",
            e.metadata.namespace.as_deref().unwrap_or("default"),
            e.metadata.name.as_deref().unwrap_or("")
        );
        match desired_tcp_endpoint(e) {
            Ok(de) => {
                endpoint_sources.insert((de.namespace.clone(), de.name.clone()), source.clone());
                desired_endpoints.push(de);
            }
            Err(err) => state.skipped.push(SkippedItem {
                source: Some(source.clone()),
                object: label,
                reason: err.reason.as_str().into(),
                message: err.message,
            }),
        }
    }
    let (aliases, duplicates) = AliasOwners::new(&desired_endpoints);
    for (de, e) in duplicates {
        state.skipped.push(SkippedItem {
            source: endpoint_sources
                .get(&(de.namespace.clone(), de.name.clone()))
                .cloned(),
            object: format!("TCPEndpoint {}/{}", de.namespace, de.name),
            reason: e.reason.as_str().into(),
            message: e.message,
        });
        desired_endpoints.retain(|d| !(d.namespace == de.namespace && d.name == de.name));
    }
    state.tcp_endpoints = desired_endpoints;

    // Tunnels.
    let tunnel_options = TunnelOptions {
        base_domain: options.base_domain.clone(),
        policy: options.policy,
    };
    let mut tunnel_hosts: BTreeMap<String, String> = BTreeMap::new();
    let mut tcp_claims: BTreeMap<PortOrAlias, String> = BTreeMap::new();
    tunnels.sort_by(|a, b| {
        (&a.0.metadata.namespace, &a.0.metadata.name)
            .cmp(&(&b.0.metadata.namespace, &b.0.metadata.name))
    });
    for (t, source) in &tunnels {
        let key = format!(
            "{}/{}",
            t.metadata.namespace.as_deref().unwrap_or("default"),
            t.metadata.name.as_deref().unwrap_or("")
        );
        let skip = |reason: &str, message: String| SkippedItem {
            source: Some(source.clone()),
            object: format!("Tunnel {key}"),
            reason: reason.into(),
            message,
        };
        let desired = match desired_tunnel(t, &services, &reservations, &aliases, &tunnel_options) {
            Ok(d) => d,
            Err(e) => {
                state.skipped.push(skip(e.reason.as_str(), e.message));
                continue;
            }
        };
        match &desired.public {
            PublicEndpoint::Http { host } => {
                if let Some(first) = tunnel_hosts.get(host) {
                    state.skipped.push(skip(
                        "HostConflict",
                        format!("host {host} is already published by Tunnel {first}"),
                    ));
                    continue;
                }
                tunnel_hosts.insert(host.clone(), key.clone());
                state.hosts.insert(
                    host.clone(),
                    PublishedHost {
                        routes: vec![RouteSpec {
                            host: host.clone(),
                            path: "/".into(),
                            path_type: PathType::Prefix,
                            backend: desired.upstream.clone(),
                            origin: tuna_routing::Origin {
                                namespace: desired.namespace.clone(),
                                name: desired.name.clone(),
                                rule: 0,
                                path: 0,
                            },
                            tie_break: tuna_routing::TieBreak {
                                created: 0,
                                namespace: desired.namespace.clone(),
                                name: desired.name.clone(),
                            },
                        }],
                        publishers: vec![Publisher::Tunnel(key.clone())],
                    },
                );
            }
            PublicEndpoint::Tcp(endpoint) => {
                if let PortOrAlias::Alias(alias) = endpoint
                    && aliases.get(alias).is_none()
                {
                    state.skipped.push(skip(
                        "TcpEndpointNotFound",
                        format!("no TCPEndpoint with alias {alias} in namespace {:?}; add one to the files", desired.namespace),
                    ));
                    continue;
                }
                if let Some(first) = tcp_claims.get(endpoint) {
                    state.skipped.push(skip(
                        "TcpEndpointInUse",
                        format!("{endpoint} is already used by Tunnel {first}"),
                    ));
                    continue;
                }
                tcp_claims.insert(endpoint.clone(), key.clone());
                state.tcp.insert(
                    key.clone(),
                    PublishedTcp {
                        endpoint: endpoint.clone(),
                        upstream: desired.upstream.clone(),
                        tunnel: key.clone(),
                    },
                );
            }
        }
        state.tunnels.insert(key, desired);
    }

    // Ingresses.
    let ingress_sources: BTreeMap<(String, String), Source> = ingresses
        .iter()
        .map(|(i, s)| {
            (
                (
                    i.metadata.namespace.clone().unwrap_or_default(),
                    i.metadata.name.clone().unwrap_or_default(),
                ),
                s.clone(),
            )
        })
        .collect();
    let source_of = |ns: &str, name: &str| {
        ingress_sources
            .get(&(ns.to_owned(), name.to_owned()))
            .cloned()
    };
    let ingress_objects: Vec<Ingress> = ingresses.into_iter().map(|(i, _)| i).collect();
    let routes = ingress::translate(
        &ingress_objects,
        &TranslateOptions {
            class: options.ingress_class.clone(),
        },
        &reservations.domains,
    );
    let (routes, unreserved) = reserved_routes(routes, &reservations);
    for s in &routes.skipped {
        let mut object = format!("Ingress {}/{}", s.namespace, s.ingress);
        if let Some(rule) = s.rule {
            object.push_str(&format!(" rule {rule}"));
        }
        if let Some(path) = s.path {
            object.push_str(&format!(" path {path}"));
        }
        state.skipped.push(SkippedItem {
            source: source_of(&s.namespace, &s.ingress),
            object,
            reason: s.reason.as_str().into(),
            message: s.message.clone(),
        });
    }
    let route_label = |o: &tuna_routing::Origin| {
        format!(
            "Ingress {}/{} rule {} path {}",
            o.namespace, o.name, o.rule, o.path
        )
    };
    for u in unreserved {
        state.skipped.push(SkippedItem {
            source: source_of(&u.spec.origin.namespace, &u.spec.origin.name),
            object: route_label(&u.spec.origin),
            reason: u.refusal.as_str().into(),
            message: u.refusal.message(&u.spec.host),
        });
    }
    let mut by_host: BTreeMap<String, Vec<HttpRouteSpec>> = BTreeMap::new();
    for spec in routes.specs {
        let host = spec.host.to_ascii_lowercase();
        if let Some(tunnel) = tunnel_hosts.get(&host) {
            state.skipped.push(SkippedItem {
                source: source_of(&spec.origin.namespace, &spec.origin.name),
                object: route_label(&spec.origin),
                reason: "HostUsedByTunnel".into(),
                message: format!("host {host} is published by Tunnel {tunnel}"),
            });
            continue;
        }
        match resolve_service(
            &spec.backend,
            &spec.origin.namespace,
            UpstreamScheme::Http,
            &services,
            &options.policy,
        ) {
            Ok(upstream) => by_host.entry(host.clone()).or_default().push(RouteSpec {
                host,
                path: spec.path,
                path_type: spec.path_type,
                backend: upstream,
                origin: spec.origin,
                tie_break: spec.tie_break,
            }),
            Err(e) => state.skipped.push(SkippedItem {
                source: source_of(&spec.origin.namespace, &spec.origin.name),
                object: route_label(&spec.origin),
                reason: e.reason.as_str().into(),
                message: e.message,
            }),
        }
    }
    // Invalid paths and equal rules are found by building the table, exactly as
    // the proxy core will; report them now and publish only what will route.
    for (host, specs) in by_host {
        let issues = match RouteTable::build(specs.clone()) {
            Ok((_, issues)) => issues,
            Err(e) => {
                state.skipped.push(SkippedItem {
                    source: None,
                    object: format!("host {host}"),
                    reason: "TooManyRoutes".into(),
                    message: e.to_string(),
                });
                continue;
            }
        };
        let mut kept = specs;
        for issue in &issues {
            let origin = issue.origin();
            kept.retain(|s| &s.origin != origin);
            state.skipped.push(SkippedItem {
                source: source_of(&origin.namespace, &origin.name),
                object: route_label(origin),
                reason: issue.reason().into(),
                message: issue.to_string(),
            });
        }
        if kept.is_empty() {
            continue;
        }
        let mut publishers: Vec<Publisher> = kept
            .iter()
            .map(|s| Publisher::Ingress(format!("{}/{}", s.origin.namespace, s.origin.name)))
            .collect();
        publishers.sort();
        publishers.dedup();
        state.hosts.insert(
            host,
            PublishedHost {
                routes: kept,
                publishers,
            },
        );
    }
    state
}
