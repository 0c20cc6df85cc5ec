//! `tuna-operator edge …`: the self-hosted edge from one command.
//!
//! `tuna-operator edge --data-dir /var/lib/tuna-edge --base-domain tunnels.example.com`
//! serves everything; `tuna-operator edge keys create|list|revoke …` manages
//! API keys on a stopped edge's data dir. Every TLS listener without a given
//! certificate uses one issued by the edge's own CA, generated on first
//! start and persisted in `<data-dir>/tls/ca.pem` (agents and API clients
//! trust that file).

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::budget::{EdgeLimits, PreAuthTotal, check_fd_budget};
use crate::control::cli::KeysArgs;
use crate::control::{ControlConfig, ControlPlane, Quotas};
use crate::error::{Error, Result};
use crate::server::{EdgeConfig, EdgeServer};
use crate::tls;

/// `edge`: serve (the default) or manage keys.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct EdgeCli {
    /// `keys …`, or nothing to serve.
    #[command(subcommand)]
    pub command: Option<EdgeCommand>,
    /// Flags of the edge server (when no subcommand is given).
    #[command(flatten)]
    pub serve: EdgeArgs,
}

/// The `edge` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum EdgeCommand {
    /// Runs the edge (same as giving the flags without a subcommand).
    Serve(Box<EdgeArgs>),
    /// Manages API keys (`create`, `list`, `revoke`).
    Keys(KeysArgs),
}

