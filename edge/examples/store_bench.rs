//! The control plane's store under load, for `benches/store.sh`.
//!
//! `store_bench --data-dir DIR [--store postgres://…] [--replicas 2]`
//!
//! Prints one JSON object of figures:
//!
//! - `reservations_per_s`: subdomain reservations (`create_domain`, one
//!   durable commit each) from `--threads` threads spread over `--replicas`
//!   control planes on the store (PostgreSQL only: a redb file has one
//!   process);
//! - the store filled to `--domains` domains and `--tokens` tunnel tokens
//!   (fill rate included), then latencies (median, p99) of listing an
//!   account's domains and tokens, of one domain's lookup, of a tunnel
//!   token's authentication, and the time to open (load) the full store;
//! - PostgreSQL with two replicas: how long a token revoked on one replica
//!   takes to be announced on the other (median, max over `--revocations`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use tuna_edge::control::{Caller, ControlConfig, ControlPlane, Quotas, StoreUrl};
use tuna_edge::{Revocation, TokenId};
use tuna_protocol::api::{Bindings, CreateDomain, CreateToken, Scope};

#[derive(Parser)]
struct Cli {
    /// Data dir (the redb file; TLS is not used here).
    #[arg(long)]
    data_dir: std::path::PathBuf,
    /// PostgreSQL store; without it, redb in the data dir.
    #[arg(long)]
    store: Option<StoreUrl>,
    /// Control planes on the store (PostgreSQL only).
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Threads reserving at once.
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// Reservations timed.
    #[arg(long, default_value_t = 2000)]
    reservations: usize,
    /// Domains in the filled store.
    #[arg(long, default_value_t = 10_000)]
    domains: usize,
    /// Tokens in the filled store.
    #[arg(long, default_value_t = 10_000)]
    tokens: usize,
    /// Lookups timed per kind.
    #[arg(long, default_value_t = 2000)]
    lookups: usize,
    /// Revocations timed across replicas.
    #[arg(long, default_value_t = 50)]
    revocations: usize,
}

fn caller(account: &str) -> Caller {
    Caller {
        key_id: "bench".into(),
        account: account.into(),
        scopes: vec![Scope::Full],
    }
}

fn config(cli: &Cli) -> ControlConfig {
    let mut config = ControlConfig::new(&cli.data_dir, "tuna.test", "edge.tuna.test");
    config.store = cli.store.clone();
    config.quotas = Quotas {
        domains: 1_000_000,
        tokens: 1_000_000,
        ..Quotas::default()
    };
    config
}

/// Runs `count` operations over `threads` threads; operations per second.
fn rate(threads: usize, count: usize, op: impl Fn(usize) + Sync) -> f64 {
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        return;
                    }
                    op(i);
                }
            });
        }
    });
    count as f64 / start.elapsed().as_secs_f64()
}

/// Median and p99 of `count` timed calls, in microseconds.
fn latency(count: usize, mut op: impl FnMut(usize)) -> serde_json::Value {
    let mut samples: Vec<Duration> = (0..count)
        .map(|i| {
            let start = Instant::now();
            op(i);
            start.elapsed()
        })
        .collect();
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    serde_json::json!({ "median_us": at(0.5), "p99_us": at(0.99) })
}

