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

#[cfg(feature = "postgres")]
mod pg_tls;
#[cfg(feature = "postgres")]
mod postgres;
mod redb;
#[cfg(not(feature = "postgres"))]
mod without_postgres;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard};

use serde::{Deserialize, Serialize};
use tuna_protocol::api::{Bindings, DomainKind, Scope};

use crate::error::{Error, Result};

#[cfg(feature = "postgres")]
pub(crate) use self::postgres::StoreTarget;
#[cfg(feature = "postgres")]
pub use self::postgres::StoreUrl;
#[cfg(not(feature = "postgres"))]
pub use self::without_postgres::StoreUrl;

/// File name of the store inside the data dir.
pub const STORE_FILE: &str = "control.redb";

/// An API key, without its clear text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// Public id (part of the key's text).
    pub id: String,
    /// Free-form name given at creation.
    #[serde(default)]
    pub name: Option<String>,
    /// The account the key acts for.
    pub account: String,
    /// What it may do.
    pub scopes: Vec<Scope>,
    /// Hex SHA-256 of the key.
    pub hash: String,
    /// Unix seconds.
    pub created_at: i64,
}

impl KeyRecord {
    /// Whether the key carries `scope` (full access carries every scope).
    pub fn has_scope(&self, scope: Scope) -> bool {
        self.scopes.contains(&Scope::Full) || self.scopes.contains(&scope)
    }
}

/// A reserved host name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DomainRecord {
    /// The host name (normalised).
    pub name: String,
    /// Subdomain or custom.
    pub kind: DomainKind,
    /// The holder.
    pub account: String,
    /// Value of the TXT ownership record (custom domains).
    #[serde(default)]
    pub challenge: String,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds of a successful verification.
    #[serde(default)]
    pub verified_at: Option<i64>,
    /// Why the last verification failed.
    #[serde(default)]
    pub verification_message: Option<String>,
}

/// A reserved TCP port.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TcpRecord {
    /// Unique alias.
    pub alias: String,
    /// Unique port.
    pub port: u16,
    /// The holder.
    pub account: String,
    /// Unix seconds.
    pub created_at: i64,
}

/// A tunnel token, without its clear text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Public id.
    pub id: String,
    /// Hex SHA-256 of the token.
    pub hash: String,
    /// The account whose reservations the token may bind.
    pub account: String,
    /// Owner labels.
    pub labels: BTreeMap<String, String>,
    /// What its tunnels may bind.
    pub bindings: Bindings,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds.
    pub expires_at: i64,
    /// The API key that minted it: revoking the key revokes the token.
    /// (Absent in records written before it was kept.)
    #[serde(default)]
    pub minted_by: Option<String>,
}

/// Everything the store holds, as it is in memory. Change it through
/// [`Write`]s only (the mirror keeps an index of it, see [`State::live_tokens`]
/// and its neighbours); a `State` built field by field is indexed when it
/// replaces the mirror's.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// By key id.
    pub keys: BTreeMap<String, KeyRecord>,
    /// Reserved host names by name: subdomains and verified custom domains.
    pub domains: BTreeMap<String, DomainRecord>,
    /// Pending custom domains by (name, account).
    pub claims: BTreeMap<(String, String), DomainRecord>,
    /// By alias.
    pub tcp: BTreeMap<String, TcpRecord>,
    /// By token id.
    pub tokens: BTreeMap<String, TokenRecord>,
    /// What the quota checks, the port allocator and the expiry sweep look
    /// up, kept by [`State::apply`]: each would otherwise scan every record
    /// per call, which made minting N tokens O(N²).
    index: Index,
}

/// Counts and reverse lookups of a [`State`], always equal to what a scan of
/// its maps would give (`the_index_agrees_with_a_scan_after_every_write`).
#[derive(Clone, Debug, Default, PartialEq)]
struct Index {
    /// Per account.
    accounts: HashMap<String, Held>,
    /// Reserved TCP ports: port → alias.
    ports: BTreeMap<u16, String>,
    /// Every token as (expires_at, id).
    token_expiry: BTreeSet<(i64, String)>,
    /// Every pending claim as (created_at, name, account).
    claim_age: BTreeSet<(i64, String, String)>,
}

/// What one account holds.
#[derive(Clone, Debug, Default, PartialEq)]
struct Held {
    /// Its tokens: expires_at → how many.
    token_expiry: BTreeMap<i64, usize>,
    domains: usize,
    claims: usize,
    tcp: usize,
}

impl Held {
    fn is_empty(&self) -> bool {
        self.token_expiry.is_empty() && self.domains == 0 && self.claims == 0 && self.tcp == 0
    }
}

/// Which of an account's counts a record is in.
#[derive(Clone, Copy)]
enum Counted {
    Domain,
    Claim,
    Tcp,
}

