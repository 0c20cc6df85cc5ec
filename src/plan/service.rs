//! Upstream URLs and Service references → addresses the proxy core can dial.
//!
//! A Tunnel names its upstream as a URL (`http://web:80`, `tcp://db:postgres`)
//! and an Ingress names Service backends; both must end up as a host and a port
//! plus the Service port's `appProtocol` (so `kubernetes.io/h2c` reaches the proxy
//! as "speak HTTP/2 cleartext"). This module is pure: the Services are passed in
//! as a [`ServiceIndex`].
//!
//! # Security (DESIGN §3)
//!
//! Tunnels and Ingresses publish Services of their own namespace only. IP
//! addresses, external host names, Services of other namespaces and
//! `ExternalName` Services are refused with a machine-readable
//! [`UpstreamReason`], unless the [`UpstreamPolicy`] allows them (the chart's
//! `agentManager.allowExternalUpstreams`, or standalone mode, see below).
//!
//! # Where the address comes from
//!
//! - [`Addressing::Cluster`]: the Service's `clusterIP` and Service `port`
//!   (kube-proxy forwards to a ready pod; the proxy dials an IP, so the pod's
//!   DNS resolver is never involved). A headless Service (`clusterIP: None`) is
//!   dialled at the ready addresses of its EndpointSlices
//!   ([`ServiceInfo::headless`], read by the caller) on the endpoint port of the
//!   same name; without a ready endpoint it is refused.
//! - [`Addressing::Standalone`]: there is no cluster, so a `Service` manifest in the
//!   files *is* the mapping: `spec.externalName` of a `type: ExternalName` Service
//!   (a host name or IP) or else `spec.clusterIP` gives the address, and the port
//!   is the numeric `targetPort` when one is set (the Service stands for its pods),
//!   else `port`. An `ExternalName` Service is the ordinary way to point at a local
//!   process here, so the standalone policy allows it. As in Kubernetes,
//!   `externalName` is ignored on a Service of another type.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;

use super::ingress::{ServicePort, ServiceRef};

/// Protocol of an upstream, from the URL scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum UpstreamScheme {
    /// `http://`: HTTP/1.1 (or h2c when the Service port's appProtocol says so).
    Http,
    /// `https://`: TLS to the upstream.
    Https,
    /// `tcp://`: raw bytes.
    Tcp,
}

impl UpstreamScheme {
    /// The URL scheme.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
            Self::Tcp => "tcp",
        }
    }

    fn default_port(self) -> Option<u16> {
        match self {
            Self::Http => Some(80),
            Self::Https => Some(443),
            Self::Tcp => None,
        }
    }
}

/// The host part of an upstream URL, classified.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum UpstreamHost {
    /// `name` or `name.ns`. The two-label form is a Service only when `ns` is the
    /// caller's namespace or that Service exists; otherwise it is an external
    /// name such as `example.com`.
    Service {
        /// Namespace named in the URL, `None` for a bare name (the Tunnel's own).
        namespace: Option<String>,
        /// Service name.
        name: String,
    },
    /// `name.ns.svc` or `name.ns.svc.cluster.local`: always a Service.
    ServiceFqdn {
        /// Namespace.
        namespace: String,
        /// Service name.
        name: String,
    },
    /// A literal IPv4 or IPv6 address.
    Ip(IpAddr),
    /// Any other host name (with dots, not of the Service forms above).
    External(String),
}

/// A parsed upstream URL (`scheme://host[:port]`, no path).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UpstreamUrl {
    /// Scheme.
    pub scheme: UpstreamScheme,
    /// Classified host.
    pub host: UpstreamHost,
    /// Port number or Service port name; `None` means the scheme's default.
    pub port: Option<ServicePort>,
}

/// A resolved upstream: what the proxy core dials.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ResolvedUpstream {
    /// Scheme (from the URL, or `http` for Ingress backends).
    pub scheme: UpstreamScheme,
    /// Host name or IP literal to connect to. Host names are resolved by the
    /// caller at apply time (the proxy core takes socket addresses).
    pub host: String,
    /// Port.
    pub port: u16,
    /// `appProtocol` of the Service port, e.g. `kubernetes.io/h2c`.
    pub app_protocol: Option<String>,
    /// The Service it came from (`namespace/name`), `None` for a literal address.
    pub service: Option<String>,
    /// For a headless Service: its ready endpoint addresses, dialled at `port`
    /// instead of `host` (empty otherwise).
    pub endpoints: Vec<IpAddr>,
}

impl ResolvedUpstream {
    /// `host:port`, with IPv6 literals bracketed.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Whether the upstream speaks HTTP/2 without TLS (gRPC backends).
    pub fn is_h2c(&self) -> bool {
        self.app_protocol.as_deref() == Some(APP_PROTOCOL_H2C)
    }
}

