//! TCPEndpoint → desired reservation (an alias for a public TCP port), and the
//! lookup tcp Tunnels use to find their endpoint.
//!
//! Aliases are account-wide at the edge, but a Tunnel may only use a TCPEndpoint of
//! its own namespace (no tenant can take another's port). An alias no TCPEndpoint
//! declares is left to the edge: it may be reserved on the account directly.

use std::collections::BTreeMap;

use serde::Serialize;
use tuna_crds::{ReclaimPolicy, TcpEndpoint};

use super::domain::is_dns_label;

/// Why a TCPEndpoint cannot be reserved; the variant name is the machine-readable reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum TcpEndpointReason {
    /// The alias is not a single DNS label.
    InvalidAlias,
    /// An older TCPEndpoint already uses the alias.
    DuplicateAlias,
}

impl TcpEndpointReason {
    /// Stable machine-readable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidAlias => "InvalidAlias",
            Self::DuplicateAlias => "DuplicateAlias",
        }
    }
}

/// A TCPEndpoint that cannot be reserved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{}: {message}", reason.as_str())]
pub struct TcpEndpointError {
    /// Machine-readable reason.
    pub reason: TcpEndpointReason,
    /// What happened and what to do.
    pub message: String,
}

/// The reservation a TCPEndpoint asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DesiredTcpEndpoint {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Alias at the edge.
    pub alias: String,
    /// What deletion does.
    pub reclaim_policy: ReclaimPolicy,
    /// Creation time in seconds, `i64::MAX` when unknown.
    pub created: i64,
    /// The port the edge reserved for it (`status.port`), once known: that
    /// port number belongs to the TCPEndpoint's namespace as its alias does.
    pub port: Option<u16>,
}

/// Translates one TCPEndpoint.
pub fn desired_tcp_endpoint(
    endpoint: &TcpEndpoint,
) -> Result<DesiredTcpEndpoint, TcpEndpointError> {
    let alias = &endpoint.spec.alias;
    if !alias.is_empty() && alias.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TcpEndpointError {
            reason: TcpEndpointReason::InvalidAlias,
            message: format!(
                "alias {alias:?} is all digits, which everywhere means a port number: give it a name with a letter"
            ),
        });
    }
    if !is_dns_label(alias) {
        return Err(TcpEndpointError {
            reason: TcpEndpointReason::InvalidAlias,
            message: format!(
                "alias {alias:?} must be one DNS label (lower-case letters, digits, '-')"
            ),
        });
    }
    Ok(DesiredTcpEndpoint {
        namespace: endpoint
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
        name: endpoint.metadata.name.clone().unwrap_or_default(),
        alias: alias.clone(),
        reclaim_policy: endpoint.spec.reclaim_policy,
        created: endpoint
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(i64::MAX, |t| t.0.as_second()),
        port: endpoint
            .status
            .as_ref()
            .and_then(|s| s.port)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0),
    })
}

/// Which namespace declares which alias.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AliasOwners {
    /// Alias → the TCPEndpoint declaring it.
    pub aliases: BTreeMap<String, DesiredTcpEndpoint>,
}

impl AliasOwners {
    /// Of two TCPEndpoints with one alias the oldest (then namespace, name) wins;
    /// the others come back as `DuplicateAlias` errors.
    pub fn new(
        endpoints: &[DesiredTcpEndpoint],
    ) -> (Self, Vec<(DesiredTcpEndpoint, TcpEndpointError)>) {
        let mut sorted: Vec<&DesiredTcpEndpoint> = endpoints.iter().collect();
        sorted.sort_by(|a, b| {
            (a.created, &a.namespace, &a.name).cmp(&(b.created, &b.namespace, &b.name))
        });
        let mut owners = Self::default();
        let mut duplicates = Vec::new();
        for e in sorted {
            match owners.aliases.get(&e.alias) {
                Some(first) => duplicates.push((
                    e.clone(),
                    TcpEndpointError {
                        reason: TcpEndpointReason::DuplicateAlias,
                        message: format!(
                            "alias {} is already used by TCPEndpoint {}/{}",
                            e.alias, first.namespace, first.name
                        ),
                    },
                )),
                None => {
                    owners.aliases.insert(e.alias.clone(), e.clone());
                }
            }
        }
        (owners, duplicates)
    }

    /// The TCPEndpoint declaring `alias`, if any.
    pub fn get(&self, alias: &str) -> Option<&DesiredTcpEndpoint> {
        self.aliases.get(alias)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use tuna_crds::TcpEndpointSpec;

    fn ep(ns: &str, name: &str, alias: &str, created: i64) -> TcpEndpoint {
        TcpEndpoint {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                creation_timestamp: Some(Time(
                    k8s_openapi::jiff::Timestamp::from_second(created).unwrap(),
                )),
                ..Default::default()
            },
            spec: TcpEndpointSpec {
                alias: alias.into(),
                reclaim_policy: ReclaimPolicy::Retain,
            },
            status: None,
        }
    }

    #[test]
    fn aliases() {
        assert_eq!(
            desired_tcp_endpoint(&ep("a", "x", "Pg", 1))
                .unwrap_err()
                .reason,
            TcpEndpointReason::InvalidAlias
        );
        let ok = desired_tcp_endpoint(&ep("a", "x", "pg", 1)).unwrap();
        assert_eq!(
            (ok.alias.as_str(), ok.reclaim_policy),
            ("pg", ReclaimPolicy::Retain)
        );
        let all: Vec<_> = [
            ep("b", "new", "pg", 5),
            ep("a", "old", "pg", 1),
            ep("a", "redis", "redis", 3),
        ]
        .iter()
        .map(|e| desired_tcp_endpoint(e).unwrap())
        .collect();
        let (owners, dups) = AliasOwners::new(&all);
        assert_eq!(owners.get("pg").map(|e| e.namespace.as_str()), Some("a"));
        assert_eq!(owners.get("redis").map(|e| e.name.as_str()), Some("redis"));
        assert_eq!(dups.len(), 1);
        assert_eq!(
            (dups[0].0.name.as_str(), dups[0].1.reason),
            ("new", TcpEndpointReason::DuplicateAlias)
        );
    }
}
