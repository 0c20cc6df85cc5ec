//! `tuna-operator standalone`: flags and the entry point.

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::demo;
use super::runtime::{RemoteEdge, Standalone, StandaloneConfig};
use crate::Error;

/// Flags of `tuna-operator standalone`.
#[derive(Debug, Clone, clap::Args)]
pub struct StandaloneArgs {
    /// Manifest file or directory (repeatable): Tunnel, Domain, TCPEndpoint,
    /// Ingress (class tuna) and Service. Watched: changes apply live.
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "FILE_OR_DIR",
        required_unless_present = "demo"
    )]
    pub paths: Vec<PathBuf>,
    /// Public HTTP listener of the embedded edge.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http_listen: SocketAddr,
    /// Base domain: `subdomain: web` is served at `web.<base-domain>`. Browsers
    /// and curl resolve `*.localhost` to this machine.
    #[arg(long, default_value = "localhost")]
    pub base_domain: String,
    /// Ports TCP endpoints are given from (on 127.0.0.1), `FIRST-LAST`.
    #[arg(long, default_value = "30000-30999", value_parser = tuna_edge::cli::parse_port_range)]
    pub tcp_port_range: RangeInclusive<u16>,
    /// State of the embedded edge (its CA, TCP port allocations). Default:
    /// `$XDG_STATE_HOME/tuna-operator/standalone` (or `~/.local/state/…`).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Use a remote edge's REST API instead of the embedded edge.
    #[arg(long, requires_all = ["edge_agent", "api_key_file"])]
    pub edge_api: Option<String>,
    /// `host:port` of the remote edge's agent listener; repeat it for the
    /// replicas of an edge fleet (one session each).
    #[arg(long, requires = "edge_api")]
    pub edge_agent: Vec<String>,
    /// File holding the remote edge's API key.
    #[arg(long, requires = "edge_api")]
    pub api_key_file: Option<PathBuf>,
    /// PEM CA file of the remote edge (its `tls/ca.pem`); default: system roots.
    #[arg(long, requires = "edge_api")]
    pub edge_ca_file: Option<PathBuf>,
    /// Also start a built-in demo backend and publish it at `demo.<base-domain>`.
    #[arg(long)]
    pub demo: bool,
    /// How often the files are checked for changes, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub poll_interval_ms: u64,
}

/// The default `--data-dir`.
pub fn default_data_dir() -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("tuna-operator/standalone")
}

/// Runs `standalone` on a new tokio runtime until interrupted.
pub fn run_blocking(args: StandaloneArgs) -> crate::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Error::Runtime)?
        .block_on(run(args))
}

/// Runs `standalone` until SIGINT/SIGTERM.
pub async fn run(args: StandaloneArgs) -> crate::Result<()> {
    let data_dir = args.data_dir.clone().unwrap_or_else(default_data_dir);
    let mut paths = args.paths.clone();
    let demo_stop = CancellationToken::new();
    let mut demo_host = None;
    if args.demo {
        let mut web = None;
        for (name, port) in demo::EXAMPLE_PORTS {
            let addr = if name == "echo" {
                demo::start_echo(port, demo_stop.clone()).await?
            } else {
                demo::start_backend(name, port, demo_stop.clone()).await?
            };
            if addr.port() != port {
                println!(
                    "note: port {port} is busy; the demo {name} service listens on {addr} instead"
                );
            }
            web.get_or_insert(addr);
        }
        let web = web.expect("EXAMPLE_PORTS starts with web");
        paths.push(demo::write_manifests(&data_dir.join("demo"), web)?);
        demo_host = Some(format!("{}.{}", demo::DEMO_SUBDOMAIN, args.base_domain));
    }
    let mut config = StandaloneConfig::new(paths.clone(), data_dir);
    config.http_listen = args.http_listen;
    config.base_domain = args.base_domain.clone();
    config.tcp_port_range = args.tcp_port_range.clone();
    config.poll_interval = Duration::from_millis(args.poll_interval_ms.max(50));
    config.print_reports = true;
    if let Some(api_url) = &args.edge_api {
        let key_file = args.api_key_file.clone().ok_or(Error::FlagRequired {
            flag: "--api-key-file",
            with: "--edge-api",
        })?;
        let key = std::fs::read_to_string(&key_file).map_err(|source| Error::ApiKeyRead {
            path: key_file.clone(),
            source,
        })?;
        config.remote = Some(RemoteEdge {
            api_url: api_url.clone(),
            agent_addr: Some(args.edge_agent.join(","))
                .filter(|a| !a.is_empty())
                .ok_or(Error::FlagRequired {
                    flag: "--edge-agent",
                    with: "--edge-api",
                })?,
            api_key: tuna_protocol::api::Secret::new(key.trim()),
            ca_file: args.edge_ca_file.clone(),
        });
    }
    let standalone = Standalone::start(config).await?;
    println!("{}", standalone.report().await);
    if let (Some(host), Some(addr)) = (demo_host, standalone.http_addr()) {
        let port = if addr.port() == 80 {
            String::new()
        } else {
            format!(":{}", addr.port())
        };
        println!("Try it:  curl http://{host}{port}/");
        println!("   or:   curl -H 'Host: {host}' http://{addr}/");
    }
    println!(
        "Watching {} for changes; Ctrl-C to stop.",
        paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    crate::role::shutdown_signal().await;
    println!("Stopping: closing tunnels and revoking their tokens…");
    standalone.shutdown().await;
    demo_stop.cancel();
    Ok(())
}
