//! What every role shares — the families' roles (`agent`, `controller`,
//! `connectors`, `csi`, `all`) are built on it.
//!
//! Every role takes the edge to use (`--edge-api`, `--edge-ca-file`, the API
//! key from `--api-key-file` or `TUNA_API_KEY`), `--resync-interval`, and
//! serves `/healthz` + `/readyz` on `--probe-listen` and `/metrics` on
//! `--metrics-listen`. The Kubernetes client follows the standard kubeconfig
//! resolution (`KUBECONFIG`, else in-cluster). It must not know a family.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tuna_agent::client::{ClientOptions, TunaClient};
use tuna_protocol::api::Secret;

use crate::Error;
use crate::edge::api::{EdgeApi, RemoteEdge};
use crate::health::{self, MetricsRenderer, Readiness};
use crate::metrics::{MeteredEdge, Metrics};

/// The environment variable holding the API key (when `--api-key-file` is not given).
pub use crate::error::API_KEY_ENV;

/// Parses `2s`, `5m`, `1h30m` (humantime).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration like 30s, 5m or 1h: {e}"))
}

/// Which edge to use and how to authenticate.
#[derive(Debug, Clone, clap::Args)]
pub struct EdgeArgs {
    /// Base URL of the edge's REST API, e.g. `https://edge.example.com:7444`.
    #[arg(long, value_name = "URL")]
    pub edge_api: String,
    /// PEM file of the CA to trust for the edge (a self-hosted edge's
    /// `<data-dir>/tls/ca.pem`). Default: the system's roots.
    #[arg(long, value_name = "PEM")]
    pub edge_ca_file: Option<PathBuf>,
    /// File holding the API key (trailing whitespace is ignored). Default: the
    /// environment variable TUNA_API_KEY.
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
}

impl EdgeArgs {
    /// The API key, from `--api-key-file` or `TUNA_API_KEY`.
    pub fn api_key(&self) -> crate::Result<Secret> {
        let key = match &self.api_key_file {
            Some(path) => std::fs::read_to_string(path).map_err(|source| Error::ApiKeyRead {
                path: path.clone(),
                source,
            })?,
            None => std::env::var(API_KEY_ENV).map_err(|_| Error::NoApiKey)?,
        };
        let key = key.trim_end();
        if key.is_empty() {
            return Err(Error::EmptyApiKey);
        }
        Ok(Secret::new(key))
    }

    /// A client of the edge's REST API with the operator's key.
    pub fn client(&self) -> crate::Result<TunaClient> {
        self.client_with(self.api_key()?)
    }

    /// A client of the edge's REST API with `key` (e.g. a Tunnel's own).
    pub fn client_with(&self, key: Secret) -> crate::Result<TunaClient> {
        let mut options = ClientOptions::new(self.edge_api.clone(), key);
        if let Some(ca) = &self.edge_ca_file {
            options = options.with_ca_file(ca.clone());
        }
        TunaClient::new(options).map_err(Error::EdgeClient)
    }
}

/// Listeners and timing every role shares.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Listener of `/metrics` (Prometheus).
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:8080")]
    pub metrics_listen: SocketAddr,
    /// Listener of `/healthz` and `/readyz`.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:8081")]
    pub probe_listen: SocketAddr,
    /// Every object is re-checked this often (e.g. `30s`, `5m`).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub resync_interval: Duration,
}

/// The edge API with the operator's key, metered.
pub fn edge_api(args: &EdgeArgs, metrics: &Arc<Metrics>) -> crate::Result<Arc<dyn EdgeApi>> {
    let remote: Arc<dyn EdgeApi> = Arc::new(RemoteEdge::new(args.client()?));
    Ok(Arc::new(MeteredEdge::new(remote, Arc::clone(metrics))))
}

/// This process's name in events and leases: `POD_NAME`, else the host name
/// with a random suffix (chosen once per process).
pub fn instance_name() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(pick_instance_name).clone()
}

fn pick_instance_name() -> String {
    if let Ok(pod) = std::env::var("POD_NAME")
        && !pod.is_empty()
    {
        return pod;
    }
    use rand::Rng;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "tuna-operator".into());
    format!("{host}-{:06x}", rand::rng().random::<u32>() & 0xff_ffff)
}

/// What every role does before its reconcilers start: `/healthz` + `/readyz`
/// and `/metrics` listening (readiness from `ready`, the body from `render`),
/// the Kubernetes client, and a token that SIGTERM/SIGINT cancels.
pub async fn start(
    serve: &ServeArgs,
    ready: watch::Receiver<Readiness>,
    render: MetricsRenderer,
) -> crate::Result<(kube::Client, CancellationToken)> {
    let (probe, metrics) =
        health::start(serve.probe_listen, serve.metrics_listen, ready, render).await?;
    tracing::info!(%probe, %metrics, "probes and metrics listening");
    Ok((cluster_client().await?, shutdown_on_signal()))
}

/// The Kubernetes client as kube-rs infers it (`KUBECONFIG`, else in-cluster).
pub async fn cluster_client() -> crate::Result<kube::Client> {
    crate::cluster::client()
        .await
        .map_err(Error::ClusterConnect)
}

/// A token cancelled on SIGINT or SIGTERM (logged once).
pub fn shutdown_on_signal() -> CancellationToken {
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        token.cancel();
    });
    shutdown
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
