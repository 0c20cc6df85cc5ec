//! The control plane as the data plane's [`SessionAuthority`]: who may open
//! a tunnel, what it may bind, and which tunnels must close.
//!
//! Two credentials open tunnels:
//! * a tunnel token (`tunat_…`), limited to the bindings it was created with
//!   *and* to what its account holds;
//! * an API key with `tunnels:connect` (or full access), allowed to bind
//!   anything its account holds. Its grant's token id is `key:<key id>`, so
//!   revoking the key closes its tunnels too (and those of the tokens it
//!   minted, which are revoked with it).
//!
//! Bindings are judged against the store when they are declared and again
//! every heartbeat interval ([`SessionAuthority::refresh`] and
//! `check_binding`). Revocations (tokens revoked or expiring unrenewed, keys
//! revoked with the tokens they minted) and releases (deleted domains and
//! TCP endpoints) are broadcast; the edge closes the tunnels at once.
//!
//! A fleet replica judges from its copy of the PostgreSQL store. Once that
//! copy is older than [`REVOCATION_BOUND`] it judges nothing
//! ([`SessionAuthority::accepting`]: no hello, attach or added binding), and
//! once it is older than [`super::ControlConfig::max_store_staleness`] the
//! tunnels it granted stop serving ([`SessionAuthority::serving`]). In
//! between, heartbeat re-checks still run against the copy: they can close a
//! tunnel (an expiry, a revocation the copy holds), never grant one.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use tokio::sync::broadcast;

use super::addresses::canonical;
use super::names::normalize_host;
use super::plane::ControlPlane;
use super::secrets::{self, API_KEY_PREFIX, KEY_GRANT_PREFIX, TUNNEL_TOKEN_PREFIX};
use super::store::State;
use tuna_protocol::api::{DomainKind, Scope, Timestamp};
use tuna_protocol::wire::{Binding, BoundTarget, ErrorCode, Rejection, TunnelToken};

use crate::authority::{Grant, Revocation, SessionAuthority, TokenId, owner_labels};

fn system_time(unix_seconds: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(unix_seconds).unwrap_or(0))
}

/// What an API-key grant reports as its expiry: never, in practice.
fn key_expiry() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(u32::MAX) * 4)
}

fn bad_token() -> Rejection {
    Rejection::new(
        ErrorCode::BadToken,
        "unknown, malformed or revoked tunnel token; create a new one with POST /v1/tokens",
    )
}

impl ControlPlane {
    /// Checks a tunnel credential (token or connect-scoped API key).
    pub fn authenticate_tunnel(&self, presented: &str) -> Result<Grant, Rejection> {
        let state = self.store().read();
        if let Some(id) = secrets::id_of(TUNNEL_TOKEN_PREFIX, presented) {
            let record = state.tokens.get(id).ok_or_else(bad_token)?;
            if !secrets::matches(&record.hash, presented) {
                return Err(bad_token());
            }
            if record.expires_at <= Timestamp::now().unix_seconds() {
                return Err(Rejection::new(
                    ErrorCode::TokenExpired,
                    format!(
                        "tunnel token {} expired at {}; create a new one",
                        record.id,
                        Timestamp(record.expires_at)
                    ),
                ));
            }
            let allowed = record
                .bindings
                .hosts
                .iter()
                .map(Binding::http)
                .chain(record.bindings.tcp_endpoints.iter().map(Binding::tcp))
                .collect();
            return Ok(Grant {
                token_id: TokenId(record.id.clone()),
                account: record.account.clone(),
                expires_at: system_time(record.expires_at),
                api_key: false,
                allowed,
                owner: owner_labels(&record.labels),
            });
        }
        if let Some(id) = secrets::id_of(API_KEY_PREFIX, presented) {
            let record = state.keys.get(id).ok_or_else(bad_token)?;
            if !secrets::matches(&record.hash, presented) {
                return Err(bad_token());
            }
            if !record.has_scope(Scope::TunnelsConnect) {
                return Err(Rejection::new(
                    ErrorCode::BadToken,
                    format!(
                        "API key {} lacks the scope tunnels:connect needed to open tunnels",
                        record.id
                    ),
                ));
            }
            return Ok(Grant {
                token_id: TokenId(format!("{KEY_GRANT_PREFIX}{}", record.id)),
                account: record.account.clone(),
                // Keys do not expire; revocation ends their tunnels.
                expires_at: key_expiry(),
                api_key: true,
                allowed: Vec::new(),
                owner: BTreeMap::new(),
            });
        }
        Err(bad_token())
    }