impl fmt::Display for ResolvedUpstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme.as_str(), self.authority())?;
        if let Some(app) = &self.app_protocol {
            write!(f, " ({app})")?;
        }
        if let Some(service) = &self.service {
            write!(f, " via Service {service}")?;
        }
        Ok(())
    }
}

/// The `appProtocol` that asks for HTTP/2 cleartext (KEP-3726).
pub const APP_PROTOCOL_H2C: &str = "kubernetes.io/h2c";

/// How Service addresses are found (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Addressing {
    /// `clusterIP:port`, as a pod in the cluster dials it.
    #[default]
    Cluster,
    /// `externalName` or `clusterIP`, at the numeric `targetPort` or `port`.
    Standalone,
}

/// What an upstream may point at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UpstreamPolicy {
    /// IP literals and external host names in upstream URLs.
    pub allow_addresses: bool,
    /// Services of another namespace.
    pub allow_other_namespaces: bool,
    /// `type: ExternalName` Services.
    pub allow_external_name: bool,
    /// Where Service addresses come from.
    pub addressing: Addressing,
}

impl UpstreamPolicy {
    /// In a cluster, default: own-namespace Services only.
    pub fn cluster() -> Self {
        Self::default()
    }

    /// In a cluster with `allowExternalUpstreams=true`: anything.
    pub fn cluster_allow_external() -> Self {
        Self {
            allow_addresses: true,
            allow_other_namespaces: true,
            allow_external_name: true,
            addressing: Addressing::Cluster,
        }
    }

    /// Standalone mode trusts its files: literal addresses and ExternalName
    /// Services are allowed (they are how a plain host names its backends), but a
    /// Service of another namespace is still refused, so manifests behave as they
    /// would in a cluster.
    pub fn standalone() -> Self {
        Self {
            allow_addresses: true,
            allow_other_namespaces: false,
            allow_external_name: true,
            addressing: Addressing::Standalone,
        }
    }
}

/// Why an upstream was refused; the variant name is the machine-readable reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum UpstreamReason {
    /// Not `scheme://host[:port]`.
    InvalidUpstreamUrl,
    /// Not http, https or tcp.
    UnsupportedScheme,
    /// An IP literal and addresses are not allowed.
    IpAddressUpstream,
    /// A host name outside the cluster and addresses are not allowed.
    ExternalHostUpstream,
    /// A Service of another namespace.
    OtherNamespaceService,
    /// No such Service.
    ServiceNotFound,
    /// The Service has no such port.
    ServicePortNotFound,
    /// `type: ExternalName` and not allowed.
    ExternalNameService,
    /// `clusterIP: None`, or no address at all (standalone).
    ServiceWithoutAddress,
}

impl UpstreamReason {
    /// The Service named is missing or unusable (as opposed to a refused URL):
    /// something only a lookup of the Service can tell.
    pub fn is_about_the_service(self) -> bool {
        matches!(
            self,
            Self::ServiceNotFound | Self::ServicePortNotFound | Self::ServiceWithoutAddress
        )
    }

    /// Stable machine-readable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidUpstreamUrl => "InvalidUpstreamUrl",
            Self::UnsupportedScheme => "UnsupportedScheme",
            Self::IpAddressUpstream => "IpAddressUpstream",
            Self::ExternalHostUpstream => "ExternalHostUpstream",
            Self::OtherNamespaceService => "OtherNamespaceService",
            Self::ServiceNotFound => "ServiceNotFound",
            Self::ServicePortNotFound => "ServicePortNotFound",
            Self::ExternalNameService => "ExternalNameService",
            Self::ServiceWithoutAddress => "ServiceWithoutAddress",
        }
    }
}

/// A refused upstream: machine-readable reason plus a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{}: {message}", reason.as_str())]
pub struct UpstreamError {
    /// Machine-readable reason.
    pub reason: UpstreamReason,
    /// What happened and what to do.
    pub message: String,
}

fn err(reason: UpstreamReason, message: impl Into<String>) -> UpstreamError {
    UpstreamError {
        reason,
        message: message.into(),
    }
}

