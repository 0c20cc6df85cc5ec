//! API keys: created by the `edge keys` command, checked on every request.

use super::names;
use super::plane::ControlPlane;
use super::secrets::{self, API_KEY_PREFIX, KEY_GRANT_PREFIX};
use super::store::{KeyRecord, Store, Write};
use tuna_protocol::api::{ApiKey, CreateApiKey, CreatedApiKey, Scope, Secret, Timestamp};

use crate::authority::{Revocation, TokenId};
use crate::error::{Error, Result};

/// Who is calling: the authenticated key's identity, never its secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The key id.
    pub key_id: String,
    /// The account the key acts for.
    pub account: String,
    /// Its scopes.
    pub scopes: Vec<Scope>,
}

impl Caller {
    /// Whether the key carries `scope` (full access carries every scope).
    pub fn has_scope(&self, scope: Scope) -> bool {
        self.scopes.contains(&Scope::Full) || self.scopes.contains(&scope)
    }

    /// `Ok` when the key carries one of `scopes`; 403 `missing_scope` otherwise.
    pub fn require_any(&self, scopes: &[Scope]) -> Result<()> {
        if scopes.iter().any(|s| self.has_scope(*s)) {
            Ok(())
        } else {
            let wanted: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
            Err(Error::MissingScope(format!(
                "this API key lacks the scope {} (it has {:?}); create a key with --scope {}",
                wanted.join(" or "),
                self.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                wanted[0]
            )))
        }
    }
}

fn key_view(record: &KeyRecord) -> ApiKey {
    ApiKey {
        id: record.id.clone(),
        name: record.name.clone(),
        account: record.account.clone(),
        scopes: record.scopes.clone(),
        created_at: Timestamp(record.created_at),
    }
}

/// Creates an API key in `store`; see [`ControlPlane::create_key`].
pub(crate) fn create_key(
    store: &Store,
    account: &str,
    name: Option<String>,
    scopes: Vec<Scope>,
) -> Result<(ApiKey, Secret)> {
    if !names::is_dns_label(account) {
        return Err(Error::InvalidName(format!(
            "account {account:?} must be an RFC 1123 label (a-z, 0-9, '-')"
        )));
    }
    if scopes.is_empty() {
        return Err(Error::InvalidRequest(
            "a key needs at least one scope: tunnels:write, tunnels:connect or full".into(),
        ));
    }
    let mut scopes = scopes;
    scopes.sort();
    scopes.dedup();
    let minted = secrets::mint(API_KEY_PREFIX);
    let record = KeyRecord {
        id: minted.id,
        name,
        account: account.to_owned(),
        scopes,
        hash: minted.hash,
        created_at: Timestamp::now().unix_seconds(),
    };
    let view = key_view(&record);
    store.commit(|_| Ok(((), vec![Write::PutKey(record)])))?;
    Ok((view, minted.secret))
}

/// Every API key in `store`, sorted by id.
pub(crate) fn list_keys(store: &Store) -> Vec<ApiKey> {
    store.read().keys.values().map(key_view).collect()
}

/// Deletes a key from `store`, and the tunnel tokens it minted (a key's
/// revocation must not leave tokens renewable forever). Returns the key and
/// the ids of the revoked tokens.
pub(crate) fn revoke_key(store: &Store, id: &str) -> Result<(ApiKey, Vec<String>)> {
    store.commit(|state| {
        let record = state
            .keys
            .get(id)
            .ok_or_else(|| Error::NotFound(format!("no API key with id {id:?}")))?;
        let minted: Vec<String> = state
            .tokens
            .values()
            .filter(|t| t.minted_by.as_deref() == Some(id))
            .map(|t| t.id.clone())
            .collect();
        let mut writes = vec![Write::DeleteKey(id.to_owned())];
        writes.extend(minted.iter().cloned().map(Write::DeleteToken));
        Ok(((key_view(record), minted), writes))
    })
}

impl ControlPlane {
    /// Creates an API key for `account` and returns it with its clear text,
    /// which is shown this once: only its hash is stored.
    pub fn create_key(
        &self,
        account: &str,
        name: Option<String>,
        scopes: Vec<Scope>,
    ) -> Result<(ApiKey, Secret)> {
        create_key(self.store(), account, name, scopes)
    }

    /// Every API key, sorted by id.
    pub fn list_keys(&self) -> Vec<ApiKey> {
        list_keys(self.store())
    }

    /// Revokes a key and the tunnel tokens it minted: requests with it are
    /// refused from now on, and the tunnels they opened are closed.
    pub fn revoke_key(&self, id: &str) -> Result<ApiKey> {
        let (key, minted) = revoke_key(self.store(), id)?;
        self.announce(Revocation::Token(TokenId(format!(
            "{KEY_GRANT_PREFIX}{id}"
        ))));
        for token in minted {
            self.announce(Revocation::Token(TokenId(token)));
        }
        Ok(key)
    }

    /// `POST /v1/keys`: a full-access caller mints a key for its own account
    /// (keys can be added while the edge runs, when the CLI cannot open the
    /// store).
    pub fn create_key_for(&self, caller: &Caller, request: &CreateApiKey) -> Result<CreatedApiKey> {
        caller.require_any(&[Scope::Full])?;
        let held = self
            .store()
            .read()
            .keys
            .values()
            .filter(|k| k.account == caller.account)
            .count();
        super::plane::check_quota(held, self.shared.quotas.keys, "API keys", "--quota-keys")?;
        let (info, key) = self.create_key(
            &caller.account,
            request.name.clone(),
            request.scopes.clone(),
        )?;
        Ok(CreatedApiKey { key, info })
    }

    /// `GET /v1/keys`: the keys of the caller's account.
    pub fn list_keys_for(&self, caller: &Caller) -> Result<Vec<ApiKey>> {
        caller.require_any(&[Scope::Full])?;
        Ok(self
            .list_keys()
            .into_iter()
            .filter(|k| k.account == caller.account)
            .collect())
    }

    /// `DELETE /v1/keys/{id}`: revokes a key of the caller's account (the
    /// caller's own key included).
    pub fn revoke_key_for(&self, caller: &Caller, id: &str) -> Result<()> {
        caller.require_any(&[Scope::Full])?;
        // Another replica may have made the key a moment ago.
        self.store().sync()?;
        let owned = self
            .store()
            .read()
            .keys
            .get(id)
            .is_some_and(|k| k.account == caller.account);
        if !owned {
            return Err(Error::NotFound(format!(
                "your account has no API key {id:?}"
            )));
        }
        self.revoke_key(id).map(drop)
    }

    /// Checks a presented API key; 401 for anything but a live key.
    pub fn authenticate_key(&self, presented: &str) -> Result<Caller> {
        let unauthorized = || {
            Error::Unauthorized(
                "missing, malformed, unknown or revoked API key; send `Authorization: Bearer tunak_…`"
                    .into(),
            )
        };
        let id = secrets::id_of(API_KEY_PREFIX, presented).ok_or_else(unauthorized)?;
        let state = self.store().read();
        let record = state.keys.get(id).ok_or_else(unauthorized)?;
        if !secrets::matches(&record.hash, presented) {
            return Err(unauthorized());
        }
        Ok(Caller {
            key_id: record.id.clone(),
            account: record.account.clone(),
            scopes: record.scopes.clone(),
        })
    }
}