    /// Judges one binding of a session opened with `grant`.
    pub fn check_tunnel_binding(
        &self,
        grant: &Grant,
        binding: &Binding,
    ) -> Result<BoundTarget, Rejection> {
        let state = self.store().read();
        let token_bindings = live_credential(&state, grant)?;
        let refuse = |why: String| Rejection::new(ErrorCode::BindingNotAllowed, why);
        match binding {
            Binding::Http { host } => {
                let host = normalize_host(host);
                if let Some(bindings) = token_bindings
                    && !bindings.hosts.contains(&host)
                {
                    return Err(refuse(format!(
                        "tunnel token {} was not created for host {host:?}",
                        grant.token_id
                    )));
                }
                let domain = state
                    .domains
                    .get(&host)
                    .filter(|d| d.account == grant.account)
                    .ok_or_else(|| {
                        refuse(format!(
                            "the account does not hold the domain {host:?}; reserve it with POST /v1/domains"
                        ))
                    })?;
                if domain.kind == DomainKind::Custom && domain.verified_at.is_none() {
                    return Err(refuse(format!(
                        "the custom domain {host:?} is not verified yet; create its DNS records and call POST /v1/domains/{host}/verify"
                    )));
                }
                Ok(BoundTarget::Http { host })
            }
            Binding::Tcp { endpoint } => {
                let record = ControlPlane::find_tcp(&state, &grant.account, endpoint).ok_or_else(|| {
                    refuse(format!(
                        "the account holds no TCP endpoint {endpoint:?}; reserve it with POST /v1/tcp-endpoints"
                    ))
                })?;
                if let Some(bindings) = token_bindings {
                    let port = record.port.to_string();
                    if !bindings
                        .tcp_endpoints
                        .iter()
                        .any(|e| *e == record.alias || *e == port)
                    {
                        return Err(refuse(format!(
                            "tunnel token {} was not created for TCP endpoint {endpoint:?}",
                            grant.token_id
                        )));
                    }
                }
                if endpoint.parse::<u16>().is_ok()
                    && alias_named_by_another_owner(&state, grant, &record.alias)
                {
                    return Err(refuse(format!(
                        "TCP port {} is the endpoint {:?}, which a live token of another owner \
                         names by its alias; bind an endpoint of your own",
                        record.port, record.alias
                    )));
                }
                Ok(BoundTarget::Tcp { port: record.port })
            }
            Binding::Address { address, port } => {
                let address = canonical(*address);
                if *port == 0 {
                    return Err(refuse(format!(
                        "port 0 of the Gateway address {address} cannot be bound"
                    )));
                }
                state
                    .addresses
                    .get(&address)
                    .filter(|a| a.account == grant.account)
                    .ok_or_else(|| {
                        refuse(format!(
                            "the account does not hold the Gateway address {address}; reserve it with POST /v1/gateway-addresses"
                        ))
                    })?;
                if let Some(bindings) = token_bindings
                    && !bindings.addresses.iter().any(|a| canonical(*a) == address)
                {
                    return Err(refuse(format!(
                        "tunnel token {} was not created for the Gateway address {address}",
                        grant.token_id
                    )));
                }
                Ok(BoundTarget::Address {
                    address,
                    port: *port,
                })
            }
        }
    }

    /// Re-validates a grant: the credential must still exist (and a token
    /// be unexpired); answers it with its current expiry.
    pub fn refresh_tunnel_grant(&self, grant: &Grant) -> Result<Grant, Rejection> {
        let state = self.store().read();
        live_credential(&state, grant)?;
        let mut fresh = grant.clone();
        if let Some(record) = state.tokens.get(&grant.token_id.0)
            && !grant.api_key
        {
            fresh.expires_at = system_time(record.expires_at);
        }
        Ok(fresh)
    }

    /// What tunnels must close: revoked tokens and keys (with the tokens a
    /// revoked key minted), tokens that expired unrenewed, released domains
    /// and TCP endpoints.
    pub fn subscribe_revocations(&self) -> broadcast::Receiver<Revocation> {
        self.shared.revoked.subscribe()
    }
}

