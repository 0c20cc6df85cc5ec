//! `tuna-operator agent`: the Tunnel and Ingress reconcilers, the Gateway API
//! sync (when its CRDs are installed), the tunnels and the proxy core, in one process (exactly one replica per cluster: the chart
//! uses the `Recreate` strategy). It is the only component that reads Secrets
//! and Services, and only with `get`.
//!
//! At start-up, once its watches are synced, it revokes the tokens of this
//! cluster (label `k8s.tuna.am/cluster`) that it did not mint itself: those
//! of resources deleted while no agent ran, and those of the previous agent
//! process (replaced by fresh ones).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::Client;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{self, ObjectRef as KubeRef};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tuna_agent::{AgentConfig, Trust};
use tuna_crds::{Domain, TcpEndpoint, Tunnel};
use tuna_proxy::{ProxyConfig, ProxyCore};

use super::{ingress, tunnel};
use crate::agent::index::TunnelIndex;
use crate::agent::state::{AgentOptions, AgentState, Stores, labels, owners_of};
use crate::edge::api::{ErrorClass, gone_is_ok};
use crate::edge::publisher::{Publisher, TunnelKey};
use crate::health::Readiness;
use crate::metrics::Metrics;
use crate::plan::ingress::rule_hosts;
use crate::plan::service::UpstreamPolicy;
use crate::reconcile::{self, Context, kit};
use crate::role::{EdgeArgs, ServeArgs, edge_api, instance_name};

/// Flags of `tuna-operator agent` (also part of `all`).
#[derive(Debug, Clone, clap::Args)]
pub struct AgentFlags {
    /// `host:port` of the edge's agent listener (the tunnel connection);
    /// repeat it for the replicas of an edge fleet (one session each).
    #[arg(long, value_name = "HOST:PORT", required = true)]
    pub edge_agent: Vec<String>,
    /// Name checked against the agent listener's certificate (default: the
    /// host of --edge-agent).
    #[arg(long, value_name = "NAME")]
    pub edge_agent_server_name: Option<String>,
    /// Let Tunnels and Ingresses publish IP addresses, external hosts,
    /// Services of other namespaces and ExternalName Services. Then the right
    /// to create a Tunnel or Ingress in any namespace is the right to publish
    /// any address the operator's pod can reach.
    #[arg(long)]
    pub allow_external_upstreams: bool,
    /// The IngressClass name served besides every IngressClass whose
    /// controller is k8s.tuna.am/ingress-controller (and the value of the
    /// legacy kubernetes.io/ingress.class annotation).
    #[arg(long, value_name = "NAME", default_value = "tuna")]
    pub ingress_class: String,
    /// This cluster's identity on tunnel tokens (tokens of other clusters of
    /// the same account are never touched). Default: the uid of the
    /// kube-system namespace.
    #[arg(long, value_name = "ID")]
    pub cluster_id: Option<String>,
    /// Lifetime of each tunnel's token at the edge (e.g. `1h`, `15m`; at
    /// least 3s). The agent renews it at a third of its lifetime; a token
    /// that leaks stops working this long after the agent stops renewing it.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_token_ttl)]
    pub tunnel_token_ttl: std::time::Duration,
    /// The ConfigMap in which the agent records which namespace holds which
    /// public host and TCP endpoint (host ownership goes by it; the agent
    /// alone writes it). Kept in --claims-namespace.
    #[arg(long, value_name = "NAME", default_value = "tuna-operator-claims")]
    pub claims_configmap: String,
    /// The namespace of --claims-configmap: the operator's own, where no
    /// tenant may write (default: the environment variable POD_NAMESPACE,
    /// else `default`).
    #[arg(long, value_name = "NAMESPACE", env = "POD_NAMESPACE")]
    pub claims_namespace: Option<String>,
}

fn parse_token_ttl(s: &str) -> Result<std::time::Duration, String> {
    let ttl = crate::role::parse_duration(s)?;
    if ttl < crate::edge::publisher::MIN_TOKEN_TTL {
        return Err(format!(
            "{s:?} is too short: tunnel tokens live at least {}s",
            crate::edge::publisher::MIN_TOKEN_TTL.as_secs()
        ));
    }
    Ok(ttl)
}

/// Flags of `tuna-operator agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// The edge API to use and its key.
    #[command(flatten)]
    pub edge: EdgeArgs,
    /// The agent's own flags.
    #[command(flatten)]
    pub agent: AgentFlags,
    /// Probes, metrics and resync.
    #[command(flatten)]
    pub serve: ServeArgs,
}

