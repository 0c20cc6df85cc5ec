//! The fleet's lease loop under a burst of attachments, for
//! `benches/lease.sh`.
//!
//! `lease_bench --store postgres://… --log <the server's log> [--tunnels 1000]`
//!
//! One fleet replica (an edge with an in-memory authority, so that the only
//! statements on the store are the lease loop's) and one agent that
//! attaches `--tunnels` HTTP tunnels at once, then one every 5 ms. Counted, from the server's
//! own log (`log_statement = all`): the lease loop's statements (upserts of
//! `edge_attachments`, `pg_notify`, reads of the live rows) from the first
//! attach until every tunnel is served and the next renewal is past. Run
//! twice in one process: with every change published on its own (the loop
//! before coalescing, `round_interval` zero) and with the default
//! interval; prints both and their ratio.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tuna_agent::{Agent, AgentConfig, Trust};
use tuna_edge::control::StoreUrl;
use tuna_edge::fleet::{LEASE_ROUND_INTERVAL, RENEW};
use tuna_edge::{EdgeConfig, EdgeServer, FleetConfig, MemoryAuthority, PeerTls};
use tuna_protocol::mux::MuxStream;
use tuna_protocol::wire::{Binding, StreamMeta, TunnelToken};

#[derive(Parser)]
struct Cli {
    /// The fleet's PostgreSQL store.
    #[arg(long)]
    store: StoreUrl,
    /// The server's log file, with `log_statement = all`.
    #[arg(long)]
    log: PathBuf,
    /// Tunnels attached at once.
    #[arg(long, default_value_t = 1000)]
    tunnels: usize,
}

fn certs(dir: &std::path::Path) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let mut leaf =
        CertificateParams::new(vec!["tuna-edge-peer".to_owned(), "localhost".to_owned()]).unwrap();
    leaf.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = leaf.signed_by(&leaf_key, &Issuer::new(ca, ca_key)).unwrap();
    let paths = (
        dir.join("ca.pem"),
        dir.join("leaf.pem"),
        dir.join("leaf.key"),
    );
    std::fs::write(&paths.0, ca_cert.pem()).unwrap();
    std::fs::write(&paths.1, leaf.pem()).unwrap();
    std::fs::write(&paths.2, leaf_key.serialize_pem()).unwrap();
    paths
}

/// The lease loop's statements in `log` from byte `from` on.
fn lease_statements(log: &std::path::Path, from: usize) -> usize {
    let text = std::fs::read(log).unwrap_or_default();
    let text = String::from_utf8_lossy(text.get(from..).unwrap_or_default());
    text.lines()
        .filter(|l| {
            (l.contains("LOG:  execute") || l.contains("LOG:  statement"))
                && (l.contains("edge_attachments") || l.contains("pg_notify"))
        })
        .count()
}

fn log_len(log: &std::path::Path) -> usize {
    std::fs::metadata(log).map_or(0, |m| m.len() as usize)
}