impl Index {
    fn of(state: &State) -> Self {
        let mut index = Self::default();
        for d in state.domains.values() {
            index.count(&d.account, Counted::Domain, 1);
        }
        for c in state.claims.values() {
            index.add_claim(c);
        }
        for t in state.tcp.values() {
            index.add_tcp(t);
        }
        for t in state.tokens.values() {
            index.add_token(t);
        }
        index
    }

    fn held(&mut self, account: &str) -> &mut Held {
        if !self.accounts.contains_key(account) {
            self.accounts.insert(account.to_owned(), Held::default());
        }
        self.accounts.get_mut(account).expect("inserted above")
    }

    /// Drops an account's entry once it holds nothing (so that the index
    /// equals a fresh one of the same state).
    fn tidy(&mut self, account: &str) {
        if self.accounts.get(account).is_some_and(Held::is_empty) {
            self.accounts.remove(account);
        }
    }

    fn count(&mut self, account: &str, what: Counted, delta: isize) {
        let held = self.held(account);
        let n = match what {
            Counted::Domain => &mut held.domains,
            Counted::Claim => &mut held.claims,
            Counted::Tcp => &mut held.tcp,
        };
        *n = n.saturating_add_signed(delta);
        self.tidy(account);
    }

    fn add_claim(&mut self, c: &DomainRecord) {
        self.count(&c.account, Counted::Claim, 1);
        self.claim_age
            .insert((c.created_at, c.name.clone(), c.account.clone()));
    }

    fn remove_claim(&mut self, c: &DomainRecord) {
        self.count(&c.account, Counted::Claim, -1);
        self.claim_age
            .remove(&(c.created_at, c.name.clone(), c.account.clone()));
    }

    fn add_tcp(&mut self, t: &TcpRecord) {
        self.count(&t.account, Counted::Tcp, 1);
        self.ports.insert(t.port, t.alias.clone());
    }

    fn remove_tcp(&mut self, t: &TcpRecord) {
        self.count(&t.account, Counted::Tcp, -1);
        if self.ports.get(&t.port) == Some(&t.alias) {
            self.ports.remove(&t.port);
        }
    }

    fn add_token(&mut self, t: &TokenRecord) {
        *self
            .held(&t.account)
            .token_expiry
            .entry(t.expires_at)
            .or_default() += 1;
        self.token_expiry.insert((t.expires_at, t.id.clone()));
    }

    fn remove_token(&mut self, t: &TokenRecord) {
        let held = self.held(&t.account);
        if let Some(n) = held.token_expiry.get_mut(&t.expires_at) {
            *n -= 1;
            if *n == 0 {
                held.token_expiry.remove(&t.expires_at);
            }
        }
        self.tidy(&t.account);
        self.token_expiry.remove(&(t.expires_at, t.id.clone()));
    }
}

impl State {
    /// The TCP endpoint on `port`, if reserved.
    pub fn tcp_by_port(&self, port: u16) -> Option<&TcpRecord> {
        self.index
            .ports
            .get(&port)
            .and_then(|alias| self.tcp.get(alias))
    }

    /// How many tokens of `account` expire after `now` (Unix seconds).
    pub fn live_tokens(&self, account: &str, now: i64) -> usize {
        self.index.accounts.get(account).map_or(0, |held| {
            held.token_expiry
                .range(now.saturating_add(1)..)
                .map(|(_, n)| n)
                .sum()
        })
    }

    /// The tokens that expired at or before `at` (Unix seconds), soonest first.
    pub fn tokens_expired_by(&self, at: i64) -> impl Iterator<Item = &TokenRecord> + '_ {
        self.index
            .token_expiry
            .range(..(at.saturating_add(1), String::new()))
            .filter_map(|(_, id)| self.tokens.get(id))
    }

    /// The pending claims made at or before `at` (Unix seconds), oldest first.
    pub fn claims_made_by(&self, at: i64) -> impl Iterator<Item = &DomainRecord> + '_ {
        self.index
            .claim_age
            .range(..(at.saturating_add(1), String::new(), String::new()))
            .filter_map(|(_, name, account)| self.claims.get(&(name.clone(), account.clone())))
    }

    /// The pending claims of the host name `name`, one per claiming account.
    pub fn claims_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a DomainRecord> + 'a {
        self.claims
            .range((name.to_owned(), String::new())..)
            .take_while(move |((n, _), _)| n == name)
            .map(|(_, c)| c)
    }

    /// How many domains `account` holds (subdomains and verified custom domains).
    pub fn domains_held(&self, account: &str) -> usize {
        self.index.accounts.get(account).map_or(0, |h| h.domains)
    }

    /// How many custom domains `account` claims and has not verified.
    pub fn claims_pending(&self, account: &str) -> usize {
        self.index.accounts.get(account).map_or(0, |h| h.claims)
    }

    /// How many TCP endpoints `account` holds.
    pub fn tcp_held(&self, account: &str) -> usize {
        self.index.accounts.get(account).map_or(0, |h| h.tcp)
    }
}