/// Parses `scheme://host[:port][/]`. Named ports (`http://web:http`) are allowed:
/// they name a Service port.
///
/// ```
/// use tuna_operator::plan::service::{parse_upstream_url, UpstreamHost, UpstreamScheme};
/// let url = parse_upstream_url("tcp://db.prod.svc.cluster.local:5432").unwrap();
/// assert_eq!(url.scheme, UpstreamScheme::Tcp);
/// assert_eq!(url.host, UpstreamHost::ServiceFqdn { namespace: "prod".into(), name: "db".into() });
/// ```
pub fn parse_upstream_url(url: &str) -> Result<UpstreamUrl, UpstreamError> {
    let invalid = |why: &str| {
        err(
            UpstreamReason::InvalidUpstreamUrl,
            format!("upstream URL {url:?} {why}; write scheme://service:port, e.g. http://web:80"),
        )
    };
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| invalid("has no scheme"))?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "http" => UpstreamScheme::Http,
        "https" => UpstreamScheme::Https,
        "tcp" => UpstreamScheme::Tcp,
        other => {
            return Err(err(
                UpstreamReason::UnsupportedScheme,
                format!("upstream scheme {other:?} is not supported; use http, https or tcp"),
            ));
        }
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#', '@']) {
        return Err(invalid(
            "has a path, query or user part; only scheme://host:port is supported",
        ));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (ip, after) = v6
            .split_once(']')
            .ok_or_else(|| invalid("has an unclosed '['"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| invalid("has junk after ']'"))?,
            ),
        };
        (ip, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(invalid("has no host"));
    }
    let port = match port {
        None => None,
        Some(p) if p.chars().all(|c| c.is_ascii_digit()) => match p.parse::<u16>() {
            Ok(n) if n > 0 => Some(ServicePort::Number(i32::from(n))),
            _ => return Err(invalid("has a port outside 1-65535")),
        },
        Some(p) if is_dns_label(p) => Some(ServicePort::Name(p.to_owned())),
        Some(_) => return Err(invalid("has an invalid port")),
    };
    let host = if let Ok(ip) = host.parse::<IpAddr>() {
        UpstreamHost::Ip(ip)
    } else {
        let lower = host.to_ascii_lowercase();
        let labels: Vec<&str> = lower.split('.').collect();
        if labels.iter().any(|l| !is_dns_label(l)) {
            return Err(invalid("has an invalid host name"));
        }
        match labels.as_slice() {
            [name] => UpstreamHost::Service {
                namespace: None,
                name: (*name).to_owned(),
            },
            [name, ns] => UpstreamHost::Service {
                namespace: Some((*ns).to_owned()),
                name: (*name).to_owned(),
            },
            [name, ns, "svc"] => UpstreamHost::ServiceFqdn {
                namespace: (*ns).to_owned(),
                name: (*name).to_owned(),
            },
            [name, ns, "svc", "cluster", "local"] => UpstreamHost::ServiceFqdn {
                namespace: (*ns).to_owned(),
                name: (*name).to_owned(),
            },
            _ => UpstreamHost::External(lower),
        }
    };
    Ok(UpstreamUrl { scheme, host, port })
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Whether `name` can be a Service's name: a DNS-1035 label (lower-case
/// letters, digits and `-`, at most 63, starting with a letter and ending
/// with a letter or digit), as the API server validates Service names.
///
/// Checked before any Service read: a name that cannot be a Service is not
/// found, without an API call (a Gateway API backendRef `name` has no
/// pattern in the CRDs, and `x y` cannot even be put in a request URL).
pub fn is_service_name(name: &str) -> bool {
    is_dns_label(name) && name.as_bytes()[0].is_ascii_lowercase()
}

/// Whether `namespace` can be a namespace's name (a DNS-1123 label).
pub fn is_namespace_name(namespace: &str) -> bool {
    is_dns_label(namespace)
}

/// One port of a Service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServicePortInfo {
    /// `name`.
    pub name: Option<String>,
    /// `port`.
    pub port: u16,
    /// Numeric `targetPort`, when set as a number.
    pub target_port: Option<u16>,
    /// `appProtocol`.
    pub app_protocol: Option<String>,
}

/// What the translation needs of a Service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServiceInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.type == ExternalName`.
    pub external_name: Option<String>,
    /// `spec.clusterIP` (`None` for absent and for `None`).
    pub cluster_ip: Option<String>,
    /// Ports.
    pub ports: Vec<ServicePortInfo>,
    /// For a headless Service (`clusterIP: None`): the ready addresses of its
    /// EndpointSlices, when the caller read them.
    pub headless: Option<HeadlessEndpoints>,
}

/// The ready endpoints of a headless Service, merged over its EndpointSlices.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HeadlessEndpoints {
    /// Addresses of endpoints whose `conditions.ready` is not false.
    pub addresses: Vec<IpAddr>,
    /// The slices' ports: name (matching the Service port's name) and number.
    pub ports: Vec<(Option<String>, u16)>,
}

impl HeadlessEndpoints {
    /// The endpoint port serving Service port `service_port`: the one of the same
    /// name, or the only one when the Service has a single unnamed port.
    fn port_for(&self, service_port: &ServicePortInfo) -> Option<u16> {
        self.ports
            .iter()
            .find(|(name, _)| name == &service_port.name)
            .or_else(|| match self.ports.as_slice() {
                [only] if service_port.name.is_none() => Some(only),
                _ => None,
            })
            .map(|(_, port)| *port)
    }
}

