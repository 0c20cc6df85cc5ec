//! `tuna-operator connectors`: the Connector reconciler and the connector
//! proxy (a CONNECT listener registered into the proxy core), in one
//! process. Start-up:
//!
//! 1. probes (`/healthz`, `/readyz`: ready once the Connector and
//!    ConnectorClass watches are synced) and `/metrics` (the role's and the
//!    proxy core's);
//! 2. the proxy CA from its Secret in the operator's namespace (made on the
//!    first start, see [`super::proxy_ca`]);
//! 3. the built-in ConnectorClass `k8s`, applied (server-side apply,
//!    forced: the operator owns it) with `Ready=True`;
//! 4. the proxy listener (`--proxy-listen`), then the reconciler.
//!
//! Steps 2 and 3 are retried with backoff while the API server or the CRDs
//! are missing, with a log line saying what is missing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tuna_crds::{ConnectorClass, ConnectorClassStatus, ConnectorCondition, builtin_k8s_class};
use tuna_proxy::{ConnectConfig, ConnectLimits, InterceptCa, ProxyConfig, ProxyCore};

use super::authorizer::{AuthorizerOptions, KubeAuthorizer};
use super::proxy_ca;
use super::targets::ProxyTargets;
use crate::connectors::reconciler::{self, ConnectorContext, ConnectorOptions, FIELD_MANAGER};
use crate::health::Readiness;
use crate::metrics::Metrics;
use crate::reconcile::{Backoff, FIELD_MANAGER as STATUS_MANAGER};
use crate::role::{ServeArgs, instance_name, parse_duration};

/// The default audience of proxy passwords (ServiceAccount tokens).
pub const DEFAULT_AUDIENCE: &str = "connectors.alauda.io";

/// Flags of `tuna-operator connectors`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectorsArgs {
    /// Listener of the connector proxy (HTTP CONNECT); the Service in front
    /// of it serves port 80.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:3128")]
    pub proxy_listen: SocketAddr,
    /// The connectors role's own flags.
    #[command(flatten)]
    pub connectors: ConnectorsFlags,
    /// (`--resync-interval` is how often every Ready Connector is probed
    /// again; one that is not Ready is checked again sooner, with a backoff
    /// from 1 s up to it.)
    /// Probes, metrics and resync.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// The connectors role's own flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectorsFlags {
    /// The operator's namespace (of the CA Secret and the proxy's Service).
    /// Default: the environment variable POD_NAMESPACE, else the
    /// kubeconfig's namespace.
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
    /// Secret (in the operator's namespace) holding the proxy's CA; its
    /// certificate alone is published in a ConfigMap of the same name (key
    /// `ca.crt`) for the CSI node plugin.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "tuna-operator-connectors-ca"
    )]
    pub ca_secret: String,
    /// The Service in front of the proxy listener, port 80: a name in the
    /// operator's namespace, or a full DNS name. Kubeconfigs and
    /// `status.proxy.httpAddress` name it; every Connector's Service
    /// `c-<name>` is an ExternalName for it.
    #[arg(long, value_name = "NAME", default_value = "tuna-operator-connectors")]
    pub proxy_service: String,
    /// The cluster's DNS domain.
    #[arg(long, value_name = "DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Audience of the ServiceAccount tokens workloads use as proxy
    /// passwords (checked with TokenReview; tokens for other audiences, e.g.
    /// the API server's, are refused).
    #[arg(long, value_name = "AUDIENCE", default_value = DEFAULT_AUDIENCE)]
    pub token_audience: String,
    /// A probe of a connector's address gives up after this long.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub probe_timeout: Duration,
    /// Most open proxy connections that have passed their CONNECT.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub proxy_max_connections: usize,
    /// Most proxy connections that have not passed their CONNECT yet (their
    /// own budget: idle sockets cannot take the places of callers with
    /// credentials).
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub proxy_max_unauthenticated: usize,
    /// Most of those from one client address.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub proxy_max_unauthenticated_per_ip: usize,
    /// How long a proxy decision holds: reviews are reused this long, and
    /// an open connection is checked again after it (a revoked token,
    /// ServiceAccount, RoleBinding or Connector is refused within it).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub proxy_recheck_interval: Duration,
    /// TokenReviews per second for tokens the proxy has not seen valid,
    /// from all sources together: the ceiling (more are answered 429 with
    /// Retry-After).
    #[arg(long, value_name = "N", default_value = "20")]
    pub proxy_token_reviews_per_second: std::num::NonZeroU32,
    /// How many of those may come at once, from all sources.
    #[arg(long, value_name = "N", default_value = "40")]
    pub proxy_token_review_burst: std::num::NonZeroU32,
    /// TokenReviews per second for tokens the proxy has not seen valid, from
    /// one source (a client IPv4 address, an IPv6 /64): one source sending
    /// garbage passwords spends its own budget, not that of new callers.
    #[arg(long, value_name = "N", default_value = "1")]
    pub proxy_token_reviews_per_second_per_source: std::num::NonZeroU32,
    /// How many of those one source may have at once.
    #[arg(long, value_name = "N", default_value = "10")]
    pub proxy_token_review_burst_per_source: std::num::NonZeroU32,
    /// Longest silence of a target during a response (a watch without events).
    #[arg(long, value_name = "DURATION", default_value = "30m", value_parser = parse_duration)]
    pub proxy_idle_timeout: Duration,
}

