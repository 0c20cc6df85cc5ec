//! Tunnel tokens: temporary, one per tunnel, carrying owner labels (so the
//! operator can find and revoke orphans) and the bindings they allow.

use std::collections::BTreeMap;

use super::keys::Caller;
use super::names;
use super::plane::ControlPlane;
use super::secrets::{self, TUNNEL_TOKEN_PREFIX};
use super::store::{TokenRecord, Write};
use tuna_protocol::api::{
    Bindings, CreateToken, CreatedToken, RenewToken, Scope, Timestamp, Token, TokenInfo,
};

use crate::authority::{Revocation, TokenId};
use crate::error::{Error, Result};

/// Lifetime of a token when the request names none: one day.
pub const DEFAULT_TTL_SECONDS: u64 = 24 * 3600;
/// Longest lifetime a token may get at once: 30 days.
pub const MAX_TTL_SECONDS: u64 = 30 * 24 * 3600;

/// Scopes that may manage tokens: writers, and connect-only keys (an agent
/// given a `tunnels:connect` key mints its own per-tunnel tokens).
const TOKEN_SCOPES: &[Scope] = &[Scope::TunnelsWrite, Scope::TunnelsConnect];

fn ttl(requested: Option<u64>) -> Result<u64> {
    let ttl = requested.unwrap_or(DEFAULT_TTL_SECONDS);
    if ttl == 0 || ttl > MAX_TTL_SECONDS {
        return Err(Error::InvalidRequest(format!(
            "ttlSeconds must be between 1 and {MAX_TTL_SECONDS} (30 days), got {ttl}"
        )));
    }
    Ok(ttl)
}

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
}

