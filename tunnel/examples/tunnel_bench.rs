//! Edge and agent as two processes, for `benches/tunnel.sh`.
//!
//! `tunnel_bench edge --agent 127.0.0.1:7000 --http 127.0.0.1:7080 --tcp-port 7201 --ca-out ca.pem --token T --host bench.test`
//! `tunnel_bench agent --edge 127.0.0.1:7000 --ca ca.pem --token T --host bench.test --tcp-port 7201 --http-upstream 127.0.0.1:8080 --tcp-upstream 127.0.0.1:5201`
//!
//! The agent hands each stream to its upstream as raw bytes (what the proxy
//! core does for TCP; for HTTP the benchmark measures the tunnel, not a proxy).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use clap::{Parser, Subcommand};
use rustls::pki_types::PrivateKeyDer;
use tuna_tunnel::agent::{Agent, AgentConfig, Trust};
use tuna_tunnel::edge::{EdgeConfig, EdgeServer, MemoryAuthority};
use tuna_tunnel::mux::MuxStream;
use tuna_tunnel::wire::{Binding, StreamKind, StreamMeta, TunnelToken};

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
    },
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
                &TunnelToken::new(token),
                "bench",
                SystemTime::now() + Duration::from_secs(86_400),
                vec![Binding::http(host), Binding::tcp(tcp_port.to_string())],
            );
            let mut config = EdgeConfig::new(agent, Arc::new(tls));
            config.http_addr = Some(http);
            config.tcp_bind_ip = "127.0.0.1".parse()?;
            config.tcp_ports = tcp_port..=tcp_port;
            let _edge = EdgeServer::start(config, Arc::new(authority), None).await?;
            tokio::signal::ctrl_c().await?;
        }
        Role::Agent {
            edge,
            ca,
            token,
            host,
            tcp_port,
            http_upstream,
            tcp_upstream,
        } => {
            let mut config = AgentConfig::new(edge, TunnelToken::new(token), Trust::CaFile(ca));
            config.server_name = Some("localhost".into());
            config.bindings = vec![Binding::http(host), Binding::tcp(tcp_port.to_string())];
            let agent = Agent::start(config, move |mut stream: MuxStream, meta: StreamMeta| {
                let upstream = match meta.kind {
                    StreamKind::Http { .. } => http_upstream,
                    StreamKind::Tcp { .. } => tcp_upstream,
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
            let session = agent.connected().await?;
            eprintln!("agent connected: {session}");
            tokio::signal::ctrl_c().await?;
        }
    }
    Ok(())
}
