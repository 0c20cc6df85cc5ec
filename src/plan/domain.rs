//! Domain → desired reservation, and which namespace owns which host.
//!
//! A host belongs to one namespace only (DESIGN §3): the namespace of the Domain
//! that reserves it. Ingress rules for a host no Domain reserves are published
//! only if the host is one of the account's domains; otherwise they are skipped
//! (`HostNotReserved`), exactly as in a cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;
use tuna_crds::{Domain, ReclaimPolicy};

use super::ingress::{IngressRoutes, ServiceRef};
use tuna_routing::RouteSpec;

/// Why a Domain cannot be reserved; the variant name is the machine-readable reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum DomainReason {
    /// Neither or both of subdomain and domain are set.
    SubdomainOrDomainRequired,
    /// The subdomain is not a single DNS label.
    InvalidSubdomain,
    /// The custom domain is not a DNS name.
    InvalidDomain,
    /// An older Domain already reserves the same host.
    DuplicateDomain,
}

impl DomainReason {
    /// Stable machine-readable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SubdomainOrDomainRequired => "SubdomainOrDomainRequired",
            Self::InvalidSubdomain => "InvalidSubdomain",
            Self::InvalidDomain => "InvalidDomain",
            Self::DuplicateDomain => "DuplicateDomain",
        }
    }
}

/// A Domain that cannot be reserved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{}: {message}", reason.as_str())]
pub struct DomainError {
    /// Machine-readable reason.
    pub reason: DomainReason,
    /// What happened and what to do.
    pub message: String,
}

/// The reservation a Domain asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DesiredDomain {
    /// Namespace of the Domain (the namespace that owns the host).
    pub namespace: String,
    /// Name of the Domain.
    pub name: String,
    /// The reserved host, lower case.
    pub fqdn: String,
    /// A custom domain (DNS records to create) rather than a subdomain.
    pub custom: bool,
    /// What deletion does.
    pub reclaim_policy: ReclaimPolicy,
    /// Creation time in seconds, `i64::MAX` when unknown (a file not yet applied).
    pub created: i64,
}

impl fmt::Display for DesiredDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (Domain {}/{})", self.fqdn, self.namespace, self.name)
    }
}

pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_name(s: &str) -> bool {
    s.len() <= 253 && s.contains('.') && s.split('.').all(is_dns_label)
}

/// Translates one Domain. The API server's CEL rules already enforce most of
/// this; it is checked again because files in standalone mode see no API server.
pub fn desired_domain(domain: &Domain, base_domain: &str) -> Result<DesiredDomain, DomainError> {
    let spec = &domain.spec;
    let (fqdn, custom) = match (&spec.subdomain, &spec.domain) {
        (Some(sub), None) => {
            if !is_dns_label(sub) {
                return Err(DomainError {
                    reason: DomainReason::InvalidSubdomain,
                    message: format!(
                        "subdomain {sub:?} must be one DNS label (lower-case letters, digits, '-')"
                    ),
                });
            }
            (format!("{sub}.{}", base_domain.to_ascii_lowercase()), false)
        }
        (None, Some(custom)) => {
            let lower = custom.to_ascii_lowercase();
            if !is_dns_name(&lower) {
                return Err(DomainError {
                    reason: DomainReason::InvalidDomain,
                    message: format!(
                        "domain {custom:?} is not a DNS name such as shop.example.com"
                    ),
                });
            }
            (lower, true)
        }
        _ => {
            return Err(DomainError {
                reason: DomainReason::SubdomainOrDomainRequired,
                message: "set exactly one of spec.subdomain or spec.domain".into(),
            });
        }
    };
    Ok(DesiredDomain {
        namespace: domain
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
        name: domain.metadata.name.clone().unwrap_or_default(),
        fqdn,
        custom,
        reclaim_policy: spec.reclaim_policy,
        created: domain
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(i64::MAX, |t| t.0.as_second()),
    })
}

/// Who may publish which host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostReservations {
    /// Host → namespace of the Domain reserving it.
    pub domains: BTreeMap<String, String>,
    /// Hosts reserved on the account outside Kubernetes (any namespace may use them;
    /// the oldest Ingress then owns the host).
    pub account: BTreeSet<String>,
}

impl HostReservations {
    /// Builds the reservations from translated Domains. Of two Domains reserving
    /// the same host, the oldest (then by namespace and name) wins; the others are
    /// returned as `DuplicateDomain` errors with their namespace and name.
    pub fn from_domains(
        domains: &[DesiredDomain],
        account: BTreeSet<String>,
    ) -> (Self, Vec<(DesiredDomain, DomainError)>) {
        let mut sorted: Vec<&DesiredDomain> = domains.iter().collect();
        sorted.sort_by(|a, b| {
            (a.created, &a.namespace, &a.name).cmp(&(b.created, &b.namespace, &b.name))
        });
        let mut winners: BTreeMap<String, &DesiredDomain> = BTreeMap::new();
        let mut duplicates = Vec::new();
        for d in sorted {
            match winners.get(&d.fqdn) {
                Some(first) => duplicates.push((
                    d.clone(),
                    DomainError {
                        reason: DomainReason::DuplicateDomain,
                        message: format!(
                            "{} is already reserved by Domain {}/{}",
                            d.fqdn, first.namespace, first.name
                        ),
                    },
                )),
                None => {
                    winners.insert(d.fqdn.clone(), d);
                }
            }
        }
        let domains = winners
            .into_iter()
            .map(|(host, d)| (host, d.namespace.clone()))
            .collect();
        (Self { domains, account }, duplicates)
    }