fn triggers<K>(
    rx: mpsc::UnboundedReceiver<KubeRef<K>>,
) -> impl Stream<Item = KubeRef<K>> + Send + 'static
where
    K: kube::Resource + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync,
{
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) })
}

/// The cluster identity: `--cluster-id`, else the kube-system namespace's uid.
async fn cluster_id(client: &Client, flag: &Option<String>) -> crate::Result<String> {
    if let Some(id) = flag {
        return Ok(id.clone());
    }
    let ns: Api<Namespace> = Api::all(client.clone());
    let kube_system = ns.get("kube-system").await.map_err(crate::Error::kube(
        "reading the kube-system namespace for the cluster's identity (give --cluster-id instead)",
    ))?;
    kube_system.metadata.uid.ok_or(crate::Error::NoClusterUid)
}

/// Runs the agent role until `shutdown`; flips `ready` once synced.
#[allow(clippy::too_many_arguments)] // the pieces `run` and `all::run` share
pub async fn serve(
    edge_args: EdgeArgs,
    flags: AgentFlags,
    serve: ServeArgs,
    client: Client,
    metrics: Arc<Metrics>,
    publisher: Publisher,
    ready: watch::Sender<Readiness>,
    shutdown: CancellationToken,
) -> crate::Result<()> {
    let cluster_id = cluster_id(&client, &flags.cluster_id).await?;
    let instance = format!("{}-{}", instance_name(), std::process::id());
    let ctx = Arc::new(Context::new(
        client.clone(),
        Some(instance_name()),
        edge_api(&edge_args, &metrics)?,
        Arc::clone(&metrics),
        serve.resync_interval,
        serve.resync_interval,
    ));
    if let Err(e) = ctx.edge_info().await {
        tracing::warn!(edge = %edge_args.edge_api, error = %e, "cannot reach the edge API yet; objects will say so until it answers");
    }
    let config = watcher::Config::default();
    let (tunnels, tunnel_writer) = reflector::store::<Tunnel>();
    let (ingresses, ingress_writer) = reflector::store::<Ingress>();
    let (classes, class_writer) = reflector::store::<IngressClass>();
    let (domains, domain_writer) = reflector::store::<Domain>();
    let (tcp_endpoints, tcp_writer) = reflector::store::<TcpEndpoint>();
    let tunnel_index = Arc::new(TunnelIndex::default());
    let stores = Stores {
        tunnels: tunnels.clone(),
        tunnel_index: Arc::clone(&tunnel_index),
        ingresses: ingresses.clone(),
        classes: classes.clone(),
        domains: domains.clone(),
        tcp_endpoints: tcp_endpoints.clone(),
    };
    let (tunnel_tx, tunnel_rx) = mpsc::unbounded_channel();
    let (ingress_tx, ingress_rx) = mpsc::unbounded_channel();
    let (gateway_tx, gateway_rx) = mpsc::unbounded_channel();
    let state = Arc::new(AgentState::new(
        Arc::clone(&ctx),
        publisher.clone(),
        stores,
        AgentOptions {
            cluster_id: cluster_id.clone(),
            instance: instance.clone(),
            ingress_class: flags.ingress_class.clone(),
            policy: if flags.allow_external_upstreams {
                UpstreamPolicy::cluster_allow_external()
            } else {
                UpstreamPolicy::cluster()
            },
            edge_args,
            claims_configmap: (
                flags
                    .claims_namespace
                    .clone()
                    .unwrap_or_else(|| "default".to_owned()),
                flags.claims_configmap.clone(),
            ),
        },
        tunnel_tx.clone(),
        ingress_tx.clone(),
        gateway_tx,
    ));
    tracing::info!(%cluster_id, %instance, allow_external_upstreams = flags.allow_external_upstreams, "agent starting");
    // Before any Tunnel is reconciled: which subdomains the previous agent
    // reserved (its tokens say so), so that they are released with their Tunnel.
    match ctx.edge.list_tokens(&cluster_selector(&cluster_id)).await {
        Ok(tokens) => state.inherit_reservations(&tokens),
        Err(e) => tracing::warn!(error = %e, "could not list this cluster's tokens at start-up"),
    }

    // Stores of the kinds that only trigger Ingresses (and feed the plans).
    let base_domain = |state: &AgentState| {
        state
            .ctx
            .edge_info_now()
            .map(|w| w.base_domain.clone())
            .unwrap_or_default()
    };
    let mut side_tasks = Vec::new();
    // The Gateway API, when (or once) its CRDs are installed.
    side_tasks.push(tokio::spawn(super::gateway::discover_and_run(
        client.clone(),
        Arc::clone(&state),
        gateway_rx,
    )));
    {
        let state = Arc::clone(&state);
        let stream = watcher(Api::<IngressClass>::all(client.clone()), config.clone())
            .default_backoff()
            .reflect(class_writer)
            .touched_objects();
        side_tasks.push(tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(changed) = stream.next().await {
                if changed.is_ok() {
                    // The set of our classes (or the default) may have changed.
                    for i in state.stores.ingresses.state() {
                        let _ = state.ingress_triggers.send(KubeRef::from_obj(i.as_ref()));
                    }
                }
            }
        }));
    }
    {
        let state = Arc::clone(&state);
        let stream = watcher(Api::<Domain>::all(client.clone()), config.clone())
            .default_backoff()
            .reflect(domain_writer)
            .touched_objects();
        side_tasks.push(tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(changed) = stream.next().await {
                if let Ok(d) = changed {
                    // A Domain decides which hosts HTTPRoutes may serve.
                    if state.gateway.get().is_some() {
                        let _ = state.gateway_triggers.send(());
                    }
                    if let Some(host) = d.spec.fqdn(&base_domain(&state)) {
                        trigger_host(&state, &host.to_ascii_lowercase());
                    }
                }
            }
        }));
    }
    {
        let stream = watcher(Api::<TcpEndpoint>::all(client.clone()), config.clone())
            .default_backoff()
            .reflect(tcp_writer)
            .touched_objects();
        let state = Arc::clone(&state);
        side_tasks.push(tokio::spawn(async move {
            futures::pin_mut!(stream);
            while stream.next().await.is_some() {
                // A TCPEndpoint is the reservation of a Gateway's TCP listener.
                if state.gateway.get().is_some() {
                    let _ = state.gateway_triggers.send(());
                }
            }
        }));
    }
    // Tunnel state changes → status and events of their objects.
    {
        let state = Arc::clone(&state);
        let mut changes = publisher.changes();
        side_tasks.push(tokio::spawn(async move {
            loop {
                match changes.recv().await {
                    Ok(key) => trigger_key(&state, &key),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        for key in state.publisher.keys() {
                            trigger_key(&state, &key);
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        }));
    }

    // tuna_operator_tunnels: recounted after tunnel state changes, at most
    // once per second (a count walks every tunnel; thousands change at start).
    {
        let publisher = state.publisher.clone();
        let metrics = Arc::clone(&state.ctx.metrics);
        let mut changes = publisher.changes();
        side_tasks.push(tokio::spawn(async move {
            let set = |counts: std::collections::BTreeMap<&'static str, usize>| {
                for (label, n) in counts {
                    metrics.set_tunnels(label, n);
                }
            };
            set(publisher.count_by_state());
            loop {
                match changes.recv().await {
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
                tokio::time::sleep(TUNNEL_GAUGE_PERIOD).await;
                changes = changes.resubscribe();
                set(publisher.count_by_state());
            }
        }));
    }

    let tunnel_stream = watcher(Api::<Tunnel>::all(client.clone()), config.clone())
        .default_backoff()
        .map(move |event| {
            if let Ok(event) = &event {
                tunnel_index.observe(event);
            }
            event
        })
        .reflect(tunnel_writer)
        .touched_objects()
        .map({
            // A Tunnel's host also decides Ingress rules (HostUsedByTunnel).
            let state = Arc::clone(&state);
            move |t| {
                if let Ok(t) = &t
                    && let Some(sub) = &t.spec.subdomain
                {
                    trigger_host(&state, &format!("{sub}.{}", base_domain(&state)));
                }
                // A tcp Tunnel keeps its endpoint against TCPRoutes.
                if let Ok(t) = &t
                    && t.spec.port_or_alias.is_some()
                    && state.gateway.get().is_some()
                {
                    let _ = state.gateway_triggers.send(());
                }
                t
            }
        });
    let tunnel_controller = kit::run(
        Arc::new(tunnel::Tunnels::new(Arc::clone(&state))),
        Controller::for_stream(tunnel_stream, tunnels.clone()).reconcile_on(triggers(tunnel_rx)),
        shutdown.clone().cancelled_owned(),
    );
    let ingress_stream = watcher(Api::<Ingress>::all(client.clone()), config)
        .default_backoff()
        .reflect(ingress_writer)
        .touched_objects()
        .map({
            // An Ingress's claim on an account host decides younger Tunnels of
            // other namespaces (HostOwnedByOtherNamespace), and its deletion
            // frees the host for them.
            let state = Arc::clone(&state);
            move |i| {
                if let Ok(i) = &i {
                    trigger_tunnels_on(&state, &rule_hosts(i));
                }
                i
            }
        });
    let ingress_controller = kit::run(
        Arc::new(ingress::Ingresses::new(Arc::clone(&state))),
        Controller::for_stream(ingress_stream, ingresses.clone())
            .reconcile_on(triggers(ingress_rx)),
        shutdown.clone().cancelled_owned(),
    );
    // Ready once every store is synced; then sweep the orphaned tokens.
    let sweeper = {
        let state = Arc::clone(&state);
        let ready = ready.clone();
        async move {
            // Not `wait_until_ready` directly: the controllers wait on the
            // tunnel and ingress stores too (see `reconcile::store_ready`).
            let (a, b, c, d, e) = futures::join!(
                reconcile::store_ready(&tunnels),
                reconcile::store_ready(&ingresses),
                reconcile::store_ready(&classes),
                reconcile::store_ready(&domains),
                reconcile::store_ready(&tcp_endpoints),
            );
            if !(a && b && c && d && e) {
                return;
            }
            ready.send_replace(Readiness::Ready);
            sweep_orphans(&state).await;
        }
    };
    tokio::select! {
        _ = futures::future::join3(tunnel_controller, ingress_controller, sweeper) => {}
        _ = shutdown.cancelled() => {}
    }
    for t in side_tasks {
        t.abort();
    }
    Ok(())
}

/// Re-reconciles whoever publishes or claims `key`.
fn trigger_key(state: &AgentState, key: &TunnelKey) {
    for owner in owners_of(state, key) {
        let _ = state
            .tunnel_triggers
            .send(KubeRef::new(&owner.name).within(&owner.namespace));
    }
    // A TCPRoute's tunnel bound (or lost): its Gateway's addresses change.
    if let TunnelKey::Tcp(id) = key
        && id.starts_with("TCPRoute/")
        && state.gateway.get().is_some()
    {
        let _ = state.gateway_triggers.send(());
    }
    if let TunnelKey::Host(host) = key {
        state.trigger_gateway_on(host);
        for claimant in ingress::claimants_of(state, host) {
            let _ = state
                .ingress_triggers
                .send(KubeRef::new(&claimant.name).within(&claimant.namespace));
        }
    }
}

/// How often at most `tuna_operator_tunnels` is recounted.
const TUNNEL_GAUGE_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

/// Re-reconciles the http Tunnels that publish one of `hosts`.
fn trigger_tunnels_on(state: &AgentState, hosts: &BTreeSet<String>) {
    if hosts.is_empty() {
        return;
    }
    let base = state
        .ctx
        .edge_info_now()
        .map(|w| w.base_domain.to_ascii_lowercase())
        .unwrap_or_default();
    for t in state.stores.tunnels.state() {
        if crate::plan::tunnel_host(&t, &base).is_some_and(|h| hosts.contains(&h)) {
            let _ = state.tunnel_triggers.send(KubeRef::from_obj(t.as_ref()));
        }
    }
}

/// Re-reconciles the Ingresses with rules for `host` (and the HTTPRoutes
/// when they may serve it).
fn trigger_host(state: &AgentState, host: &str) {
    state.trigger_gateway_on(host);
    let mut seen = BTreeSet::new();
    for i in state.stores.ingresses.state() {
        if rule_hosts(&i).contains(host) {
            let r = KubeRef::from_obj(i.as_ref());
            if seen.insert((r.namespace.clone(), r.name.clone())) {
                let _ = state.ingress_triggers.send(r);
            }
        }
    }
    for claimant in ingress::claimants_of(state, host) {
        let _ = state
            .ingress_triggers
            .send(KubeRef::new(&claimant.name).within(&claimant.namespace));
    }
}

/// The label selector of this cluster's tokens.
fn cluster_selector(cluster_id: &str) -> String {
    format!(
        "{}={}",
        labels::CLUSTER,
        crate::agent::state::label_value(cluster_id)
    )
}

/// Revokes this cluster's tokens that this agent process did not mint.
async fn sweep_orphans(state: &AgentState) {
    let selector = cluster_selector(&state.options.cluster_id);
    let tokens = match state.ctx.edge.list_tokens(&selector).await {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "could not list this cluster's tunnel tokens; orphans stay until they expire");
            return;
        }
    };
    let me = crate::agent::state::label_value(&state.options.instance);
    let tunnel_uids: BTreeSet<String> = state
        .stores
        .tunnels
        .state()
        .iter()
        .filter_map(|t| t.metadata.uid.clone())
        .collect();
    let (mut gone, mut previous) = (0usize, 0usize);
    for token in tokens.into_iter().filter(|t| !t.expired) {
        let labels_of = &token.info.labels;
        if labels_of.get(labels::AGENT).is_some_and(|a| *a == me) {
            continue;
        }
        let owner_exists = match labels_of.get(labels::KIND).map(String::as_str) {
            Some("Tunnel") => labels_of
                .get(labels::UID)
                .is_some_and(|u| tunnel_uids.contains(u)),
            Some("Ingress") => token
                .info
                .bindings
                .hosts
                .iter()
                .any(|h| !ingress::claimants_of(state, h).is_empty()),
            Some("HTTPRoute") => {
                let known = state.gateway_hosts.lock().expect("gateway hosts");
                token.info.bindings.hosts.iter().any(|h| known.contains(h))
            }
            _ => false,
        };
        match gone_is_ok(state.ctx.edge.revoke_token(&token.id).await) {
            Ok(()) => {
                if owner_exists {
                    previous += 1;
                } else {
                    gone += 1;
                }
                // A subdomain reserved for a Tunnel deleted while no agent ran goes too.
                if !owner_exists && labels_of.get(labels::RESERVED).is_some_and(|v| v == "true") {
                    for host in &token.info.bindings.hosts {
                        if let Err(e) = gone_is_ok(state.ctx.edge.delete_domain(host).await) {
                            tracing::warn!(%host, error = %e, "could not release the subdomain of a deleted Tunnel");
                        }
                    }
                }
            }
            Err(e) if e.class() == ErrorClass::Retryable => {
                tracing::warn!(error = %e, "could not revoke an orphaned token; it expires by itself");
            }
            Err(e) => tracing::warn!(error = %e, "could not revoke an orphaned token"),
        }
    }
    tracing::info!(
        owner_deleted = gone,
        previous_agent = previous,
        "revoked tunnel tokens this agent did not mint"
    );
}