/// One run: statements and seconds from the first attach until every
/// tunnel serves and one renewal has passed.
async fn run(
    cli: &Cli,
    dir: &std::path::Path,
    name: &str,
    round_interval: Duration,
    gap: Duration,
) -> anyhow::Result<(usize, f64, f64)> {
    let (ca, cert, key) = certs(dir);
    let identity = tuna_edge::tls::pem_identity(&cert, &key)?;
    let authority = MemoryAuthority::new();
    let far = std::time::SystemTime::now() + Duration::from_secs(3600);
    for i in 0..cli.tunnels {
        authority.add_token(
            &format!("tok-{i}"),
            &TunnelToken::new(format!("{name}-t{i}")),
            "acct",
            far,
            vec![Binding::http(format!("{name}-{i}.tuna.test"))],
        );
    }
    let mut config = EdgeConfig::new(
        "127.0.0.1:0".parse::<SocketAddr>()?,
        tuna_edge::tls::server_config(&identity, &[])?,
    );
    config.limits.max_tunnels_per_account = cli.tunnels * 2;
    config.fleet = Some(FleetConfig {
        store: cli.store.clone(),
        replica_id: name.to_owned(),
        peer_bind: "127.0.0.1:0".parse()?,
        peer_advertise: None,
        tls: PeerTls::from_files(&cert, &key, &ca)?,
        share: Default::default(),
        round_interval,
    });
    let edge = EdgeServer::start(config, Arc::new(authority), None).await?;
    // The first rounds (the empty row) before counting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut agent_config = AgentConfig::new(
        edge.agent_addr.to_string(),
        Trust::CaPem(std::fs::read(&ca)?),
    );
    agent_config.server_name = Some("localhost".into());
    let agent = Agent::start(agent_config, |_: MuxStream, _: StreamMeta| {})?;
    let from = log_len(&cli.log);
    let started = Instant::now();
    for i in 0..cli.tunnels {
        agent
            .attach(
                format!("t{i}"),
                TunnelToken::new(format!("{name}-t{i}")),
                vec![Binding::http(format!("{name}-{i}.tuna.test"))],
            )
            .await?;
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
    }
    for i in 0..cli.tunnels {
        tokio::time::timeout(Duration::from_secs(60), agent.serving(&format!("t{i}"))).await??;
    }
    let served = started.elapsed().as_secs_f64();
    // Past the next renewal: what the burst left to publish is published.
    tokio::time::sleep(RENEW + Duration::from_millis(500)).await;
    let window = started.elapsed().as_secs_f64();
    let statements = lease_statements(&cli.log, from);
    agent.shutdown().await;
    edge.shutdown().await;
    Ok((statements, served, window))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let dir = tempfile::tempdir()?;
    // The schema (`edge_attachments` among it) is the control plane's:
    // opened once to migrate, then closed, so that only the lease loop
    // talks to the store while counting.
    {
        let mut config =
            tuna_edge::control::ControlConfig::new(dir.path(), "tuna.test", "tuna.test");
        config.store = Some(cli.store.clone());
        let plane =
            tokio::task::spawn_blocking(move || tuna_edge::control::ControlPlane::open(config))
                .await??;
        tokio::task::spawn_blocking(move || drop(plane)).await?;
    }
    let mut rows = Vec::new();
    // At once (as fast as one agent attaches), and spread: one attach
    // every 5 ms (1 000 over about 5 s), as many agents reconnecting do.
    for (load, gap) in [
        ("at once", Duration::ZERO),
        ("every 5 ms", Duration::from_millis(5)),
    ] {
        for (mode, interval) in [
            ("each", Duration::ZERO),
            ("coalesced", LEASE_ROUND_INTERVAL),
        ] {
            let name = format!("{}-{mode}", if gap.is_zero() { "burst" } else { "spread" });
            let (statements, served, window) = run(&cli, dir.path(), &name, interval, gap).await?;
            println!(
                "{{\"attach\":\"{load}\",\"run\":\"{mode}\",\"round_interval_ms\":{},\"tunnels\":{},\"statements\":{statements},\"served_s\":{served:.2},\"window_s\":{window:.2},\"statements_per_s\":{:.1}}}",
                interval.as_millis(),
                cli.tunnels,
                statements as f64 / window
            );
            rows.push((format!("{load}, {mode}"), statements, window));
        }
    }
    let per_s = |r: &(String, usize, f64)| r.1 as f64 / r.2;
    println!();
    println!("| run | lease statements | window (s) | statements/s |");
    println!("|---|---|---|---|");
    for r in &rows {
        println!("| {} | {} | {:.2} | {:.1} |", r.0, r.1, r.2, per_s(r));
    }
    println!(
        "\ncoalesced / each, statements/s: at once {:.3}, every 5 ms {:.3}",
        per_s(&rows[1]) / per_s(&rows[0]),
        per_s(&rows[3]) / per_s(&rows[2])
    );
    Ok(())
}
