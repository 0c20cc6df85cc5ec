//! `Connector` (`connectors.alauda.io/v1alpha1`, namespaced): one external
//! system a workload reaches without holding its credentials.
//!
//! The schema follows the published one of the Connectors product (field
//! names, the knative-style conditions with `severity`, `status.proxy.
//! httpAddress`), so that manifests written for it apply here unchanged; no
//! field is required by the schema (as there), and the reconciler says in
//! the conditions what is missing.

// Several `printcolumn(type_ = "string", ..)` entries look like duplicated
// attributes to clippy; they are distinct columns.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Desired state of a Connector: which ConnectorClass it is (`k8s`), the
/// address of the system, and the Secret with the credentials the proxy
/// injects. Workloads never see the credentials: they get a configuration
/// (for `k8s`, a kubeconfig) that points at the connector's proxy.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "connectors.alauda.io",
    version = "v1alpha1",
    kind = "Connector",
    namespaced,
    status = "ConnectorStatus",
    derive = "PartialEq",
    derive = "Default",
    category = "alauda",
    doc = "Connector describes one external system (for class k8s: a Kubernetes API server) and the Secret with its credentials. Workloads reach it through the connector's proxy with a short-lived token of their own; the proxy injects the real credentials, which workloads never hold.",
    printcolumn(
        name = "Class",
        type_ = "string",
        json_path = ".spec.connectorClassName",
        description = "The ConnectorClass (k8s for a Kubernetes API server)"
    ),
    printcolumn(
        name = "Address",
        type_ = "string",
        json_path = ".spec.address",
        description = "Address of the system"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the connector can be used"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        description = "Why the connector is (not) ready",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ConnectorSpec {
    /// Name of the ConnectorClass of this connector: `k8s` (built in) for a
    /// Kubernetes API server.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub connector_class_name: String,

    /// Address of the system. For class k8s the API server's URL,
    /// `https://<host>[:<port>][/<path>]`, e.g. `https://192.168.1.100:6443`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,

    /// Further addresses of the same system (by name); credentials are
    /// injected only toward `address` and these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub address_extensions: Vec<AddressExtension>,

    /// How the proxy authenticates to the system: an auth type of the
    /// ConnectorClass (`bearerTokenAuth` for k8s) and the Secret holding the
    /// credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<ConnectorAuth>,

    /// A Secret of this namespace holding the CA certificate(s) to verify the
    /// system's TLS certificate with, in `ca.crt` (PEM). Default: the
    /// operator's system roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert_secret_ref: Option<LocalSecretRef>,

    /// Parameters declared by the ConnectorClass (`spec.params`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<Param>,
}

/// A named further address of a connector.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
pub struct AddressExtension {
    /// Name of the address.
    pub name: String,
    /// The address, in the same form as `spec.address`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
}

/// The credentials of a connector.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectorAuth {
    /// Name of an auth type of the ConnectorClass
    /// (`ConnectorClass.spec.auth.types[].name`), e.g. `bearerTokenAuth`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The Secret with the credentials, in the connector's namespace. Its type
    /// must be the auth type's `secretType` (`connectors.cpaas.io/bearer-token`,
    /// key `token`, for bearerTokenAuth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<ObjectReference>,
    /// Parameters of the auth type, if it declares any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub params: Option<serde_json::Value>,
}

/// A Secret of the same namespace, by name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
pub struct LocalSecretRef {
    /// Name of the Secret.
    pub name: String,
}

/// A parameter value.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
pub struct Param {
    /// Name of the parameter (as the ConnectorClass declares it).
    pub name: String,
    /// Its value: a string, a list or an object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown")]
    pub value: Option<serde_json::Value>,
}

/// Observed state of a Connector.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectorStatus {
    /// `ConnectorClassReady`, `SecretReady`, `CACertReady` (informational),
    /// `LivenessReady`, `AuthReady`, `ProxyServiceReady` and `Ready` (all of
    /// the others but the informational ones are True).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<ConnectorCondition>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Where workloads reach the connector's proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ConnectorProxyStatus>,
    /// Further information from the reconciler.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The connector's proxy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectorProxyStatus {
    /// The proxy's HTTP address: `proxy-url` of the kubeconfigs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_address: Option<Addressable>,
}

