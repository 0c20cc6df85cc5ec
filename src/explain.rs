//! `tuna-operator route explain` (being written for issue 2).

/// Subcommands of `tuna-operator route`.
#[derive(clap::Subcommand)]
pub enum RouteCommand {}

/// Runs a `route` subcommand.
pub fn run(cmd: RouteCommand) -> anyhow::Result<()> {
    match cmd {}
}