/// Flags of the edge server.
#[derive(Debug, Clone, clap::Args)]
pub struct EdgeArgs {
    /// Persistent state: the store (keys, reservations, tokens) and the generated CA.
    #[arg(long, env = "TUNA_EDGE_DATA_DIR", required = true)]
    pub data_dir: Option<PathBuf>,
    /// Keeps keys, reservations and tokens in this PostgreSQL database,
    /// shared by every replica of an edge fleet, instead of
    /// `<data-dir>/control.redb`: `postgres://USER[:PASSWORD]@HOST:PORT/DB`,
    /// with `?sslmode=verify-full&sslrootcert=CA.pem` for a database on
    /// another machine (prefer the environment variable: a command line is
    /// visible to every local user). See docs/edge-fleet.md.
    #[arg(
        long,
        env = "TUNA_EDGE_STORE",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub store: Option<crate::control::StoreUrl>,
    /// Allow `sslmode=prefer` or `disable` in `--store` to a database on
    /// another machine (refused otherwise: the connection could be read or
    /// changed on its way, and every replica trusts what the store says).
    #[arg(long, env = "TUNA_EDGE_STORE_INSECURE_TLS")]
    pub store_insecure_tls: bool,
    /// Subdomains are reserved under this domain (`app.<base-domain>`).
    #[arg(long, env = "TUNA_EDGE_BASE_DOMAIN", required = true)]
    pub base_domain: Option<String>,
    /// The public host name custom domains must CNAME to (default: the base domain).
    #[arg(long, env = "TUNA_EDGE_PUBLIC_HOST")]
    pub public_host: Option<String>,
    /// Public plain-HTTP listener.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub http_listen: Option<SocketAddr>,
    /// Public HTTPS listener (HTTP/1.1 and h2).
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub https_listen: Option<SocketAddr>,
    /// PEM certificate chain of the public HTTPS listener (e.g. a wildcard for the base domain).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Listener agents dial (TLS).
    #[arg(long, default_value = "0.0.0.0:7443")]
    pub agent_listen: SocketAddr,
    /// PEM certificate of the agent listener (default: issued by the edge's CA).
    #[arg(long, requires = "agent_tls_key")]
    pub agent_tls_cert: Option<PathBuf>,
    /// PEM key of `--agent-tls-cert`.
    #[arg(long, requires = "agent_tls_cert")]
    pub agent_tls_key: Option<PathBuf>,
    /// REST API listener (TLS).
    #[arg(long, default_value = "0.0.0.0:7444")]
    pub api_listen: SocketAddr,
    /// PEM certificate of the API listener (default: issued by the edge's CA).
    #[arg(long, requires = "api_tls_key")]
    pub api_tls_cert: Option<PathBuf>,
    /// PEM key of `--api-tls-cert`.
    #[arg(long, requires = "api_tls_cert")]
    pub api_tls_key: Option<PathBuf>,
    /// Serves the REST API in plain text; refused unless `--api-listen` is a loopback address.
    #[arg(long)]
    pub insecure_plaintext_api: bool,
    /// Ports TCP endpoints are allocated from, `FIRST-LAST`.
    #[arg(long, default_value = "30000-30999", value_parser = parse_port_range)]
    pub tcp_port_range: RangeInclusive<u16>,
    /// Addresses Gateways reserve (`POST /v1/gateway-addresses`), each for
    /// any port: a comma-separated list of addresses and CIDR ranges, IPv4
    /// and IPv6 (`203.0.113.10,203.0.113.11`, `127.0.100.0/24`). An IPv4
    /// range wider than /31 leaves out its network and broadcast addresses;
    /// a range, and the whole list, may hold at most 65 536 addresses.
    /// Empty (the default): no Gateway addresses.
    #[arg(
        long,
        default_value = "",
        value_name = "LIST",
        hide_default_value = true
    )]
    pub gateway_addresses: crate::control::AddressPool,
    /// Address the TCP endpoint listeners bind to.
    #[arg(long, default_value = "0.0.0.0")]
    pub tcp_bind: IpAddr,
    /// DNS servers for custom-domain verification (repeatable; default: the system's).
    #[arg(long = "dns-nameserver")]
    pub dns_nameservers: Vec<SocketAddr>,
    /// Heartbeat interval announced to agents, in seconds.
    #[arg(long, default_value_t = 10)]
    pub heartbeat_secs: u64,
    /// Seconds a public request for a host whose tunnel just went away (an
    /// agent restarting, as on `helm upgrade`) waits for it to come back
    /// before `503 Tunnel offline`; 0 answers at once.
    #[arg(long, default_value_t = 5)]
    pub reconnect_grace_secs: u64,
    /// REST API requests one key may send back to back (token bucket size).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..))]
    pub api_rate_burst: u32,
    /// REST API requests one key may send per second, sustained.
    #[arg(long, default_value_t = 20.0, value_parser = parse_positive_rate)]
    pub api_rate_per_second: f64,
    /// Tunnels one account may have open at once (the benchmark of 10 000
    /// tunnels on one account fits the default).
    #[arg(long, default_value_t = EdgeLimits::default().max_tunnels_per_account)]
    pub max_tunnels_per_account: usize,
    /// Agent connections carrying tunnels of one account at once.
    #[arg(long, default_value_t = EdgeLimits::default().max_sessions_per_account)]
    pub max_sessions_per_account: usize,
    /// Tunnels one tunnel token may have open at once (API keys: the account's quota only).
    #[arg(long, default_value_t = EdgeLimits::default().max_tunnels_per_token)]
    pub max_tunnels_per_token: usize,
    /// Unauthenticated agent connections (TCP accept to a judged hello) at
    /// once, edge-wide; more are closed at accept. Every `--max-pending-*`
    /// total, plus 256 descriptors of headroom, must fit in the open-file
    /// limit (RLIMIT_NOFILE, raised to its hard limit at start), or the
    /// edge refuses to start.
    #[arg(long, default_value_t = EdgeLimits::default().max_pending_handshakes)]
    pub max_pending_handshakes: usize,
    /// Unauthenticated agent connections at once from one client (an IPv4
    /// address).
    #[arg(long, default_value_t = EdgeLimits::default().max_pending_handshakes_per_ip)]
    pub max_pending_handshakes_per_ip: usize,
    /// REST API connections that have not carried an authenticated request
    /// yet (TLS handshake, no or a refused key, idle) at once, edge-wide;
    /// more are closed at accept.
    #[arg(long, default_value_t = EdgeLimits::default().max_pending_api_connections)]
    pub max_pending_api_connections: usize,
    /// The same from one client (an IPv4 address or an IPv6 /64).
    #[arg(long, default_value_t = EdgeLimits::default().max_pending_api_connections_per_ip)]
    pub max_pending_api_connections_per_ip: usize,
    /// Public connections that have not sent a complete request head yet
    /// (TLS handshake included), per listener (HTTP and HTTPS each); more
    /// are closed at accept.
    #[arg(long, default_value_t = EdgeLimits::default().max_pending_public_connections)]
    pub max_pending_public_connections: usize,
    /// The same from one client (an IPv4 address or an IPv6 /64), per listener.
    #[arg(long, default_value_t = EdgeLimits::default().max_pending_public_connections_per_ip)]
    pub max_pending_public_connections_per_ip: usize,
    /// Peer-listener connections whose client certificate is not verified
    /// yet (TCP accept to a completed mutual TLS handshake) at once; more
    /// are closed at accept.
    #[arg(long, default_value_t = EdgeLimits::default().max_pending_peer_connections)]
    pub max_pending_peer_connections: usize,
    /// The same from one client (an IPv4 address or an IPv6 /64).
    #[arg(long, default_value_t = EdgeLimits::default().max_pending_peer_connections_per_ip)]
    pub max_pending_peer_connections_per_ip: usize,
    /// Public TCP endpoint connections open at once, over every endpoint;
    /// more are closed at accept. Counted in the open-file budget with the
    /// `--max-pending-*` totals.
    #[arg(long, default_value_t = EdgeLimits::default().max_tcp_connections)]
    pub max_tcp_connections: usize,
    /// The same from one client (an IPv4 address or an IPv6 /64).
    #[arg(long, default_value_t = EdgeLimits::default().max_tcp_connections_per_ip)]
    pub max_tcp_connections_per_ip: usize,
    /// A TCP endpoint connection on which no byte has moved either way this
    /// many seconds after accept is closed.
    #[arg(long, default_value_t = EdgeLimits::default().tcp_first_byte_timeout.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub tcp_first_byte_timeout_secs: u64,
    /// A TCP endpoint connection on which no byte has moved either way for
    /// this many seconds is closed.
    #[arg(long, default_value_t = EdgeLimits::default().tcp_idle_timeout.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub tcp_idle_timeout_secs: u64,
    /// Domains one account may hold (subdomains and verified custom domains).
    #[arg(long, default_value_t = Quotas::default().domains)]
    pub quota_domains: usize,
    /// Unverified custom domains one account may claim.
    #[arg(long, default_value_t = Quotas::default().pending_domains)]
    pub quota_pending_domains: usize,
    /// TCP endpoints (ports) one account may hold.
    #[arg(long, default_value_t = Quotas::default().tcp_endpoints)]
    pub quota_tcp_endpoints: usize,
    /// Gateway addresses one account may hold.
    #[arg(long, default_value_t = Quotas::default().gateway_addresses)]
    pub quota_gateway_addresses: usize,
    /// Live tunnel tokens one account may hold.
    #[arg(long, default_value_t = Quotas::default().tokens)]
    pub quota_tokens: usize,
    /// API keys one account may create through the REST API.
    #[arg(long, default_value_t = Quotas::default().keys)]
    pub quota_keys: usize,
    /// Longest total lifetime of a tunnel token, renewals included, in days.
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_token_lifetime_days: u64,
    /// Unverified custom domains are released after this many hours.
    #[arg(long, default_value_t = 168, value_parser = clap::value_parser!(u64).range(1..))]
    pub pending_domain_ttl_hours: u64,
    /// A host name or IP address agents and API clients reach this edge by,
    /// put into the certificate the edge issues itself (repeatable). The
    /// listen addresses that are not wildcards are in it anyway; give this
    /// for a wildcard listener or a name in front of it (e.g. the address
    /// of a bridge the cluster's pods reach the host on).
    #[arg(long = "advertise-name", value_name = "NAME")]
    pub advertise_names: Vec<String>,
    /// Once every listener is bound, write their addresses here as JSON
    /// (`{"agent": "127.0.0.1:7443", "http": …, "https": …, "api": …, "caFile": …}`),
    /// atomically: scripts and tests that bind port 0 read the real ports from it.
    #[arg(long, value_name = "FILE")]
    pub addresses_file: Option<PathBuf>,
    /// A proxy or load balancer in front of the edge (an address or CIDR,
    /// repeatable). On every listener, a connection of its that starts with
    /// a PROXY protocol v2 header counts as the client the header names
    /// (budgets, caps, logs). On the public listeners its `X-Forwarded-For`,
    /// `Forwarded`, `X-Real-IP` and `X-Request-Id` are kept; everyone
    /// else's are removed.
    #[arg(long = "trusted-proxy", value_name = "CIDR")]
    pub trusted_proxies: Vec<crate::public::IpCidr>,
    /// A replica that has not reached its `--store` for longer than this
    /// (seconds, 2–30) ends its agent sessions and answers the REST API
    /// `503` with `Retry-After` until it reaches it again: its copy may miss
    /// revocations and releases made through other replicas. (After 1 s it
    /// already judges no new tunnel.) See docs/edge-fleet.md.
    #[arg(
        long,
        default_value_t = crate::control::MAX_STORE_STALENESS.as_secs(),
        value_parser = clap::value_parser!(u64).range(2..=30)
    )]
    pub max_store_staleness_secs: u64,
    /// Peer listener of a fleet replica (needs `--store` and the
    /// `--peer-tls-*` files): public traffic for a tunnel attached to
    /// another replica hops there over mutually authenticated TLS, and the
    /// others hop here for tunnels attached to this one. See docs/edge-fleet.md.
    #[arg(long, value_name = "ADDR", requires_all = ["store", "peer_tls_cert", "peer_ca"])]
    pub peer_bind: Option<SocketAddr>,
    /// The address other replicas dial to reach `--peer-bind` (default: the bound address).
    #[arg(long, value_name = "ADDR", requires = "peer_bind")]
    pub peer_advertise: Option<SocketAddr>,
    /// This replica's id in the fleet (default: the advertised peer address).
    #[arg(long, requires = "peer_bind")]
    pub replica_id: Option<String>,
    /// PEM certificate the replica shows peers, as server and as client; it
    /// must carry the DNS name `tuna-edge-peer` and chain to `--peer-ca`.
    #[arg(long, requires_all = ["peer_tls_key", "peer_bind"])]
    pub peer_tls_cert: Option<PathBuf>,
    /// PEM key of `--peer-tls-cert`.
    #[arg(long, requires = "peer_tls_cert")]
    pub peer_tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) the fleet's peer certificates are issued by.
    #[arg(long, requires = "peer_bind")]
    pub peer_ca: Option<PathBuf>,
}

