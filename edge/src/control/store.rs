//! The control plane's persistent state: API keys, domains, TCP endpoints
//! and tunnel tokens, behind one [`Backend`] trait with two implementations:
//!
//! - [`redb`](self::redb) (the default of a single edge and of standalone
//!   mode): one file, `<data dir>/control.redb`, open by one process;
//! - [`postgres`](self::postgres) (`--store postgres://…`): one PostgreSQL
//!   database shared by every replica of an edge fleet.
//!
//! Both keep the whole state mirrored in memory so that reads (and the
//! per-request key check) never leave the process. Writers go through
//! [`Store::commit`], one at a time across everything sharing the store (one
//! process for redb, every replica for PostgreSQL): each decides, looking at
//! a mirror that holds every change committed before, which writes to make;
//! the writes are durable before the commit returns and reach the mirror only
//! after they are. Check-then-reserve is therefore atomic: two callers racing
//! for one name cannot both win, on one replica or on two. Readers are
//! blocked only while a committed change is applied to the mirror.
//!
//! Changes another replica committed reach this mirror without a commit of
//! our own too (PostgreSQL only: `LISTEN/NOTIFY` plus a poll, see
//! [`postgres`](self::postgres)); [`Store::on_remote_changes`] hears them, so
//! that the control plane closes the tunnels of a token revoked elsewhere.

mod model;
#[cfg(feature = "postgres")]
mod pg_tls;
#[cfg(feature = "postgres")]
mod postgres;
mod redb;
#[cfg(not(feature = "postgres"))]
mod without_postgres;

use std::path::Path;
use std::sync::{Arc, RwLockReadGuard};

use tuna_protocol::api::DomainKind;

use crate::error::{Error, Result};

#[cfg(feature = "postgres")]
pub(crate) use self::postgres::StoreTarget;
#[cfg(feature = "postgres")]
pub use self::postgres::StoreUrl;
#[cfg(not(feature = "postgres"))]
pub use self::without_postgres::StoreUrl;

pub use self::model::*;

/// The persistent store. See the module docs.
pub struct Store {
    mirror: Arc<Mirror>,
    backend: Box<dyn Backend>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend.describe())
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (or creates) the redb store in `data_dir`, creating the directory.
    pub fn open(data_dir: &Path) -> Result<Self> {
        let mirror = Arc::new(Mirror::default());
        let backend = redb::Redb::open(data_dir, &mirror)?;
        Self::with_backend(mirror, Box::new(backend))
    }

    /// Opens the store at `url` (PostgreSQL), or the redb store in
    /// `data_dir` without one. Opening PostgreSQL connects, applies the
    /// schema migrations and loads the state; it must not be called on an
    /// async runtime's thread (it blocks). Without the `postgres` feature a
    /// URL is refused ([`Error::ControlConfig`], saying why).
    pub fn open_at(url: Option<&StoreUrl>, data_dir: &Path) -> Result<Self> {
        match url {
            None => Self::open(data_dir),
            #[cfg(feature = "postgres")]
            Some(url) => {
                let mirror = Arc::new(Mirror::default());
                let backend = postgres::Postgres::open(url, Arc::clone(&mirror))?;
                Self::with_backend(mirror, Box::new(backend))
            }
            #[cfg(not(feature = "postgres"))]
            Some(_) => Err(Error::ControlConfig(
                without_postgres::NO_POSTGRES.to_owned(),
            )),
        }
    }

    /// A store on another redb storage backend (tests: a slow disk).
    #[cfg(test)]
    pub(crate) fn open_with_backend(backend: impl ::redb::StorageBackend) -> Result<Self> {
        let mirror = Arc::new(Mirror::default());
        let backend = redb::Redb::open_with_backend(backend, &mirror)?;
        Self::with_backend(mirror, Box::new(backend))
    }

    fn with_backend(mirror: Arc<Mirror>, backend: Box<dyn Backend>) -> Result<Self> {
        let store = Self { mirror, backend };
        // Stores written before claims existed kept pending custom domains
        // among the reservations: move them.
        store.commit(|state| {
            let writes = state
                .domains
                .values()
                .filter(|d| d.kind == DomainKind::Custom && d.verified_at.is_none())
                .flat_map(|d| {
                    [
                        Write::DeleteDomain(d.name.clone()),
                        Write::PutClaim(d.clone()),
                    ]
                })
                .collect();
            Ok(((), writes))
        })?;
        Ok(store)
    }

    /// A read-only look at the current state (hold it briefly).
    pub fn read(&self) -> RwLockReadGuard<'_, State> {
        self.mirror.read()
    }

    /// Decides under the store's write lock which writes to make, commits
    /// them durably, then applies them to the mirror. `decide` returns the
    /// caller's answer and the writes; an `Err` from it writes nothing.
    /// Blocks (a disk sync or a database round trip): call it off the async
    /// runtime.
    pub fn commit<R>(&self, decide: impl FnOnce(&State) -> Result<(R, Vec<Write>)>) -> Result<R> {
        let mut decide = Some(decide);
        let mut answer = None;
        self.backend.commit(&self.mirror, &mut |state| {
            let decide = decide
                .take()
                .ok_or_else(|| Error::Internal("a store decision was asked twice".into()))?;
            let (value, writes) = decide(state)?;
            answer = Some(value);
            Ok(writes)
        })?;
        answer.ok_or_else(|| Error::Internal("a store commit did not decide".into()))
    }

    /// Brings the mirror up to every change committed before the call, by
    /// any replica (a no-op for redb, whose only writer is this process).
    /// Operations that look at the state before they commit call it first,
    /// so that an object another replica made a moment ago is found. Blocks.
    pub fn sync(&self) -> Result<()> {
        self.backend.sync()
    }

    /// How long ago this copy was last known to hold every commit of the
    /// store, other replicas' included (always zero with redb).
    pub fn staleness(&self) -> std::time::Duration {
        self.backend.staleness()
    }

    /// [`Store::sync`] for async callers (the REST API does it before each
    /// request: reads see every write acknowledged before, on any replica).
    pub fn sync_async(&self) -> futures::future::BoxFuture<'static, Result<()>> {
        self.backend.sync_async()
    }

    /// Sets what hears changes committed by other replicas (once; later
    /// calls are ignored).
    pub(crate) fn on_remote_changes(&self, listener: RemoteChanges) {
        let _ = self.mirror.remote.set(listener);
    }
}

