//! The control plane's persistent state: API keys, domains, TCP endpoints
//! and tunnel tokens in one redb file (`<data dir>/control.redb`).
//!
//! redb commits are ACID and crash-safe (copy-on-write B-trees with a
//! checksummed two-phase commit), so a write the API acknowledged survives a
//! crash. Records are JSON values in one table per kind: readable by a
//! future version, and small (an edge holds thousands, not millions).
//!
//! The whole state is mirrored in memory so that reads (and the per-request
//! key check) never touch the disk. Writers go through [`Store::commit`],
//! one at a time: each decides, looking at the current state, which writes
//! to make; the writes reach the file first and the mirror only after the
//! commit succeeded. Check-then-reserve is therefore atomic: two callers
//! racing for one name cannot both win. Readers are blocked only while a
//! committed change is applied to the mirror, not during the disk sync.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock, RwLockReadGuard};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::error::{ControlError, Result};
use crate::api::{Bindings, DomainKind, Scope};

const KEYS: TableDefinition<&str, &[u8]> = TableDefinition::new("api_keys");
const DOMAINS: TableDefinition<&str, &[u8]> = TableDefinition::new("domains");
const TCP_ENDPOINTS: TableDefinition<&str, &[u8]> = TableDefinition::new("tcp_endpoints");
const TOKENS: TableDefinition<&str, &[u8]> = TableDefinition::new("tunnel_tokens");
/// Pending custom domains, keyed `"<name> <account>"`: several accounts may
/// claim one name until one of them verifies it.
const CLAIMS: TableDefinition<&str, &[u8]> = TableDefinition::new("domain_claims");

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

/// Everything the store holds, as it is in memory.
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
}

impl State {
    /// The TCP endpoint on `port`, if reserved.
    pub fn tcp_by_port(&self, port: u16) -> Option<&TcpRecord> {
        self.tcp.values().find(|t| t.port == port)
    }
}

/// One change to apply, to the file and then to the mirror.
#[derive(Clone, Debug)]
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

