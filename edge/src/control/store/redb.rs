//! The embedded backend: one redb file, `<data dir>/control.redb`.
//!
//! redb commits are ACID and crash-safe (copy-on-write B-trees with a
//! checksummed two-phase commit), so a write the API acknowledged survives a
//! crash. Records are JSON values in one table per kind: readable by a
//! future version, and small (an edge holds thousands, not millions). The
//! file is open by one process at a time, so the process's writer lock is
//! the store's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ::redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::model::{
    AddressRecord, Backend, DomainRecord, KeyRecord, Mirror, STORE_FILE, State, TcpRecord,
    TokenRecord, Write,
};
use crate::error::{Error, Result};

const KEYS: TableDefinition<&str, &[u8]> = TableDefinition::new("api_keys");
const DOMAINS: TableDefinition<&str, &[u8]> = TableDefinition::new("domains");
const TCP_ENDPOINTS: TableDefinition<&str, &[u8]> = TableDefinition::new("tcp_endpoints");
const TOKENS: TableDefinition<&str, &[u8]> = TableDefinition::new("tunnel_tokens");
/// Pending custom domains, keyed `"<name> <account>"`: several accounts may
/// claim one name until one of them verifies it.
const CLAIMS: TableDefinition<&str, &[u8]> = TableDefinition::new("domain_claims");
/// Reserved Gateway addresses, keyed by the address's text.
const ADDRESSES: TableDefinition<&str, &[u8]> = TableDefinition::new("gateway_addresses");

/// The redb backend. See the module docs.
pub(crate) struct Redb {
    path: PathBuf,
    db: Database,
    /// Serialises writers from their decision to the mirror update.
    writer: Mutex<()>,
}

impl Redb {
    /// Opens (or creates) `<data_dir>/control.redb` and loads it into `mirror`.
    pub(crate) fn open(data_dir: &Path, mirror: &Mirror) -> Result<Self> {
        std::fs::create_dir_all(data_dir).map_err(|source| Error::File {
            path: data_dir.to_owned(),
            source,
        })?;
        let path = data_dir.join(STORE_FILE);
        let db = Database::create(&path).map_err(|e| match e {
            ::redb::DatabaseError::DatabaseAlreadyOpen => Error::StoreInUse { path: path.clone() },
            other => Error::storage(&path, "opening")(other.into()),
        })?;
        Self::with_database(path, db, mirror)
    }

    /// A store on another storage backend (tests: a slow disk).
    #[cfg(test)]
    pub(crate) fn open_with_backend(
        backend: impl ::redb::StorageBackend,
        mirror: &Mirror,
    ) -> Result<Self> {
        let path = PathBuf::from("<backend>");
        let db = Database::builder()
            .create_with_backend(backend)
            .map_err(|e| Error::storage(&path, "opening")(e.into()))?;
        Self::with_database(path, db, mirror)
    }

    fn with_database(path: PathBuf, db: Database, mirror: &Mirror) -> Result<Self> {
        // Create the tables so that first reads find them.
        let txn = db
            .begin_write()
            .map_err(|e| Error::storage(&path, "creating tables")(e.into()))?;
        for table in [KEYS, DOMAINS, TCP_ENDPOINTS, TOKENS, CLAIMS, ADDRESSES] {
            txn.open_table(table)
                .map_err(|e| Error::storage(&path, "creating tables")(e.into()))?;
        }
        txn.commit()
            .map_err(|e| Error::storage(&path, "creating tables")(e.into()))?;

        let read = db
            .begin_read()
            .map_err(|e| Error::storage(&path, "loading")(e.into()))?;
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
            addresses: load(
                &path,
                &read,
                ADDRESSES,
                "gateway_addresses",
                |r: &AddressRecord| r.address.to_string(),
            )?
            .into_values()
            .map(|r| (r.address, r))
            .collect(),
            // Built by the mirror when the state replaces its own.
            ..State::default()
        };
        drop(read);
        mirror.replace(state);
        Ok(Self {
            path,
            db,
            writer: Mutex::new(()),
        })
    }
}

impl Backend for Redb {
    fn describe(&self) -> String {
        format!("redb {}", self.path.display())
    }

    fn sync(&self) -> Result<()> {
        // This process is the file's only writer: the mirror is current.
        Ok(())
    }

    fn sync_async(&self) -> futures::future::BoxFuture<'static, Result<()>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn commit(
        &self,
        mirror: &Mirror,
        decide: &mut dyn FnMut(&State) -> Result<Vec<Write>>,
    ) -> Result<()> {
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        // Only writers change the mirror, and they hold `writer`: the state
        // seen here is still current when the writes are applied below.
        let writes = decide(&mirror.read())?;
        if writes.is_empty() {
            return Ok(());
        }
        let path = &self.path;
        let txn = self
            .db
            .begin_write()
            .map_err(|e| Error::storage(path, "beginning a write")(e.into()))?;
        {
            let fail = |e: ::redb::Error| Error::storage(path, "writing")(e);
            let mut keys = txn.open_table(KEYS).map_err(|e| fail(e.into()))?;
            let mut domains = txn.open_table(DOMAINS).map_err(|e| fail(e.into()))?;
            let mut tcp = txn.open_table(TCP_ENDPOINTS).map_err(|e| fail(e.into()))?;
            let mut tokens = txn.open_table(TOKENS).map_err(|e| fail(e.into()))?;
            let mut claims = txn.open_table(CLAIMS).map_err(|e| fail(e.into()))?;
            let mut addresses = txn.open_table(ADDRESSES).map_err(|e| fail(e.into()))?;
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
                    Write::PutAddress(r) => addresses
                        .insert(r.address.to_string().as_str(), json(r).as_slice())
                        .map(drop),
                    Write::DeleteAddress(address) => {
                        addresses.remove(address.to_string().as_str()).map(drop)
                    }
                };
                result.map_err(|e| fail(e.into()))?;
            }
        }
        txn.commit()
            .map_err(|e| Error::storage(path, "committing")(e.into()))?;
        mirror.apply(writes);
        Ok(())
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
    read: &::redb::ReadTransaction,
    table: TableDefinition<&str, &[u8]>,
    table_name: &'static str,
    key_of: impl Fn(&T) -> String,
) -> Result<BTreeMap<String, T>> {
    let fail = |e: ::redb::Error| Error::storage(path, "loading")(e);
    let table = read.open_table(table).map_err(|e| fail(e.into()))?;
    let mut out = BTreeMap::new();
    for entry in table.iter().map_err(|e| fail(e.into()))? {
        let (key, value) = entry.map_err(|e| fail(e.into()))?;
        let record: T =
            serde_json::from_slice(value.value()).map_err(|source| Error::CorruptRecord {
                path: path.to_owned(),
                table: table_name,
                key: key.value().to_owned(),
                source,
            })?;
        out.insert(key_of(&record), record);
    }
    Ok(out)
}