/// One change to apply, to the durable store and then to the mirror. Also
/// the unit of the PostgreSQL change log (JSON), so renaming a variant or a
/// field needs a migration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Write {
    /// Insert or replace a key.
    PutKey(KeyRecord),
    /// Remove a key by id.
    DeleteKey(String),
    /// Insert or replace a domain.
    PutDomain(DomainRecord),
    /// Remove a domain by name.
    DeleteDomain(String),
    /// Insert or replace a pending custom domain (name and account from the record).
    PutClaim(DomainRecord),
    /// Remove a pending custom domain: (name, account).
    DeleteClaim(String, String),
    /// Insert or replace a TCP endpoint.
    PutTcp(TcpRecord),
    /// Remove a TCP endpoint by alias.
    DeleteTcp(String),
    /// Insert or replace a token.
    PutToken(TokenRecord),
    /// Remove a token by id.
    DeleteToken(String),
}

/// Hears the changes other replicas committed, once they are in the
/// mirror, with the TCP endpoints they released (a `DeleteTcp` names only
/// the alias; closing its tunnels needs the port).
pub(crate) type RemoteChanges = Box<dyn Fn(&[Write], &[TcpRecord]) + Send + Sync>;

/// The in-memory copy of the store's state.
#[derive(Default)]
pub(crate) struct Mirror {
    state: RwLock<State>,
    remote: OnceLock<RemoteChanges>,
}

impl Mirror {
    /// A read-only look at the state (hold it briefly).
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, State> {
        // A panic while holding the lock leaves the mirror as consistent as
        // the store (writes reach it only after a commit), so keep going.
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies writes this process committed.
    pub(crate) fn apply(&self, writes: Vec<Write>) {
        let mut state = self.write();
        for write in writes {
            state.apply(write);
        }
    }

    /// Applies writes another replica committed, then tells the listener.
    #[cfg(feature = "postgres")]
    pub(crate) fn apply_remote(&self, writes: Vec<Write>) {
        let released = {
            let mut state = self.write();
            let released = state.released_tcp(&writes);
            for write in writes.iter().cloned() {
                state.apply(write);
            }
            released
        };
        if let Some(listener) = self.remote.get() {
            listener(&writes, &released);
        }
    }

    /// Replaces the whole state (a full reload); the listener hears what
    /// disappeared as deletions.
    pub(crate) fn replace(&self, new: State) {
        let (gone, released) = {
            let mut state = self.write();
            let gone = state.deletions_to(&new);
            let released = state.released_tcp(&gone);
            *state = new;
            state.index = Index::of(&state);
            (gone, released)
        };
        if let (Some(listener), false) = (self.remote.get(), gone.is_empty()) {
            listener(&gone, &released);
        }
    }
}

/// Where the store lives, and how writers there are serialised. See the
/// module docs; implementations: [`redb::Redb`], [`postgres::Postgres`].
pub(crate) trait Backend: Send + Sync {
    /// Runs `decide` on `mirror` once it holds every change committed
    /// before (by any writer of the store), makes the writes it returns
    /// durable, then applies them to `mirror`. Writers run one at a time.
    /// An `Err` from `decide` writes nothing and is returned.
    fn commit(
        &self,
        mirror: &Mirror,
        decide: &mut dyn FnMut(&State) -> Result<Vec<Write>>,
    ) -> Result<()>;

    /// Brings `mirror` up to every change committed before the call (other
    /// replicas' included). Blocks; not on an async runtime's thread.
    fn sync(&self) -> Result<()>;

    /// [`Backend::sync`] for async callers (it runs on the store's own
    /// runtime, if it has one).
    fn sync_async(&self) -> futures::future::BoxFuture<'static, Result<()>>;

    /// Where the store is, for `Debug` and logs (never a password).
    fn describe(&self) -> String;

    /// How long ago the mirror was last known to hold every commit of the
    /// store (zero for a store only this process writes).
    fn staleness(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

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
        keys.cloned()
            .map(Write::DeleteKey)
            .chain(domains.cloned().map(Write::DeleteDomain))
            .chain(claims.cloned().map(|(n, a)| Write::DeleteClaim(n, a)))
            .chain(tcp.cloned().map(Write::DeleteTcp))
            .chain(tokens.cloned().map(Write::DeleteToken))
            .collect()
    }
}

#[cfg(test)]
mod tests {
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
        ]
    }

    /// What the index answers for one account at one time: live tokens,
    /// domains, claims, TCP endpoints; tokens expired and claims made by then.
    #[derive(Debug, PartialEq)]
    struct Answers(
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
