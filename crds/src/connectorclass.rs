//! `ConnectorClass` (`connectors.alauda.io/v1alpha1`, cluster-scoped): a kind
//! of external system — its auth types, probes and the configurations
//! (files) workloads get — and the built-in class `k8s`.
//!
//! The known fields of the published schema are typed; the objects that the
//! published schema leaves open, and newer sub-fields (`api`, `proxy`,
//! generators), keep unknown fields, so that classes written for the
//! Connectors product apply here unchanged.

#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::connector::{ConnectorCondition, preserve_unknown};

/// Name of the built-in ConnectorClass of Kubernetes API servers.
pub const K8S_CLASS: &str = "k8s";
/// Auth type of the `k8s` class: a bearer token.
pub const BEARER_TOKEN_AUTH: &str = "bearerTokenAuth";
/// Secret type of `bearerTokenAuth`.
pub const BEARER_TOKEN_SECRET_TYPE: &str = "connectors.cpaas.io/bearer-token";
/// Key of the token in a `connectors.cpaas.io/bearer-token` Secret.
pub const BEARER_TOKEN_KEY: &str = "token";
/// The configuration of the `k8s` class that renders a kubeconfig.
pub const KUBECONFIG_CONFIGURATION: &str = "kubeconfig";
/// Key of the CA certificate(s) in a Connector's `caCertSecretRef` Secret.
pub const CA_CERT_KEY: &str = "ca.crt";

/// What connectors of this class are: their auth types (and the Secret type
/// each needs), how they are probed, and the configurations (files) that
/// workloads get to reach them through the connector's proxy.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "connectors.alauda.io",
    version = "v1alpha1",
    kind = "ConnectorClass",
    status = "ConnectorClassStatus",
    derive = "PartialEq",
    derive = "Default",
    category = "alauda",
    doc = "ConnectorClass describes a kind of external system: its auth types and the Secret type each needs, how connectors are probed, and the configurations (files such as a kubeconfig) that workloads get. The class k8s is built in.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether connectors of this class are served"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        description = "Why the class is (not) ready"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ConnectorClassSpec {
    /// Constraints of the connectors' `spec.address`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<ParamSpec>,
    /// Further addresses connectors of this class may declare.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub address_extensions: Option<serde_json::Value>,
    /// Parameters connectors of this class may set (`Connector.spec.params`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<ParamSpec>,
    /// The auth types connectors of this class may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<ClassAuth>,
    /// How the credentials of each auth type are checked against the system.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub auth_probes: Vec<AuthProbe>,
    /// How the system is checked to be up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<Probe>,
    /// The configurations (files) workloads get, by name; `kubeconfig` for k8s.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub configurations: Vec<Configuration>,
    /// The class's API plugin, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub api: Option<serde_json::Value>,
    /// The class's proxy, if it is not the operator's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub proxy: Option<serde_json::Value>,
}

/// A parameter declaration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
pub struct ParamSpec {
    /// Name by which the parameter is referenced.
    pub name: String,
    /// `string` (default), `array` or `object`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// What the parameter is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The value when none is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub default: Option<serde_json::Value>,
    /// Allowed values, if restricted.
    #[serde(rename = "enum", default, skip_serializing_if = "Vec::is_empty")]
    pub enum_: Vec<String>,
    /// Keys of an object parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub properties: Option<serde_json::Value>,
}

/// The auth types of a class.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
pub struct ClassAuth {
    /// The auth types; a connector picks one by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<AuthType>,
}

/// One auth type.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthType {
    /// Name, unique within the class, e.g. `bearerTokenAuth`.
    pub name: String,
    /// Type the connector's Secret must have, e.g. `connectors.cpaas.io/bearer-token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_type: Option<String>,
    /// The data fields (Secret keys) of this auth type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<ParamSpec>,
    /// Whether connectors may omit the credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// Human-readable name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// What this auth type is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// How credentials are generated dynamically, if they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub generator: Option<serde_json::Value>,
}

/// How the credentials of one auth type are checked.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthProbe {
    /// The auth type (`spec.auth.types[].name`) this probe checks.
    pub auth_name: String,
    /// Parameters of the probe.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<ParamSpec>,
    /// The request that checks the credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
}

/// A probe of a connector's system.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
pub struct Probe {
    /// An HTTP request to the connector's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpProbe>,
}

/// An HTTP probe, relative to the connector's address.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct HttpProbe {
    /// Path (and query) appended to the connector's address, e.g. `/version`.
    pub path: String,
    /// `GET` (default) or `POST`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// `http` or `https`; default: the scheme of the connector's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Another host to probe; default: the connector's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Headers to send.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http_headers: Vec<HttpHeader>,
    /// Do not follow redirects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_redirect: Option<bool>,
}

/// An HTTP header of a probe.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
pub struct HttpHeader {
    /// Field name.
    pub name: String,
    /// Field value.
    pub value: String,
}

/// A configuration: named files rendered for a workload.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
pub struct Configuration {
    /// Name of the configuration, e.g. `kubeconfig`.
    pub name: String,
    /// The files, by name (`[-._a-zA-Z0-9]+`), as templates.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
    /// Annotations of the configuration.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Parameters of the templates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<ParamSpec>,
}