/// Parses an equality-based selector: `k=v,k2==v2,k3!=v3` (empty: all).
pub(crate) fn parse_selector(selector: &str) -> Result<Vec<Requirement>> {
    let mut out = Vec::new();
    for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let requirement = if let Some((k, v)) = term.split_once("!=") {
            Requirement::NotEquals(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = term.split_once("==") {
            Requirement::Equals(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = term.split_once('=') {
            Requirement::Equals(k.trim().to_owned(), v.trim().to_owned())
        } else {
            return Err(Error::InvalidRequest(format!(
                "selector term {term:?} is not key=value, key==value or key!=value"
            )));
        };
        let (Requirement::Equals(k, v) | Requirement::NotEquals(k, v)) = &requirement;
        names::label(k, v)?;
        out.push(requirement);
    }
    Ok(out)
}

fn selected(labels: &BTreeMap<String, String>, requirements: &[Requirement]) -> bool {
    requirements.iter().all(|r| match r {
        Requirement::Equals(k, v) => labels.get(k) == Some(v),
        Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
    })
}

fn normalize_bindings(bindings: &Bindings) -> Result<Bindings> {
    let mut hosts = bindings
        .hosts
        .iter()
        .map(|h| names::host_name(h))
        .collect::<Result<Vec<_>>>()?;
    hosts.sort();
    hosts.dedup();
    let mut tcp = bindings
        .tcp_endpoints
        .iter()
        .map(|e| match e.parse::<u16>() {
            Ok(port) if port > 0 => Ok(port.to_string()),
            Ok(_) => Err(Error::InvalidName("TCP port 0 cannot be bound".into())),
            Err(_) => names::tcp_alias(e),
        })
        .collect::<Result<Vec<_>>>()?;
    tcp.sort();
    tcp.dedup();
    let mut addresses: Vec<_> = bindings
        .addresses
        .iter()
        .map(|a| super::addresses::canonical(*a))
        .collect();
    addresses.sort();
    addresses.dedup();
    Ok(Bindings {
        hosts,
        tcp_endpoints: tcp,
        addresses,
    })
}

fn token_view(record: &TokenRecord, now: i64) -> Token {
    Token {
        id: record.id.clone(),
        expires_at: Timestamp(record.expires_at),
        expired: record.expires_at <= now,
        info: info(record),
    }
}

fn info(record: &TokenRecord) -> TokenInfo {
    TokenInfo {
        labels: record.labels.clone(),
        bindings: record.bindings.clone(),
        account: record.account.clone(),
        created_at: Timestamp(record.created_at),
    }
}

impl ControlPlane {
    /// Mints a tunnel token for the caller's account. The clear text is in
    /// the answer only; the store keeps its hash.
    pub fn create_token(&self, caller: &Caller, request: &CreateToken) -> Result<CreatedToken> {
        caller.require_any(TOKEN_SCOPES)?;
        for (k, v) in &request.labels {
            names::label(k, v)?;
        }
        let bindings = normalize_bindings(&request.bindings)?;
        let ttl = ttl(request.ttl_seconds)?.min(self.shared.max_token_lifetime.as_secs());
        let now = Timestamp::now();
        let minted = secrets::mint(TUNNEL_TOKEN_PREFIX);
        let record = TokenRecord {
            id: minted.id,
            hash: minted.hash,
            account: caller.account.clone(),
            labels: request.labels.clone(),
            bindings,
            created_at: now.unix_seconds(),
            expires_at: now.plus_seconds(ttl).unix_seconds(),
            minted_by: Some(caller.key_id.clone()),
        };
        let created = CreatedToken {
            id: record.id.clone(),
            token: minted.secret,
            expires_at: Timestamp(record.expires_at),
            info: info(&record),
        };
        let live = now.unix_seconds();
        self.store().commit(|state| {
            super::plane::check_quota(
                state.live_tokens(&caller.account, live),
                self.shared.quotas.tokens,
                "live tunnel tokens",
                "--quota-tokens",
            )?;
            Ok(((), vec![Write::PutToken(record)]))
        })?;
        Ok(created)
    }

    /// The caller's tokens matching `selector`, an equality-based label
    /// selector (`k=v,k2==v2,k3!=v3`; empty: all).
    pub fn list_tokens(&self, caller: &Caller, selector: &str) -> Result<Vec<Token>> {
        caller.require_any(TOKEN_SCOPES)?;
        let requirements = parse_selector(selector)?;
        let now = Timestamp::now().unix_seconds();
        Ok(self
            .store()
            .read()
            .tokens
            .values()
            .filter(|t| t.account == caller.account && selected(&t.labels, &requirements))
            .map(|t| token_view(t, now))
            .collect())
    }

    fn own_token(&self, caller: &Caller, id: &str) -> Result<TokenRecord> {
        self.store()
            .read()
            .tokens
            .get(id)
            .filter(|t| t.account == caller.account)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("your account has no tunnel token {id:?}")))
    }

    /// One of the caller's tokens (without its secret).
    pub fn get_token(&self, caller: &Caller, id: &str) -> Result<Token> {
        caller.require_any(TOKEN_SCOPES)?;
        Ok(token_view(
            &self.own_token(caller, id)?,
            Timestamp::now().unix_seconds(),
        ))
    }

    /// Revokes a token: it opens no new session, and the sessions it opened
    /// are told to close (through the authority's revocation channel).
    pub fn revoke_token(&self, caller: &Caller, id: &str) -> Result<()> {
        caller.require_any(TOKEN_SCOPES)?;
        // The lookup below reads the mirror: another replica may have made
        // the token a moment ago.
        self.store().sync()?;
        let record = self.own_token(caller, id)?;
        self.store().commit(|state| {
            let writes = if state.tokens.contains_key(&record.id) {
                vec![Write::DeleteToken(record.id.clone())]
            } else {
                Vec::new()
            };
            Ok(((), writes))
        })?;
        self.announce(Revocation::Token(TokenId(record.id)));
        Ok(())
    }

    /// Extends a live token to `now + ttl`, but never past its creation plus
    /// the maximum lifetime; an expired token stays expired.
    pub fn renew_token(&self, caller: &Caller, id: &str, request: &RenewToken) -> Result<Token> {
        caller.require_any(TOKEN_SCOPES)?;
        let ttl = ttl(request.ttl_seconds)?;
        let lifetime = i64::try_from(self.shared.max_token_lifetime.as_secs()).unwrap_or(i64::MAX);
        let now = Timestamp::now();
        self.store().commit(|state| {
            let record = state
                .tokens
                .get(id)
                .filter(|t| t.account == caller.account)
                .ok_or_else(|| {
                    Error::NotFound(format!("your account has no tunnel token {id:?}"))
                })?;
            if record.expires_at <= now.unix_seconds() {
                return Err(Error::TokenExpired(format!(
                    "tunnel token {id:?} expired at {}; create a new token",
                    Timestamp(record.expires_at)
                )));
            }
            let end_of_life = record.created_at.saturating_add(lifetime);
            if end_of_life <= now.unix_seconds() {
                return Err(Error::TokenExpired(format!(
                    "tunnel token {id:?} reached its maximum lifetime at {}; create a new token",
                    Timestamp(end_of_life)
                )));
            }
            let mut renewed = record.clone();
            renewed.expires_at = now.plus_seconds(ttl).unix_seconds().min(end_of_life);
            Ok((
                token_view(&renewed, now.unix_seconds()),
                vec![Write::PutToken(renewed)],
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors() {
        let labels: BTreeMap<String, String> = [("app", "web"), ("ns", "prod")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        for (selector, expected) in [
            ("", true),
            ("app=web", true),
            ("app==web, ns=prod", true),
            ("app=web,ns=dev", false),
            ("app!=web", false),
            ("team!=x", true),
            ("team=x", false),
        ] {
            let requirements = parse_selector(selector).unwrap();
            assert_eq!(selected(&labels, &requirements), expected, "{selector:?}");
        }
        assert!(parse_selector("app").is_err());
        assert!(parse_selector("a b=c").is_err());
    }

    #[test]
    fn ttl_bounds() {
        assert_eq!(ttl(None).unwrap(), DEFAULT_TTL_SECONDS);
        assert!(ttl(Some(0)).is_err());
        assert!(ttl(Some(MAX_TTL_SECONDS + 1)).is_err());
        assert_eq!(ttl(Some(60)).unwrap(), 60);
    }
}