impl ConnectorsFlags {
    fn namespace(&self, client: &Client) -> String {
        self.namespace
            .clone()
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|n| !n.is_empty())
            })
            .unwrap_or_else(|| client.default_namespace().to_owned())
    }

    fn proxy_service_host(&self, namespace: &str) -> String {
        super::reconciler::proxy_service_host(&self.proxy_service, namespace, &self.cluster_domain)
    }
}

/// Retries `what` with backoff until it succeeds or `shutdown`.
async fn until_ok<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    shutdown: &CancellationToken,
    mut attempt: impl FnMut() -> F,
) -> Option<T> {
    let backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    loop {
        match attempt().await {
            Ok(v) => return Some(v),
            Err(e) => {
                let delay = backoff.fail(what);
                tracing::warn!(error = %e, ?delay, "{what}: retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Applies the built-in class `k8s` and marks it Ready.
pub async fn ensure_builtin_class(client: &Client) -> Result<(), kube::Error> {
    let api: Api<ConnectorClass> = Api::all(client.clone());
    let class = builtin_k8s_class();
    let name = tuna_crds::K8S_CLASS;
    let applied = api
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&class),
        )
        .await?;
    let mut conditions = applied
        .status
        .clone()
        .map(|s| s.conditions)
        .unwrap_or_default();
    ConnectorCondition::set(
        &mut conditions,
        ConnectorCondition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "BuiltIn".into(),
            message: "built into tuna-operator; served by its connectors role".into(),
            observed_generation: applied.metadata.generation,
            ..Default::default()
        },
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let status = ConnectorClassStatus {
        conditions,
        observed_generation: applied.metadata.generation,
        ..Default::default()
    };
    if applied.status.as_ref() != Some(&status) {
        let patch = serde_json::json!({
            "apiVersion": "connectors.alauda.io/v1alpha1",
            "kind": "ConnectorClass",
            "status": status,
        });
        api.patch_status(
            name,
            &PatchParams::apply(STATUS_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    }
    Ok(())
}

/// Runs the role until `shutdown`.
pub async fn serve(
    args: ConnectorsArgs,
    client: Client,
    metrics: Arc<Metrics>,
    proxy: ProxyCore,
    ready: watch::Sender<Readiness>,
    shutdown: CancellationToken,
) -> crate::Result<()> {
    let flags = &args.connectors;
    let namespace = flags.namespace(&client);
    ready.send_replace(Readiness::NotReady("loading the proxy CA".into()));
    let Some(ca) = until_ok(
        &format!(
            "loading the proxy CA from Secret {namespace}/{}",
            flags.ca_secret
        ),
        &shutdown,
        || proxy_ca::load_or_create(&client, &namespace, &flags.ca_secret),
    )
    .await
    else {
        return Ok(());
    };
    ready.send_replace(Readiness::NotReady(
        "publishing the proxy CA's certificate".into(),
    ));
    if until_ok(
        &format!(
            "publishing the proxy CA's certificate in ConfigMap {namespace}/{}",
            flags.ca_secret
        ),
        &shutdown,
        || proxy_ca::publish_certificate(&client, &namespace, &flags.ca_secret, &ca.cert_pem),
    )
    .await
    .is_none()
    {
        return Ok(());
    }
    ready.send_replace(Readiness::NotReady(
        "applying the built-in ConnectorClass k8s".into(),
    ));
    if until_ok(
        "applying the built-in ConnectorClass k8s (are the connectors CRDs installed?)",
        &shutdown,
        || ensure_builtin_class(&client),
    )
    .await
    .is_none()
    {
        return Ok(());
    }
    let targets = Arc::new(ProxyTargets::default());
    let authorizer = KubeAuthorizer::with_options(
        client.clone(),
        Arc::clone(&targets),
        AuthorizerOptions {
            recheck_interval: flags.proxy_recheck_interval,
            reviews_per_second: flags.proxy_token_reviews_per_second,
            review_burst: flags.proxy_token_review_burst,
            reviews_per_second_per_source: flags.proxy_token_reviews_per_second_per_source,
            review_burst_per_source: flags.proxy_token_review_burst_per_source,
            ..AuthorizerOptions::new(flags.token_audience.clone())
        },
    );
    let intercept = InterceptCa::from_pem(&ca).map_err(crate::Error::ProxyCa)?;
    let bound = proxy
        .add_connect_listener(
            args.proxy_listen,
            ConnectConfig {
                authorizer: Arc::new(authorizer),
                ca: Arc::new(intercept),
                limits: ConnectLimits {
                    max_connections: flags.proxy_max_connections,
                    max_unauthenticated: flags.proxy_max_unauthenticated,
                    max_unauthenticated_per_ip: flags.proxy_max_unauthenticated_per_ip,
                    upstream_idle: flags.proxy_idle_timeout,
                    ..ConnectLimits::default()
                },
            },
        )
        .await
        .map_err(|source| crate::Error::ProxyListen {
            addr: args.proxy_listen,
            source,
        })?;
    tracing::info!(addr = %bound, "connector proxy listening");
    let options = ConnectorOptions {
        probe_interval: args.serve.resync_interval,
        probe_timeout: flags.probe_timeout,
        cluster_domain: flags.cluster_domain.clone(),
        proxy_service_host: flags.proxy_service_host(&namespace),
        token_audience: flags.token_audience.clone(),
    };
    let ctx = Arc::new(ConnectorContext::new(
        client,
        Some(instance_name()),
        metrics,
        options,
        ca.cert_pem.clone(),
        targets,
    ));
    let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
    {
        let ready = ready.clone();
        tokio::spawn(async move {
            ready.send_replace(Readiness::NotReady("syncing the Connector watches".into()));
            if synced_rx.await.is_ok() {
                ready.send_replace(Readiness::Ready);
            }
        });
    }
    reconciler::run(ctx, synced_tx, shutdown.cancelled_owned()).await;
    Ok(())
}

/// Runs the connectors role until SIGTERM/SIGINT.
pub async fn run(args: ConnectorsArgs) -> crate::Result<()> {
    crate::cluster::install_crypto_provider();
    let metrics = Arc::new(Metrics::new());
    let proxy = ProxyCore::new(ProxyConfig::default());
    let (ready_tx, ready_rx) = watch::channel(Readiness::NotReady("starting".into()));
    let render = {
        let (metrics, proxy) = (Arc::clone(&metrics), proxy.clone());
        Arc::new(move || {
            let mut out = metrics.render();
            out.push_str(&proxy.render_metrics());
            out
        })
    };
    let (client, shutdown) = crate::role::start(&args.serve, ready_rx, render).await?;
    let result = serve(args, client, metrics, proxy.clone(), ready_tx, shutdown).await;
    // Open proxy connections (watches, exec sessions) drain.
    proxy.shutdown().await;
    result
}
