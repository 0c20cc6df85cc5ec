//! `tuna-operator csi`: the `connectors-csi` node plugin. kubelet mounts a
//! connector's kubeconfig into a pod as an inline CSI volume:
//!
//! ```yaml
//! volumes:
//! - name: kubeconfig
//!   csi:
//!     readOnly: true
//!     driver: connectors-csi
//!     volumeAttributes:
//!       connector.name: "k8s-connector"
//!       configuration.names: "kubeconfig"
//! ```
//!
//! The plugin serves the CSI v1 Identity and Node services over a Unix
//! socket (gRPC, tonic; the protocol compiled from `csi.proto` by
//! `build.rs` with protox). For each `NodePublishVolume` it
//!
//! 1. reads the attributes, the pod's identity and the pod's token that
//!    kubelet requested for the CSIDriver's `tokenRequests` — bound to the
//!    pod, for the proxy's audience ([`attributes`]);
//! 2. reads the Pod: it must run on this node (`--node-id`) with the uid
//!    and ServiceAccount kubelet names;
//! 3. reads the Connector, and checks that the pod's ServiceAccount may use
//!    it — the connector proxy's own rule
//!    ([`crate::connectors::authorizer::may_use_connector`]): a pod that may
//!    not gets `PERMISSION_DENIED` and no files;
//! 4. renders the configurations with the connector family's one renderer
//!    ([`crate::connectors::kubeconfig`]) plus the built-in files, and writes
//!    them atomically into `target_path` ([`volume`]), never following a
//!    link the pod planted there.
//!
//! The plugin mints no token: its ServiceAccount may not create any
//! (`serviceaccounts/token`), so owning one node's plugin gives no
//! ServiceAccount's token. A repeated call with the same request and token
//! is answered from the volume's state without calling the API server;
//! kubelet renews the token at 80 % of its lifetime and republishes
//! (`requiresRepublish: true`), and the new token replaces the old one.
//! `NodeUnpublishVolume` removes the directory.
//!
//! With `--registration-socket` the plugin also registers itself with the
//! kubelet ([`registration`]): no `csi-node-driver-registrar` sidecar.
//!
//! Nothing is mounted: an inline volume of this driver is the directory the
//! plugin fills, which kubelet hands to the pod's containers.

pub mod attributes;
pub mod authority;
pub mod node;
pub mod registration;
pub mod socket;
pub mod volume;

/// The code `tonic-prost-build` generated from `csi.proto` (package `csi.v1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("csi.v1");
}

use std::path::PathBuf;

use crate::Error;

/// The driver's name (`GetPluginInfo`, the CSIDriver object).
pub const DRIVER_NAME: &str = "connectors-csi";

/// Each `Csi*` variant is one gRPC status code; whatever else reaches
/// kubelet is something the user cannot fix from the pod.
impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        use tonic::Code;
        let code = match &e {
            Error::CsiInvalidArgument(_) => Code::InvalidArgument,
            Error::CsiNotFound(_) => Code::NotFound,
            Error::CsiPermissionDenied(_) => Code::PermissionDenied,
            Error::CsiFailedPrecondition(_) => Code::FailedPrecondition,
            Error::CsiAborted(_) => Code::Aborted,
            Error::CsiUnavailable(_) => Code::Unavailable,
            _ => Code::Internal,
        };
        tonic::Status::new(code, e.to_string())
    }
}

/// Flags of `tuna-operator csi`.
#[derive(Debug, Clone, clap::Args)]
pub struct CsiArgs {
    /// The CSI endpoint: `unix:///csi/csi.sock` (or a plain path).
    #[arg(
        long,
        value_name = "URL",
        env = "CSI_ENDPOINT",
        default_value = "unix:///csi/csi.sock"
    )]
    pub endpoint: String,
    /// This node's name (`NodeGetInfo`); in the chart, `spec.nodeName`. A
    /// pod of another node is refused.
    #[arg(long, value_name = "NODE", env = "NODE_NAME")]
    pub node_id: String,
    /// Proxy URL written into kubeconfigs instead of the proxy's Service
    /// (`--proxy-service`), for nodes whose pods cannot resolve the
    /// cluster's DNS names (tests, debugging).
    #[arg(long, value_name = "URL")]
    pub proxy_url: Option<String>,
    /// The proxy's Service in the operator's namespace (`--namespace`), as
    /// the connectors role's `--proxy-service`, or a full DNS name:
    /// kubeconfigs dial `http://<service>.<namespace>.svc.<cluster domain>`
    /// and name the Connector in the userinfo. Never a Service of the
    /// Connector's namespace, which its editors could repoint.
    #[arg(long, value_name = "NAME", default_value = "tuna-operator-connectors")]
    pub proxy_service: String,
    /// The operator's namespace, of the proxy CA's ConfigMap. Default: the
    /// environment variable POD_NAMESPACE, else the kubeconfig's namespace.
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
    /// ConfigMap in which the connectors role publishes its proxy CA's
    /// certificate (named as the role's `--ca-secret`): its `ca.crt` is the
    /// CA that kubeconfigs trust. The plugin reads no Secret (the CA's key
    /// stays off the nodes), and not the Connector's
    /// `status.proxy.httpAddress`: whoever may patch a status could redirect
    /// workloads with it.
    #[arg(
        long = "ca-configmap",
        value_name = "NAME",
        default_value = "tuna-operator-connectors-ca"
    )]
    pub ca_config_map: String,
    /// The cluster's DNS domain (of the proxy URL).
    #[arg(long, value_name = "DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Audience of the pod tokens used as proxy passwords: the connectors
    /// role's `--token-audience`, and one of the CSIDriver's
    /// `tokenRequests`.
    #[arg(long, value_name = "AUDIENCE", default_value = crate::connectors::role::DEFAULT_AUDIENCE)]
    pub token_audience: String,
    /// Registers the plugin with the kubelet itself (no registrar sidecar):
    /// the socket to serve the kubelet's plugin-registration API on, in the
    /// kubelet's registration directory (`<kubeletDir>/plugins_registry`;
    /// in the chart, mounted at `/registration`). Without it, something
    /// else must register the plugin.
    #[arg(long, value_name = "PATH")]
    pub registration_socket: Option<PathBuf>,
    /// The CSI socket as the kubelet reaches it (a path on the node), which
    /// the registration hands to the kubelet. Default: the `--endpoint`
    /// path (right when the plugin sees the node's paths).
    #[arg(long, value_name = "PATH")]
    pub kubelet_endpoint: Option<String>,
}

/// The socket path of `endpoint` (`unix:///path`, `unix:/path` or `/path`).
pub fn socket_path(endpoint: &str) -> crate::Result<PathBuf> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    if !path.starts_with('/') {
        return Err(Error::CsiInvalidArgument(format!(
            "--endpoint {endpoint:?} is not unix:///<absolute path>"
        )));
    }
    Ok(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        for (endpoint, path) in [
            ("unix:///csi/csi.sock", "/csi/csi.sock"),
            ("unix:/csi/csi.sock", "/csi/csi.sock"),
            ("/csi/csi.sock", "/csi/csi.sock"),
        ] {
            assert_eq!(socket_path(endpoint).unwrap(), PathBuf::from(path));
        }
        for bad in ["tcp://1.2.3.4:5", "unix://relative", "csi.sock"] {
            assert!(socket_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn errors_are_status_codes() {
        let status: tonic::Status = Error::CsiPermissionDenied("no".into()).into();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert_eq!(status.message(), "no");
    }
}
