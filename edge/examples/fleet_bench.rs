//! An edge fleet under HTTP load, for `benches/fleet.sh`.
//!
//! `fleet_bench --store postgres://… [--conns 32] [--seconds 5]`
//!
//! Starts three edge replicas in this process (control planes on the one
//! PostgreSQL store, public HTTP on 127.0.0.2/3/4, the internal hop over
//! mutually authenticated TLS), an agent holding a session to every replica
//! (`direct.tuna.test`) and one holding a session to the first only
//! (`hop.tuna.test`); the agents answer each request themselves (a 1 KiB
//! body), so the figures are the edges' and the hop's. Then, in one run,
//! keep-alive HTTP/1.1 load from `--conns` connections spread evenly over
//! 1, 2 and 3 replicas (direct attachment), and through replica 2 alone for
//! the directly attached host and for the host that hops to replica 1.
//! Prints one JSON object per load and a Markdown table with the ratios.
//! Everything shares this machine's cores: more replicas on one machine
//! add no CPU, so the 1/2/3 figures show what spreading costs or gains
//! here, not the capacity of a fleet of machines.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tuna_agent::{Agent, AgentConfig, AgentHandle, Trust};
use tuna_edge::control::{Caller, ControlConfig, ControlPlane, StoreUrl};
use tuna_edge::{EdgeConfig, EdgeHandle, EdgeServer, FleetConfig, PeerTls};
use tuna_protocol::api::{Bindings, CreateDomain, CreateToken, Scope};
use tuna_protocol::mux::MuxStream;
use tuna_protocol::wire::{Binding, StreamMeta, TunnelToken};

#[derive(Parser)]
struct Cli {
    /// The fleet's PostgreSQL store.
    #[arg(long)]
    store: StoreUrl,
    /// Client connections of each load.
    #[arg(long, default_value_t = 32)]
    conns: usize,
    /// Seconds each load runs.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
}

const REPLICAS: usize = 3;
const BODY: &[u8] = &[b'x'; 1024];

fn ip(i: usize) -> std::net::IpAddr {
    format!("127.0.0.{}", i + 2).parse().unwrap()
}

/// The fleet's certificate files: one CA, one leaf for every listener.
fn certs(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let mut names: Vec<String> = vec!["tuna-edge-peer".into(), "localhost".into()];
    names.extend((0..REPLICAS).map(|i| ip(i).to_string()));
    let leaf_key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(names).unwrap();
    // As a peer, both sides of the hop: server and client.
    leaf.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let leaf = leaf.signed_by(&leaf_key, &Issuer::new(ca, ca_key)).unwrap();
    let paths = (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    );
    std::fs::write(&paths.0, ca_cert.pem()).unwrap();
    std::fs::write(&paths.1, leaf.pem()).unwrap();
    std::fs::write(&paths.2, leaf_key.serialize_pem()).unwrap();
    paths
}

/// The agent's side: every stream is answered with 200 and [`BODY`].
fn answer(stream: MuxStream, _meta: StreamMeta) {
    tokio::spawn(async move {
        let service = hyper::service::service_fn(|_req| async {
            Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(BODY))))
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .await;
    });
}