impl State {
    /// Applies one write, to the maps and to their index.
    fn apply(&mut self, write: Write) {
        let index = &mut self.index;
        match write {
            Write::PutKey(r) => {
                self.keys.insert(r.id.clone(), r);
            }
            Write::DeleteKey(id) => {
                self.keys.remove(&id);
            }
            Write::PutDomain(r) => {
                if let Some(old) = self.domains.remove(&r.name) {
                    index.count(&old.account, Counted::Domain, -1);
                }
                index.count(&r.account, Counted::Domain, 1);
                self.domains.insert(r.name.clone(), r);
            }
            Write::DeleteDomain(name) => {
                if let Some(old) = self.domains.remove(&name) {
                    index.count(&old.account, Counted::Domain, -1);
                }
            }
            Write::PutClaim(r) => {
                let key = (r.name.clone(), r.account.clone());
                if let Some(old) = self.claims.remove(&key) {
                    index.remove_claim(&old);
                }
                index.add_claim(&r);
                self.claims.insert(key, r);
            }
            Write::DeleteClaim(name, account) => {
                if let Some(old) = self.claims.remove(&(name, account)) {
                    index.remove_claim(&old);
                }
            }
            Write::PutTcp(r) => {
                if let Some(old) = self.tcp.remove(&r.alias) {
                    index.remove_tcp(&old);
                }
                index.add_tcp(&r);
                self.tcp.insert(r.alias.clone(), r);
            }
            Write::DeleteTcp(alias) => {
                if let Some(old) = self.tcp.remove(&alias) {
                    index.remove_tcp(&old);
                }
            }
            Write::PutToken(r) => {
                if let Some(old) = self.tokens.remove(&r.id) {
                    index.remove_token(&old);
                }
                index.add_token(&r);
                self.tokens.insert(r.id.clone(), r);
            }
            Write::DeleteToken(id) => {
                if let Some(old) = self.tokens.remove(&id) {
                    index.remove_token(&old);
                }
            }
            Write::PutAddress(r) => {
                if let Some(old) = self.addresses.remove(&r.address) {
                    index.count(&old.account, Counted::Address, -1);
                }
                index.count(&r.account, Counted::Address, 1);
                self.addresses.insert(r.address, r);
            }
            Write::DeleteAddress(address) => {
                if let Some(old) = self.addresses.remove(&address) {
                    index.count(&old.account, Counted::Address, -1);
                }
            }
        }
    }

