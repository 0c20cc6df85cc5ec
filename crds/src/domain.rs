//! `Domain`: reserves a host name at the edge (a subdomain of the edge's base
//! domain, or a custom domain verified through DNS).

// Several `printcolumn(type_ = "string", ..)` entries look like duplicated
// attributes to clippy; they are distinct columns.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::reclaim::ReclaimPolicy;

/// Desired state of a Domain: exactly one of `subdomain` or `domain`. Ingresses
/// (class tuna) of this namespace may publish the reserved host; Ingresses of
/// other namespaces claiming it are ignored.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "k8s.tuna.am",
    version = "v1alpha1",
    kind = "Domain",
    namespaced,
    status = "DomainStatus",
    derive = "PartialEq",
    shortname = "tdom",
    category = "tuna",
    doc = "Domain reserves a host name at the edge (a subdomain of the edge's base domain, or a custom domain verified through DNS) for the Ingresses of its namespace.",
    printcolumn(
        name = "FQDN",
        type_ = "string",
        json_path = ".status.fqdn",
        description = "Reserved host name"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the reservation is active (and, for custom domains, verified)"
    ),
    printcolumn(
        name = "Adopted",
        type_ = "boolean",
        json_path = ".status.adopted",
        description = "The reservation existed before this resource and is never released by the operator"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("has(self.subdomain) != has(self.domain)")
        .message("set exactly one of spec.subdomain or spec.domain"),
    validation = Rule::new("has(self.subdomain) == has(oldSelf.subdomain)")
        .message("a Domain cannot switch between subdomain and domain; delete it and create a new one"),
)]
#[serde(rename_all = "camelCase")]
pub struct DomainSpec {
    /// A single DNS label reserved under the edge's base domain: `shop` becomes
    /// `shop.<base domain>`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.subdomain is immutable; create another Domain instead"))]
    pub subdomain: Option<String>,

    /// A custom domain you own, e.g. `shop.example.com`. The DNS records to create
    /// appear in status.dnsRecords; verification is retried every 5 minutes.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)+[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.domain is immutable; create another Domain instead"))]
    pub domain: Option<String>,

    /// `Delete` (default) releases the reservation when this resource is deleted;
    /// `Retain` keeps it at the edge. Adopted reservations are never released.
    #[serde(default)]
    pub reclaim_policy: ReclaimPolicy,
}

/// A DNS record to create for a custom domain.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub struct DnsRecord {
    /// Record type, e.g. `CNAME` or `TXT`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Record name, e.g. `shop.example.com` or `_tuna-challenge.shop.example.com`.
    pub name: String,
    /// Record value, e.g. the edge host a CNAME points to.
    pub value: String,
}

/// Observed state of a Domain.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainStatus {
    /// Conditions; `Ready` is True once the reservation exists (and, for a custom
    /// domain, is verified).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The reserved fully qualified host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fqdn: Option<String>,
    /// For custom domains: the DNS records to create at your DNS provider.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_records: Vec<DnsRecord>,
    /// True when the reservation already existed at the edge and was adopted; an
    /// adopted reservation is never released by the operator.
    #[serde(default)]
    pub adopted: bool,
}

impl DomainSpec {
    /// The fully qualified host this spec reserves, given the edge's base domain.
    /// `None` when neither field is set (the API server's CEL rule forbids that;
    /// files in standalone mode are not checked by an API server).
    pub fn fqdn(&self, base_domain: &str) -> Option<String> {
        match (&self.subdomain, &self.domain) {
            (Some(sub), None) => Some(format!("{sub}.{base_domain}")),
            (None, Some(domain)) => Some(domain.clone()),
            _ => None,
        }
    }
}
