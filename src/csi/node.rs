//! The CSI Identity and Node services of `connectors-csi`, and the server
//! that runs them on the Unix socket.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tuna_crds::{Connector, K8S_CLASS};

use super::attributes::{self, VolumeRequest};
use super::proto::identity_server::{Identity, IdentityServer};
use super::proto::node_server::{Node, NodeServer};
use super::proto::{self, node_service_capability, volume_capability};
use super::registration::Registration;
use super::socket::bind_socket;
use super::volume::{self, Ownership, VolumeFile, VolumeState};
use super::{CsiArgs, DRIVER_NAME};
use crate::Error;
use crate::connectors::authorizer::{Subject, may_use_connector, refusal};
use crate::connectors::kubeconfig::{self, KubeconfigInput};
use crate::connectors::proxy_ca;
use crate::connectors::reconciler::proxy_service_host;

/// The built-in files every volume gets (unless excluded with `!name`).
pub const TOKEN_FILE: &str = "context.token";
/// The proxy's CA, PEM.
pub const PROXY_CA_FILE: &str = "context.proxy.caCert";
/// The proxy's URL (without credentials).
pub const PROXY_ADDRESS_FILE: &str = "connector.status.proxyAddress";

/// What the Node service needs.
#[derive(Clone)]
pub struct NodeContext {
    client: Client,
    node_id: String,
    proxy_url: Option<String>,
    /// `host` of the proxy's own Service (operator's namespace).
    proxy_host: String,
    /// Namespace and name of the ConfigMap of the proxy CA's certificate.
    ca_config_map: (String, String),
    token_audience: String,
    /// Volumes with a call in progress: a second call on one gets ABORTED,
    /// as the CSI spec recommends.
    busy: Arc<Mutex<HashSet<String>>>,
}

impl NodeContext {
    /// The services' context for `args`, reading the cluster with `client`.
    pub fn new(client: Client, args: &CsiArgs) -> Self {
        let namespace = args
            .namespace
            .clone()
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|n| !n.is_empty())
            })
            .unwrap_or_else(|| client.default_namespace().to_owned());
        Self {
            node_id: args.node_id.clone(),
            proxy_url: args.proxy_url.clone(),
            proxy_host: proxy_service_host(&args.proxy_service, &namespace, &args.cluster_domain),
            ca_config_map: (namespace, args.ca_config_map.clone()),
            token_audience: args.token_audience.clone(),
            client,
            busy: Arc::default(),
        }
    }
}

/// Marks a volume busy while it lives.
struct BusyGuard {
    busy: Arc<Mutex<HashSet<String>>>,
    volume_id: String,
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.busy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.volume_id);
    }
}

impl NodeContext {
    fn claim(&self, volume_id: &str) -> crate::Result<BusyGuard> {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        if !busy.insert(volume_id.to_owned()) {
            return Err(Error::CsiAborted(format!(
                "another operation on volume {volume_id} is in progress"
            )));
        }
        Ok(BusyGuard {
            busy: Arc::clone(&self.busy),
            volume_id: volume_id.to_owned(),
        })
    }
}

/// The Identity service.
pub struct IdentityService;

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<proto::GetPluginInfoRequest>,
    ) -> Result<Response<proto::GetPluginInfoResponse>, Status> {
        Ok(Response::new(proto::GetPluginInfoResponse {
            name: DRIVER_NAME.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: Default::default(),
        }))
    }

    /// No Controller service: inline volumes need none.
    async fn get_plugin_capabilities(
        &self,
        _: Request<proto::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<proto::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(proto::GetPluginCapabilitiesResponse {
            capabilities: vec![],
        }))
    }

    async fn probe(
        &self,
        _: Request<proto::ProbeRequest>,
    ) -> Result<Response<proto::ProbeResponse>, Status> {
        Ok(Response::new(proto::ProbeResponse { ready: Some(true) }))
    }
}

/// The Node service.
pub struct NodeService {
    ctx: NodeContext,
}