impl ServiceInfo {
    /// Reads a Service object; the namespace defaults to `default`.
    pub fn from_service(service: &Service) -> Self {
        let spec = service.spec.clone().unwrap_or_default();
        // Kubernetes ignores `externalName` unless the type is ExternalName; so do we.
        let external_name = match spec.type_.as_deref() {
            Some("ExternalName") => spec.external_name.clone().filter(|n| !n.is_empty()),
            _ => None,
        };
        let cluster_ip = spec
            .cluster_ip
            .clone()
            .filter(|ip| !ip.is_empty() && ip != "None");
        let ports = spec
            .ports
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| {
                Some(ServicePortInfo {
                    name: p.name.filter(|n| !n.is_empty()),
                    port: u16::try_from(p.port).ok().filter(|n| *n > 0)?,
                    target_port: match p.target_port {
                        Some(IntOrString::Int(n)) => u16::try_from(n).ok().filter(|n| *n > 0),
                        _ => None,
                    },
                    app_protocol: p.app_protocol,
                })
            })
            .collect();
        Self {
            namespace: service
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_owned()),
            name: service.metadata.name.clone().unwrap_or_default(),
            external_name,
            cluster_ip,
            ports,
            headless: None,
        }
    }

    fn port(&self, port: &ServicePort) -> Option<&ServicePortInfo> {
        match port {
            ServicePort::Number(n) => self.ports.iter().find(|p| i32::from(p.port) == *n),
            ServicePort::Name(name) => self
                .ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str())),
        }
    }
}

/// Where a translation finds Services: an index built from files or a
/// reflector, or a cache filled by `get` requests.
pub trait ServiceLookup {
    /// The Service `namespace/name`, if known.
    fn service(&self, namespace: &str, name: &str) -> Option<&ServiceInfo>;
}

impl ServiceLookup for ServiceIndex {
    fn service(&self, namespace: &str, name: &str) -> Option<&ServiceInfo> {
        self.get(namespace, name)
    }
}

/// The Services visible to a translation, by namespace and name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceIndex {
    services: BTreeMap<(String, String), ServiceInfo>,
}

impl ServiceIndex {
    /// Builds an index; a later Service with the same namespace/name replaces an earlier one.
    pub fn new(services: impl IntoIterator<Item = ServiceInfo>) -> Self {
        Self {
            services: services
                .into_iter()
                .map(|s| ((s.namespace.clone(), s.name.clone()), s))
                .collect(),
        }
    }

    /// Looks a Service up.
    pub fn get(&self, namespace: &str, name: &str) -> Option<&ServiceInfo> {
        self.services.get(&(namespace.to_owned(), name.to_owned()))
    }

    /// Number of Services.
    pub fn len(&self) -> usize {
        self.services.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }
}

