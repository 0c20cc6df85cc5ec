//! `tuna-operator` — thin entry point: parse flags, build config, call the library.

use clap::{Parser, Subcommand};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "tuna-operator",
    version,
    about = "Publish Kubernetes Services to the internet through outbound tunnels"
)]
struct Cli {
    /// Log format (the level comes from RUST_LOG, default `info`).
    #[arg(long, global = true, value_enum, default_value_t = tuna_operator::telemetry::LogFormat::Text)]
    log_format: tuna_operator::telemetry::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Reconcile Domains and TCPEndpoints into reservations at the edge (leader-elected).
    Controller(Box<tuna_operator::roles::controller::ControllerArgs>),
    /// Run the tunnels and the proxy core: reconcile Tunnels and Ingresses (one replica).
    Agent(Box<tuna_operator::roles::agent::AgentArgs>),
    /// Run the controller and the agent in one process (small installs, tests).
    All(Box<tuna_operator::roles::all::AllArgs>),
    /// Inspect how routes are built and matched.
    #[command(subcommand)]
    Route(tuna_operator::explain::RouteCommand),
    /// Write the CRDs into the Helm chart (or check them with --check).
    Crdgen(tuna_operator::crdgen::CrdgenArgs),
    /// Serve Tunnel/Domain/TCPEndpoint/Ingress/Service manifests from files, with an embedded edge.
    Standalone(Box<tuna_operator::standalone::cli::StandaloneArgs>),
    /// Run the self-hosted edge (the Tuna API and tunnel endpoint), or manage its API keys.
    Edge(Box<tuna_tunnel::edge::cli::EdgeCli>),
    /// Reconcile Connectors and serve the connector proxy (kubectl to other clusters without their credentials).
    Connectors(Box<tuna_operator::connectors::role::ConnectorsArgs>),
    /// Work with one Connector (print a kubeconfig for it).
    #[command(subcommand)]
    Connector(tuna_operator::connectors::cli::ConnectorCommand),
    /// Run the connectors-csi node plugin (kubeconfigs of Connectors mounted into pods).
    Csi(Box<tuna_operator::csi::CsiArgs>),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tuna_operator::telemetry::init_with(cli.log_format);
    match cli.command {
        Command::Controller(args) => {
            tokio::runtime::Runtime::new()?.block_on(tuna_operator::roles::controller::run(*args))
        }
        Command::Agent(args) => {
            tokio::runtime::Runtime::new()?.block_on(tuna_operator::roles::agent::run(*args))
        }
        Command::All(args) => {
            tokio::runtime::Runtime::new()?.block_on(tuna_operator::roles::all::run(*args))
        }
        Command::Route(cmd) => tuna_operator::explain::run(cmd),
        Command::Crdgen(args) => tuna_operator::crdgen::run(args),
        Command::Standalone(args) => tuna_operator::standalone::cli::run_blocking(*args),
        Command::Connectors(args) => {
            tokio::runtime::Runtime::new()?.block_on(tuna_operator::connectors::role::run(*args))
        }
        Command::Connector(cmd) => tuna_operator::connectors::cli::run(cmd),
        Command::Csi(args) => {
            tokio::runtime::Runtime::new()?.block_on(tuna_operator::csi::node::run(*args))
        }
        Command::Edge(cli) => {
            let _ = rustls::crypto::ring::default_provider().install_default();
            tokio::runtime::Runtime::new()?.block_on(tuna_tunnel::edge::cli::run(*cli))
        }
    }
}