fn parse_positive_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(format!(
            "{s:?} is not a positive number of requests per second"
        )),
    }
}

/// Parses a `FIRST-LAST` port range (both inclusive, not starting at 0); the
/// clap value parser of every `--tcp-port-range` flag.
pub fn parse_port_range(s: &str) -> Result<RangeInclusive<u16>, String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?} is not FIRST-LAST"))?;
    let a: u16 = a
        .trim()
        .parse()
        .map_err(|_| format!("{a:?} is not a port"))?;
    let b: u16 = b
        .trim()
        .parse()
        .map_err(|_| format!("{b:?} is not a port"))?;
    if a == 0 || a > b {
        return Err(format!("{s:?} is empty or starts at 0"));
    }
    Ok(a..=b)
}

/// Runs `edge …` until interrupted (SIGINT/SIGTERM) or, for `keys`, once.
pub async fn run(cli: EdgeCli) -> Result<()> {
    match cli.command {
        Some(EdgeCommand::Keys(keys)) => {
            // Opening the store blocks (a PostgreSQL store has its own runtime).
            tokio::task::spawn_blocking(move || {
                let (mut out, mut note) = (std::io::stdout(), std::io::stderr());
                crate::control::cli::run(&keys, &mut out, &mut note)?;
                out.flush().map_err(|source| Error::File {
                    path: PathBuf::from("<stdout>"),
                    source,
                })
            })
            .await
            .map_err(|e| Error::Internal(format!("the keys command did not finish: {e}")))?
        }
        Some(EdgeCommand::Serve(args)) => serve(*args).await,
        None => serve(cli.serve).await,
    }
}