    /// The TCP endpoints `writes` delete, as they are before.
    fn released_tcp(&self, writes: &[Write]) -> Vec<TcpRecord> {
        writes
            .iter()
            .filter_map(|w| match w {
                Write::DeleteTcp(alias) => self.tcp.get(alias).cloned(),
                _ => None,
            })
            .collect()
    }

    /// The deletions that, applied to `self`, remove what `new` lacks.
    fn deletions_to(&self, new: &State) -> Vec<Write> {
        let keys = self.keys.keys().filter(|k| !new.keys.contains_key(*k));
        let domains = self
            .domains
            .keys()
            .filter(|k| !new.domains.contains_key(*k));
        let claims = self.claims.keys().filter(|k| !new.claims.contains_key(*k));
        let tcp = self.tcp.keys().filter(|k| !new.tcp.contains_key(*k));
        let tokens = self.tokens.keys().filter(|k| !new.tokens.contains_key(*k));
        let addresses = self
            .addresses
            .keys()
            .filter(|k| !new.addresses.contains_key(*k));
        keys.cloned()
            .map(Write::DeleteKey)
            .chain(domains.cloned().map(Write::DeleteDomain))
            .chain(claims.cloned().map(|(n, a)| Write::DeleteClaim(n, a)))
            .chain(tcp.cloned().map(Write::DeleteTcp))
            .chain(tokens.cloned().map(Write::DeleteToken))
            .chain(addresses.copied().map(Write::DeleteAddress))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use tuna_protocol::api::{Bindings, Scope};

    use super::*;

    fn key(id: &str) -> KeyRecord {
        KeyRecord {
            id: id.to_owned(),
            name: None,
            account: "default".to_owned(),
            scopes: vec![Scope::Full],
            hash: "00".to_owned(),
            created_at: 1,
        }
    }

    /// Writes over a few names, accounts, ports and times, so that puts
    /// replace records (of another account, port or age) and deletes hit.
    fn write() -> impl proptest::strategy::Strategy<Value = Write> {
        use proptest::prelude::*;
        let name = || (0..4u8).prop_map(|n| format!("n{n}"));
        let account = || (0..3u8).prop_map(|a| format!("a{a}"));
        let time = || 0..4i64;
        let domain = (name(), account(), time()).prop_map(|(name, account, t)| DomainRecord {
            name,
            kind: DomainKind::Custom,
            account,
            challenge: String::new(),
            created_at: t,
            verified_at: None,
            verification_message: None,
        });
        prop_oneof![
            domain.clone().prop_map(Write::PutDomain),
            name().prop_map(Write::DeleteDomain),
            domain.prop_map(Write::PutClaim),
            (name(), account()).prop_map(|(n, a)| Write::DeleteClaim(n, a)),
            // One port per alias, as the commits keep it.
            ((0..4u16), account()).prop_map(|(port, account)| Write::PutTcp(TcpRecord {
                alias: format!("n{port}"),
                port,
                account,
                created_at: 0,
            })),
            name().prop_map(Write::DeleteTcp),
            (name(), account(), time()).prop_map(|(id, account, expires_at)| Write::PutToken(
                TokenRecord {
                    id,
                    hash: String::new(),
                    account,
                    labels: BTreeMap::new(),
                    bindings: Bindings::default(),
                    created_at: 0,
                    expires_at,
                    minted_by: None,
                }
            )),
            name().prop_map(Write::DeleteToken),
            (0..4u8, name(), account(), time()).prop_map(|(a, name, account, created_at)| {
                Write::PutAddress(AddressRecord {
                    address: std::net::IpAddr::from([192, 0, 2, a]),
                    name,
                    account,
                    created_at,
                })
            }),
            (0..4u8).prop_map(|a| Write::DeleteAddress(std::net::IpAddr::from([192, 0, 2, a]))),
        ]
    }

    /// What the index answers for one account at one time: live tokens,
    /// domains, claims, TCP endpoints, Gateway addresses; tokens expired and
    /// claims made by then.
    #[derive(Debug, PartialEq)]
    struct Answers(
        usize,
        usize,
        usize,
        usize,
        usize,
        Vec<String>,
        Vec<(String, String)>,
    );

    /// What the index answers, computed by a scan of the maps.
    fn scanned(state: &State, account: &str, at: i64) -> Answers {
        Answers(
            state
                .tokens
                .values()
                .filter(|t| t.account == account && t.expires_at > at)
                .count(),
            state
                .domains
                .values()
                .filter(|d| d.account == account)
                .count(),
            state
                .claims
                .values()
                .filter(|c| c.account == account)
                .count(),
            state.tcp.values().filter(|t| t.account == account).count(),
            state
                .addresses
                .values()
                .filter(|a| a.account == account)
                .count(),
            state
                .tokens
                .values()
                .filter(|t| t.expires_at <= at)
                .map(|t| t.id.clone())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            state
                .claims
                .values()
                .filter(|c| c.created_at <= at)
                .map(|c| (c.name.clone(), c.account.clone()))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
        )
    }

    fn indexed(state: &State, account: &str, at: i64) -> Answers {
        Answers(
            state.live_tokens(account, at),
            state.domains_held(account),
            state.claims_pending(account),
            state.tcp_held(account),
            state.addresses_held(account),
            state
                .tokens_expired_by(at)
                .map(|t| t.id.clone())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            state
                .claims_made_by(at)
                .map(|c| (c.name.clone(), c.account.clone()))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
        )
    }

    proptest::proptest! {
        #[test]
        fn the_index_agrees_with_a_scan_after_every_write(
            writes in proptest::collection::vec(write(), 1..60)
        ) {
            let mut state = State::default();
            for write in writes {
                state.apply(write);
                for port in 0..4u16 {
                    let scan = state.tcp.values().find(|t| t.port == port);
                    proptest::prop_assert_eq!(state.tcp_by_port(port), scan);
                }
                for account in ["a0", "a1", "a2"] {
                    for at in -1..5 {
                        proptest::prop_assert_eq!(indexed(&state, account, at), scanned(&state, account, at));
                    }
                }
                for name in ["n0", "n1", "n2", "n3"] {
                    let of: Vec<_> = state.claims_of(name).map(|c| c.account.clone()).collect();
                    let scan: Vec<_> = state.claims.keys().filter(|(n, _)| n == name).map(|(_, a)| a.clone()).collect();
                    proptest::prop_assert_eq!(of, scan);
                }
                // And the index kept write by write equals one built afresh.
                proptest::prop_assert_eq!(&state.index, &Index::of(&state));
            }
        }
    }

    #[test]
    fn commits_survive_reopen_and_failed_decisions_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store
                .commit(|_| Ok(((), vec![Write::PutKey(key("a")), Write::PutKey(key("b"))])))
                .unwrap();
            store
                .commit(|_| Ok(((), vec![Write::DeleteKey("a".to_owned())])))
                .unwrap();
            let refused: Result<()> = store.commit(|_| Err(Error::NotFound("no".to_owned())));
            assert!(refused.is_err());
            // Open twice in one process: refused with a clear error.
            assert!(matches!(
                Store::open(dir.path()),
                Err(Error::StoreInUse { .. })
            ));
        }
        let store = Store::open(dir.path()).unwrap();
        let keys: Vec<String> = store.read().keys.keys().cloned().collect();
        assert_eq!(keys, ["b"]);
    }

    /// Without the `postgres` feature, `--store` parses (the command line
    /// stays the documented one) and opening it says why it cannot, without
    /// quoting the URL, and opens nothing.
    #[cfg(not(feature = "postgres"))]
    #[test]
    fn a_store_url_is_refused_with_the_reason_without_postgres() {
        let dir = tempfile::tempdir().unwrap();
        let url: StoreUrl = "postgres://edge:hunter2@db:5432/tuna".parse().unwrap();
        let url = url.allowing_insecure_tls(true);
        let error = Store::open_at(Some(&url), dir.path()).unwrap_err();
        let Error::ControlConfig(message) = &error else {
            panic!("{error:?}");
        };
        assert!(
            message.contains("without the PostgreSQL store"),
            "{message}"
        );
        assert!(message.contains("`postgres` feature"), "{message}");
        for shown in [format!("{error}"), format!("{url:?}"), format!("{url}")] {
            assert!(!shown.contains("hunter2"), "{shown}");
        }
        assert!(!dir.path().join(STORE_FILE).exists());
    }
}