/// Resolves a parsed upstream URL of an object in `namespace`.
pub fn resolve_url(
    url: &UpstreamUrl,
    namespace: &str,
    services: &dyn ServiceLookup,
    policy: &UpstreamPolicy,
) -> Result<ResolvedUpstream, UpstreamError> {
    let literal_port = |what: &str| -> Result<u16, UpstreamError> {
        match &url.port {
            Some(ServicePort::Number(n)) => Ok(*n as u16),
            Some(ServicePort::Name(name)) => Err(err(
                UpstreamReason::InvalidUpstreamUrl,
                format!("named port {name:?} needs a Service; give {what} a port number"),
            )),
            None => url.scheme.default_port().ok_or_else(|| {
                err(
                    UpstreamReason::InvalidUpstreamUrl,
                    format!("a {}:// upstream needs a port", url.scheme.as_str()),
                )
            }),
        }
    };
    match &url.host {
        UpstreamHost::Ip(ip) => {
            if !policy.allow_addresses {
                return Err(err(
                    UpstreamReason::IpAddressUpstream,
                    format!(
                        "upstream {ip} is an IP address; name a Service of namespace {namespace:?} (or enable allowExternalUpstreams)"
                    ),
                ));
            }
            Ok(ResolvedUpstream {
                scheme: url.scheme,
                host: ip.to_string(),
                port: literal_port("the address")?,
                app_protocol: None,
                service: None,
                endpoints: Vec::new(),
            })
        }
        UpstreamHost::External(host) => {
            if !policy.allow_addresses {
                return Err(err(
                    UpstreamReason::ExternalHostUpstream,
                    format!(
                        "upstream {host} is outside the cluster; name a Service of namespace {namespace:?} (or enable allowExternalUpstreams)"
                    ),
                ));
            }
            Ok(ResolvedUpstream {
                scheme: url.scheme,
                host: host.clone(),
                port: literal_port("the host")?,
                app_protocol: None,
                service: None,
                endpoints: Vec::new(),
            })
        }
        UpstreamHost::ServiceFqdn {
            namespace: ns,
            name,
        } => {
            let port = url.port.clone().or_else(|| {
                url.scheme
                    .default_port()
                    .map(|p| ServicePort::Number(i32::from(p)))
            });
            let Some(port) = port else {
                return Err(err(
                    UpstreamReason::InvalidUpstreamUrl,
                    format!("a {}:// upstream needs a port", url.scheme.as_str()),
                ));
            };
            let service = ServiceRef {
                namespace: ns.clone(),
                name: name.clone(),
                port,
            };
            resolve_service(&service, namespace, url.scheme, services, policy)
        }
        UpstreamHost::Service {
            namespace: named_ns,
            name,
        } => {
            let service_ns = named_ns.as_deref().unwrap_or(namespace);
            // `a.b` is `service.namespace` to cluster DNS, but also what an external
            // name like `example.com` looks like: it is a Service only when it is
            // in the caller's namespace or such a Service exists.
            if let Some(ns) = named_ns
                && ns != namespace
                && services.service(ns, name).is_none()
            {
                let host = format!("{name}.{ns}");
                return resolve_url(
                    &UpstreamUrl {
                        scheme: url.scheme,
                        host: UpstreamHost::External(host),
                        port: url.port.clone(),
                    },
                    namespace,
                    services,
                    policy,
                );
            }
            // `localhost` is the one single-label name people mean as a host, not a
            // Service; every other bare name is a Service (so a missing one is
            // reported as such instead of failing later as a DNS error).
            if named_ns.is_none()
                && name == "localhost"
                && services.service(service_ns, name).is_none()
            {
                if !policy.allow_addresses {
                    return Err(err(
                        UpstreamReason::ExternalHostUpstream,
                        format!(
                            "upstream localhost is not a Service; name a Service of namespace {namespace:?} (or enable allowExternalUpstreams)"
                        ),
                    ));
                }
                return Ok(ResolvedUpstream {
                    scheme: url.scheme,
                    host: name.clone(),
                    port: literal_port("the host")?,
                    app_protocol: None,
                    service: None,
                    endpoints: Vec::new(),
                });
            }
            let port = url.port.clone().or_else(|| {
                url.scheme
                    .default_port()
                    .map(|p| ServicePort::Number(i32::from(p)))
            });
            let Some(port) = port else {
                return Err(err(
                    UpstreamReason::InvalidUpstreamUrl,
                    format!("a {}:// upstream needs a port", url.scheme.as_str()),
                ));
            };
            let service = ServiceRef {
                namespace: service_ns.to_owned(),
                name: name.clone(),
                port,
            };
            resolve_service(&service, namespace, url.scheme, services, policy)
        }
    }
}

