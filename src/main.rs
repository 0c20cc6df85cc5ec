//! `tuna-operator` — thin entry point: parse flags, build config, call the library.

use clap::{Parser, Subcommand};

// `--features system-allocator` leaves malloc to libc, for heap profilers
// (heaptrack, massif) that intercept it.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc commits its 1 GiB arenas eagerly on Linux, and memory it purges
/// from a committed arena is only reset: it stays in the resident set until
/// the kernel is short of memory. Committing on demand makes RSS follow the
/// heap (benches/operator.sh, the agent with 1 000 Tunnels: 93 → 55 MiB, the
/// edge 100 → 31 MiB). It must be set before the first allocation creates an
/// arena, and Rust's runtime allocates before `main`: so from a constructor
/// (`.init_array`, run before `main`). `MIMALLOC_ARENA_EAGER_COMMIT` still
/// wins for the arenas created after it is read.
#[cfg(all(target_os = "linux", not(feature = "system-allocator")))]
#[used]
#[unsafe(link_section = ".init_array")]
static TUNE_ALLOCATOR: extern "C" fn() = tune_allocator;

#[cfg(all(target_os = "linux", not(feature = "system-allocator")))]
extern "C" fn tune_allocator() {
    // `mi_option_arena_eager_commit`, the fifth of `mi_option_e` in the
    // mimalloc.h of both v2 and v3 (the bindings do not name it).
    const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
    // SAFETY: plain option writes; no other thread exists yet.
    unsafe { libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0) };
    if let Some(v) = std::env::var_os("MIMALLOC_ARENA_EAGER_COMMIT")
        .and_then(|v| v.to_str()?.trim().parse::<std::ffi::c_long>().ok())
    {
        // SAFETY: as above.
        unsafe { libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, v) };
    }
}

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
    Controller(Box<tuna_operator::reservations::role::ControllerArgs>),
    /// Run the tunnels and the proxy core: reconcile Tunnels and Ingresses (one replica).
    Agent(Box<tuna_operator::agent::role::AgentArgs>),
    /// Run the controller and the agent in one process (small installs, tests).
    All(Box<tuna_operator::all::AllArgs>),
    /// Inspect how routes are built and matched.
    #[command(subcommand)]
    Route(tuna_operator::explain::RouteCommand),
    /// Write the CRDs into the Helm chart (or check them with --check).
    Crdgen(tuna_operator::crdgen::CrdgenArgs),
    /// Serve Tunnel/Domain/TCPEndpoint/Ingress/Service manifests from files, with an embedded edge.
    Standalone(Box<tuna_operator::standalone::cli::StandaloneArgs>),
    /// Run the self-hosted edge (the Tuna API and tunnel endpoint), or manage its API keys.
    Edge(Box<tuna_edge::cli::EdgeCli>),
    /// Reconcile Connectors and serve the connector proxy (kubectl to other clusters without their credentials).
    Connectors(Box<tuna_operator::connectors::role::ConnectorsArgs>),
    /// Work with one Connector (print a kubeconfig for it).
    #[command(subcommand)]
    Connector(tuna_operator::connectors::cli::ConnectorCommand),
    /// Run the connectors-csi node plugin (kubeconfigs of Connectors mounted into pods).
    Csi(Box<tuna_operator::csi::CsiArgs>),
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {}", report(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error, then the causes its message does not already quote: the
/// library's messages carry their cause (they also go to logs and status
/// conditions), so anyhow's chain printer would say everything twice.
fn report(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let line = cause.to_string();
        if text.contains(&line) {
            continue;
        }
        if !text.is_empty() {
            text.push_str("\nCaused by: ");
        }
        text.push_str(&line);
    }
    text
}

fn run(cli: Cli) -> anyhow::Result<()> {
    tuna_operator::telemetry::init_with(cli.log_format);
    let runtime = || tokio::runtime::Runtime::new().map_err(tuna_operator::Error::Runtime);
    match cli.command {
        Command::Controller(args) => {
            runtime()?.block_on(tuna_operator::reservations::role::run(*args))?
        }
        Command::Agent(args) => runtime()?.block_on(tuna_operator::agent::role::run(*args))?,
        Command::All(args) => runtime()?.block_on(tuna_operator::all::run(*args))?,
        Command::Route(cmd) => tuna_operator::explain::run(cmd)?,
        Command::Crdgen(args) => tuna_operator::crdgen::run(args)?,
        Command::Standalone(args) => tuna_operator::standalone::cli::run_blocking(*args)?,
        Command::Connectors(args) => {
            runtime()?.block_on(tuna_operator::connectors::role::run(*args))?
        }
        Command::Connector(cmd) => tuna_operator::connectors::cli::run(cmd)?,
        Command::Csi(args) => runtime()?.block_on(tuna_operator::csi::node::run(*args))?,
        Command::Edge(cli) => {
            let _ = rustls::crypto::ring::default_provider().install_default();
            runtime()?.block_on(tuna_edge::cli::run(*cli))?
        }
    }
    Ok(())
}
