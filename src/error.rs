//! The crate's error type: one enum, a variant per failure, each message
//! saying what failed and, where there is one, what to do about it.
//!
//! Messages carry their cause (`…: {source}`) because most of them end up in
//! one log line or one status message, not in a chain printer; `main` prints
//! a chain without repeating what a message already holds.
//!
//! Not here, on purpose: the plan's refusals ([`crate::plan::tunnel::TunnelError`],
//! [`crate::plan::domain::DomainError`], [`crate::plan::tcpendpoint::TcpEndpointError`],
//! [`crate::plan::service::UpstreamError`]) and [`crate::manifest::ManifestError`] are
//! values handed on — a reason and a sentence for a status condition, an event
//! or one line of a list — never propagated with `?`; [`ErrorClass`] is the
//! verdict on an error, not an error.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tuna_agent::Error as TunnelError;

/// The environment variable that holds the edge API key when no
/// `--api-key-file` is given.
pub const API_KEY_ENV: &str = "TUNA_API_KEY";

/// What a caller should do about a failed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Network failure, timeout, 5xx: retry with backoff.
    Retryable,
    /// 429: wait this long (at least), then retry.
    RateLimited(Duration),
    /// 4xx that only a change can fix (invalid name, held by another account,
    /// missing scope, bad key): report it and wait for a change.
    NeedsChange,
    /// 404: the object is not (or no longer) there.
    Gone,
}