/// Keep-alive GETs of `host` from `conns` connections spread over
/// `targets` for `seconds`; (requests answered 200, failures).
async fn load(targets: &[SocketAddr], host: &str, conns: usize, seconds: u64) -> (u64, u64) {
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..conns)
        .map(|c| {
            let target = targets[c % targets.len()];
            let (ok, failed, host) = (ok.clone(), failed.clone(), host.to_owned());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let Ok(tcp) = tokio::net::TcpStream::connect(target).await else {
                        failed.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let _ = tcp.set_nodelay(true);
                    let Ok((mut sender, conn)) =
                        hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await
                    else {
                        failed.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    tokio::spawn(conn);
                    while Instant::now() < deadline {
                        let req = hyper::Request::get("/")
                            .header("host", &host)
                            .body(Empty::<Bytes>::new())
                            .unwrap();
                        match sender.send_request(req).await {
                            Ok(resp) if resp.status() == 200 => {
                                if resp.into_body().collect().await.is_ok() {
                                    ok.fetch_add(1, Ordering::Relaxed);
                                } else {
                                    failed.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            _ => {
                                failed.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed))
}

async fn agent(
    edges: &[&EdgeHandle],
    ca: &std::path::Path,
    id: &str,
    token: TunnelToken,
    host: &str,
) -> AgentHandle {
    let addrs: Vec<String> = edges.iter().map(|e| e.agent_addr.to_string()).collect();
    let mut config = AgentConfig::new(addrs.join(","), Trust::CaFile(ca.to_owned()));
    config.server_name = Some("localhost".into());
    let agent = Agent::start(config, answer).unwrap();
    agent
        .attach(id, token, vec![Binding::http(host)])
        .await
        .unwrap();
    agent.serving(id).await.unwrap();
    agent
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir()?;
    let (ca, cert, key) = certs(dir.path());
    let owner = Caller {
        key_id: "bench".into(),
        account: "default".into(),
        scopes: vec![Scope::Full],
    };

    let mut planes = Vec::new();
    for i in 0..REPLICAS {
        let data = dir.path().join(format!("r{i}"));
        let mut config = ControlConfig::new(&data, "tuna.test", "tuna.test");
        config.store = Some(cli.store.clone());
        planes.push(tokio::task::spawn_blocking(move || ControlPlane::open(config)).await??);
    }
    let tokens = {
        let (plane, owner) = (planes[0].clone(), owner.clone());
        tokio::task::spawn_blocking(move || {
            ["direct", "hop"].map(|name| {
                let domain = CreateDomain {
                    subdomain: Some(name.into()),
                    domain: None,
                };
                plane.create_domain(&owner, &domain).ok();
                let request = CreateToken {
                    bindings: Bindings {
                        hosts: vec![format!("{name}.tuna.test")],
                        tcp_endpoints: Vec::new(),
                        addresses: Vec::new(),
                    },
                    ..Default::default()
                };
                plane.create_token(&owner, &request).unwrap().token
            })
        })
        .await?
    };
    let identity = tuna_edge::tls::pem_identity(&cert, &key)?;
    let mut edges = Vec::new();
    for (i, plane) in planes.iter().enumerate() {
        let mut config = EdgeConfig::new(
            SocketAddr::new(ip(i), 0),
            tuna_edge::tls::server_config(&identity, &[])?,
        );
        config.http_addr = Some(SocketAddr::new(ip(i), 0));
        config.fleet = Some(FleetConfig {
            store: cli.store.clone(),
            replica_id: format!("r{i}"),
            peer_bind: SocketAddr::new(ip(i), 0),
            peer_advertise: None,
            tls: PeerTls::from_files(&cert, &key, &ca)?,
            share: Default::default(),
            round_interval: tuna_edge::fleet::LEASE_ROUND_INTERVAL,
        });
        edges.push(EdgeServer::start(config, Arc::new(plane.clone()), None).await?);
    }
    let [direct_token, hop_token] = tokens;
    let all: Vec<&EdgeHandle> = edges.iter().collect();
    let _direct = agent(
        &all,
        &ca,
        "direct",
        TunnelToken::new(direct_token.expose()),
        "direct.tuna.test",
    )
    .await;
    let _hop = agent(
        &all[..1],
        &ca,
        "hop",
        TunnelToken::new(hop_token.expose()),
        "hop.tuna.test",
    )
    .await;
    let http: Vec<SocketAddr> = edges.iter().map(|e| e.http_addr.unwrap()).collect();
    // Until the other replicas know where hop.tuna.test is.
    let start = Instant::now();
    while load(&http[1..2], "hop.tuna.test", 1, 1).await.0 == 0 {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(30),
            "the hop never served"
        );
    }

    let mut rows = Vec::new();
    for n in 1..=REPLICAS {
        let (ok, failed) = load(&http[..n], "direct.tuna.test", cli.conns, cli.seconds).await;
        rows.push((format!("direct, {n} replica(s)"), n, ok, failed));
    }
    let (ok, failed) = load(&http[1..2], "direct.tuna.test", cli.conns, cli.seconds).await;
    rows.push(("direct through replica 2".into(), 1, ok, failed));
    let (ok, failed) = load(&http[1..2], "hop.tuna.test", cli.conns, cli.seconds).await;
    rows.push(("hop: replica 2 → replica 1".into(), 1, ok, failed));

    let rate = |ok: u64| ok as f64 / cli.seconds as f64;
    for (label, replicas, ok, failed) in &rows {
        println!(
            "{}",
            serde_json::json!({
                "load": label, "replicas": replicas, "conns": cli.conns,
                "seconds": cli.seconds, "requests": ok, "failed": failed,
                "req_per_s": rate(*ok),
            })
        );
    }
    let one = rate(rows[0].2);
    println!("\n| load | replicas | req/s | vs 1 replica | failed |");
    println!("|---|---:|---:|---:|---:|");
    for (label, replicas, ok, failed) in &rows {
        println!(
            "| {label} | {replicas} | {:.0} | {:.2}× | {failed} |",
            rate(*ok),
            rate(*ok) / one
        );
    }
    println!(
        "\nhop / direct through the same replica: {:.2}×",
        rate(rows[4].2) / rate(rows[3].2)
    );
    // Agents first: an edge's shutdown waits for its sessions to end.
    drop((_direct, _hop));
    for e in edges {
        let _ = tokio::time::timeout(Duration::from_secs(5), e.shutdown()).await;
    }
    Ok(())
}
