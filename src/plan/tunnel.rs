//! Tunnel → desired tunnel: the public endpoint (an https host or a TCP endpoint)
//! and the resolved upstream.
//!
//! Files in standalone mode are not checked by an API server, so the CEL rules of
//! the CRD are checked here again, with the same messages in spirit.

use std::fmt;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use tuna_crds::{Tunnel, TunnelProtocol};

use super::domain::{HostReservations, is_dns_label};
use super::service::{
    ResolvedUpstream, ServiceLookup, UpstreamHost, UpstreamPolicy, UpstreamReason, UpstreamScheme,
    parse_upstream_url, resolve_url,
};
use super::tcpendpoint::AliasOwners;

/// Translation settings for Tunnels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelOptions {
    /// The edge's base domain: `subdomain: web` is served at `web.<base_domain>`.
    pub base_domain: String,
    /// What upstreams may point at.
    pub policy: UpstreamPolicy,
}

/// Where a tcp Tunnel is published.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum PortOrAlias {
    /// A reserved port number.
    Port(u16),
    /// The alias of a TCPEndpoint.
    Alias(String),
}

impl PortOrAlias {
    /// A port number when `s` is all digits and a port (however written:
    /// `30001`, `"30001"`, a listener named `30001`), else an alias.
    pub fn parse(s: &str) -> Self {
        match s.parse::<u16>() {
            Ok(p) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => Self::Port(p),
            _ => Self::Alias(s.to_owned()),
        }
    }

    /// The key of the endpoint in host and port ownership
    /// ([`super::claims::tcp_key`]): the port in decimal, or the alias.
    pub fn key(&self) -> String {
        match self {
            Self::Port(p) => p.to_string(),
            Self::Alias(a) => a.clone(),
        }
    }
}

impl fmt::Display for PortOrAlias {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Port(p) => write!(f, "port {p}"),
            Self::Alias(a) => write!(f, "alias {a}"),
        }
    }
}

/// The public side of a tunnel.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum PublicEndpoint {
    /// Served at `https://<host>` (and http on the edge's HTTP listener).
    Http {
        /// `<subdomain>.<base domain>`, lower case.
        host: String,
    },
    /// Served on a reserved TCP port.
    Tcp(PortOrAlias),
}

/// What a Tunnel asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct DesiredTunnel {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Public side.
    pub public: PublicEndpoint,
    /// Where traffic goes.
    pub upstream: ResolvedUpstream,
    /// `(secret name, key)` of the API key to connect with, if any.
    pub api_key_secret: Option<(String, String)>,
}

/// Why a Tunnel cannot be published; the variant name is the machine-readable reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum TunnelReason {
    /// http without `subdomain`.
    MissingSubdomain,
    /// `subdomain` is not a DNS label.
    InvalidSubdomain,
    /// tcp without `portOrAlias`.
    MissingPortOrAlias,
    /// `portOrAlias` is neither a port 1–65535 nor a DNS label.
    InvalidPortOrAlias,
    /// A field of the other protocol is set.
    FieldNotForProtocol,
    /// The upstream scheme does not fit the protocol.
    SchemeMismatch,
    /// The TCPEndpoint alias belongs to another namespace.
    TcpEndpointOwnedByOtherNamespace,
    /// The host belongs to another namespace: its Domain, or an older Ingress
    /// on an account host.
    HostOwnedByOtherNamespace,
    /// The upstream was refused (see [`UpstreamReason`]).
    Upstream(UpstreamReason),
}

impl TunnelReason {
    /// Stable machine-readable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MissingSubdomain => "MissingSubdomain",
            Self::InvalidSubdomain => "InvalidSubdomain",
            Self::MissingPortOrAlias => "MissingPortOrAlias",
            Self::InvalidPortOrAlias => "InvalidPortOrAlias",
            Self::FieldNotForProtocol => "FieldNotForProtocol",
            Self::SchemeMismatch => "SchemeMismatch",
            Self::TcpEndpointOwnedByOtherNamespace => "TcpEndpointOwnedByOtherNamespace",
            Self::HostOwnedByOtherNamespace => "HostOwnedByOtherNamespace",
            Self::Upstream(r) => r.as_str(),
        }
    }
}

/// A Tunnel that cannot be published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{}: {message}", reason.as_str())]
pub struct TunnelError {
    /// Machine-readable reason.
    pub reason: TunnelReason,
    /// What happened and what to do.
    pub message: String,
}

fn fail(reason: TunnelReason, message: impl Into<String>) -> TunnelError {
    TunnelError {
        reason,
        message: message.into(),
    }
}