/// An address with what a client needs to trust it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
pub struct Addressable {
    /// The URL, e.g. `http://c-<name>.<namespace>.svc.cluster.local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Name of the address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The OIDC audience of the address, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// PEM certificate(s) of the CA that signs the certificates the proxy
    /// presents: what kubeconfigs carry in `certificate-authority-data`.
    #[serde(rename = "CACerts", default, skip_serializing_if = "Option::is_none")]
    pub ca_certs: Option<String>,
}

/// A condition of a Connector or ConnectorClass (the published schema's
/// shape: knative's, plus `observedGeneration`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectorCondition {
    /// Type of the condition, e.g. `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// A CamelCase reason for the last transition.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// What happened, in words a person can act on.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// `Info` for informational conditions (they do not decide Ready);
    /// empty means Error.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub severity: String,
    /// When the status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// The metadata.generation the condition was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A `Vec` of conditions with by-type helpers.
pub trait ConnectorConditions {
    /// The condition of `type_`, if set.
    fn condition(&self, type_: &str) -> Option<&ConnectorCondition>;
    /// Whether the condition of `type_` is `True`.
    fn is_true(&self, type_: &str) -> bool {
        self.condition(type_).is_some_and(|c| c.status == "True")
    }
}

impl ConnectorConditions for [ConnectorCondition] {
    fn condition(&self, type_: &str) -> Option<&ConnectorCondition> {
        self.iter().find(|c| c.type_ == type_)
    }
}

impl ConnectorCondition {
    /// Sets `next` in `conditions` (replacing the one of its type), keeping the
    /// previous `lastTransitionTime` unless the status changed, so that an
    /// unchanged reconcile writes an identical status.
    pub fn set(conditions: &mut Vec<ConnectorCondition>, mut next: ConnectorCondition, now: Time) {
        match conditions.iter_mut().find(|c| c.type_ == next.type_) {
            Some(existing) => {
                next.last_transition_time = if existing.status == next.status {
                    existing.last_transition_time.clone().or(Some(now))
                } else {
                    Some(now)
                };
                *existing = next;
            }
            None => {
                next.last_transition_time = Some(now);
                conditions.push(next);
            }
        }
    }
}

pub(crate) fn preserve_unknown(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn cond(status: &str, reason: &str) -> ConnectorCondition {
        ConnectorCondition {
            type_: "SecretReady".into(),
            status: status.into(),
            reason: reason.into(),
            ..Default::default()
        }
    }

    #[test]
    fn transition_time_moves_only_when_the_status_flips() {
        let mut conds = Vec::new();
        ConnectorCondition::set(&mut conds, cond("False", "SecretNotFound"), at(10));
        ConnectorCondition::set(&mut conds, cond("False", "SecretWrongType"), at(20));
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].last_transition_time, Some(at(10)));
        assert_eq!(conds[0].reason, "SecretWrongType");
        ConnectorCondition::set(&mut conds, cond("True", "SecretReady"), at(30));
        assert_eq!(conds[0].last_transition_time, Some(at(30)));
        assert!(conds.is_true("SecretReady"));
        assert!(!conds.is_true("Ready"));
    }

    /// The quick start's manifest, as written there, is a valid Connector.
    #[test]
    fn the_documentation_connector_parses() {
        let c: Connector = serde_saphyr::from_str(
            "apiVersion: connectors.alauda.io/v1alpha1\nkind: Connector\nmetadata:\n  name: k8s-connector\nspec:\n  connectorClassName: k8s\n  address: https://192.168.1.100:6443\n  auth:\n    name: bearerTokenAuth\n    secretRef:\n      name: k8s-secret\n",
        )
        .unwrap();
        assert_eq!(c.spec.connector_class_name, "k8s");
        let auth = c.spec.auth.unwrap();
        assert_eq!(auth.name, "bearerTokenAuth");
        assert_eq!(auth.secret_ref.unwrap().name.as_deref(), Some("k8s-secret"));
    }
}
