//! Self-registration with the kubelet: the plugin serves the kubelet's
//! plugin-registration API (`pluginregistration/v1`, the `Registration`
//! service of `k8s.io/kubelet`, compiled from `pluginregistration.proto`)
//! on a socket in the kubelet's registration directory
//! (`<kubeletDir>/plugins_registry`), which is what the
//! `csi-node-driver-registrar` sidecar does for other drivers. The kubelet's
//! plugin watcher finds the socket, asks [`GetInfo`] (a `CSIPlugin` named
//! [`DRIVER_NAME`], the CSI socket as the kubelet reaches it, CSI 1.0.0),
//! dials the CSI socket and reports the outcome with
//! `NotifyRegistrationStatus`. No sidecar: the plugin's pod runs one
//! container.
//!
//! The registration socket appears only once the CSI socket listens (the
//! kubelet dials it right after `GetInfo`); a stale one is replaced at start
//! and the socket is removed at shutdown, so the kubelet unregisters the
//! driver when the plugin stops.
//!
//! [`GetInfo`]: proto::registration_server::Registration::get_info

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::DRIVER_NAME;

/// The code `tonic-prost-build` generated from `pluginregistration.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("pluginregistration");
}

/// The plugin type the kubelet's CSI handler takes.
pub const CSI_PLUGIN: &str = "CSIPlugin";

/// The CSI versions the plugin speaks (the kubelet needs a 1.x).
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

/// Where to register: the socket to create in the kubelet's registration
/// directory, and the CSI socket as the kubelet reaches it (a node path).
#[derive(Debug, Clone)]
pub struct Registration {
    /// The registration socket (in the chart,
    /// `/registration/connectors-csi-reg.sock`).
    pub socket: PathBuf,
    /// The CSI endpoint the kubelet dials, as a node path.
    pub endpoint: String,
}

struct RegistrationService {
    endpoint: String,
}

#[tonic::async_trait]
impl proto::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _: Request<proto::InfoRequest>,
    ) -> Result<Response<proto::PluginInfo>, Status> {
        Ok(Response::new(proto::PluginInfo {
            r#type: CSI_PLUGIN.into(),
            name: DRIVER_NAME.into(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| (*v).into()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<proto::RegistrationStatus>,
    ) -> Result<Response<proto::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = DRIVER_NAME, endpoint = %self.endpoint, "registered with the kubelet");
        } else {
            // The kubelet tries again when the socket is created anew: a
            // restart of the plugin (or its pod) does that.
            tracing::error!(
                driver = DRIVER_NAME,
                endpoint = %self.endpoint,
                error = %status.error,
                "the kubelet refused the registration"
            );
        }
        Ok(Response::new(proto::RegistrationStatusResponse {}))
    }
}

/// Serves the registration API on `registration.socket` until `shutdown`,
/// then removes the socket.
pub async fn serve(registration: &Registration, shutdown: CancellationToken) -> crate::Result<()> {
    let socket = &registration.socket;
    let listener = super::socket::bind_socket(socket)?;
    tracing::info!(
        socket = %socket.display(),
        endpoint = %registration.endpoint,
        "registration socket for the kubelet listening"
    );
    // The kubelet's registration client sends the socket path as the
    // authority, which tonic's HTTP/2 refuses: see [`super::authority`].
    let incoming = super::authority::incoming(listener, shutdown.clone());
    let result = tonic::transport::Server::builder()
        .timeout(Duration::from_secs(60))
        .add_service(proto::registration_server::RegistrationServer::new(
            RegistrationService {
                endpoint: registration.endpoint.clone(),
            },
        ))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await;
    remove(socket);
    result.map_err(|e| crate::Error::CsiInternal(format!("the registration server failed: {e}")))
}

fn remove(socket: &Path) {
    let _ = std::fs::remove_file(socket);
}
