//! `tuna-operator all`: the controller and the agent in one process, with one
//! pair of probe and metrics listeners (small installs, tests and demos).

use std::sync::Arc;

use tokio::sync::watch;

use crate::agent::role::{self as agent, AgentFlags};
use crate::health::Readiness;
use crate::metrics::Metrics;
use crate::reservations::role::{self as controller, ControllerFlags};
use crate::role::{EdgeArgs, ServeArgs};

/// Flags of `tuna-operator all`: those of both roles.
#[derive(Debug, Clone, clap::Args)]
pub struct AllArgs {
    /// The edge API to use and its key.
    #[command(flatten)]
    pub edge: EdgeArgs,
    /// The agent's own flags.
    #[command(flatten)]
    pub agent: AgentFlags,
    /// The controller's own flags.
    #[command(flatten)]
    pub controller: ControllerFlags,
    /// Probes, metrics and resync.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Runs both roles until SIGTERM/SIGINT; ready when both are.
pub async fn run(args: AllArgs) -> crate::Result<()> {
    crate::cluster::install_crypto_provider();
    let metrics = Arc::new(Metrics::new());
    let publisher = agent::publisher(&args.edge, &args.agent)?;
    let (ready_tx, ready_rx) = watch::channel(Readiness::NotReady("starting".into()));
    let render = {
        let (metrics, publisher) = (Arc::clone(&metrics), publisher.clone());
        Arc::new(move || agent::render_metrics(&metrics, &publisher))
    };
    let (client, shutdown) = crate::role::start(&args.serve, ready_rx, render).await?;
    let (controller_ready, mut controller_rx) =
        watch::channel(Readiness::NotReady("controller starting".into()));
    let (agent_ready, mut agent_rx) =
        watch::channel(Readiness::NotReady("agent syncing watches".into()));
    tokio::spawn(async move {
        loop {
            let both = match (&*controller_rx.borrow(), &*agent_rx.borrow()) {
                (Readiness::Ready, Readiness::Ready) => Readiness::Ready,
                (Readiness::NotReady(why), _) | (_, Readiness::NotReady(why)) => {
                    Readiness::NotReady(why.clone())
                }
            };
            ready_tx.send_replace(both);
            tokio::select! {
                r = controller_rx.changed() => if r.is_err() { return },
                r = agent_rx.changed() => if r.is_err() { return },
            }
        }
    });
    let (a, c) = futures::future::join(
        agent::serve(
            args.edge.clone(),
            args.agent,
            args.serve.clone(),
            client.clone(),
            Arc::clone(&metrics),
            publisher.clone(),
            agent_ready,
            shutdown.clone(),
        ),
        controller::serve(
            args.edge,
            args.controller,
            args.serve,
            client,
            metrics,
            controller_ready,
            shutdown,
        ),
    )
    .await;
    publisher.shutdown_keeping_tokens().await;
    a.and(c)
}