impl NodeService {
    /// The service with `ctx`.
    pub fn new(ctx: NodeContext) -> Self {
        Self { ctx }
    }
}

/// A stable digest of what a publish asks for and of kubelet's tokens: a
/// republish with a new token (kubelet renews it at 80 % of its lifetime)
/// or other attributes is written anew. Only the digest is kept.
fn request_digest(
    request: &proto::NodePublishVolumeRequest,
    group: Option<u32>,
    tokens: &str,
) -> String {
    let context: BTreeMap<&String, &String> = request
        .volume_context
        .iter()
        .filter(|(k, _)| k.as_str() != attributes::SERVICE_ACCOUNT_TOKENS)
        .collect();
    let text = serde_json::json!({
        "context": context,
        "readonly": request.readonly,
        "group": group,
        "tokens": tokens,
    })
    .to_string();
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn io_error(what: &str, target: &Path, e: std::io::Error) -> Error {
    Error::CsiInternal(format!("{what} {}: {e}", target.display()))
}

fn kube_error(what: String, e: kube::Error) -> Error {
    match &e {
        kube::Error::Api(status) if status.code == 404 => {
            Error::CsiNotFound(format!("{what}: {}", status.message))
        }
        kube::Error::Api(status) if status.code == 403 => Error::CsiInternal(format!(
            "{what}: the plugin's ServiceAccount was refused ({}): check the RBAC of the chart's csi component",
            status.message
        )),
        kube::Error::Api(status)
            if status.code == 409 || status.code == 400 || status.code == 422 =>
        {
            Error::CsiFailedPrecondition(format!("{what}: {}", status.message))
        }
        _ => Error::CsiUnavailable(format!("{what}: {e}; kubelet will retry")),
    }
}

/// The group of a publish: the pod's `fsGroup`, as kubelet passes it.
fn mount_group(request: &proto::NodePublishVolumeRequest) -> crate::Result<Option<u32>> {
    let capability = request
        .volume_capability
        .as_ref()
        .ok_or_else(|| Error::CsiInvalidArgument("volume_capability is required".into()))?;
    match &capability.access_type {
        Some(volume_capability::AccessType::Mount(mount)) => {
            let group = mount.volume_mount_group.trim();
            if group.is_empty() {
                return Ok(None);
            }
            // (u32::MAX is -1, "no group", to chown.)
            group
                .parse()
                .ok()
                .filter(|g| *g != u32::MAX)
                .map(Some)
                .ok_or_else(|| {
                    Error::CsiInvalidArgument(format!(
                        "volume_mount_group {group:?} is not a numeric group id"
                    ))
                })
        }
        Some(volume_capability::AccessType::Block(_)) => Err(Error::CsiInvalidArgument(
            "connectors-csi serves file systems, not block volumes".into(),
        )),
        None => Err(Error::CsiInvalidArgument(
            "volume_capability has no access type (mount)".into(),
        )),
    }
}

impl NodeService {
    async fn publish(&self, request: proto::NodePublishVolumeRequest) -> crate::Result<()> {
        if request.volume_id.is_empty() {
            return Err(Error::CsiInvalidArgument("volume_id is required".into()));
        }
        if request.target_path.is_empty() {
            return Err(Error::CsiInvalidArgument("target_path is required".into()));
        }
        let target = PathBuf::from(&request.target_path);
        if !target.is_absolute() {
            return Err(Error::CsiInvalidArgument(format!(
                "target_path {:?} is not absolute",
                request.target_path
            )));
        }
        let group = mount_group(&request)?;
        let asked = VolumeRequest::parse(&request.volume_context)?;
        let tokens = attributes::service_account_tokens(&request.secrets, &request.volume_context)?;
        let _busy = self.ctx.claim(&request.volume_id)?;
        let digest = request_digest(&request, group, tokens);
        let now = volume::unix_now();
        // kubelet republishes every minute or so: the same request with the
        // same token is already on disk, and costs no API call.
        if let Some(state) = volume::read_state(&target)
            && state.volume_id == request.volume_id
            && state.request == digest
            && now < state.expires_at
        {
            return Ok(());
        }
        match self.render(&asked, tokens, now).await {
            Ok((files, expires_at)) => {
                let state = VolumeState {
                    volume_id: request.volume_id.clone(),
                    request: digest,
                    issued_at: now,
                    expires_at,
                };
                let ownership = Ownership {
                    group,
                    readonly: request.readonly,
                };
                volume::write_volume(&target, &files, ownership, &state).map_err(|e| {
                    let e = io_error("writing the volume at", &target, e);
                    tracing::warn!(volume = %request.volume_id, error = %e, "publish failed");
                    e
                })?;
                tracing::info!(
                    volume = %request.volume_id,
                    pod = %format!("{}/{}", asked.pod.namespace, asked.pod.name),
                    connector = %format!("{}/{}", asked.connector_namespace, asked.connector_name),
                    files = files.len(),
                    "published"
                );
                Ok(())
            }
            Err(e) => {
                // A pod that may no longer use the connector keeps no token.
                if matches!(e, Error::CsiPermissionDenied(_) | Error::CsiNotFound(_)) {
                    volume::remove_volume(&target)
                        .map_err(|e| io_error("removing the volume at", &target, e))?;
                }
                tracing::warn!(volume = %request.volume_id, error = %e, "publish refused");
                Err(e)
            }
        }
    }

    /// The pod kubelet names runs on this node, with that uid and
    /// ServiceAccount: a plugin publishes only for its own node's pods.
    async fn check_pod(&self, asked: &VolumeRequest) -> crate::Result<()> {
        let pod = &asked.pod;
        let (ns, name) = (&pod.namespace, &pod.name);
        let found = Api::<Pod>::namespaced(self.ctx.client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(|e| kube_error(format!("reading pod {ns}/{name}"), e))?
            .ok_or_else(|| Error::CsiNotFound(format!("there is no pod {ns}/{name}")))?;
        let uid = found.metadata.uid.unwrap_or_default();
        if uid != pod.uid {
            return Err(Error::CsiFailedPrecondition(format!(
                "pod {ns}/{name} has the uid {uid}, not {} as the request says: it was replaced",
                pod.uid
            )));
        }
        let spec = found.spec.unwrap_or_default();
        let node = spec.node_name.unwrap_or_default();
        if node != self.ctx.node_id {
            return Err(Error::CsiFailedPrecondition(format!(
                "pod {ns}/{name} runs on node {node:?}, not on this plugin's node {:?} (--node-id): a node's plugin publishes only the pods of its node",
                self.ctx.node_id
            )));
        }
        let service_account = spec
            .service_account_name
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into());
        if service_account != pod.service_account {
            return Err(Error::CsiFailedPrecondition(format!(
                "pod {ns}/{name} runs as ServiceAccount {service_account}, not {} as the request says",
                pod.service_account
            )));
        }
        Ok(())
    }

    /// The files of `asked` with kubelet's `tokens`, and when their token
    /// expires (Unix seconds).
    async fn render(
        &self,
        asked: &VolumeRequest,
        tokens: &str,
        now: u64,
    ) -> crate::Result<(Vec<VolumeFile>, u64)> {
        self.check_pod(asked).await?;
        let (ns, name) = (&asked.connector_namespace, &asked.connector_name);
        let connector = Api::<Connector>::namespaced(self.ctx.client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(|e| kube_error(format!("reading connector {ns}/{name}"), e))?
            .ok_or_else(|| {
                Error::CsiNotFound(format!(
                    "there is no connector {ns}/{name} (volumeAttributes connector.name / connector.namespace)"
                ))
            })?;
        let subject = Subject::service_account(&asked.pod.namespace, &asked.pod.service_account);
        let allowed = may_use_connector(&self.ctx.client, &subject, ns, name)
            .await
            .map_err(|e| {
                kube_error(
                    "checking who may use the connector (SubjectAccessReview)".into(),
                    e,
                )
            })?;
        if !allowed {
            return Err(Error::CsiPermissionDenied(format!(
                "pod {}/{}: {}",
                asked.pod.namespace,
                asked.pod.name,
                refusal(&subject.username, ns, name)
            )));
        }
        if connector.spec.connector_class_name != K8S_CLASS {
            return Err(Error::CsiFailedPrecondition(format!(
                "connector {ns}/{name} is of class {:?}: connectors-csi renders the k8s class only",
                connector.spec.connector_class_name
            )));
        }
        let render_error = |e: Error| match e {
            Error::UnknownConfiguration(_) => {
                Error::CsiInvalidArgument(format!("configuration.names: {e}"))
            }
            Error::NoProxyAddress(_) => Error::CsiUnavailable(e.to_string()),
            _ => Error::CsiFailedPrecondition(e.to_string()),
        };
        let configurations = if asked.files.configurations.is_empty() {
            vec![tuna_crds::KUBECONFIG_CONFIGURATION.to_owned()]
        } else {
            asked.files.configurations.clone()
        };
        for c in &configurations {
            if c != tuna_crds::KUBECONFIG_CONFIGURATION {
                return Err(render_error(Error::UnknownConfiguration(c.clone())));
            }
        }
        // The proxy's URL and CA come from its Service's name and the CA's
        // ConfigMap, never from the Connector's status: whoever may patch
        // `connectors/status` could otherwise send workloads' tokens to a
        // proxy of their own.
        let token = attributes::pod_token(tokens, &self.ctx.token_audience, now)?;
        let (ca_namespace, ca_name) = &self.ctx.ca_config_map;
        let ca = proxy_ca::certificate(&self.ctx.client, ca_namespace, ca_name)
            .await
            .map_err(|e| match e {
                Error::ProxyCaConfigMap { source, .. } => kube_error(
                    format!("reading the proxy CA's ConfigMap {ca_namespace}/{ca_name}"),
                    source,
                ),
                e => Error::CsiFailedPrecondition(e.to_string()),
            })?
            .ok_or_else(|| {
                Error::CsiUnavailable(format!(
                    "there is no proxy CA ConfigMap {ca_namespace}/{ca_name} yet (the connectors role writes it at its start; --ca-configmap, --namespace)"
                ))
            })?;
        let proxy_url = self
            .ctx
            .proxy_url
            .clone()
            .unwrap_or_else(|| format!("http://{}", self.ctx.proxy_host));
        let input = KubeconfigInput::with_proxy(&connector, token.token, &proxy_url, ca)
            .map_err(render_error)?;
        let mut files = Vec::new();
        for c in &configurations {
            for f in kubeconfig::render_configuration(c, &input).map_err(render_error)? {
                files.push(VolumeFile {
                    name: f.name,
                    contents: f.contents.into_bytes(),
                });
            }
        }
        let proxy_url = format!("http://{}", input.proxy_host);
        for (file, contents) in [
            (TOKEN_FILE, input.token.expose().to_owned()),
            (PROXY_CA_FILE, input.proxy_ca_pem.clone()),
            (PROXY_ADDRESS_FILE, proxy_url),
        ] {
            if !files.iter().any(|f| f.name == file) {
                files.push(VolumeFile {
                    name: file.into(),
                    contents: contents.into_bytes(),
                });
            }
        }
        for excluded in &asked.files.excluded {
            if !files.iter().any(|f| &f.name == excluded) {
                let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
                return Err(Error::CsiInvalidArgument(format!(
                    "configuration.names: !{excluded} excludes no file (the files are: {})",
                    names.join(", ")
                )));
            }
        }
        files.retain(|f| !asked.files.excluded.contains(&f.name));
        Ok((files, token.expires_at))
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_publish_volume(
        &self,
        request: Request<proto::NodePublishVolumeRequest>,
    ) -> Result<Response<proto::NodePublishVolumeResponse>, Status> {
        self.publish(request.into_inner()).await?;
        Ok(Response::new(proto::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<proto::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<proto::NodeUnpublishVolumeResponse>, Status> {
        let request = request.into_inner();
        if request.volume_id.is_empty() {
            return Err(Error::CsiInvalidArgument("volume_id is required".into()).into());
        }
        if request.target_path.is_empty() || !Path::new(&request.target_path).is_absolute() {
            return Err(
                Error::CsiInvalidArgument("target_path must be an absolute path".into()).into(),
            );
        }
        let _busy = self.ctx.claim(&request.volume_id)?;
        let target = PathBuf::from(&request.target_path);
        volume::remove_volume(&target)
            .map_err(|e| io_error("removing the volume at", &target, e))?;
        tracing::info!(volume = %request.volume_id, "unpublished");
        Ok(Response::new(proto::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<proto::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<proto::NodeGetCapabilitiesResponse>, Status> {
        // VOLUME_MOUNT_GROUP: kubelet passes the pod's fsGroup with each
        // publish instead of changing the files' owner itself afterwards
        // (which a rotation would undo).
        let rpc = node_service_capability::Rpc {
            r#type: node_service_capability::rpc::Type::VolumeMountGroup as i32,
        };
        Ok(Response::new(proto::NodeGetCapabilitiesResponse {
            capabilities: vec![proto::NodeServiceCapability {
                r#type: Some(node_service_capability::Type::Rpc(rpc)),
            }],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<proto::NodeGetInfoRequest>,
    ) -> Result<Response<proto::NodeGetInfoResponse>, Status> {
        Ok(Response::new(proto::NodeGetInfoResponse {
            node_id: self.ctx.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}

/// Serves Identity and Node on the Unix socket `socket` until `shutdown`,
/// and once it listens, the kubelet's registration API when `registration`
/// says where ([`super::registration`]). A stale socket file is replaced;
/// the sockets are removed at the end.
pub async fn serve(
    socket: &Path,
    ctx: NodeContext,
    registration: Option<Registration>,
    shutdown: CancellationToken,
) -> crate::Result<()> {
    let listener = bind_socket(socket)?;
    tracing::info!(socket = %socket.display(), "CSI plugin listening");
    let registered = registration.map(|r| {
        let shutdown = shutdown.clone();
        tokio::spawn(async move { super::registration::serve(&r, shutdown).await })
    });
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let result = tonic::transport::Server::builder()
        .timeout(Duration::from_secs(60))
        .add_service(IdentityServer::new(IdentityService))
        .add_service(NodeServer::new(NodeService::new(ctx)))
        .serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned())
        .await;
    let _ = std::fs::remove_file(socket);
    // The registration socket goes with the plugin (the kubelet then
    // unregisters the driver).
    shutdown.cancel();
    if let Some(registered) = registered {
        match registered.await {
            Ok(Err(e)) => tracing::error!(error = %e, "registration with the kubelet"),
            Err(e) => tracing::error!(error = %e, "registration task"),
            Ok(Ok(())) => {}
        }
    }
    result.map_err(|e| Error::CsiInternal(format!("the gRPC server failed: {e}")))
}

/// Runs `tuna-operator csi` until SIGTERM/SIGINT.
pub async fn run(args: CsiArgs) -> crate::Result<()> {
    let socket = super::socket_path(&args.endpoint)?;
    let client = crate::role::cluster_client().await?;
    let shutdown = crate::role::shutdown_on_signal();
    let registration = args.registration_socket.clone().map(|at| Registration {
        socket: at,
        endpoint: args
            .kubelet_endpoint
            .clone()
            .unwrap_or_else(|| socket.display().to_string()),
    });
    serve(
        &socket,
        NodeContext::new(client, &args),
        registration,
        shutdown,
    )
    .await?;
    Ok(())
}