fn identity(
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
    data_dir: &Path,
    names: &[String],
) -> Result<tls::ServerIdentity> {
    Ok(match (cert, key) {
        (Some(cert), Some(key)) => tls::pem_identity(cert, key)?,
        _ => tls::self_signed_identity(data_dir, names)?,
    })
}

/// The names the edge's own certificate is issued for (besides loopback,
/// which it always holds): the public host, the base domain and its
/// wildcard, every listen address that is not a wildcard (a client that
/// dials the address it was given must find it in the certificate: an agent
/// in a pod reaches the edge on the host's bridge address, never on
/// loopback) and the `--advertise-name`s, without repeats.
fn certificate_names(args: &EdgeArgs, public_host: &str, base_domain: &str) -> Vec<String> {
    let listeners = [
        Some(args.agent_listen),
        Some(args.api_listen),
        args.https_listen,
    ];
    let addresses = listeners
        .into_iter()
        .flatten()
        .map(|addr| addr.ip())
        .filter(|ip| !ip.is_unspecified() && !ip.is_loopback())
        .map(|ip| ip.to_string());
    let mut names: Vec<String> = Vec::new();
    for name in [
        public_host.to_owned(),
        base_domain.to_owned(),
        format!("*.{base_domain}"),
    ]
    .into_iter()
    .chain(addresses)
    .chain(args.advertise_names.iter().cloned())
    {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// The pre-authentication totals of the listeners `args` opens, named by
/// their flags.
fn pre_auth_totals(args: &EdgeArgs) -> Vec<PreAuthTotal> {
    let total = |flag, total| PreAuthTotal { flag, total };
    let mut totals = vec![
        total("--max-pending-handshakes", args.max_pending_handshakes),
        total(
            "--max-pending-api-connections",
            args.max_pending_api_connections,
        ),
    ];
    if args.http_listen.is_some() {
        totals.push(total(
            "--max-pending-public-connections (HTTP)",
            args.max_pending_public_connections,
        ));
    }
    if args.https_listen.is_some() {
        totals.push(total(
            "--max-pending-public-connections (HTTPS)",
            args.max_pending_public_connections,
        ));
    }
    if args.peer_bind.is_some() {
        totals.push(total(
            "--max-pending-peer-connections",
            args.max_pending_peer_connections,
        ));
    }
    // Not pre-auth, but as open to anyone: a TCP endpoint has no
    // authentication, its connections count for their whole life.
    totals.push(total("--max-tcp-connections", args.max_tcp_connections));
    totals
}

/// Starts the edge with `args` and serves until a shutdown signal.
pub async fn serve(args: EdgeArgs) -> Result<()> {
    match crate::budget::raise_fd_limit() {
        Ok(soft) => {
            tracing::info!(open_files = soft, "open-file limit (RLIMIT_NOFILE)");
            check_fd_budget(&pre_auth_totals(&args), soft)?;
        }
        Err(e) => tracing::warn!(error = %e, "could not raise the open-file limit (RLIMIT_NOFILE)"),
    }
    let data_dir = args
        .data_dir
        .clone()
        .ok_or(Error::FlagRequired("--data-dir"))?;
    let base_domain = args
        .base_domain
        .clone()
        .ok_or(Error::FlagRequired("--base-domain"))?;
    let public_host = args
        .public_host
        .clone()
        .unwrap_or_else(|| base_domain.clone());
    if args.insecure_plaintext_api && !args.api_listen.ip().is_loopback() {
        return Err(Error::PlaintextApiOffLoopback(args.api_listen));
    }
    std::fs::create_dir_all(&data_dir).map_err(|source| Error::EdgeFile {
        action: "creating",
        path: data_dir.clone(),
        source,
    })?;
    let mut control_config = ControlConfig::new(&data_dir, &base_domain, &public_host);
    control_config.tcp_port_range = args.tcp_port_range.clone();
    control_config.gateway_addresses = args.gateway_addresses.clone();
    control_config.dns_nameservers = args.dns_nameservers.clone();
    control_config.rate_limit = crate::control::RateLimit {
        burst: args.api_rate_burst,
        per_second: args.api_rate_per_second,
    };
    control_config.quotas = Quotas {
        domains: args.quota_domains,
        pending_domains: args.quota_pending_domains,
        tcp_endpoints: args.quota_tcp_endpoints,
        gateway_addresses: args.quota_gateway_addresses,
        tokens: args.quota_tokens,
        keys: args.quota_keys,
    };
    control_config.max_token_lifetime = Duration::from_secs(args.max_token_lifetime_days * 86_400);
    control_config.pending_domain_ttl = Duration::from_secs(args.pending_domain_ttl_hours * 3600);
    let store = args
        .store
        .clone()
        .map(|s| s.allowing_insecure_tls(args.store_insecure_tls));
    control_config.store = store.clone();
    control_config.max_store_staleness = Duration::from_secs(args.max_store_staleness_secs);
    // One handle: the lease task counts the replicas, the limiters divide.
    let fleet_share = control_config.fleet_share.clone();
    if let Some(store) = &args.store {
        tracing::info!(%store, "using the PostgreSQL store");
    }
    // Opening blocks (a redb sync; PostgreSQL: connect, migrate, load).
    let control = tokio::task::spawn_blocking(move || ControlPlane::open(control_config))
        .await
        .map_err(|e| Error::Internal(format!("opening the store did not finish: {e}")))??;

    let names = certificate_names(&args, &public_host, &base_domain);
    let agent_identity = identity(&args.agent_tls_cert, &args.agent_tls_key, &data_dir, &names)?;
    let public_identity = identity(&args.tls_cert, &args.tls_key, &data_dir, &names)?;
    let mut config = EdgeConfig::new(args.agent_listen, tls::server_config(&agent_identity, &[])?);
    config.http_addr = args.http_listen;
    config.https_addr = args.https_listen;
    config.public_tls = Some(tls::server_config(&public_identity, tls::ALPN_H2_HTTP1)?);
    config.api_addr = Some(args.api_listen);
    config.api_tls = if args.insecure_plaintext_api {
        None
    } else {
        let api_identity = identity(&args.api_tls_cert, &args.api_tls_key, &data_dir, &names)?;
        Some(tls::server_config(&api_identity, tls::ALPN_H2_HTTP1)?)
    };
    config.tcp_bind_ip = args.tcp_bind;
    config.tcp_ports = args.tcp_port_range.clone();
    config.heartbeat = Duration::from_secs(args.heartbeat_secs.max(1));
    config.public_limits.reconnect_grace = Duration::from_secs(args.reconnect_grace_secs);
    config.limits = EdgeLimits {
        max_tunnels_per_account: args.max_tunnels_per_account,
        max_sessions_per_account: args.max_sessions_per_account,
        max_tunnels_per_token: args.max_tunnels_per_token,
        max_pending_handshakes: args.max_pending_handshakes,
        max_pending_handshakes_per_ip: args.max_pending_handshakes_per_ip,
        max_pending_api_connections: args.max_pending_api_connections,
        max_pending_api_connections_per_ip: args.max_pending_api_connections_per_ip,
        max_pending_public_connections: args.max_pending_public_connections,
        max_pending_public_connections_per_ip: args.max_pending_public_connections_per_ip,
        max_pending_peer_connections: args.max_pending_peer_connections,
        max_pending_peer_connections_per_ip: args.max_pending_peer_connections_per_ip,
        max_tcp_connections: args.max_tcp_connections,
        max_tcp_connections_per_ip: args.max_tcp_connections_per_ip,
        tcp_first_byte_timeout: Duration::from_secs(args.tcp_first_byte_timeout_secs),
        tcp_idle_timeout: Duration::from_secs(args.tcp_idle_timeout_secs),
        ..EdgeLimits::default()
    };
    config.trusted_proxies = args.trusted_proxies.clone();
    // Without the `postgres` feature there is no fleet: `--store`, which the
    // peer flags require, was refused when the store opened.
    #[cfg(not(feature = "postgres"))]
    let _ = fleet_share;
    #[cfg(feature = "postgres")]
    if let (Some(peer_bind), Some(store), Some(cert), Some(key), Some(ca)) = (
        args.peer_bind,
        &store,
        &args.peer_tls_cert,
        &args.peer_tls_key,
        &args.peer_ca,
    ) {
        let advertise = args.peer_advertise.unwrap_or(peer_bind);
        config.fleet = Some(crate::fleet::FleetConfig {
            round_interval: crate::fleet::LEASE_ROUND_INTERVAL,
            store: store.clone(),
            replica_id: args
                .replica_id
                .clone()
                .unwrap_or_else(|| advertise.to_string()),
            peer_bind,
            peer_advertise: args.peer_advertise,
            tls: crate::fleet::PeerTls::from_files(cert, key, ca)?,
            share: fleet_share,
        });
    }

    let router = control.router();
    let edge = EdgeServer::start(config, Arc::new(control), Some(router)).await?;
    if let Some(ca) = agent_identity.ca_file.as_ref() {
        tracing::info!(ca_file = %ca.display(), "agents and API clients trust this CA file");
    }
    if let Some(path) = &args.addresses_file {
        let addresses = serde_json::json!({
            "agent": edge.agent_addr.to_string(),
            "http": edge.http_addr.map(|a| a.to_string()),
            "https": edge.https_addr.map(|a| a.to_string()),
            "api": edge.api_addr.map(|a| a.to_string()),
            "peer": edge.peer_addr.map(|a| a.to_string()),
            "caFile": agent_identity.ca_file.as_ref().map(|p| p.display().to_string()),
        });
        crate::fsutil::write_atomically(path, addresses.to_string().as_bytes()).map_err(
            |source| Error::EdgeFile {
                action: "writing",
                path: path.clone(),
                source,
            },
        )?;
    }
    tracing::info!(
        agent = %edge.agent_addr,
        http = ?edge.http_addr,
        https = ?edge.https_addr,
        api = ?edge.api_addr,
        peer = ?edge.peer_addr,
        "edge listening"
    );
    shutdown_signal().await;
    tracing::info!("shutting down");
    edge.shutdown().await;
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    struct Top {
        #[command(flatten)]
        edge: EdgeCli,
    }

    #[test]
    fn flags_serve_by_default_and_keys_is_a_subcommand() {
        Top::command().debug_assert();
        let top = Top::try_parse_from([
            "edge",
            "--data-dir",
            "/d",
            "--base-domain",
            "t.example",
            "--tcp-port-range",
            "4000-4010",
        ])
        .unwrap();
        assert!(top.edge.command.is_none());
        assert_eq!(top.edge.serve.tcp_port_range, 4000..=4010);
        assert_eq!(top.edge.serve.agent_listen, "0.0.0.0:7443".parse().unwrap());

        let top = Top::try_parse_from(["edge", "keys", "list", "--data-dir", "/d"]).unwrap();
        assert!(matches!(top.edge.command, Some(EdgeCommand::Keys(_))));

        assert!(
            Top::try_parse_from(["edge", "--data-dir", "/d"]).is_err(),
            "--base-domain is required to serve"
        );
        assert!(
            Top::try_parse_from([
                "edge",
                "--data-dir",
                "/d",
                "--base-domain",
                "b",
                "--tcp-port-range",
                "9-3"
            ])
            .is_err()
        );
    }

    #[test]
    fn the_certificate_names_the_listen_addresses_and_the_advertised_names() {
        let top = Top::try_parse_from([
            "edge",
            "--data-dir",
            "/d",
            "--base-domain",
            "t.example",
            "--agent-listen",
            "198.19.254.1:7443",
            "--api-listen",
            "198.19.254.1:7444",
            "--https-listen",
            "127.0.0.1:8443",
            "--advertise-name",
            "edge.cluster.test",
            "--advertise-name",
            "198.19.254.1",
        ])
        .unwrap();
        assert_eq!(
            certificate_names(&top.edge.serve, "t.example", "t.example"),
            [
                "t.example",
                "*.t.example",
                "198.19.254.1",
                "edge.cluster.test"
            ]
        );
        // Wildcard listeners (the defaults) add nothing: the operator names them.
        let top =
            Top::try_parse_from(["edge", "--data-dir", "/d", "--base-domain", "b.test"]).unwrap();
        assert_eq!(
            certificate_names(&top.edge.serve, "edge.b.test", "b.test"),
            ["edge.b.test", "b.test", "*.b.test"]
        );
    }

    #[test]
    fn api_rate_limit_flags_parse_and_reject_nonsense() {
        let base = ["edge", "--data-dir", "/d", "--base-domain", "b"];
        let top = Top::try_parse_from(base).unwrap();
        assert_eq!(top.edge.serve.api_rate_burst, 60);
        assert_eq!(top.edge.serve.api_rate_per_second, 20.0);
        let with = |extra: &[&str]| {
            let args: Vec<&str> = base.iter().chain(extra).copied().collect();
            Top::try_parse_from(args)
        };
        assert_eq!(top.edge.serve.max_tunnels_per_account, 20_000);
        assert_eq!(top.edge.serve.quota_tcp_endpoints, 100);
        assert!(top.edge.serve.gateway_addresses.is_empty());
        assert_eq!(top.edge.serve.quota_gateway_addresses, 10);
        let top = with(&[
            "--gateway-addresses",
            "127.0.100.0/24,2001:db8::7",
            "--quota-gateway-addresses",
            "3",
        ])
        .unwrap();
        assert_eq!(top.edge.serve.gateway_addresses.len(), 255);
        assert_eq!(top.edge.serve.quota_gateway_addresses, 3);
        let refused = with(&["--gateway-addresses", "10.0.0.0/8"]).unwrap_err();
        assert!(
            refused.to_string().contains("more than 65536 addresses"),
            "{refused}"
        );
        let top = with(&["--api-rate-burst", "5", "--api-rate-per-second", "0.5"]).unwrap();
        assert_eq!(top.edge.serve.api_rate_burst, 5);
        assert_eq!(top.edge.serve.api_rate_per_second, 0.5);
        for bad in [
            ["--api-rate-burst", "0"],
            ["--api-rate-per-second", "0"],
            ["--api-rate-per-second", "-1"],
            ["--api-rate-per-second", "NaN"],
        ] {
            assert!(with(&bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn the_store_outage_bound_defaults_to_15_s_and_stays_within_2_to_30() {
        let base = ["edge", "--data-dir", "/d", "--base-domain", "b"];
        let with = |extra: &[&str]| {
            let args: Vec<&str> = base.iter().chain(extra).copied().collect();
            Top::try_parse_from(args)
        };
        let top = with(&[]).unwrap();
        assert_eq!(top.edge.serve.max_store_staleness_secs, 15);
        let top = with(&["--max-store-staleness-secs", "30"]).unwrap();
        assert_eq!(top.edge.serve.max_store_staleness_secs, 30);
        for bad in ["0", "1", "31", "-5"] {
            assert!(
                with(&["--max-store-staleness-secs", bad]).is_err(),
                "{bad} must be refused"
            );
        }
    }

    #[tokio::test]
    async fn plaintext_api_is_refused_off_loopback() {
        let top = Top::try_parse_from([
            "edge",
            "--data-dir",
            "/nonexistent",
            "--base-domain",
            "t.example",
            "--api-listen",
            "0.0.0.0:7444",
            "--insecure-plaintext-api",
        ])
        .unwrap();
        let err = serve(top.edge.serve).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "--insecure-plaintext-api is for tests on loopback only; 0.0.0.0:7444 is not a loopback address"
        );
    }

    /// Caps that cannot fit in the open-file limit stop `edge` before it
    /// opens anything, naming the flags and the limit.
    #[tokio::test]
    async fn caps_beyond_the_open_file_limit_are_refused_at_start() {
        let top = Top::try_parse_from([
            "edge",
            "--data-dir",
            "/nonexistent",
            "--base-domain",
            "t.example",
            "--max-pending-api-connections",
            "100000000",
        ])
        .unwrap();
        let limit = crate::budget::raise_fd_limit().unwrap();
        let err = serve(top.edge.serve).await.unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        let msg = err.to_string();
        for needle in [
            "--max-pending-api-connections 100000000".to_owned(),
            "--max-pending-public-connections (HTTPS) 4096".to_owned(),
            format!("open-file limit {limit}"),
        ] {
            assert!(msg.contains(&needle), "{needle:?} in {msg}");
        }
        let defaults = Top::try_parse_from(["edge", "--data-dir", "/d", "--base-domain", "b"])
            .unwrap()
            .edge
            .serve;
        check_fd_budget(&pre_auth_totals(&defaults), 65_536)
            .expect("the defaults fit a 65 536 open-file limit");
        check_fd_budget(&pre_auth_totals(&defaults), 16_384)
            .expect("the defaults fit a 16 384 open-file limit too");
    }

    /// The command's own failures name the step and carry their cause in
    /// one message (the cause used to be a second line of `main`'s report).
    #[tokio::test]
    async fn start_failures_name_the_step_and_the_cause() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let data_dir = file.path().join("data");
        let data_dir_flag = data_dir.display().to_string();
        let top = Top::try_parse_from([
            "edge",
            "--data-dir",
            &data_dir_flag,
            "--base-domain",
            "t.example",
        ])
        .unwrap();
        let mut args = top.edge.serve;
        let err = serve(args.clone()).await.unwrap_err();
        let cause = std::fs::create_dir_all(&data_dir).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("creating {}: {cause}", data_dir.display())
        );
        assert!(matches!(
            err,
            Error::EdgeFile {
                action: "creating",
                ..
            }
        ));

        // clap requires these; a caller that builds the flags itself may not.
        args.base_domain = None;
        assert_eq!(
            serve(args.clone()).await.unwrap_err().to_string(),
            "--base-domain is required"
        );
        args.data_dir = None;
        assert_eq!(
            serve(args).await.unwrap_err().to_string(),
            "--data-dir is required"
        );
    }
}
