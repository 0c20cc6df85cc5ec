//! `TCPEndpoint`: reserves a public TCP port at the edge under an alias.

// Several `printcolumn(type_ = "string", ..)` entries look like duplicated
// attributes to clippy; they are distinct columns.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::reclaim::ReclaimPolicy;

/// Desired state of a TCPEndpoint: the alias under which a public TCP port is
/// reserved; tcp Tunnels refer to it with `portOrAlias: <alias>`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "k8s.tuna.am",
    version = "v1alpha1",
    kind = "TCPEndpoint",
    root = "TcpEndpoint",
    plural = "tcpendpoints",
    singular = "tcpendpoint",
    namespaced,
    status = "TcpEndpointStatus",
    derive = "PartialEq",
    shortname = "tcpe",
    category = "tuna",
    doc = "TCPEndpoint reserves a public TCP port at the edge under an alias; tcp Tunnels refer to it with portOrAlias.",
    printcolumn(
        name = "Alias",
        type_ = "string",
        json_path = ".spec.alias",
        description = "Alias tcp Tunnels refer to"
    ),
    printcolumn(
        name = "Address",
        type_ = "string",
        json_path = ".status.address",
        description = "Public host:port"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the port is reserved"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TcpEndpointSpec {
    /// Name of the reservation at the edge, used by tcp Tunnels in `portOrAlias`.
    /// A single DNS label: lower-case letters, digits and '-'. Immutable.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.alias is immutable; create another TCPEndpoint instead"))]
    pub alias: String,

    /// `Delete` (default) releases the port when this resource is deleted;
    /// `Retain` keeps it reserved at the edge. Adopted reservations are never released.
    #[serde(default)]
    pub reclaim_policy: ReclaimPolicy,
}

/// Observed state of a TCPEndpoint.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TcpEndpointStatus {
    /// Conditions; `Ready` is True once the port is reserved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The reserved public port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// Public address clients connect to, `host:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// True when the reservation already existed at the edge and was adopted; an
    /// adopted reservation is never released by the operator.
    #[serde(default)]
    pub adopted: bool,
}