/// Resolves a Service reference (from an Ingress backend or an upstream URL)
/// made by an object in `namespace`.
pub fn resolve_service(
    service: &ServiceRef,
    namespace: &str,
    scheme: UpstreamScheme,
    services: &dyn ServiceLookup,
    policy: &UpstreamPolicy,
) -> Result<ResolvedUpstream, UpstreamError> {
    let ServiceRef {
        namespace: service_ns,
        name,
        port,
    } = service;
    if service_ns != namespace && !policy.allow_other_namespaces {
        return Err(err(
            UpstreamReason::OtherNamespaceService,
            format!(
                "Service {service_ns}/{name} is in another namespace; an object of namespace {namespace:?} may only publish Services of its own namespace"
            ),
        ));
    }
    let Some(info) = services.service(service_ns, name) else {
        return Err(err(
            UpstreamReason::ServiceNotFound,
            format!("Service {service_ns}/{name} not found"),
        ));
    };
    let Some(port_info) = info.port(port) else {
        let known: Vec<String> = info
            .ports
            .iter()
            .map(|p| match &p.name {
                Some(n) => format!("{n}/{}", p.port),
                None => p.port.to_string(),
            })
            .collect();
        return Err(err(
            UpstreamReason::ServicePortNotFound,
            format!(
                "Service {service_ns}/{name} has no port {port} (ports: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ),
        ));
    };
    if let Some(external) = &info.external_name
        && !policy.allow_external_name
    {
        return Err(err(
            UpstreamReason::ExternalNameService,
            format!(
                "Service {service_ns}/{name} is an ExternalName Service ({external}); these are refused unless allowExternalUpstreams is enabled"
            ),
        ));
    }
    let mut endpoints = Vec::new();
    let (host, dial_port) = match (policy.addressing, &info.external_name, &info.cluster_ip) {
        (_, Some(external), _) => (external.clone(), resolve_port(policy.addressing, port_info)),
        (_, None, Some(ip)) => (ip.clone(), resolve_port(policy.addressing, port_info)),
        (Addressing::Cluster, None, None) => {
            // Headless: the ready EndpointSlice addresses, at the endpoint port.
            let ready = info
                .headless
                .as_ref()
                .filter(|h| !h.addresses.is_empty())
                .and_then(|h| Some((h, h.port_for(port_info)?)));
            let Some((headless, endpoint_port)) = ready else {
                return Err(err(
                    UpstreamReason::ServiceWithoutAddress,
                    format!(
                        "Service {service_ns}/{name} is headless (clusterIP: None) and has no ready endpoint for port {port}"
                    ),
                ));
            };
            endpoints = headless.addresses.clone();
            (format!("{name}.{service_ns}"), endpoint_port)
        }
        (Addressing::Standalone, None, None) => {
            return Err(err(
                UpstreamReason::ServiceWithoutAddress,
                format!(
                    "Service {service_ns}/{name} has neither an address in spec.clusterIP nor type: ExternalName with spec.externalName; in standalone mode one of them is the backend's address"
                ),
            ));
        }
    };
    Ok(ResolvedUpstream {
        scheme,
        host,
        port: dial_port,
        app_protocol: port_info.app_protocol.clone(),
        service: Some(format!("{service_ns}/{name}")),
        endpoints,
    })
}

fn resolve_port(addressing: Addressing, port: &ServicePortInfo) -> u16 {
    match addressing {
        Addressing::Cluster => port.port,
        Addressing::Standalone => port.target_port.unwrap_or(port.port),
    }
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // test tables
mod tests {
    use super::*;

    #[test]
    fn service_names_are_dns_1035_labels() {
        for (name, ok) in [
            ("web", true),
            ("a", true),
            ("web-2", true),
            ("w2", true),
            (&"a".repeat(63), true),
            (&"a".repeat(64), false),
            ("", false),
            ("x y", false),
            ("2web", false),
            ("-web", false),
            ("web-", false),
            ("Web", false),
            ("web.default", false),
            ("web_1", false),
            ("../secrets", false),
            ("web%20x", false),
            ("wéb", false),
            ("web\n", false),
        ] {
            assert_eq!(is_service_name(name), ok, "{name:?}");
        }
        for (namespace, ok) in [
            ("team-a", true),
            ("2team", true),
            ("", false),
            ("team a", false),
            ("Team", false),
            (&"n".repeat(64), false),
        ] {
            assert_eq!(is_namespace_name(namespace), ok, "{namespace:?}");
        }
    }

    fn svc(
        ns: &str,
        name: &str,
        external: Option<&str>,
        ip: Option<&str>,
        ports: &[(Option<&str>, u16, Option<u16>, Option<&str>)],
    ) -> ServiceInfo {
        ServiceInfo {
            namespace: ns.into(),
            name: name.into(),
            external_name: external.map(Into::into),
            cluster_ip: ip.map(Into::into),
            ports: ports
                .iter()
                .map(|(n, p, t, a)| ServicePortInfo {
                    name: n.map(Into::into),
                    port: *p,
                    target_port: *t,
                    app_protocol: a.map(Into::into),
                })
                .collect(),
            headless: None,
        }
    }

    fn index() -> ServiceIndex {
        ServiceIndex::new([
            svc(
                "default",
                "web",
                None,
                Some("10.0.0.7"),
                &[(Some("http"), 80, Some(8080), None)],
            ),
            svc(
                "default",
                "grpc",
                None,
                Some("10.0.0.8"),
                &[(Some("grpc"), 9000, None, Some(APP_PROTOCOL_H2C))],
            ),
            svc(
                "default",
                "local",
                Some("127.0.0.1"),
                None,
                &[(None, 3000, None, None)],
            ),
            svc("default", "headless", None, None, &[(None, 80, None, None)]),
            svc(
                "other",
                "db",
                None,
                Some("10.0.1.1"),
                &[(None, 5432, None, None)],
            ),
        ])
    }

    /// Kubernetes ignores `externalName` unless `type: ExternalName`: a
    /// ClusterIP Service that happens to carry the field is dialled at its
    /// cluster IP, and one without a cluster IP has no address.
    #[test]
    fn external_name_counts_only_on_external_name_services() {
        let service = |yaml: &str| -> ServiceInfo {
            ServiceInfo::from_service(&serde_saphyr::from_str(yaml).expect("test Service"))
        };
        let typed = service(
            "metadata: {name: a}\nspec: {type: ExternalName, externalName: db.example.com}",
        );
        assert_eq!(typed.external_name.as_deref(), Some("db.example.com"));
        let cluster_ip = service(
            "metadata: {name: b}\nspec: {type: ClusterIP, clusterIP: 10.0.0.9, externalName: db.example.com}",
        );
        assert_eq!(cluster_ip.external_name, None);
        assert_eq!(cluster_ip.cluster_ip.as_deref(), Some("10.0.0.9"));
        let untyped = service("metadata: {name: c}\nspec: {externalName: db.example.com}");
        assert_eq!(untyped.external_name, None);
    }

    /// A headless Service is dialled at its ready EndpointSlice addresses on the
    /// endpoint port of the same name; without endpoints it is refused.
    #[test]
    fn headless_services_use_ready_endpoints() {
        let mut info = svc(
            "default",
            "db",
            None,
            None,
            &[(Some("pg"), 5432, None, None)],
        );
        let services = ServiceIndex::new([info.clone()]);
        let url = parse_upstream_url("tcp://db:pg").unwrap();
        let refused =
            resolve_url(&url, "default", &services, &UpstreamPolicy::cluster()).unwrap_err();
        assert_eq!(refused.reason, UpstreamReason::ServiceWithoutAddress);
        info.headless = Some(HeadlessEndpoints {
            addresses: vec!["10.1.0.5".parse().unwrap(), "10.1.0.6".parse().unwrap()],
            ports: vec![(Some("pg".into()), 15432)],
        });
        let services = ServiceIndex::new([info]);
        let resolved = resolve_url(&url, "default", &services, &UpstreamPolicy::cluster()).unwrap();
        assert_eq!(resolved.port, 15432);
        assert_eq!(resolved.endpoints.len(), 2);
        assert_eq!(resolved.service.as_deref(), Some("default/db"));
    }

    #[test]
    fn url_parsing() {
        let cases: Vec<(
            &str,
            Result<(UpstreamScheme, UpstreamHost, Option<ServicePort>), UpstreamReason>,
        )> = vec![
            (
                "http://web:80",
                Ok((
                    UpstreamScheme::Http,
                    UpstreamHost::Service {
                        namespace: None,
                        name: "web".into(),
                    },
                    Some(ServicePort::Number(80)),
                )),
            ),
            (
                "HTTPS://web",
                Ok((
                    UpstreamScheme::Https,
                    UpstreamHost::Service {
                        namespace: None,
                        name: "web".into(),
                    },
                    None,
                )),
            ),
            (
                "http://web:http/",
                Ok((
                    UpstreamScheme::Http,
                    UpstreamHost::Service {
                        namespace: None,
                        name: "web".into(),
                    },
                    Some(ServicePort::Name("http".into())),
                )),
            ),
            (
                "tcp://db.other:5432",
                Ok((
                    UpstreamScheme::Tcp,
                    UpstreamHost::Service {
                        namespace: Some("other".into()),
                        name: "db".into(),
                    },
                    Some(ServicePort::Number(5432)),
                )),
            ),
            (
                "tcp://db.other.svc:5432",
                Ok((
                    UpstreamScheme::Tcp,
                    UpstreamHost::ServiceFqdn {
                        namespace: "other".into(),
                        name: "db".into(),
                    },
                    Some(ServicePort::Number(5432)),
                )),
            ),
            (
                "http://127.0.0.1:3000",
                Ok((
                    UpstreamScheme::Http,
                    UpstreamHost::Ip("127.0.0.1".parse().unwrap()),
                    Some(ServicePort::Number(3000)),
                )),
            ),
            (
                "http://[::1]:3000",
                Ok((
                    UpstreamScheme::Http,
                    UpstreamHost::Ip("::1".parse().unwrap()),
                    Some(ServicePort::Number(3000)),
                )),
            ),
            (
                "http://api.example.com",
                Ok((
                    UpstreamScheme::Http,
                    UpstreamHost::External("api.example.com".into()),
                    None,
                )),
            ),
            ("ftp://web:21", Err(UpstreamReason::UnsupportedScheme)),
            ("web:80", Err(UpstreamReason::InvalidUpstreamUrl)),
            ("http://web:80/api", Err(UpstreamReason::InvalidUpstreamUrl)),
            ("http://web:0", Err(UpstreamReason::InvalidUpstreamUrl)),
            ("http://web:70000", Err(UpstreamReason::InvalidUpstreamUrl)),
            ("http://:80", Err(UpstreamReason::InvalidUpstreamUrl)),
            ("http://we_b:80", Err(UpstreamReason::InvalidUpstreamUrl)),
            (
                "http://user@web:80",
                Err(UpstreamReason::InvalidUpstreamUrl),
            ),
        ];
        for (url, expected) in cases {
            let got = parse_upstream_url(url)
                .map(|u| (u.scheme, u.host, u.port))
                .map_err(|e| e.reason);
            assert_eq!(got, expected, "{url}");
        }
    }

    #[test]
    fn resolution_in_a_cluster() {
        let services = index();
        let strict = UpstreamPolicy::cluster();
        let open = UpstreamPolicy::cluster_allow_external();
        // (url, policy, expected authority + appProtocol, or reason)
        let cases: Vec<(
            &str,
            UpstreamPolicy,
            Result<(&str, Option<&str>), UpstreamReason>,
        )> = vec![
            ("http://web:80", strict, Ok(("10.0.0.7:80", None))),
            ("http://web:http", strict, Ok(("10.0.0.7:80", None))),
            ("http://web", strict, Ok(("10.0.0.7:80", None))),
            (
                "http://web.default.svc.cluster.local:80",
                strict,
                Ok(("10.0.0.7:80", None)),
            ),
            (
                "http://grpc:grpc",
                strict,
                Ok(("10.0.0.8:9000", Some(APP_PROTOCOL_H2C))),
            ),
            (
                "http://web:81",
                strict,
                Err(UpstreamReason::ServicePortNotFound),
            ),
            (
                "http://missing:80",
                strict,
                Err(UpstreamReason::ServiceNotFound),
            ),
            (
                "http://headless:80",
                strict,
                Err(UpstreamReason::ServiceWithoutAddress),
            ),
            (
                "http://local:3000",
                strict,
                Err(UpstreamReason::ExternalNameService),
            ),
            (
                "tcp://db.other:5432",
                strict,
                Err(UpstreamReason::OtherNamespaceService),
            ),
            (
                "tcp://nosuch.other.svc:5432",
                strict,
                Err(UpstreamReason::OtherNamespaceService),
            ),
            ("http://web.default:80", strict, Ok(("10.0.0.7:80", None))),
            (
                "http://10.1.2.3:80",
                strict,
                Err(UpstreamReason::IpAddressUpstream),
            ),
            (
                "http://example.com",
                strict,
                Err(UpstreamReason::ExternalHostUpstream),
            ),
            (
                "http://localhost:3000",
                strict,
                Err(UpstreamReason::ExternalHostUpstream),
            ),
            ("tcp://db.other:5432", open, Ok(("10.0.1.1:5432", None))),
            ("http://10.1.2.3:80", open, Ok(("10.1.2.3:80", None))),
            ("http://example.com", open, Ok(("example.com:80", None))),
            ("http://local:3000", open, Ok(("127.0.0.1:3000", None))),
            ("http://[::1]:8080", open, Ok(("[::1]:8080", None))),
            (
                "tcp://10.1.2.3",
                open,
                Err(UpstreamReason::InvalidUpstreamUrl),
            ),
        ];
        for (url, policy, expected) in cases {
            let got = parse_upstream_url(url)
                .and_then(|u| resolve_url(&u, "default", &services, &policy))
                .map(|r| (r.authority(), r.app_protocol))
                .map_err(|e| e.reason);
            let expected = expected.map(|(a, p)| (a.to_owned(), p.map(str::to_owned)));
            assert_eq!(got, expected, "{url}");
        }
    }

    #[test]
    fn resolution_in_standalone_mode() {
        let services = index();
        let policy = UpstreamPolicy::standalone();
        let cases: Vec<(&str, Result<&str, UpstreamReason>)> = vec![
            // targetPort wins: the Service stands for its pods.
            ("http://web:80", Ok("10.0.0.7:8080")),
            ("http://local:3000", Ok("127.0.0.1:3000")),
            ("http://127.0.0.1:3000", Ok("127.0.0.1:3000")),
            ("http://localhost:3000", Ok("localhost:3000")),
            ("http://nosuch:3000", Err(UpstreamReason::ServiceNotFound)),
            (
                "tcp://db.other:5432",
                Err(UpstreamReason::OtherNamespaceService),
            ),
            ("http://web:81", Err(UpstreamReason::ServicePortNotFound)),
            (
                "http://headless:80",
                Err(UpstreamReason::ServiceWithoutAddress),
            ),
        ];
        for (url, expected) in cases {
            let got = parse_upstream_url(url)
                .and_then(|u| resolve_url(&u, "default", &services, &policy))
                .map(|r| r.authority())
                .map_err(|e| e.reason);
            assert_eq!(got, expected.map(str::to_owned), "{url}");
        }
    }

    #[test]
    fn service_from_manifest() {
        let service: Service = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "api"},
            "spec": {"type": "ExternalName", "externalName": "localhost",
                     "ports": [{"name": "h2", "port": 50051, "appProtocol": "kubernetes.io/h2c"}, {"port": 0}]}
        }))
        .unwrap();
        let info = ServiceInfo::from_service(&service);
        assert_eq!(info.namespace, "default");
        assert_eq!(info.external_name.as_deref(), Some("localhost"));
        assert_eq!(info.ports.len(), 1, "a port 0 is dropped");
        assert_eq!(
            info.ports[0].app_protocol.as_deref(),
            Some(APP_PROTOCOL_H2C)
        );
    }
}
