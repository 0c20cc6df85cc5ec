//! What every step of the plan shares, below all of them: the reference of
//! an object, why something of it is refused, and the backends of a route.
//! Pure data; the steps ([`super::ingress`], [`super::tunnel`],
//! [`super::httproute`], …) import it and the plan above them assembles their
//! results.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use tuna_routing::{Origin, RouteSpec};

use super::domain::DomainReason;
use super::gateway::GatewayAction;
use super::ingress::{ServiceRef, SkipKind, SkipReason};
use super::service::{ResolvedUpstream, UpstreamReason};
use super::tcpendpoint::TcpEndpointReason;
use super::tunnel::{PortOrAlias, TunnelReason};

/// The kinds the plan reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Kind {
    /// `networking.k8s.io/v1` Ingress.
    Ingress,
    /// `k8s.tuna.am/v1alpha1` Tunnel.
    Tunnel,
    /// `k8s.tuna.am/v1alpha1` Domain.
    Domain,
    /// `k8s.tuna.am/v1alpha1` TCPEndpoint.
    TcpEndpoint,
    /// `gateway.networking.k8s.io/v1` HTTPRoute.
    HttpRoute,
    /// `gateway.networking.k8s.io/v1` TCPRoute.
    TcpRoute,
    /// `gateway.networking.k8s.io/v1` Gateway.
    Gateway,
    /// `gateway.networking.k8s.io/v1` GatewayClass.
    GatewayClass,
}

impl Kind {
    /// The Kubernetes kind.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ingress => "Ingress",
            Self::Tunnel => "Tunnel",
            Self::Domain => "Domain",
            Self::TcpEndpoint => "TCPEndpoint",
            Self::HttpRoute => "HTTPRoute",
            Self::TcpRoute => "TCPRoute",
            Self::Gateway => "Gateway",
            Self::GatewayClass => "GatewayClass",
        }
    }
}

