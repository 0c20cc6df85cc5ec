//! `tuna-operator controller`: the Domain and TCPEndpoint reconcilers
//! (reservations at the edge), leader-elected with a `coordination.k8s.io/v1`
//! Lease so that several replicas can run and only one reconciles. It never
//! reads Secrets.

use std::sync::Arc;
use std::time::Duration;

use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{domain, tcpendpoint};
use crate::health::Readiness;
use crate::metrics::Metrics;
use crate::reconcile::Context;
use crate::role::{EdgeArgs, ServeArgs, edge_api, instance_name, parse_duration};

/// Default name of the controller's leader-election Lease.
pub const LEASE_NAME: &str = "tuna-operator-controller";

/// Flags of `tuna-operator controller`.
#[derive(Debug, Clone, clap::Args)]
pub struct ControllerArgs {
    /// The edge API to use and its key.
    #[command(flatten)]
    pub edge: EdgeArgs,
    /// The controller's own flags.
    #[command(flatten)]
    pub controller: ControllerFlags,
    /// Probes, metrics and resync.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// The controller's own flags (also part of `all`).
#[derive(Debug, Clone, clap::Args)]
pub struct ControllerFlags {
    /// Unverified custom domains are checked again this often.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub dns_recheck_interval: Duration,
    /// Namespace of the leader-election Lease (default: the environment
    /// variable POD_NAMESPACE, else the kubeconfig's namespace).
    #[arg(long, value_name = "NS")]
    pub leader_election_namespace: Option<String>,
    /// Name of the leader-election Lease (one per installation: the chart
    /// passes its release's name).
    #[arg(long, value_name = "NAME", default_value = LEASE_NAME)]
    pub leader_election_lease_name: String,
    /// How long the leader's Lease lasts unrenewed: when the leader dies, a
    /// standby takes over within this time.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,
    /// Reconcile without leader election (run exactly one replica then).
    #[arg(long)]
    pub no_leader_election: bool,
}

/// The reconcilers' context. The edge is not awaited here: an edge that is
/// down is reported on every object (`EdgeUnavailable`) until it answers.
pub(crate) fn context(
    edge: &EdgeArgs,
    serve: &ServeArgs,
    dns_recheck_interval: Duration,
    metrics: &Arc<Metrics>,
    client: kube::Client,
) -> crate::Result<Arc<Context>> {
    Ok(Arc::new(Context::new(
        client,
        Some(instance_name()),
        edge_api(edge, metrics)?,
        Arc::clone(metrics),
        serve.resync_interval,
        dns_recheck_interval,
    )))
}

/// Runs the Domain and TCPEndpoint controllers until `stop` is cancelled.
pub async fn reconcile_until(ctx: Arc<Context>, stop: CancellationToken) {
    futures::future::join(
        domain::run(Arc::clone(&ctx), stop.clone().cancelled_owned()),
        tcpendpoint::run(ctx, stop.cancelled_owned()),
    )
    .await;
}

/// Runs the controller role until `shutdown`: reconciles while it holds the
/// Lease (or always, with `--no-leader-election`).
pub async fn serve(
    edge: EdgeArgs,
    flags: ControllerFlags,
    serve: ServeArgs,
    client: kube::Client,
    metrics: Arc<Metrics>,
    ready: watch::Sender<Readiness>,
    shutdown: CancellationToken,
) -> crate::Result<()> {
    let namespace = flags
        .leader_election_namespace
        .clone()
        .or_else(|| {
            std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|n| !n.is_empty())
        })
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let ctx = context(
        &edge,
        &serve,
        flags.dns_recheck_interval,
        &metrics,
        client.clone(),
    )?;
    if let Err(e) = ctx.edge_info().await {
        tracing::warn!(edge = %edge.edge_api, error = %e, "cannot reach the edge API yet; objects will say so until it answers");
    }
    ready.send_replace(Readiness::Ready);
    if flags.no_leader_election {
        metrics.set_leader(true);
        reconcile_until(ctx, shutdown).await;
        return Ok(());
    }
    let lease_seconds = flags.leader_election_lease_duration.as_secs().max(2);
    let grace = (lease_seconds / 3).max(1);
    let identity = instance_name();
    let lease_name = flags.leader_election_lease_name.clone();
    let manager = LeaseManagerBuilder::new(client, &lease_name)
        .with_namespace(&namespace)
        .with_identity(&identity)
        .with_duration(lease_seconds)
        .with_grace(grace)
        .with_field_manager("tuna-operator-controller")
        .build()
        .await
        .map_err(|source| crate::Error::LeaderElection {
            namespace: namespace.clone(),
            source,
        })?;
    let (mut leader, lease_task) = manager.watch().await;
    tracing::info!(lease = %format!("{namespace}/{lease_name}"), %identity, "waiting to become the leader");
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            became = leader.wait_for(|l| *l) => if became.is_err() { break },
        }
        tracing::info!(%identity, "became the leader: reconciling");
        metrics.set_leader(true);
        let stop = shutdown.child_token();
        let running = tokio::spawn(reconcile_until(Arc::clone(&ctx), stop.clone()));
        tokio::select! {
            _ = shutdown.cancelled() => {}
            lost = leader.wait_for(|l| !*l) => {
                if lost.is_ok() {
                    tracing::warn!(%identity, "lost the leadership: stopping the reconcilers");
                }
            }
        }
        stop.cancel();
        let _ = running.await;
        metrics.set_leader(false);
        if shutdown.is_cancelled() {
            break;
        }
    }
    // Closing the channel releases the Lease, so a standby takes over at once.
    drop(leader);
    match lease_task.await {
        Ok(Ok(_)) => tracing::info!("released the leader Lease"),
        Ok(Err(e)) => tracing::warn!(error = %e, "could not release the leader Lease"),
        Err(e) => tracing::warn!(error = %e, "leader election task failed"),
    }
    Ok(())
}

/// Runs the controller role until SIGTERM/SIGINT.
pub async fn run(args: ControllerArgs) -> crate::Result<()> {
    crate::cluster::install_crypto_provider();
    let metrics = Arc::new(Metrics::new());
    let (ready_tx, ready_rx) = watch::channel(Readiness::NotReady("starting".into()));
    let render = {
        let metrics = Arc::clone(&metrics);
        Arc::new(move || metrics.render())
    };
    let (client, shutdown) = crate::role::start(&args.serve, ready_rx, render).await?;
    serve(
        args.edge,
        args.controller,
        args.serve,
        client,
        metrics,
        ready_tx,
        shutdown,
    )
    .await
}
