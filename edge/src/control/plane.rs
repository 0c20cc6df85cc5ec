//! The control plane itself: its configuration, its shared state over the
//! store, and what every part of it builds on (revocations, the expiry
//! watcher). The REST API (`server.rs`), keys, tokens, domains and TCP
//! endpoints each add their part in their own module.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::broadcast;

use crate::authority::{Revocation, TokenId};
use crate::error::{Error, Result};

use crate::budget::{FleetShare, RateLimit, RateLimiter};

use super::addresses::AddressPool;
use super::dns::DnsVerifier;
use super::names;
use super::secrets::KEY_GRANT_PREFIX;
use super::store::{self, Store, StoreUrl};

/// Longest total lifetime of a token, renewals included, by default: 90 days.
pub const MAX_LIFETIME: Duration = Duration::from_secs(90 * 24 * 3600);

/// The account keys belong to when none is named.
pub const DEFAULT_ACCOUNT: &str = "default";

/// The default of [`ControlConfig::max_store_staleness`]: past it a fleet
/// replica cut off from its store stops serving from its copy.
pub const MAX_STORE_STALENESS: Duration = Duration::from_secs(15);

/// How the control plane is set up (the `edge` command's flags).
#[derive(Clone, Debug)]
pub struct ControlConfig {
    /// Where the redb store (`control.redb`) lives without [`Self::store`].
    pub data_dir: PathBuf,
    /// The PostgreSQL database shared by the replicas of an edge fleet
    /// (`--store postgres://…`); `None`: the redb file in `data_dir`.
    pub store: Option<StoreUrl>,
    /// Subdomains are reserved under it (`app.<base_domain>`).
    pub base_domain: String,
    /// The host name custom domains must CNAME to.
    pub public_host: String,
    /// Ports TCP endpoints are allocated from.
    pub tcp_port_range: RangeInclusive<u16>,
    /// Addresses Gateways reserve (`--gateway-addresses`); empty: none.
    pub gateway_addresses: AddressPool,
    /// DNS servers custom-domain verification asks; empty: the system's.
    pub dns_nameservers: Vec<SocketAddr>,
    /// Request budget per API key.
    pub rate_limit: RateLimit,
    /// Failed API-key authentications per client address: when spent, every
    /// request from the address answers 429 until the bucket refills.
    pub auth_failures: RateLimit,
    /// Longest total lifetime of a tunnel token, renewals included.
    pub max_token_lifetime: Duration,
    /// Per-account quotas.
    pub quotas: Quotas,
    /// A custom domain claimed but not verified within this is released.
    pub pending_domain_ttl: Duration,
    /// A fleet replica whose copy of the store is older than this (it has
    /// not reached PostgreSQL for as long) ends its agent sessions and
    /// answers the REST API `503`: its copy may miss revocations and
    /// releases made through other replicas. `--max-store-staleness-secs`,
    /// default [`MAX_STORE_STALENESS`]; no effect without [`Self::store`].
    pub max_store_staleness: Duration,
    /// The replicas sharing [`Self::rate_limit`] and [`Self::auth_failures`]
    /// (an edge fleet's lease task keeps it; 1 for a single edge).
    pub fleet_share: FleetShare,
}

/// What one account may hold at once (`tuna-operator edge --quota-*`).
/// Exceeding a quota answers `403 quota_exceeded`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quotas {
    /// Domains (subdomains and verified custom domains).
    pub domains: usize,
    /// Custom domains claimed but not verified yet.
    pub pending_domains: usize,
    /// TCP endpoints (each holds a port of the edge's range).
    pub tcp_endpoints: usize,
    /// Gateway addresses (each an address of the edge's pool).
    pub gateway_addresses: usize,
    /// Tunnel tokens not yet expired.
    pub tokens: usize,
    /// API keys.
    pub keys: usize,
}

impl Default for Quotas {
    /// Room for the 10 000-tunnel benchmark on one account; TCP ports are
    /// the scarce resource.
    fn default() -> Self {
        Self {
            domains: 20_000,
            pending_domains: 100,
            tcp_endpoints: 100,
            gateway_addresses: 10,
            tokens: 50_000,
            keys: 100,
        }
    }
}

