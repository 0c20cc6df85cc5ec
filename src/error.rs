//! The crate's error type: one enum, a variant per failure, each message
//! saying what failed and, where there is one, what to do about it.
//!
//! Messages carry their cause (`…: {source}`) because most of them end up in
//! one log line or one status message, not in a chain printer; `main` prints
//! a chain without repeating what a message already holds.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::role::API_KEY_ENV;

/// Everything the operator's library can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No Kubernetes client could be built from `KUBECONFIG` or the pod's
    /// service account.
    #[error("connecting to the Kubernetes API (KUBECONFIG or in-cluster): {0}")]
    ClusterConnect(#[source] kube::Error),
    /// `route explain` without `-f` found no cluster to read.
    #[error("no Kubernetes cluster to read (set KUBECONFIG, or give manifests with -f): {0}")]
    NoClusterToRead(#[source] kube::Error),
    /// A Kubernetes API call failed; `action` says which.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done, e.g. `listing Ingresses`.
        action: String,
        /// What the API (or the client) said.
        #[source]
        source: kube::Error,
    },
    /// A listener (`--probe-listen`, `--metrics-listen`) could not be bound.
    #[error("{flag} {addr}: {source}")]
    Listen {
        /// The flag that names the address.
        flag: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file or folder could not be read, written, created, listed or removed.
    #[error("cannot {action} {}: {source}", path.display())]
    File {
        /// `read`, `write`, `create`, `list` or `remove`.
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The tokio runtime could not be started.
    #[error("starting the tokio runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// A flag needs another one.
    #[error("{flag} is required with {with}")]
    FlagRequired {
        /// The missing flag.
        flag: &'static str,
        /// The flag given that needs it.
        with: &'static str,
    },
    /// `--api-key-file` could not be read.
    #[error("reading the API key from {}: {source}", path.display())]
    ApiKeyRead {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Neither `--api-key-file` nor `TUNA_API_KEY` is given.
    #[error("no API key: give --api-key-file FILE or set the environment variable {API_KEY_ENV}")]
    NoApiKey,
    /// The API key is empty (or whitespace).
    #[error("the API key is empty (check --api-key-file or {API_KEY_ENV})")]
    EmptyApiKey,
    /// The edge API client could not be built (bad URL or CA file).
    #[error("edge API client: {0}")]
    EdgeClient(#[source] tuna_tunnel::api::ClientError),
    /// The tunnel agent could not start (bad `--edge-agent` or TLS settings).
    #[error("starting the tunnel agent: {0}")]
    TunnelAgent(#[source] tuna_tunnel::wire::Error),
    /// The cluster's identity is unknown.
    #[error("the kube-system namespace has no uid; give --cluster-id")]
    NoClusterUid,
    /// The leader election could not start.
    #[error("leader election in namespace {namespace}: {source}")]
    LeaderElection {
        /// The Lease's namespace.
        namespace: String,
        /// Why.
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },
    /// A CRD could not be rendered.
    #[error(transparent)]
    Crd(#[from] tuna_crds::Error),
    /// `crdgen --check` found generated files out of date.
    #[error("{count} CRD file(s) out of date; run `tuna-operator crdgen` and commit the result")]
    CrdDrift {
        /// How many files differ, are missing or are stale.
        count: usize,
    },
    /// A URL to explain is not an http(s) URL.
    #[error("URL {url:?}: only http and https URLs are routed")]
    UrlScheme {
        /// As given.
        url: String,
    },
    /// A URL to explain has no host.
    #[error("URL {url:?} has no host")]
    UrlNoHost {
        /// As given.
        url: String,
    },
    /// A URL to explain has a host that is not a valid `host[:port]`.
    #[error("URL {url:?}: {host:?} is not a valid host[:port]")]
    UrlHost {
        /// As given.
        url: String,
        /// Its host part.
        host: String,
    },
    /// `-f` files or documents could not be read (one line per problem).
    #[error("cannot read the manifests:\n{}", indent(.0))]
    ManifestsUnreadable(Vec<String>),
    /// `-f` documents are not valid objects (one line per problem).
    #[error("invalid Ingress manifests:\n{}", indent(.0))]
    ManifestsInvalid(Vec<String>),
    /// The route table could not be built.
    #[error("building the route table: {0}")]
    RouteTable(#[source] tuna_routing::Error),
    /// An answer could not be written as JSON.
    #[error("writing the JSON answer: {0}")]
    Json(#[source] serde_json::Error),
    /// `connector kubeconfig --duration` below what the API server accepts.
    #[error(
        "--duration {} is too short: the API server refuses tokens of less than 10m",
        humantime::format_duration(*.0)
    )]
    DurationTooShort(Duration),
    /// The Connector named does not exist.
    #[error("there is no connector {namespace}/{name}")]
    NoConnector {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A TokenRequest succeeded without a token.
    #[error("the TokenRequest answered no token")]
    NoToken,
    /// The connector proxy's CA could not be loaded.
    #[error("the proxy CA: {0}")]
    ProxyCa(#[source] tuna_proxy::Error),
    /// The connector proxy could not listen.
    #[error("--proxy-listen {addr}: {source}")]
    ProxyListen {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: tuna_proxy::Error,
    },
    /// A kubeconfig could not be rendered for a Connector.
    #[error(transparent)]
    Kubeconfig(#[from] crate::connectors::kubeconfig::RenderError),
    /// The CSI plugin failed.
    #[error(transparent)]
    Csi(#[from] crate::csi::CsiError),
    /// Standalone mode failed.
    #[error(transparent)]
    Standalone(#[from] crate::standalone::Error),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A failed Kubernetes API call, saying what it was for.
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let action = action.into();
        move |source| Self::Kube { action, source }
    }

    /// A failed file operation on `path` (`action`: `read`, `write`, …).
    pub fn file(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::File {
            action,
            path,
            source,
        }
    }
}

/// One problem a line, indented under the message.
fn indent(lines: &[String]) -> String {
    lines
        .iter()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