/// Whether a live token of `grant`'s account but of another owner (other
/// owner labels, [`tuna_protocol::api::OWNER_LABELS`]) was minted for the TCP
/// endpoint `alias` by name. A reservation records only its account, not the
/// tenant it was made for; the owner that names an alias in its tokens is the
/// one it serves, and a port number must not reach around that name. (One
/// pass over the tokens, for bindings given by port number only.)
fn alias_named_by_another_owner(state: &State, grant: &Grant, alias: &str) -> bool {
    let now = Timestamp::now().unix_seconds();
    state.tokens.values().any(|t| {
        t.account == grant.account
            && t.expires_at > now
            && t.bindings.tcp_endpoints.iter().any(|e| e == alias)
            && owner_labels(&t.labels) != grant.owner
    })
}

/// The credential behind `grant` must still exist and be live. Returns the
/// token's bindings, or `None` for an API-key grant (bounded by the account).
fn live_credential<'s>(
    state: &'s State,
    grant: &Grant,
) -> Result<Option<&'s tuna_protocol::api::Bindings>, Rejection> {
    let revoked = || {
        Rejection::new(
            ErrorCode::TokenRevoked,
            format!("the credential {} has been revoked", grant.token_id),
        )
    };
    if let Some(key_id) = grant.token_id.0.strip_prefix(KEY_GRANT_PREFIX) {
        return match state.keys.get(key_id) {
            Some(key) if key.has_scope(Scope::TunnelsConnect) => Ok(None),
            _ => Err(revoked()),
        };
    }
    let record = state.tokens.get(&grant.token_id.0).ok_or_else(revoked)?;
    if record.expires_at <= Timestamp::now().unix_seconds() {
        return Err(Rejection::new(
            ErrorCode::TokenExpired,
            format!("tunnel token {} has expired", record.id),
        ));
    }
    Ok(Some(&record.bindings))
}

impl SessionAuthority for ControlPlane {
    fn authenticate<'a>(
        &'a self,
        token: &'a TunnelToken,
    ) -> BoxFuture<'a, Result<Grant, Rejection>> {
        // Judged on this copy; a token another replica minted a moment ago
        // is found by the edge's catch-up (`may_catch_up`, `catch_up`),
        // which it charges to the source's failure budget first.
        Box::pin(std::future::ready(self.authenticate_tunnel(token.expose())))
    }

    fn may_catch_up(&self, token: &TunnelToken) -> bool {
        let presented = token.expose();
        secrets::id_of(TUNNEL_TOKEN_PREFIX, presented).is_some()
            || secrets::id_of(API_KEY_PREFIX, presented).is_some()
    }

    fn catch_up(&self) -> BoxFuture<'_, bool> {
        let sync = self.store().sync_async();
        Box::pin(async move { sync.await.is_ok() })
    }

    fn check_binding<'a>(
        &'a self,
        grant: &'a Grant,
        binding: &'a Binding,
    ) -> BoxFuture<'a, Result<BoundTarget, Rejection>> {
        Box::pin(async move {
            match self.check_tunnel_binding(grant, binding) {
                Ok(target) => Ok(target),
                // Likewise a domain or endpoint reserved elsewhere just now.
                Err(_) if self.store().sync_async().await.is_ok() => {
                    self.check_tunnel_binding(grant, binding)
                }
                Err(rejection) => Err(rejection),
            }
        })
    }

    fn refresh<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<Grant, Rejection>> {
        Box::pin(async move { self.refresh_tunnel_grant(grant) })
    }

    fn revocations(&self) -> broadcast::Receiver<Revocation> {
        self.subscribe_revocations()
    }

    fn accepting(&self) -> Result<(), Rejection> {
        let stale = self.store().staleness();
        if stale > REVOCATION_BOUND {
            return Err(Rejection::new(
                ErrorCode::Unavailable,
                format!(
                    "this edge replica has not reached its store for {} ms (more than the {} ms revocation bound); it accepts no new sessions until it does, try another replica",
                    stale.as_millis(),
                    REVOCATION_BOUND.as_millis()
                ),
            ));
        }
        Ok(())
    }

    fn serving(&self) -> Result<(), Rejection> {
        self.store_outage()
            .map_err(|e| Rejection::new(ErrorCode::Unavailable, e.to_string()))
    }
}

/// A revocation reaches every replica within this; a replica whose copy of
/// the store is older does not judge new sessions.
pub const REVOCATION_BOUND: Duration = Duration::from_secs(1);