impl ControlConfig {
    /// A configuration with TCP ports 30000–30999, the system's DNS and the
    /// default rate limit.
    pub fn new(
        data_dir: impl Into<PathBuf>,
        base_domain: impl Into<String>,
        public_host: impl Into<String>,
    ) -> Self {
        Self {
            data_dir: data_dir.into(),
            store: None,
            base_domain: base_domain.into(),
            public_host: public_host.into(),
            tcp_port_range: 30000..=30999,
            gateway_addresses: AddressPool::default(),
            dns_nameservers: Vec::new(),
            rate_limit: RateLimit::default(),
            auth_failures: RateLimit {
                burst: 30,
                per_second: 1.0,
            },
            max_token_lifetime: MAX_LIFETIME,
            quotas: Quotas::default(),
            pending_domain_ttl: Duration::from_secs(7 * 24 * 3600),
            max_store_staleness: MAX_STORE_STALENESS,
            fleet_share: FleetShare::default(),
        }
    }
}

/// The control plane. Cheap to clone (clones share state).
#[derive(Clone, Debug)]
pub struct ControlPlane {
    pub(super) shared: Arc<Shared>,
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) store: Store,
    pub(super) base_domain: String,
    pub(super) public_host: String,
    pub(super) tcp_port_range: RangeInclusive<u16>,
    pub(super) gateway_addresses: AddressPool,
    pub(super) dns: DnsVerifier,
    pub(super) limiter: RateLimiter,
    /// Failed API-key authentications per client address.
    pub(super) auth_failures: RateLimiter,
    pub(super) max_token_lifetime: Duration,
    pub(super) quotas: Quotas,
    pub(super) pending_domain_ttl: Duration,
    pub(super) max_store_staleness: Duration,
    pub(super) revoked: broadcast::Sender<Revocation>,
    /// Expired tokens already announced on `revoked` (expiry is final:
    /// renewal of an expired token is refused).
    pub(super) announced_expired: Mutex<HashSet<String>>,
}

impl ControlPlane {
    /// Opens the store in `config.data_dir` (creating it). Fails with
    /// [`Error::StoreInUse`] when another process has it open.
    ///
    /// With [`ControlConfig::store`] it opens the PostgreSQL store instead
    /// (any number of processes may); that connects, migrates and loads,
    /// and blocks: call it off the async runtime (`spawn_blocking`).
    /// Changes other replicas commit reach this control plane within
    /// moments, and revocations among them close this edge's tunnels as
    /// local ones do.
    ///
    /// Inside a tokio runtime it also starts the expiry watcher, which
    /// announces tokens that expire unrenewed on the revocation channel (so
    /// their tunnels close), purges tokens expired for a week and releases
    /// custom-domain claims not verified within the pending TTL; the task
    /// ends when the last clone of the control plane is dropped.
    pub fn open(config: ControlConfig) -> Result<Self> {
        let names = validate(&config)?;
        let store = Store::open_at(config.store.as_ref(), &config.data_dir)?;
        Ok(Self::with_store(config, names, store))
    }

    /// A control plane on a store of another backend (tests: a slow disk).
    #[cfg(test)]
    pub(crate) fn open_with_backend(
        config: ControlConfig,
        backend: impl redb::StorageBackend,
    ) -> Result<Self> {
        let names = validate(&config)?;
        Ok(Self::with_store(
            config,
            names,
            Store::open_with_backend(backend)?,
        ))
    }

    pub(super) fn with_store(
        config: ControlConfig,
        (base_domain, public_host): (String, String),
        store: Store,
    ) -> Self {
        let (revoked, _) = broadcast::channel(1024);
        let remote = revoked.clone();
        store.on_remote_changes(Box::new(move |writes, released| {
            for revocation in revocations(writes, released) {
                let _ = remote.send(revocation);
            }
        }));
        let plane = Self {
            shared: Arc::new(Shared {
                store,
                base_domain,
                public_host,
                tcp_port_range: config.tcp_port_range,
                gateway_addresses: config.gateway_addresses,
                dns: DnsVerifier::new(config.dns_nameservers),
                limiter: RateLimiter::shared(config.rate_limit, config.fleet_share.clone()),
                auth_failures: RateLimiter::shared(
                    config.auth_failures,
                    config.fleet_share.clone(),
                ),
                max_token_lifetime: config.max_token_lifetime,
                quotas: config.quotas,
                pending_domain_ttl: config.pending_domain_ttl,
                max_store_staleness: config.max_store_staleness,
                revoked,
                announced_expired: Mutex::new(HashSet::new()),
            }),
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(expiry_watcher(Arc::downgrade(&plane.shared)));
        }
        plane
    }

    /// The base domain subdomains live under.
    pub fn base_domain(&self) -> &str {
        &self.shared.base_domain
    }

