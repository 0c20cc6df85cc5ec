//! `tuna-operator` — thin entry point: parse flags, build config, call the library.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "tuna-operator", version, about = "Publish Kubernetes Services to the internet through outbound tunnels")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Inspect how routes are built and matched.
    #[command(subcommand)]
    Route(tuna_operator::explain::RouteCommand),
    /// Write the CRDs into the Helm chart (or check them with --check).
    Crdgen(tuna_operator::crdgen::CrdgenArgs),
}

fn main() -> anyhow::Result<()> {
    tuna_operator::telemetry::init();
    let cli = Cli::parse();
    match cli.command {
        Command::Route(cmd) => tuna_operator::explain::run(cmd),
        Command::Crdgen(args) => tuna_operator::crdgen::run(args),
    }
}