/// The persistent store. See the module docs.
pub struct Store {
    path: PathBuf,
    db: Database,
    state: RwLock<State>,
    /// Serialises writers from their decision to the mirror update.
    writer: Mutex<()>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (or creates) the store in `data_dir`, creating the directory.
    pub fn open(data_dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(data_dir).map_err(|source| ControlError::Io {
            path: data_dir.to_owned(),
            source,
        })?;
        let path = data_dir.join(STORE_FILE);
        let db = Database::create(&path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => {
                ControlError::StoreInUse { path: path.clone() }
            }
            other => ControlError::storage(&path, "opening")(other.into()),
        })?;
        Self::with_database(path, db)
    }

    /// A store on another storage backend (tests: a slow disk).
    #[cfg(test)]
    pub(crate) fn open_with_backend(backend: impl redb::StorageBackend) -> Result<Self> {
        let path = PathBuf::from("<backend>");
        let db = Database::builder()
            .create_with_backend(backend)
            .map_err(|e| ControlError::storage(&path, "opening")(e.into()))?;
        Self::with_database(path, db)
    }

    fn with_database(path: PathBuf, db: Database) -> Result<Self> {
        // Create the tables so that first reads find them.
        let txn = db
            .begin_write()
            .map_err(|e| ControlError::storage(&path, "creating tables")(e.into()))?;
        for table in [KEYS, DOMAINS, TCP_ENDPOINTS, TOKENS, CLAIMS] {
            txn.open_table(table)
                .map_err(|e| ControlError::storage(&path, "creating tables")(e.into()))?;
        }
        txn.commit()
            .map_err(|e| ControlError::storage(&path, "creating tables")(e.into()))?;

        let read = db
            .begin_read()
            .map_err(|e| ControlError::storage(&path, "loading")(e.into()))?;
        let state = State {
            keys: load(&path, &read, KEYS, "api_keys", |r: &KeyRecord| r.id.clone())?,
            domains: load(&path, &read, DOMAINS, "domains", |r: &DomainRecord| {
                r.name.clone()
            })?,
            tcp: load(
                &path,
                &read,
                TCP_ENDPOINTS,
                "tcp_endpoints",
                |r: &TcpRecord| r.alias.clone(),
            )?,
            tokens: load(&path, &read, TOKENS, "tunnel_tokens", |r: &TokenRecord| {
                r.id.clone()
            })?,
            claims: load(&path, &read, CLAIMS, "domain_claims", claim_key)?
                .into_values()
                .map(|r| ((r.name.clone(), r.account.clone()), r))
                .collect(),
        };
        drop(read);
        let store = Self {
            path,
            db,
            state: RwLock::new(state),
            writer: Mutex::new(()),
        };
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
        // A panic while holding the lock leaves the mirror as consistent as
        // the file (writes reach it only after a commit), so keep going.
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides under the lock which writes to make, commits them durably,
    /// then applies them to the mirror. `decide` returns the caller's answer
    /// and the writes; an `Err` from it writes nothing.
    pub fn commit<R>(&self, decide: impl FnOnce(&State) -> Result<(R, Vec<Write>)>) -> Result<R> {
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        // Only writers change the mirror, and they hold `writer`: the state
        // seen here is still current when the writes are applied below.
        let (answer, writes) = decide(&self.read())?;
        if writes.is_empty() {
            return Ok(answer);
        }
        let path = &self.path;
        let txn = self
            .db
            .begin_write()
            .map_err(|e| ControlError::storage(path, "beginning a write")(e.into()))?;
        {
            let fail = |e: redb::Error| ControlError::storage(path, "writing")(e);
            let mut keys = txn.open_table(KEYS).map_err(|e| fail(e.into()))?;
            let mut domains = txn.open_table(DOMAINS).map_err(|e| fail(e.into()))?;
            let mut tcp = txn.open_table(TCP_ENDPOINTS).map_err(|e| fail(e.into()))?;
            let mut tokens = txn.open_table(TOKENS).map_err(|e| fail(e.into()))?;
            let mut claims = txn.open_table(CLAIMS).map_err(|e| fail(e.into()))?;
            for write in &writes {
                let result = match write {
                    Write::PutKey(r) => keys.insert(r.id.as_str(), json(r).as_slice()).map(drop),
                    Write::DeleteKey(id) => keys.remove(id.as_str()).map(drop),
                    Write::PutDomain(r) => domains
                        .insert(r.name.as_str(), json(r).as_slice())
                        .map(drop),
                    Write::DeleteDomain(name) => domains.remove(name.as_str()).map(drop),
                    Write::PutClaim(r) => claims
                        .insert(claim_key(r).as_str(), json(r).as_slice())
                        .map(drop),
                    Write::DeleteClaim(name, account) => claims
                        .remove(format!("{name} {account}").as_str())
                        .map(drop),
                    Write::PutTcp(r) => tcp.insert(r.alias.as_str(), json(r).as_slice()).map(drop),
                    Write::DeleteTcp(alias) => tcp.remove(alias.as_str()).map(drop),
                    Write::PutToken(r) => {
                        tokens.insert(r.id.as_str(), json(r).as_slice()).map(drop)
                    }
                    Write::DeleteToken(id) => tokens.remove(id.as_str()).map(drop),
                };
                result.map_err(|e| fail(e.into()))?;
            }
        }
        txn.commit()
            .map_err(|e| ControlError::storage(path, "committing")(e.into()))?;
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        for write in writes {
            match write {
                Write::PutKey(r) => {
                    state.keys.insert(r.id.clone(), r);
                }
                Write::DeleteKey(id) => {
                    state.keys.remove(&id);
                }
                Write::PutDomain(r) => {
                    state.domains.insert(r.name.clone(), r);
                }
                Write::DeleteDomain(name) => {
                    state.domains.remove(&name);
                }
                Write::PutClaim(r) => {
                    state.claims.insert((r.name.clone(), r.account.clone()), r);
                }
                Write::DeleteClaim(name, account) => {
                    state.claims.remove(&(name, account));
                }
                Write::PutTcp(r) => {
                    state.tcp.insert(r.alias.clone(), r);
                }
                Write::DeleteTcp(alias) => {
                    state.tcp.remove(&alias);
                }
                Write::PutToken(r) => {
                    state.tokens.insert(r.id.clone(), r);
                }
                Write::DeleteToken(id) => {
                    state.tokens.remove(&id);
                }
            }
        }
        Ok(answer)
    }
}

/// The table key of a pending custom domain (names and accounts hold no spaces).
fn claim_key(record: &DomainRecord) -> String {
    format!("{} {}", record.name, record.account)
}

fn json(value: &impl Serialize) -> Vec<u8> {
    // Records are plain structs of strings and numbers: serialising cannot fail.
    serde_json::to_vec(value).expect("records serialise to JSON")
}

fn load<T: DeserializeOwned>(
    path: &Path,
    read: &redb::ReadTransaction,
    table: TableDefinition<&str, &[u8]>,
    table_name: &'static str,
    key_of: impl Fn(&T) -> String,
) -> Result<BTreeMap<String, T>> {
    let fail = |e: redb::Error| ControlError::storage(path, "loading")(e);
    let table = read.open_table(table).map_err(|e| fail(e.into()))?;
    let mut out = BTreeMap::new();
    for entry in table.iter().map_err(|e| fail(e.into()))? {
        let (key, value) = entry.map_err(|e| fail(e.into()))?;
        let record: T = serde_json::from_slice(value.value()).map_err(|source| {
            ControlError::CorruptRecord {
                path: path.to_owned(),
                table: table_name,
                key: key.value().to_owned(),
                source,
            }
        })?;
        out.insert(key_of(&record), record);
    }
    Ok(out)
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
            let refused: Result<()> =
                store.commit(|_| Err(ControlError::NotFound("no".to_owned())));
            assert!(refused.is_err());
            // Open twice in one process: refused with a clear error.
            assert!(matches!(
                Store::open(dir.path()),
                Err(ControlError::StoreInUse { .. })
            ));
        }
        let store = Store::open(dir.path()).unwrap();
        let keys: Vec<String> = store.read().keys.keys().cloned().collect();
        assert_eq!(keys, ["b"]);
    }
}