    /// The host name custom domains must point to.
    pub fn public_host(&self) -> &str {
        &self.shared.public_host
    }

    /// The TCP port range endpoints are allocated from.
    pub fn tcp_port_range(&self) -> RangeInclusive<u16> {
        self.shared.tcp_port_range.clone()
    }

    /// How long ago this replica's copy of the store was last known to
    /// hold every commit (other replicas' included); zero with redb. Above
    /// the revocation bound (1 s, `authority.rs`) the edge accepts no new
    /// sessions.
    pub fn store_staleness(&self) -> std::time::Duration {
        self.store().staleness()
    }

    /// `Err` when this replica's copy of the store is older than
    /// [`ControlConfig::max_store_staleness`]: it then serves no tunnel and
    /// answers no API request from that copy.
    pub(crate) fn store_outage(&self) -> Result<(), Error> {
        let stale = self.store().staleness();
        let bound = self.shared.max_store_staleness;
        if stale > bound {
            return Err(Error::StoreStale { stale, bound });
        }
        Ok(())
    }

    pub(super) fn store(&self) -> &Store {
        &self.shared.store
    }

    /// Tells the edge's sessions what must close. No receiver only means no
    /// session is open.
    pub(super) fn announce(&self, revocation: Revocation) {
        let _ = self.shared.revoked.send(revocation);
    }
}

/// What a change committed by another replica revokes here, as the local
/// operations announce it: a deleted token or key closes the tunnels it
/// opened, a released domain or port closes the tunnels serving it, a
/// Gateway address given back every binding on it.
fn revocations(writes: &[store::Write], released: &[store::TcpRecord]) -> Vec<Revocation> {
    use tuna_protocol::wire::BoundTarget;
    let ports = released
        .iter()
        .map(|t| Revocation::Target(BoundTarget::Tcp { port: t.port }));
    writes
        .iter()
        .filter_map(|write| match write {
            store::Write::DeleteToken(id) => Some(Revocation::Token(TokenId(id.clone()))),
            store::Write::DeleteKey(id) => Some(Revocation::Token(TokenId(format!(
                "{KEY_GRANT_PREFIX}{id}"
            )))),
            store::Write::DeleteDomain(name) => {
                Some(Revocation::Target(BoundTarget::Http { host: name.clone() }))
            }
            store::Write::DeleteAddress(address) => Some(Revocation::Address(*address)),
            _ => None,
        })
        .chain(ports)
        .collect()
}

/// Checks the configuration; the normalised base domain and public host.
fn validate(config: &ControlConfig) -> Result<(String, String)> {
    // One label is enough here: `localhost` and lab names are fine for
    // the edge's own names (reserved names need two labels).
    let edge_name = |flag: &str, value: &str| -> Result<String> {
        let name = names::normalize_host(value);
        let valid = name.parse::<std::net::IpAddr>().is_ok()
            || (!name.is_empty() && name.len() <= 253 && name.split('.').all(names::is_dns_label));
        if valid {
            Ok(name)
        } else {
            Err(Error::ControlConfig(format!(
                "{flag} {value:?} is neither a DNS name nor an IP address"
            )))
        }
    };
    let base_domain = edge_name("base domain", &config.base_domain)?;
    let public_host = edge_name("public host", &config.public_host)?;
    if config.tcp_port_range.is_empty() || *config.tcp_port_range.start() == 0 {
        return Err(Error::ControlConfig(format!(
            "TCP port range {:?} is empty or starts at 0",
            config.tcp_port_range
        )));
    }
    Ok((base_domain, public_host))
}