    /// Whether `host` may be published by an object of `namespace`: `Ok` when a
    /// Domain of that namespace or the account reserves it.
    pub fn check(&self, host: &str, namespace: &str) -> Result<(), HostRefusal> {
        let host = host.to_ascii_lowercase();
        match self.domains.get(&host) {
            Some(owner) if owner == namespace => Ok(()),
            Some(owner) => Err(HostRefusal::OtherNamespace {
                owner: owner.clone(),
            }),
            None if self.account.contains(&host) => Ok(()),
            None => Err(HostRefusal::NotReserved),
        }
    }
}

/// Why a host may not be published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum HostRefusal {
    /// No Domain and no account domain reserves it.
    NotReserved,
    /// A Domain of another namespace reserves it.
    OtherNamespace {
        /// That namespace.
        owner: String,
    },
}

impl HostRefusal {
    /// Stable machine-readable name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::NotReserved => "HostNotReserved",
            Self::OtherNamespace { .. } => "HostOwnedByOtherNamespace",
        }
    }

    /// A sentence for people.
    pub fn message(&self, host: &str) -> String {
        match self {
            Self::NotReserved => {
                format!("host {host} is not reserved; add a Domain for it in this namespace")
            }
            Self::OtherNamespace { owner } => {
                format!("host {host} is reserved by a Domain of namespace {owner:?}")
            }
        }
    }
}

/// An Ingress route dropped because its host is not reserved for its namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreservedRoute {
    /// The route.
    pub spec: RouteSpec<ServiceRef>,
    /// Why.
    pub refusal: HostRefusal,
}

/// Keeps the Ingress routes whose host is reserved for the Ingress's namespace
/// and returns the others. Call it after `ingress::translate` (which already
/// settled host ownership among Ingresses).
pub fn reserved_routes(
    routes: IngressRoutes,
    reservations: &HostReservations,
) -> (IngressRoutes, Vec<UnreservedRoute>) {
    let mut kept = IngressRoutes {
        specs: Vec::with_capacity(routes.specs.len()),
        skipped: routes.skipped,
    };
    let mut dropped = Vec::new();
    for spec in routes.specs {
        match reservations.check(&spec.host, &spec.origin.namespace) {
            Ok(()) => kept.specs.push(spec),
            Err(refusal) => dropped.push(UnreservedRoute { spec, refusal }),
        }
    }
    (kept, dropped)
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // test tables
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use tuna_crds::DomainSpec;

    fn domain(
        ns: &str,
        name: &str,
        sub: Option<&str>,
        custom: Option<&str>,
        created: i64,
    ) -> Domain {
        Domain {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                creation_timestamp: Some(Time(
                    k8s_openapi::jiff::Timestamp::from_second(created).unwrap(),
                )),
                ..Default::default()
            },
            spec: DomainSpec {
                subdomain: sub.map(Into::into),
                domain: custom.map(Into::into),
                reclaim_policy: ReclaimPolicy::Delete,
            },
            status: None,
        }
    }

    #[test]
    fn translation_table() {
        let cases: Vec<(Domain, Result<(&str, bool), DomainReason>)> = vec![
            (
                domain("a", "d", Some("shop"), None, 1),
                Ok(("shop.localhost", false)),
            ),
            (
                domain("a", "d", None, Some("Shop.Example.com"), 1),
                Ok(("shop.example.com", true)),
            ),
            (
                domain("a", "d", Some("shop"), Some("shop.example.com"), 1),
                Err(DomainReason::SubdomainOrDomainRequired),
            ),
            (
                domain("a", "d", None, None, 1),
                Err(DomainReason::SubdomainOrDomainRequired),
            ),
            (
                domain("a", "d", Some("a.b"), None, 1),
                Err(DomainReason::InvalidSubdomain),
            ),
            (
                domain("a", "d", Some("-x"), None, 1),
                Err(DomainReason::InvalidSubdomain),
            ),
            (
                domain("a", "d", None, Some("localhost"), 1),
                Err(DomainReason::InvalidDomain),
            ),
        ];
        for (d, expected) in cases {
            let got = desired_domain(&d, "localhost")
                .map(|d| (d.fqdn, d.custom))
                .map_err(|e| e.reason);
            assert_eq!(
                got,
                expected.map(|(f, c)| (f.to_owned(), c)),
                "{:?}",
                d.spec
            );
        }
    }

    #[test]
    fn oldest_domain_owns_the_host_and_others_are_duplicates() {
        let ds: Vec<DesiredDomain> = [
            domain("b", "late", Some("shop"), None, 20),
            domain("a", "early", Some("shop"), None, 10),
            domain("c", "blog", Some("blog"), None, 30),
        ]
        .iter()
        .map(|d| desired_domain(d, "localhost").unwrap())
        .collect();
        let (res, dups) = HostReservations::from_domains(&ds, BTreeSet::new());
        assert_eq!(
            res.domains.get("shop.localhost").map(String::as_str),
            Some("a")
        );
        assert_eq!(dups.len(), 1);
        assert_eq!(
            (dups[0].0.namespace.as_str(), dups[0].1.reason),
            ("b", DomainReason::DuplicateDomain)
        );
        assert!(dups[0].1.message.contains("Domain a/early"));
        assert_eq!(res.check("SHOP.localhost", "a"), Ok(()));
        assert_eq!(
            res.check("shop.localhost", "b"),
            Err(HostRefusal::OtherNamespace { owner: "a".into() })
        );
        assert_eq!(
            res.check("nope.localhost", "a"),
            Err(HostRefusal::NotReserved)
        );
        let with_account = HostReservations {
            account: ["api.example.com".to_owned()].into(),
            ..res
        };
        assert_eq!(with_account.check("api.example.com", "z"), Ok(()));
    }
}