/// Observed state of a ConnectorClass.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectorClassStatus {
    /// `Ready`: whether this operator serves connectors of the class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<ConnectorCondition>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Further information from the reconciler.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl ConnectorClassSpec {
    /// The auth type named `name`.
    pub fn auth_type(&self, name: &str) -> Option<&AuthType> {
        self.auth.as_ref()?.types.iter().find(|t| t.name == name)
    }

    /// The HTTP probe of auth type `name`.
    pub fn auth_probe(&self, name: &str) -> Option<&HttpProbe> {
        self.auth_probes
            .iter()
            .find(|p| p.auth_name == name)?
            .probe
            .as_ref()?
            .http
            .as_ref()
    }

    /// The HTTP liveness probe.
    pub fn liveness(&self) -> Option<&HttpProbe> {
        self.liveness_probe.as_ref()?.http.as_ref()
    }
}

/// The kubeconfig the `kubeconfig` configuration of the `k8s` class renders,
/// with its placeholders: the operator renders exactly this shape
/// (`tuna-operator connector kubeconfig`, the CSI driver).
pub const KUBECONFIG_TEMPLATE: &str = "\
apiVersion: v1
kind: Config
clusters:
- name: k8s
  cluster:
    server: {{ .connector.spec.address }}
    proxy-url: http://{{ .connector.metadata.namespace }}%2F{{ .connector.metadata.name }}:{{ .context.token }}@{{ .connector.status.proxy.httpAddress.host }}
    certificate-authority-data: {{ .connector.status.proxy.httpAddress.CACerts | b64enc }}
contexts:
- name: k8s
  context:
    cluster: k8s
    user: k8s
users:
- name: k8s
  user:
    token: fake-token
current-context: k8s
";

/// The built-in class `k8s`: Kubernetes API servers, auth `bearerTokenAuth`
/// (a `connectors.cpaas.io/bearer-token` Secret with key `token`), probed
/// with `GET /version` (liveness) and `GET /api/v1/pods?limit=1` (the token
/// must be able to list pods), configuration `kubeconfig`.
///
/// The connectors role applies it at start (server-side apply, forced): the
/// operator owns it, and edits are undone at the next start.
pub fn builtin_k8s_class() -> ConnectorClass {
    let mut class = ConnectorClass::new(
        K8S_CLASS,
        ConnectorClassSpec {
            address: Some(ParamSpec {
                name: "address".into(),
                type_: Some("string".into()),
                description: Some(
                    "URL of the Kubernetes API server, https://<host>[:<port>][/<path>]".into(),
                ),
                ..Default::default()
            }),
            auth: Some(ClassAuth {
                types: vec![AuthType {
                    name: BEARER_TOKEN_AUTH.into(),
                    secret_type: Some(BEARER_TOKEN_SECRET_TYPE.into()),
                    params: vec![ParamSpec {
                        name: BEARER_TOKEN_KEY.into(),
                        type_: Some("string".into()),
                        description: Some(
                            "Bearer token of the target cluster; it must be able to list pods"
                                .into(),
                        ),
                        ..Default::default()
                    }],
                    display_name: Some("Bearer token".into()),
                    description: Some(
                        "A bearer token of the target cluster, injected by the proxy as Authorization: Bearer".into(),
                    ),
                    ..Default::default()
                }],
            }),
            auth_probes: vec![AuthProbe {
                auth_name: BEARER_TOKEN_AUTH.into(),
                probe: Some(Probe {
                    http: Some(HttpProbe {
                        path: "/api/v1/pods?limit=1".into(),
                        method: Some("GET".into()),
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }],
            liveness_probe: Some(Probe {
                http: Some(HttpProbe {
                    path: "/version".into(),
                    method: Some("GET".into()),
                    ..Default::default()
                }),
            }),
            configurations: vec![Configuration {
                name: KUBECONFIG_CONFIGURATION.into(),
                data: BTreeMap::from([(
                    KUBECONFIG_CONFIGURATION.to_owned(),
                    KUBECONFIG_TEMPLATE.to_owned(),
                )]),
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    class.metadata.labels = Some(BTreeMap::from([(
        "app.kubernetes.io/managed-by".to_owned(),
        "tuna-operator".to_owned(),
    )]));
    class.metadata.annotations = Some(BTreeMap::from([(
        "connectors.alauda.io/built-in".to_owned(),
        "true".to_owned(),
    )]));
    class
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_class_declares_bearer_tokens_and_a_kubeconfig() {
        let class = builtin_k8s_class();
        let auth = class.spec.auth_type(BEARER_TOKEN_AUTH).unwrap();
        assert_eq!(auth.secret_type.as_deref(), Some(BEARER_TOKEN_SECRET_TYPE));
        assert_eq!(auth.params[0].name, BEARER_TOKEN_KEY);
        assert_eq!(
            class.spec.auth_probe(BEARER_TOKEN_AUTH).unwrap().path,
            "/api/v1/pods?limit=1"
        );
        assert_eq!(class.spec.liveness().unwrap().path, "/version");
        assert!(
            class
                .spec
                .configurations
                .iter()
                .any(|c| c.name == KUBECONFIG_CONFIGURATION && c.data.contains_key("kubeconfig"))
        );
    }
}
