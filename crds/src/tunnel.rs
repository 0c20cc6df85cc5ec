//! `Tunnel`: publishes one Service of the Tunnel's namespace at a public address.

// Several `printcolumn(type_ = "string", ..)` entries look like duplicated
// attributes to clippy; they are distinct columns.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Secret key a Tunnel's `apiKeySecretRef` reads when `key` is not given.
pub const DEFAULT_API_KEY_SECRET_KEY: &str = "api-key";

/// Desired state of a Tunnel: what to publish (`upstream`) and where
/// (`subdomain` for http, `portOrAlias` for tcp). The public address appears in
/// `status.url` and in `kubectl get tunnels`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "k8s.tuna.am",
    version = "v1alpha1",
    kind = "Tunnel",
    namespaced,
    status = "TunnelStatus",
    derive = "PartialEq",
    shortname = "tun",
    category = "tuna",
    doc = "Tunnel publishes one Service of its namespace at a public address through the edge: https://<subdomain>.<base domain> for protocol http, or a reserved TCP port (TCPEndpoint) for protocol tcp.",
    printcolumn(
        name = "Protocol",
        type_ = "string",
        json_path = ".spec.protocol",
        description = "http or tcp"
    ),
    printcolumn(
        name = "URL",
        type_ = "string",
        json_path = ".status.url",
        description = "Public address"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the tunnel is connected and serving"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("self.protocol != 'tcp' || has(self.portOrAlias)")
        .message("a tcp Tunnel needs spec.portOrAlias (a TCPEndpoint alias or a reserved port)")
        .field_path(".portOrAlias")
        .reason(Reason::FieldValueRequired),
    validation = Rule::new("self.protocol != 'tcp' || self.upstream.url.startsWith('tcp://')")
        .message("a tcp Tunnel needs a tcp:// upstream URL, e.g. tcp://postgres:5432")
        .field_path(".upstream.url"),
    validation = Rule::new("self.protocol != 'http' || self.upstream.url.startsWith('http://') || self.upstream.url.startsWith('https://')")
        .message("an http Tunnel needs an http:// or https:// upstream URL, e.g. http://web:80")
        .field_path(".upstream.url"),
    validation = Rule::new("self.protocol != 'http' || has(self.subdomain)")
        .message("an http Tunnel needs spec.subdomain")
        .field_path(".subdomain")
        .reason(Reason::FieldValueRequired),
    validation = Rule::new("self.protocol != 'http' || !has(self.portOrAlias)")
        .message("spec.portOrAlias applies to tcp Tunnels only")
        .field_path(".portOrAlias"),
    validation = Rule::new("self.protocol != 'tcp' || !has(self.subdomain)")
        .message("spec.subdomain applies to http Tunnels only")
        .field_path(".subdomain"),
)]
#[serde(rename_all = "camelCase")]
pub struct TunnelSpec {
    /// What the tunnel carries: `http` (routed by host name, served at
    /// https://<subdomain>.<base domain>) or `tcp` (raw TCP on a reserved port).
    #[serde(default)]
    pub protocol: TunnelProtocol,

    /// http only: the public host is `<subdomain>.<base domain of the edge>`. A
    /// single DNS label: lower-case letters, digits and '-'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub subdomain: Option<String>,

    /// tcp only: the public TCP endpoint, as the alias of a TCPEndpoint (for
    /// example `postgres`) or as a reserved port number (for example 30001).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_or_alias: Option<IntOrString>,

    /// Where the traffic goes inside the cluster.
    pub upstream: Upstream,

    /// Optional Secret in this namespace holding the API key this tunnel connects
    /// with (needs the `tunnels:connect` scope). Without it the operator's own
    /// credentials are used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<ApiKeySecretRef>,
}

/// Transport of a Tunnel.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum TunnelProtocol {
    /// HTTP/1.1 and HTTP/2, routed by Host header; the backend sees the public
    /// Host plus X-Forwarded-Host / -Proto / -For.
    #[default]
    Http,
    /// Raw TCP, one public connection per tunnel stream.
    Tcp,
}

/// The target of a Tunnel.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub struct Upstream {
    /// URL of a Service in the Tunnel's namespace: `http://<service>:<port>`,
    /// `https://<service>:<port>` or `tcp://<service>:<port>`; the port is a number
    /// or the name of a Service port. IP addresses, external hosts, other
    /// namespaces and ExternalName Services are refused unless the operator runs
    /// with allowExternalUpstreams.
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,
}

/// A key of a Secret in the Tunnel's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub struct ApiKeySecretRef {
    /// Name of the Secret, in the Tunnel's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside the Secret; `api-key` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl ApiKeySecretRef {
    /// The Secret key to read, applying the documented default.
    pub fn key_or_default(&self) -> &str {
        self.key.as_deref().unwrap_or(DEFAULT_API_KEY_SECRET_KEY)
    }
}

/// Observed state of a Tunnel.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TunnelStatus {
    /// Conditions; `Ready` is True while the tunnel is connected and serving.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Public address: `https://<host>` for http, `tcp://<host>:<port>` for tcp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}