/// The trust and address of the edge's agent listener.
pub fn agent_config(edge: &EdgeArgs, flags: &AgentFlags) -> AgentConfig {
    let trust = match &edge.edge_ca_file {
        Some(ca) => Trust::CaFile(PathBuf::from(ca)),
        None => Trust::SystemRoots,
    };
    let mut config = AgentConfig::new(flags.edge_agent.join(","), trust);
    config.server_name = flags.edge_agent_server_name.clone();
    config.agent_name = format!("tuna-operator-agent/{}", env!("CARGO_PKG_VERSION"));
    config
}

/// The publisher (proxy core + the agent's connection) of the agent role.
pub fn publisher(edge: &EdgeArgs, flags: &AgentFlags) -> crate::Result<Publisher> {
    let proxy = ProxyCore::new(ProxyConfig::default());
    let options = crate::edge::publisher::PublisherOptions {
        token_ttl: flags.tunnel_token_ttl,
        ..Default::default()
    };
    Publisher::start_with(proxy, agent_config(edge, flags), options)
        .map_err(crate::Error::TunnelAgent)
}

/// The `/metrics` body of the agent: its own metrics and the proxy core's.
pub fn render_metrics(metrics: &Arc<Metrics>, publisher: &Publisher) -> String {
    let mut out = metrics.render();
    out.push_str(&publisher.proxy().render_metrics());
    out
}

/// Runs the agent role until SIGTERM/SIGINT.
pub async fn run(args: AgentArgs) -> crate::Result<()> {
    crate::cluster::install_crypto_provider();
    let metrics = Arc::new(Metrics::new());
    let publisher = publisher(&args.edge, &args.agent)?;
    let (ready_tx, ready_rx) = watch::channel(Readiness::NotReady("syncing watches".into()));
    let render = {
        let (metrics, publisher) = (Arc::clone(&metrics), publisher.clone());
        Arc::new(move || render_metrics(&metrics, &publisher))
    };
    let (client, shutdown) = crate::role::start(&args.serve, ready_rx, render).await?;
    let result = serve(
        args.edge,
        args.agent,
        args.serve,
        client,
        metrics,
        publisher.clone(),
        ready_tx,
        shutdown,
    )
    .await;
    // Tunnels stop (their tokens stay for the next agent's start-up sweep,
    // which also learns what this one reserved); the proxy drains.
    publisher.shutdown_keeping_tokens().await;
    result
}