/// Translates one Tunnel. `reservations` and `aliases` guard against publishing a
/// host or TCP endpoint that another namespace reserved; an http Tunnel's host
/// needs no Domain of its own (the subdomain is claimed when the tunnel connects).
pub fn desired_tunnel(
    tunnel: &Tunnel,
    services: &dyn ServiceLookup,
    reservations: &HostReservations,
    aliases: &AliasOwners,
    options: &TunnelOptions,
) -> Result<DesiredTunnel, TunnelError> {
    let namespace = tunnel
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    let name = tunnel.metadata.name.clone().unwrap_or_default();
    let spec = &tunnel.spec;
    let public = match spec.protocol {
        TunnelProtocol::Http => {
            if spec.port_or_alias.is_some() {
                return Err(fail(
                    TunnelReason::FieldNotForProtocol,
                    "spec.portOrAlias applies to tcp Tunnels only",
                ));
            }
            let Some(sub) = spec.subdomain.as_deref() else {
                return Err(fail(
                    TunnelReason::MissingSubdomain,
                    "an http Tunnel needs spec.subdomain",
                ));
            };
            if !is_dns_label(sub) {
                return Err(fail(
                    TunnelReason::InvalidSubdomain,
                    format!(
                        "subdomain {sub:?} must be one DNS label (lower-case letters, digits, '-')"
                    ),
                ));
            }
            let host = format!("{sub}.{}", options.base_domain.to_ascii_lowercase());
            if let Some(owner) = reservations
                .domains
                .get(&host)
                .filter(|owner| **owner != namespace)
            {
                return Err(fail(
                    TunnelReason::HostOwnedByOtherNamespace,
                    format!("host {host} is reserved by a Domain of namespace {owner:?}"),
                ));
            }
            PublicEndpoint::Http { host }
        }
        TunnelProtocol::Tcp => {
            if spec.subdomain.is_some() {
                return Err(fail(
                    TunnelReason::FieldNotForProtocol,
                    "spec.subdomain applies to http Tunnels only",
                ));
            }
            let endpoint = match &spec.port_or_alias {
                None => {
                    return Err(fail(
                        TunnelReason::MissingPortOrAlias,
                        "a tcp Tunnel needs spec.portOrAlias (a TCPEndpoint alias or a reserved port)",
                    ));
                }
                Some(IntOrString::Int(n)) => port_number(i64::from(*n))?,
                Some(IntOrString::String(s))
                    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    port_number(s.parse().unwrap_or(i64::MAX))?
                }
                Some(IntOrString::String(s)) if is_dns_label(s) => PortOrAlias::Alias(s.clone()),
                Some(IntOrString::String(s)) => {
                    return Err(fail(
                        TunnelReason::InvalidPortOrAlias,
                        format!(
                            "portOrAlias {s:?} is neither a port number nor a TCPEndpoint alias"
                        ),
                    ));
                }
            };
            if let PortOrAlias::Alias(alias) = &endpoint
                && let Some(owner) = aliases.get(alias).filter(|e| e.namespace != namespace)
            {
                return Err(fail(
                    TunnelReason::TcpEndpointOwnedByOtherNamespace,
                    format!(
                        "TCPEndpoint alias {alias} belongs to {}/{}; use a TCPEndpoint of namespace {namespace:?}",
                        owner.namespace, owner.name
                    ),
                ));
            }
            PublicEndpoint::Tcp(endpoint)
        }
    };
    let url = parse_upstream_url(&spec.upstream.url)
        .map_err(|e| fail(TunnelReason::Upstream(e.reason), e.message))?;
    match (spec.protocol, url.scheme) {
        (TunnelProtocol::Http, UpstreamScheme::Http | UpstreamScheme::Https)
        | (TunnelProtocol::Tcp, UpstreamScheme::Tcp) => {}
        (TunnelProtocol::Http, UpstreamScheme::Tcp) => {
            return Err(fail(
                TunnelReason::SchemeMismatch,
                "an http Tunnel needs an http:// or https:// upstream URL, e.g. http://web:80",
            ));
        }
        (TunnelProtocol::Tcp, _) => {
            return Err(fail(
                TunnelReason::SchemeMismatch,
                "a tcp Tunnel needs a tcp:// upstream URL, e.g. tcp://postgres:5432",
            ));
        }
    }
    let upstream = resolve_url(&url, &namespace, services, &options.policy)
        .map_err(|e| fail(TunnelReason::Upstream(e.reason), e.message))?;
    let api_key_secret = spec
        .api_key_secret_ref
        .as_ref()
        .map(|r| (r.name.clone(), r.key_or_default().to_owned()));
    Ok(DesiredTunnel {
        namespace,
        name,
        public,
        upstream,
        api_key_secret,
    })
}