/// Names one object: kind, namespace, name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ObjectRef {
    /// Kind.
    pub kind: Kind,
    /// Namespace (`default` when the object has none).
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectRef {
    /// A reference from parts.
    pub fn new(kind: Kind, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The reference of an object of `kind` with `meta`.
    pub fn of(kind: Kind, meta: &ObjectMeta) -> Self {
        Self::new(
            kind,
            meta.namespace.as_deref().unwrap_or("default"),
            meta.name.as_deref().unwrap_or(""),
        )
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

/// Why something is not published. Every variant has a stable CamelCase name
/// ([`Reason::as_str`]): the reason of the `Ready` condition or the event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Reason {
    /// A Domain's spec (or a younger duplicate).
    Domain(DomainReason),
    /// A TCPEndpoint's spec (or a younger duplicate).
    TcpEndpoint(TcpEndpointReason),
    /// A Tunnel's spec or upstream.
    Tunnel(TunnelReason),
    /// An Ingress rule, path or backend skipped by the translation.
    Ingress(SkipReason),
    /// An Ingress route whose Service cannot be used.
    Backend(UpstreamReason),
    /// An Ingress route on a host that is not reserved for its namespace.
    HostNotReserved,
    /// An Ingress route on a host reserved by a Domain of another namespace.
    HostOwnedByOtherNamespace,
    /// An Ingress route on a host an http Tunnel publishes.
    HostUsedByTunnel,
    /// An HTTPRoute on a host an Ingress publishes.
    HostUsedByIngress,
    /// A Tunnel whose host an older Tunnel publishes.
    HostConflict,
    /// A tcp Tunnel whose endpoint an older tcp Tunnel uses.
    TcpEndpointInUse,
    /// A tcp Tunnel naming an alias no TCPEndpoint declares (standalone).
    TcpEndpointNotFound,
    /// A route the route table refused (`InvalidPath`, `RouteConflict`, …).
    Route(&'static str),
    /// A host with more routes than a table holds.
    TooManyRoutes,
}

impl Reason {
    /// Stable machine-readable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Domain(r) => r.as_str(),
            Self::TcpEndpoint(r) => r.as_str(),
            Self::Tunnel(r) => r.as_str(),
            Self::Ingress(r) => r.as_str(),
            Self::Backend(r) => r.as_str(),
            Self::HostNotReserved => "HostNotReserved",
            Self::HostOwnedByOtherNamespace => "HostOwnedByOtherNamespace",
            Self::HostUsedByTunnel => "HostUsedByTunnel",
            Self::HostUsedByIngress => "HostUsedByIngress",
            Self::HostConflict => "HostConflict",
            Self::TcpEndpointInUse => "TcpEndpointInUse",
            Self::TcpEndpointNotFound => "TcpEndpointNotFound",
            Self::Route(r) => r,
            Self::TooManyRoutes => "TooManyRoutes",
        }
    }

    /// For Ingresses: the event this becomes (`RuleSkipped` or `BackendSkipped`).
    pub fn ingress_event(self) -> &'static str {
        match self {
            Self::Backend(_) => "BackendSkipped",
            Self::Ingress(r) if r.kind() == SkipKind::Backend => "BackendSkipped",
            _ => "RuleSkipped",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Something not published, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// The object it comes from.
    pub object: ObjectRef,
    /// For Ingresses: the index in `spec.rules`, when it is a rule or inside one.
    pub rule: Option<usize>,
    /// For Ingresses: the index in the rule's `http.paths`.
    pub path: Option<usize>,
    /// Machine-readable reason.
    pub reason: Reason,
    /// What happened and what to do.
    pub message: String,
}

impl Refusal {
    pub(crate) fn new(object: ObjectRef, reason: Reason, message: impl Into<String>) -> Self {
        Self {
            object,
            rule: None,
            path: None,
            reason,
            message: message.into(),
        }
    }

    pub(crate) fn at(
        object: ObjectRef,
        origin: &Origin,
        reason: Reason,
        message: impl Into<String>,
    ) -> Self {
        Self {
            object,
            rule: Some(origin.rule),
            path: Some(origin.path),
            reason,
            message: message.into(),
        }
    }

    /// `Ingress ns/name rule 0 path 1` (or just the object).
    pub fn location(&self) -> String {
        let mut out = self.object.to_string();
        if let Some(rule) = self.rule {
            out.push_str(&format!(" rule {rule}"));
        }
        if let Some(path) = self.path {
            out.push_str(&format!(" path {path}"));
        }
        out
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.location(), self.reason, self.message)
    }
}

/// Whether Ingress backends are resolved against Services.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backends {
    /// Resolve every backend; an unusable Service skips the route.
    #[default]
    Resolve,
    /// Keep backends as named (`route explain` on files that hold no Service).
    Unchecked,
    /// Services are known from their manifests but not dialled (`route
    /// explain` on files with Gateway API objects): an HTTPRoute backendRef
    /// must name a Service there, and one of its ports; Ingress backends are
    /// kept as named.
    Declared,
}

/// The backend of a route.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Backend {
    /// The Service as an Ingress names it (`None` for a Tunnel).
    pub service: Option<ServiceRef>,
    /// A Tunnel's `spec.upstream.url` (`None` for an Ingress).
    pub url: Option<String>,
    /// What the proxy dials; `None` only with [`Backends::Unchecked`], and
    /// for a Gateway API rule (which has `gateway` instead).
    pub upstream: Option<ResolvedUpstream>,
    /// A Gateway API rule: its weighted backends, filters and timeouts.
    #[serde(skip)]
    pub gateway: Option<Arc<GatewayAction>>,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(action) = &self.gateway {
            let names: Vec<String> = action
                .backends
                .iter()
                .map(|b| format!("{}/{}", b.namespace, b.service))
                .collect();
            return if names.is_empty() {
                f.write_str("500 (no valid backend)")
            } else {
                f.write_str(&names.join(", "))
            };
        }
        match (&self.service, &self.url, &self.upstream) {
            (Some(s), _, _) => write!(f, "{s}"),
            (None, _, Some(u)) => write!(f, "{u}"),
            (None, Some(url), None) => f.write_str(url),
            (None, None, None) => f.write_str("?"),
        }
    }
}

/// One route of a published host.
pub type HostRoute = RouteSpec<Backend>;

/// A TCP endpoint to publish for a tcp Tunnel or a TCPRoute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpPlan {
    /// The endpoint, by port or alias.
    pub endpoint: PortOrAlias,
    /// Where the bytes go.
    pub upstream: ResolvedUpstream,
}
