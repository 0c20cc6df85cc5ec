//! Edge and agent as two processes, for `benches/tunnel.sh`.
//!
//! `tunnel_bench edge --agent 127.0.0.1:7000 --http 127.0.0.1:7080 --tcp-port 7201 --ca-out ca.pem --token T --host bench.test`
//! `tunnel_bench agent --edge 127.0.0.1:7000 --ca ca.pem --token T --host bench.test --tcp-port 7201 --http-upstream 127.0.0.1:8080 --tcp-upstream 127.0.0.1:5201`
//!
//! The agent hands each stream to its upstream as raw bytes (what the proxy
//! core does for TCP; for HTTP the benchmark measures the tunnel, not a proxy).
//!
//! `--tunnels N` (both sides) adds N more tunnels on the agent's one
//! connection, each with its own token (`T-<i>`) and host (`<i>.bench.test`),
//! to measure what a tunnel costs: the agent prints its RSS once every tunnel
//! is served, the edge whenever the number of tunnels it serves settles.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use clap::{Parser, Subcommand};
use rustls::pki_types::PrivateKeyDer;
use tuna_agent::{Agent, AgentConfig, Trust};
use tuna_edge::{EdgeConfig, EdgeServer, MemoryAuthority};
use tuna_protocol::mux::MuxStream;
use tuna_protocol::wire::{Binding, StreamKind, StreamMeta, TunnelToken};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand)]
enum Role {
    Edge {
        #[arg(long)]
        agent: SocketAddr,
        #[arg(long)]
        http: SocketAddr,
        #[arg(long)]
        tcp_port: u16,
        #[arg(long)]
        ca_out: PathBuf,
        #[arg(long)]
        token: String,
        #[arg(long)]
        host: String,
        #[arg(long, default_value_t = 0)]
        tunnels: usize,
    },
    Agent {
        #[arg(long)]
        edge: String,
        #[arg(long)]
        ca: PathBuf,
        #[arg(long)]
        token: String,
        #[arg(long)]
        host: String,
        #[arg(long)]
        tcp_port: u16,
        #[arg(long)]
        http_upstream: SocketAddr,
        #[arg(long)]
        tcp_upstream: SocketAddr,
        #[arg(long, default_value_t = 0)]
        tunnels: usize,
    },
}

/// Resident set size of this process, from `/proc/self/status`.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Open file descriptors of this process.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Warnings (a lost session, h2 refusing a peer) must show in a benchmark
    // run: figures measured on a broken tunnel are worthless.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().role {
        Role::Edge {
            agent,
            http,
            tcp_port,
            ca_out,
            token,
            host,
            tunnels,
        } => {
            let ck =
                rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])?;
            std::fs::write(&ca_out, ck.cert.pem())?;
            let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![ck.cert.der().clone()],
                PrivateKeyDer::try_from(ck.signing_key.serialize_der())
                    .map_err(anyhow::Error::msg)?,
            )?;
            let authority = MemoryAuthority::new();
            authority.add_token(
                "bench",
                &TunnelToken::new(&token),
                "bench",
                SystemTime::now() + Duration::from_secs(86_400),
                vec![Binding::http(&host), Binding::tcp(tcp_port.to_string())],
            );
            for i in 0..tunnels {
                authority.add_token(
                    &format!("bench-{i}"),
                    &TunnelToken::new(format!("{token}-{i}")),
                    "bench",
                    SystemTime::now() + Duration::from_secs(86_400),
                    vec![Binding::http(format!("{i}.{host}"))],
                );
            }
            let mut config = EdgeConfig::new(agent, Arc::new(tls));
            config.http_addr = Some(http);
            config.tcp_bind_ip = "127.0.0.1".parse()?;
            config.tcp_ports = tcp_port..=tcp_port;
            let edge = EdgeServer::start(config, Arc::new(authority), None).await?;
            if tunnels > 0 {
                let mut sessions = edge.sessions();
                tokio::spawn(async move {
                    while sessions.changed().await.is_ok() {
                        // Give the attaches a moment to land before measuring.
                        tokio::time::sleep(Duration::from_secs(3)).await;
                        eprintln!(
                            "edge: {} session(s), rss {} KiB, {} fds",
                            *sessions.borrow(),
                            rss_kib(),
                            fds()
                        );
                    }
                });
            }
            tokio::signal::ctrl_c().await?;
            drop(edge);
        }
        Role::Agent {
            edge,
            ca,
            token,
            host,
            tcp_port,
            http_upstream,
            tcp_upstream,
            tunnels,
        } => {
            let mut config = AgentConfig::new(edge, Trust::CaFile(ca));
            config.server_name = Some("localhost".into());
            let before = rss_kib();
            let agent = Agent::start(config, move |mut stream: MuxStream, meta: StreamMeta| {
                let upstream = match meta.kind {
                    StreamKind::Http { .. } => http_upstream,
                    StreamKind::Tcp { .. } | StreamKind::Address { .. } => tcp_upstream,
                };
                tokio::spawn(async move {
                    let Ok(mut tcp) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = tcp.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional_with_sizes(
                        &mut stream,
                        &mut tcp,
                        64 * 1024,
                        64 * 1024,
                    )
                    .await;
                });
            })?;
            agent
                .attach(
                    "bench",
                    TunnelToken::new(&token),
                    vec![Binding::http(&host), Binding::tcp(tcp_port.to_string())],
                )
                .await?;
            let session = agent.connected().await?;
            agent.serving("bench").await?;
            eprintln!("agent connected: {session}");
            if tunnels > 0 {
                let started = std::time::Instant::now();
                for i in 0..tunnels {
                    agent
                        .attach(
                            format!("bench-{i}"),
                            TunnelToken::new(format!("{token}-{i}")),
                            vec![Binding::http(format!("{i}.{host}"))],
                        )
                        .await?;
                }
                for i in 0..tunnels {
                    agent.serving(&format!("bench-{i}")).await?;
                }
                eprintln!(
                    "agent: {} tunnels served in {:?} on session {:?}; rss {} KiB (before start {} KiB), {} fds",
                    tunnels + 1,
                    started.elapsed(),
                    agent.session_id(),
                    rss_kib(),
                    before,
                    fds()
                );
            }
            tokio::signal::ctrl_c().await?;
        }
    }
    Ok(())
}