fn port_number(n: i64) -> Result<PortOrAlias, TunnelError> {
    u16::try_from(n)
        .ok()
        .filter(|p| *p > 0)
        .map(PortOrAlias::Port)
        .ok_or_else(|| {
            fail(
                TunnelReason::InvalidPortOrAlias,
                format!("port {n} is outside 1-65535"),
            )
        })
}

/// The Services a Tunnel's upstream names: `(namespace, name)`.
pub fn upstream_service(tunnel: &Tunnel) -> Option<(String, String)> {
    let namespace = tunnel
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    match parse_upstream_url(&tunnel.spec.upstream.url).ok()?.host {
        UpstreamHost::Service {
            namespace: ns,
            name,
        } => Some((ns.unwrap_or(namespace), name)),
        UpstreamHost::ServiceFqdn { namespace, name } => Some((namespace, name)),
        UpstreamHost::Ip(_) | UpstreamHost::External(_) => None,
    }
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // test tables
mod tests {
    use super::*;
    use crate::plan::domain::{DesiredDomain, HostReservations};
    use crate::plan::service::ServiceIndex;
    use crate::plan::service::{APP_PROTOCOL_H2C, ServiceInfo, ServicePortInfo};
    use crate::plan::tcpendpoint::DesiredTcpEndpoint;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use tuna_crds::{ApiKeySecretRef, ReclaimPolicy, TunnelSpec, Upstream};

    fn tunnel(
        protocol: TunnelProtocol,
        sub: Option<&str>,
        poa: Option<IntOrString>,
        url: &str,
    ) -> Tunnel {
        Tunnel {
            metadata: ObjectMeta {
                namespace: Some("shop".into()),
                name: Some("t".into()),
                ..Default::default()
            },
            spec: TunnelSpec {
                protocol,
                subdomain: sub.map(Into::into),
                port_or_alias: poa,
                upstream: Upstream { url: url.into() },
                api_key_secret_ref: None,
            },
            status: None,
        }
    }

    fn services() -> ServiceIndex {
        let port = |name: &str, port: u16, app: Option<&str>| ServicePortInfo {
            name: Some(name.into()),
            port,
            target_port: None,
            app_protocol: app.map(Into::into),
        };
        ServiceIndex::new([
            ServiceInfo {
                namespace: "shop".into(),
                name: "web".into(),
                external_name: None,
                cluster_ip: Some("10.0.0.1".into()),
                ports: vec![
                    port("http", 80, None),
                    port("grpc", 9000, Some(APP_PROTOCOL_H2C)),
                ],
                headless: None,
            },
            ServiceInfo {
                namespace: "shop".into(),
                name: "db".into(),
                external_name: None,
                cluster_ip: Some("10.0.0.2".into()),
                ports: vec![port("pg", 5432, None)],
                headless: None,
            },
        ])
    }

    fn reservations() -> HostReservations {
        let d = DesiredDomain {
            namespace: "blog".into(),
            name: "b".into(),
            fqdn: "taken.tuna.dev".into(),
            custom: false,
            reclaim_policy: ReclaimPolicy::Delete,
            created: 0,
        };
        HostReservations::from_domains(&[d], Default::default()).0
    }

    fn aliases() -> AliasOwners {
        let e = |ns: &str, alias: &str| DesiredTcpEndpoint {
            namespace: ns.into(),
            name: alias.into(),
            alias: alias.into(),
            reclaim_policy: ReclaimPolicy::Delete,
            created: 0,
            port: None,
        };
        AliasOwners::new(&[e("shop", "pg"), e("other", "redis")]).0
    }

    #[test]
    fn translation_table() {
        use IntOrString::{Int, String as Str};
        use TunnelProtocol::{Http, Tcp};
        let options = TunnelOptions {
            base_domain: "tuna.dev".into(),
            policy: UpstreamPolicy::cluster(),
        };
        let cases: Vec<(&str, Tunnel, Result<(PublicEndpoint, &str), &str>)> = vec![
            (
                "http",
                tunnel(Http, Some("web"), None, "http://web:80"),
                Ok((
                    PublicEndpoint::Http {
                        host: "web.tuna.dev".into(),
                    },
                    "http://10.0.0.1:80 via Service shop/web",
                )),
            ),
            (
                "h2c",
                tunnel(Http, Some("api"), None, "http://web:grpc"),
                Ok((
                    PublicEndpoint::Http {
                        host: "api.tuna.dev".into(),
                    },
                    "http://10.0.0.1:9000 (kubernetes.io/h2c) via Service shop/web",
                )),
            ),
            (
                "tcp alias",
                tunnel(Tcp, None, Some(Str("pg".into())), "tcp://db:5432"),
                Ok((
                    PublicEndpoint::Tcp(PortOrAlias::Alias("pg".into())),
                    "tcp://10.0.0.2:5432 via Service shop/db",
                )),
            ),
            (
                "tcp alias unknown to files",
                tunnel(Tcp, None, Some(Str("elsewhere".into())), "tcp://db:pg"),
                Ok((
                    PublicEndpoint::Tcp(PortOrAlias::Alias("elsewhere".into())),
                    "tcp://10.0.0.2:5432 via Service shop/db",
                )),
            ),
            (
                "tcp port",
                tunnel(Tcp, None, Some(Int(30001)), "tcp://db:5432"),
                Ok((
                    PublicEndpoint::Tcp(PortOrAlias::Port(30001)),
                    "tcp://10.0.0.2:5432 via Service shop/db",
                )),
            ),
            (
                "tcp port as string",
                tunnel(Tcp, None, Some(Str("30001".into())), "tcp://db:5432"),
                Ok((
                    PublicEndpoint::Tcp(PortOrAlias::Port(30001)),
                    "tcp://10.0.0.2:5432 via Service shop/db",
                )),
            ),
            (
                "http without subdomain",
                tunnel(Http, None, None, "http://web:80"),
                Err("MissingSubdomain"),
            ),
            (
                "bad subdomain",
                tunnel(Http, Some("Web"), None, "http://web:80"),
                Err("InvalidSubdomain"),
            ),
            (
                "http with port",
                tunnel(Http, Some("web"), Some(Int(1)), "http://web:80"),
                Err("FieldNotForProtocol"),
            ),
            (
                "tcp with subdomain",
                tunnel(Tcp, Some("web"), Some(Int(1)), "tcp://db:5432"),
                Err("FieldNotForProtocol"),
            ),
            (
                "tcp without endpoint",
                tunnel(Tcp, None, None, "tcp://db:5432"),
                Err("MissingPortOrAlias"),
            ),
            (
                "tcp port 0",
                tunnel(Tcp, None, Some(Int(0)), "tcp://db:5432"),
                Err("InvalidPortOrAlias"),
            ),
            (
                "tcp bad alias",
                tunnel(Tcp, None, Some(Str("Bad_Alias".into())), "tcp://db:5432"),
                Err("InvalidPortOrAlias"),
            ),
            (
                "foreign alias",
                tunnel(Tcp, None, Some(Str("redis".into())), "tcp://db:5432"),
                Err("TcpEndpointOwnedByOtherNamespace"),
            ),
            (
                "foreign host",
                tunnel(Http, Some("taken"), None, "http://web:80"),
                Err("HostOwnedByOtherNamespace"),
            ),
            (
                "http to tcp",
                tunnel(Http, Some("web"), None, "tcp://db:5432"),
                Err("SchemeMismatch"),
            ),
            (
                "tcp to http",
                tunnel(Tcp, None, Some(Int(1)), "http://web:80"),
                Err("SchemeMismatch"),
            ),
            (
                "ip upstream",
                tunnel(Http, Some("web"), None, "http://10.9.9.9:80"),
                Err("IpAddressUpstream"),
            ),
            (
                "external upstream",
                tunnel(Http, Some("web"), None, "https://example.com"),
                Err("ExternalHostUpstream"),
            ),
            (
                "other namespace",
                tunnel(Http, Some("web"), None, "http://web.blog.svc:80"),
                Err("OtherNamespaceService"),
            ),
            (
                "missing service",
                tunnel(Http, Some("web"), None, "http://nope:80"),
                Err("ServiceNotFound"),
            ),
            (
                "bad url",
                tunnel(Http, Some("web"), None, "web"),
                Err("InvalidUpstreamUrl"),
            ),
        ];
        for (name, t, expected) in cases {
            let got = desired_tunnel(&t, &services(), &reservations(), &aliases(), &options)
                .map(|d| (d.public, d.upstream.to_string()))
                .map_err(|e| e.reason.as_str());
            assert_eq!(got, expected.map(|(p, u)| (p, u.to_owned())), "{name}");
        }
    }

    #[test]
    fn allow_external_upstreams_and_secret_ref() {
        let options = TunnelOptions {
            base_domain: "tuna.dev".into(),
            policy: UpstreamPolicy::cluster_allow_external(),
        };
        let mut t = tunnel(
            TunnelProtocol::Http,
            Some("web"),
            None,
            "https://example.com",
        );
        t.spec.api_key_secret_ref = Some(ApiKeySecretRef {
            name: "key".into(),
            key: None,
        });
        let d = desired_tunnel(&t, &services(), &reservations(), &aliases(), &options).unwrap();
        assert_eq!(d.upstream.authority(), "example.com:443");
        assert_eq!(d.api_key_secret, Some(("key".into(), "api-key".into())));
    }
}