/// Everything the operator's library can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // The cluster and the edge, as every reconciler and role meets them.
    /// No Kubernetes client could be built from `KUBECONFIG` or the pod's
    /// service account.
    #[error("connecting to the Kubernetes API (KUBECONFIG or in-cluster): {0}")]
    ClusterConnect(#[source] kube::Error),
    /// `route explain` without `-f` found no cluster to read.
    #[error("no Kubernetes cluster to read (set KUBECONFIG, or give manifests with -f): {0}")]
    NoClusterToRead(#[source] kube::Error),
    /// The edge's REST API answered with an error or could not be reached;
    /// [`Error::class`] says what to do about it.
    #[error("{what}: {source}")]
    Edge {
        /// What was being done, e.g. `reserving domain shop.example.com`.
        what: String,
        /// The client's classified error.
        #[source]
        source: TunnelError,
    },
    /// Standalone mode's embedded edge refused (e.g. no free port in its range).
    #[error("{what}: {message}")]
    EmbeddedEdge {
        /// What was being done.
        what: String,
        /// Why it failed.
        message: String,
        /// Whether retrying may help.
        retryable: bool,
    },
    /// The Kubernetes API failed during a reconcile (retried with backoff).
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Adding or removing a finalizer failed, or the cleanup did.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// The operator is not ready to reconcile yet (e.g. the edge's base
    /// domain is unknown).
    #[error("{0}")]
    NotReady(String),
    /// A Kubernetes API call of a command or a role's start failed; `action`
    /// says which.
    #[error("{action}: {source}")]
    KubeCall {
        /// What was being done, e.g. `listing Ingresses`.
        action: String,
        /// What the API (or the client) said.
        #[source]
        source: kube::Error,
    },
    // Starting a role or a command: flags, files, listeners.
    /// A listener (`--probe-listen`, `--metrics-listen`, the demo's
    /// backends) could not be bound.
    #[error("{flag} {addr}: {source}")]
    Listen {
        /// The flag that names the address (or what listens).
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
    EdgeClient(#[source] TunnelError),
    /// The tunnel agent could not start (bad `--edge-agent` or TLS settings).
    #[error("starting the tunnel agent: {0}")]
    TunnelAgent(#[source] TunnelError),
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
    // `crdgen`.
    /// A CRD could not be rendered.
    #[error(transparent)]
    Crd(#[from] tuna_crds::Error),
    /// `crdgen --check` found generated files out of date.
    #[error("{count} CRD file(s) out of date; run `tuna-operator crdgen` and commit the result")]
    CrdDrift {
        /// How many files differ, are missing or are stale.
        count: usize,
    },
    // `route explain`.
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
    // Connectors: `connector kubeconfig`, the connector proxy, probes, kubeconfigs.
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
    /// Reading or creating the connector proxy's CA Secret failed.
    #[error("the proxy CA Secret {secret}: {source}")]
    ProxyCaSecret {
        /// The Secret, `namespace/name`.
        secret: String,
        /// The API's error.
        #[source]
        source: kube::Error,
    },
    /// Reading or writing the ConfigMap that publishes the proxy CA's
    /// certificate failed.
    #[error("the proxy CA's ConfigMap {config_map}: {source}")]
    ProxyCaConfigMap {
        /// The ConfigMap, `namespace/name`.
        config_map: String,
        /// The API's error.
        #[source]
        source: kube::Error,
    },
    /// The ConfigMap of the proxy CA's certificate holds no certificate.
    #[error(
        "the proxy CA's ConfigMap {0} has no certificate in ca.crt: the connectors role writes it at its start (restart it)"
    )]
    ProxyCaCertificateMissing(String),
    /// The CA Secret exists but does not hold a CA.
    #[error(
        "the proxy CA Secret {0} has no tls.crt and tls.key: delete it and restart, and a new CA is made (kubeconfigs minted before stop working)"
    )]
    ProxyCaIncomplete(String),
    /// Generating or loading the proxy CA failed.
    #[error("the proxy CA in Secret {secret}: {source}")]
    ProxyCaInvalid {
        /// The Secret, `namespace/name`.
        secret: String,
        /// Why the CA is unusable.
        #[source]
        source: tuna_proxy::Error,
    },
    /// A probe client of a Connector cannot be built: the CA certificates
    /// or the TLS settings are unusable.
    #[error("TLS settings: {0}")]
    ProbeTls(String),
    /// A Connector's status has no proxy address or CA yet.
    #[error(
        "connector {0} has no proxy address yet (status.proxy.httpAddress): is the connectors role running? see kubectl describe connector"
    )]
    NoProxyAddress(String),
    /// A Connector has no address.
    #[error("connector {0} has no spec.address")]
    NoConnectorAddress(String),
    /// A proxy URL (of the status or an override) is not `http://host[:port]`.
    #[error("the proxy URL {0:?} is not http://<host>[:<port>]")]
    BadProxyUrl(String),
    /// The k8s class has no configuration of that name.
    #[error("the k8s class has no configuration {0:?} (it has: kubeconfig)")]
    UnknownConfiguration(String),
    // Standalone mode.
    /// A state file of standalone mode's data dir is corrupt; delete it to
    /// start afresh.
    #[error("{}: {message} (delete the file to start afresh)", path.display())]
    StateFile {
        /// Which.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// Standalone mode's edge (embedded or remote) refused or failed.
    #[error("edge: {0}")]
    StandaloneEdge(String),
    // The CSI plugin: each `Csi*` variant is one gRPC status code
    // (`impl From<Error> for tonic::Status` in `csi`).
    /// CSI: a missing or malformed request field or attribute
    /// (`INVALID_ARGUMENT`; every `Csi*` variant is one gRPC status code).
    #[error("{0}")]
    CsiInvalidArgument(String),
    /// CSI: the connector (or the pod's ServiceAccount) does not exist.
    #[error("{0}")]
    CsiNotFound(String),
    /// CSI: the pod may not use the connector.
    #[error("{0}")]
    CsiPermissionDenied(String),
    /// CSI: the connector cannot be served by this driver as it is (another class).
    #[error("{0}")]
    CsiFailedPrecondition(String),
    /// CSI: another call on the same volume is in progress.
    #[error("{0}")]
    CsiAborted(String),
    /// CSI: the API server cannot be reached, or the connector is not ready
    /// yet: kubelet retries.
    #[error("{0}")]
    CsiUnavailable(String),
    /// CSI: something the user cannot fix from the pod (the plugin's own
    /// RBAC, the node's file system).
    #[error("{0}")]
    CsiInternal(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A failed Kubernetes API call, saying what it was for.
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let action = action.into();
        move |source| Self::KubeCall { action, source }
    }

    /// A failed call to the edge's REST API, saying what it was for.
    pub fn edge(what: impl Into<String>, source: TunnelError) -> Self {
        Self::Edge {
            what: what.into(),
            source,
        }
    }

    /// How to react (see [`ErrorClass`]): the edge's errors by their class,
    /// a failed cleanup by its cause, everything else is retried.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Edge { source, .. } => match source {
                TunnelError::ApiTransient { .. } | TunnelError::ApiUnexpected { .. } => {
                    ErrorClass::Retryable
                }
                TunnelError::ApiRateLimited { retry_after, .. } => {
                    ErrorClass::RateLimited(retry_after.unwrap_or(Duration::from_secs(1)))
                }
                TunnelError::ApiNotFound { .. } => ErrorClass::Gone,
                TunnelError::ApiAlreadyExists { .. }
                | TunnelError::ApiUnauthorized { .. }
                | TunnelError::ApiForbidden { .. }
                | TunnelError::ApiInvalid { .. }
                | TunnelError::ClientConfig(_) => ErrorClass::NeedsChange,
                // Not a failure of `TunaClient`, which returns none of these.
                _ => ErrorClass::Retryable,
            },
            Self::EmbeddedEdge { retryable, .. } => {
                if *retryable {
                    ErrorClass::Retryable
                } else {
                    ErrorClass::NeedsChange
                }
            }
            Self::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e)
                | kube::runtime::finalizer::Error::CleanupFailed(e) => e.class(),
                _ => ErrorClass::Retryable,
            },
            _ => ErrorClass::Retryable,
        }
    }

    /// The edge's machine-readable code (`invalid_name`,
    /// `held_by_other_account`, …), if the edge answered one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Edge { source, .. } => source.code(),
            _ => None,
        }
    }

    /// The edge's own message, without what the operator was doing: what a
    /// person reads in a condition or event (other errors: the whole message).
    pub fn edge_message(&self) -> String {
        match self {
            Self::Edge { source, .. } => match source {
                TunnelError::ApiAlreadyExists { message, .. }
                | TunnelError::ApiUnauthorized { message }
                | TunnelError::ApiForbidden { message, .. }
                | TunnelError::ApiNotFound { message }
                | TunnelError::ApiInvalid { message, .. }
                | TunnelError::ApiRateLimited { message, .. }
                | TunnelError::ApiTransient { message, .. }
                | TunnelError::ApiUnexpected { message, .. }
                | TunnelError::ClientConfig(message) => message.clone(),
                other => other.to_string(),
            },
            Self::EmbeddedEdge { message, .. } => message.clone(),
            other => other.to_string(),
        }
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