async fn expiry_watcher(shared: Weak<Shared>) {
    const PURGE_AFTER_SECS: i64 = 7 * 24 * 3600;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let now = tuna_protocol::api::Timestamp::now().unix_seconds();
        let expired: Vec<String> = shared
            .store
            .read()
            .tokens_expired_by(now)
            .map(|t| t.id.clone())
            .collect();
        {
            let mut announced = shared
                .announced_expired
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for id in &expired {
                if announced.insert(id.clone()) {
                    let _ = shared.revoked.send(Revocation::Token(TokenId(id.clone())));
                }
            }
        }
        // Tokens expired this long ago, and claims made this long ago.
        let stale = now.saturating_sub(PURGE_AFTER_SECS);
        let claim_ttl = i64::try_from(shared.pending_domain_ttl.as_secs()).unwrap_or(i64::MAX);
        let lapsed = now.saturating_sub(claim_ttl);
        {
            let state = shared.store.read();
            if state.tokens_expired_by(stale).next().is_none()
                && state.claims_made_by(lapsed).next().is_none()
            {
                continue;
            }
        }
        // The commit syncs the store file: off the async runtime.
        let purging = Arc::clone(&shared);
        let purge = tokio::task::spawn_blocking(move || {
            purging.store.commit(|state| {
                let tokens = state
                    .tokens_expired_by(stale)
                    .map(|t| store::Write::DeleteToken(t.id.clone()));
                // Unverified custom domains do not squat a name forever.
                let claims = state
                    .claims_made_by(lapsed)
                    .map(|c| store::Write::DeleteClaim(c.name.clone(), c.account.clone()));
                Ok(((), tokens.chain(claims).collect()))
            })
        })
        .await;
        if let Ok(Err(e)) = purge {
            tracing::warn!(error = %e, "purging long-expired tunnel tokens failed");
        }
    }
}

/// `Err(quota_exceeded)` when `count` objects already use up `quota`.
pub(super) fn check_quota(count: usize, quota: usize, what: &str, flag: &str) -> Result<()> {
    if count >= quota {
        return Err(Error::QuotaExceeded(format!(
            "your account holds {count} {what}, its quota (tuna-operator edge {flag}); delete some first"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::keys::Caller;

    #[test]
    fn racing_reservations_have_exactly_one_winner() {
        let dir = tempfile::tempdir().unwrap();
        let plane = ControlPlane::open(ControlConfig::new(
            dir.path(),
            "tuna.test",
            "edge.tuna.test",
        ))
        .unwrap();
        let outcomes: Vec<Result<tuna_protocol::api::Domain>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let plane = plane.clone();
                    scope.spawn(move || {
                        let caller = Caller {
                            key_id: format!("k{i}"),
                            account: format!("account-{i}"),
                            scopes: vec![tuna_protocol::api::Scope::TunnelsWrite],
                        };
                        plane.create_domain(
                            &caller,
                            &tuna_protocol::api::CreateDomain {
                                subdomain: Some("race".into()),
                                domain: None,
                            },
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners = outcomes.iter().filter(|o| o.is_ok()).count();
        assert_eq!(winners, 1, "{outcomes:?}");
        assert!(
            outcomes
                .iter()
                .filter_map(|o| o.as_ref().err())
                .all(|e| matches!(e, Error::HeldByOtherAccount(_)))
        );
    }

    #[test]
    fn remote_releases_revoke_as_local_ones_do() {
        use tuna_protocol::wire::BoundTarget;
        let address: std::net::IpAddr = "203.0.113.10".parse().unwrap();
        let released = store::TcpRecord {
            alias: "db".into(),
            port: 30001,
            account: "a".into(),
            created_at: 0,
        };
        let revoked = revocations(
            &[
                store::Write::DeleteAddress(address),
                store::Write::DeleteDomain("app.tuna.test".into()),
            ],
            &[released],
        );
        assert_eq!(
            revoked,
            [
                Revocation::Address(address),
                Revocation::Target(BoundTarget::Http {
                    host: "app.tuna.test".into()
                }),
                Revocation::Target(BoundTarget::Tcp { port: 30001 }),
            ]
        );
    }

    #[test]
    fn config_is_checked_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let open = |base: &str, public: &str, ports: RangeInclusive<u16>| {
            let mut config = ControlConfig::new(dir.path(), base, public);
            config.tcp_port_range = ports;
            ControlPlane::open(config).map(|plane| {
                (
                    plane.base_domain().to_owned(),
                    plane.public_host().to_owned(),
                )
            })
        };
        assert_eq!(
            open("Tuna.Example.", "localhost", 30000..=30001).unwrap(),
            ("tuna.example".to_owned(), "localhost".to_owned())
        );
        assert_eq!(
            open("tuna.example", "127.0.0.1", 1..=1).unwrap().1,
            "127.0.0.1"
        );
        for (base, public, ports) in [
            ("bad_domain", "edge.example", 30000..=30001),
            ("tuna.example", "", 30000..=30001),
            ("tuna.example", "edge.example", 0..=10),
            #[allow(clippy::reversed_empty_ranges)]
            ("tuna.example", "edge.example", 30001..=30000),
        ] {
            assert!(
                matches!(
                    open(base, public, ports.clone()),
                    Err(Error::ControlConfig(_))
                ),
                "{base:?} {public:?} {ports:?}"
            );
        }
    }
}
