//! What the store holds and how a backend keeps it: the records, the
//! in-memory copy every read is served from ([`State`], kept by a
//! [`Mirror`]), the writes ([`Write`]) and the [`Backend`] trait that
//! [`super::redb`] and [`super::postgres`] implement.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{OnceLock, RwLock, RwLockReadGuard};

use serde::{Deserialize, Serialize};
use tuna_protocol::api::{Bindings, DomainKind, Scope};

use crate::error::Result;

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

/// A reserved address of the Gateway pool: its holder's tunnels may bind
/// any port on it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AddressRecord {
    /// Unique address.
    pub address: IpAddr,
    /// The holder's label (e.g. `namespace/gateway`), unique per account.
    pub name: String,
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
    /// Reserved Gateway addresses, by address.
    pub addresses: BTreeMap<IpAddr, AddressRecord>,
    /// What the quota checks, the port allocator and the expiry sweep look
    /// up, kept by [`State::apply`]: each would otherwise scan every record
    /// per call, which made minting N tokens O(N²).
    pub(super) index: Index,
}

/// Counts and reverse lookups of a [`State`], always equal to what a scan of
/// its maps would give (`the_index_agrees_with_a_scan_after_every_write`).
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Index {
    /// Per account.
    pub(super) accounts: HashMap<String, Held>,
    /// Reserved TCP ports: port → alias.
    pub(super) ports: BTreeMap<u16, String>,
    /// Every token as (expires_at, id).
    pub(super) token_expiry: BTreeSet<(i64, String)>,
    /// Every pending claim as (created_at, name, account).
    pub(super) claim_age: BTreeSet<(i64, String, String)>,
}

/// What one account holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Held {
    /// Its tokens: expires_at → how many.
    pub(super) token_expiry: BTreeMap<i64, usize>,
    pub(super) domains: usize,
    pub(super) claims: usize,
    pub(super) tcp: usize,
    pub(super) addresses: usize,
}

impl Held {
    pub(super) fn is_empty(&self) -> bool {
        self.token_expiry.is_empty()
            && self.domains == 0
            && self.claims == 0
            && self.tcp == 0
            && self.addresses == 0
    }
}

/// Which of an account's counts a record is in.
#[derive(Clone, Copy)]
pub(super) enum Counted {
    Domain,
    Claim,
    Tcp,
    Address,
}

impl Index {
    pub(super) fn of(state: &State) -> Self {
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
        for a in state.addresses.values() {
            index.count(&a.account, Counted::Address, 1);
        }
        index
    }

    pub(super) fn held(&mut self, account: &str) -> &mut Held {
        if !self.accounts.contains_key(account) {
            self.accounts.insert(account.to_owned(), Held::default());
        }
        self.accounts.get_mut(account).expect("inserted above")
    }

    /// Drops an account's entry once it holds nothing (so that the index
    /// equals a fresh one of the same state).
    pub(super) fn tidy(&mut self, account: &str) {
        if self.accounts.get(account).is_some_and(Held::is_empty) {
            self.accounts.remove(account);
        }
    }

    pub(super) fn count(&mut self, account: &str, what: Counted, delta: isize) {
        let held = self.held(account);
        let n = match what {
            Counted::Domain => &mut held.domains,
            Counted::Claim => &mut held.claims,
            Counted::Tcp => &mut held.tcp,
            Counted::Address => &mut held.addresses,
        };
        *n = n.saturating_add_signed(delta);
        self.tidy(account);
    }

    pub(super) fn add_claim(&mut self, c: &DomainRecord) {
        self.count(&c.account, Counted::Claim, 1);
        self.claim_age
            .insert((c.created_at, c.name.clone(), c.account.clone()));
    }

    pub(super) fn remove_claim(&mut self, c: &DomainRecord) {
        self.count(&c.account, Counted::Claim, -1);
        self.claim_age
            .remove(&(c.created_at, c.name.clone(), c.account.clone()));
    }

    pub(super) fn add_tcp(&mut self, t: &TcpRecord) {
        self.count(&t.account, Counted::Tcp, 1);
        self.ports.insert(t.port, t.alias.clone());
    }

    pub(super) fn remove_tcp(&mut self, t: &TcpRecord) {
        self.count(&t.account, Counted::Tcp, -1);
        if self.ports.get(&t.port) == Some(&t.alias) {
            self.ports.remove(&t.port);
        }
    }

    pub(super) fn add_token(&mut self, t: &TokenRecord) {
        *self
            .held(&t.account)
            .token_expiry
            .entry(t.expires_at)
            .or_default() += 1;
        self.token_expiry.insert((t.expires_at, t.id.clone()));
    }

    pub(super) fn remove_token(&mut self, t: &TokenRecord) {
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

    /// How many Gateway addresses `account` holds.
    pub fn addresses_held(&self, account: &str) -> usize {
        self.index.accounts.get(account).map_or(0, |h| h.addresses)
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
    /// Insert or replace a reserved Gateway address.
    PutAddress(AddressRecord),
    /// Give a Gateway address back to the pool.
    DeleteAddress(IpAddr),
}

/// Hears the changes other replicas committed, once they are in the
/// mirror, with the TCP endpoints they released (a `DeleteTcp` names only
/// the alias; closing its tunnels needs the port).
pub(crate) type RemoteChanges = Box<dyn Fn(&[Write], &[TcpRecord]) + Send + Sync>;

/// The in-memory copy of the store's state.
#[derive(Default)]
pub(crate) struct Mirror {
    pub(super) state: RwLock<State>,
    pub(super) remote: OnceLock<RemoteChanges>,
}

impl Mirror {
    /// A read-only look at the state (hold it briefly).
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, State> {
        // A panic while holding the lock leaves the mirror as consistent as
        // the store (writes reach it only after a commit), so keep going.
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
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