fn main() {
    let cli = Cli::parse();
    let replicas = if cli.store.is_some() {
        cli.replicas.max(1)
    } else {
        1
    };
    let planes: Vec<ControlPlane> = (0..replicas)
        .map(|_| ControlPlane::open(config(&cli)).expect("opening the store"))
        .collect();
    let plane = |i: usize| &planes[i % planes.len()];

    // Reservations: one commit each, from every thread and replica at once.
    let reservations_per_s = rate(cli.threads, cli.reservations, |i| {
        plane(i)
            .create_domain(
                &caller(&format!("r{}", i % 16)),
                &CreateDomain {
                    subdomain: Some(format!("r{i}")),
                    domain: None,
                },
            )
            .expect("reserving");
    });

    // Fill to the target size on one account.
    let owner = caller("big");
    let fill_domains_per_s = rate(cli.threads, cli.domains, |i| {
        plane(i)
            .create_domain(
                &owner,
                &CreateDomain {
                    subdomain: Some(format!("d{i}")),
                    domain: None,
                },
            )
            .expect("filling domains");
    });
    let secrets: Vec<std::sync::Mutex<Option<String>>> = (0..cli.tokens)
        .map(|_| std::sync::Mutex::new(None))
        .collect();
    let fill_tokens_per_s = rate(cli.threads, cli.tokens, |i| {
        let created = plane(i)
            .create_token(
                &owner,
                &CreateToken {
                    labels: [("n".to_owned(), (i % 100).to_string())].into(),
                    bindings: Bindings {
                        hosts: vec![format!("d{}.tuna.test", i % cli.domains.max(1))],
                        tcp_endpoints: Vec::new(),
                        addresses: Vec::new(),
                    },
                    ttl_seconds: None,
                },
            )
            .expect("filling tokens");
        *secrets[i].lock().unwrap() = Some(created.token.expose().to_owned());
    });
    let secrets: Vec<String> = secrets
        .into_iter()
        .map(|s| s.into_inner().unwrap().unwrap())
        .collect();

    let first = &planes[0];
    let list_domains = latency(cli.lookups.min(200), |_| {
        assert_eq!(first.list_domains(&owner).unwrap().len(), cli.domains);
    });
    let list_tokens = latency(cli.lookups.min(200), |_| {
        assert_eq!(first.list_tokens(&owner, "").unwrap().len(), cli.tokens);
    });
    let list_tokens_selected = latency(cli.lookups.min(200), |_| {
        first.list_tokens(&owner, "n=7").unwrap();
    });
    let get_domain = latency(cli.lookups, |i| {
        first
            .get_domain(&owner, &format!("d{}.tuna.test", (i * 7919) % cli.domains))
            .unwrap();
    });
    let authenticate_tunnel = latency(cli.lookups, |i| {
        assert!(
            first
                .authenticate_tunnel(&secrets[(i * 7919) % secrets.len()])
                .is_ok()
        );
    });

    // Opening the full store again: what a replica's start costs.
    let open_start = Instant::now();
    let reopened = if cli.store.is_some() {
        ControlPlane::open(config(&cli)).expect("reopening")
    } else {
        drop(planes);
        ControlPlane::open(config(&cli)).expect("reopening")
    };
    let open_full_ms = open_start.elapsed().as_secs_f64() * 1e3;

    // Revocation on one replica, announced on another.
    let propagation = if cli.store.is_some() {
        let other = ControlPlane::open(config(&cli)).expect("opening a second replica");
        let mut revocations = other.subscribe_revocations();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let mut samples = Vec::new();
        let tokens: Vec<String> = reopened
            .list_tokens(&owner, "")
            .unwrap()
            .into_iter()
            .take(cli.revocations)
            .map(|t| t.id)
            .collect();
        for id in tokens {
            let start = Instant::now();
            reopened.revoke_token(&owner, &id).unwrap();
            let wanted = Revocation::Token(TokenId(id));
            runtime.block_on(async {
                loop {
                    match tokio::time::timeout(Duration::from_secs(5), revocations.recv()).await {
                        Ok(Ok(got)) if got == wanted => break,
                        Ok(Ok(_)) => {}
                        other => panic!("no revocation: {other:?}"),
                    }
                }
            });
            samples.push(start.elapsed());
        }
        samples.sort();
        Some(serde_json::json!({
            "median_ms": samples[samples.len() / 2].as_secs_f64() * 1e3,
            "max_ms": samples[samples.len() - 1].as_secs_f64() * 1e3,
            "count": samples.len(),
        }))
    } else {
        None
    };
    drop(reopened);

    let figures = serde_json::json!({
        "store": if cli.store.is_some() { "postgres" } else { "redb" },
        "replicas": replicas,
        "threads": cli.threads,
        "reservations_per_s": reservations_per_s,
        "fill_domains_per_s": fill_domains_per_s,
        "fill_tokens_per_s": fill_tokens_per_s,
        "domains": cli.domains,
        "tokens": cli.tokens,
        "list_domains": list_domains,
        "list_tokens": list_tokens,
        "list_tokens_selector": list_tokens_selected,
        "get_domain": get_domain,
        "authenticate_tunnel": authenticate_tunnel,
        "open_full_ms": open_full_ms,
        "revocation_propagation": propagation,
    });
    println!("{figures}");
}
