//! The seam between the edge's data plane (agent acceptor, public listeners)
//! and its control plane (keys, reservations, tunnel tokens).
//!
//! # The shape to implement
//!
//! ```text
//! pub trait SessionAuthority: Send + Sync + 'static {
//!     fn authenticate<'a>(&'a self, token: &'a TunnelToken) -> BoxFuture<'a, Result<Grant, Rejection>>;
//!     fn check_binding<'a>(&'a self, grant: &'a Grant, binding: &'a Binding) -> BoxFuture<'a, Result<BoundTarget, Rejection>>;
//!     fn refresh<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<Grant, Rejection>>;
//!     fn revocations(&self) -> broadcast::Receiver<Revocation>;
//! }
//! ```
//!
//! * `authenticate` runs for every tunnel an agent attaches (in its hello or
//!   later). Return `Rejection::new(ErrorCode::BadToken, ..)` for an unknown
//!   or revoked token and `ErrorCode::TokenExpired` for an expired one; the
//!   edge also refuses a [`Grant`] whose `expires_at` is in the past. Compare
//!   token hashes in constant time; never log the token ([`TunnelToken`]'s
//!   `Debug` is masked).
//! * `check_binding` runs for every binding a tunnel declares, at attach and
//!   for each live `UpdateBindings`, and again periodically: return the
//!   concrete public target (for `Binding::Http` the normalised host, for
//!   `Binding::Tcp { endpoint }` the TCP port); refuse with
//!   `ErrorCode::BindingNotAllowed` when the grant's token or account may
//!   not serve it.
//! * `refresh` re-validates a grant: every heartbeat interval for every open
//!   tunnel, and at once after missed revocation events. Return the current
//!   grant (a renewal moves `expires_at`) or why it no longer holds
//!   (`TokenRevoked`, `TokenExpired`).
//! * `revocations` hands out a receiver of [`Revocation`]s: a token (or API
//!   key) revoked or expired unrenewed closes the tunnels attached with it; a
//!   released target (deleted domain or TCP endpoint) closes the tunnels
//!   serving it — at once, well within the 1 s the contract promises. A
//!   receiver that lags makes the edge re-check every tunnel with `refresh`
//!   and `check_binding`, so nothing is lost, only later.
//!
//! The trait is object safe (`Arc<dyn SessionAuthority>`) and needs no
//! `async-trait`: methods return boxed futures.
//!
//! [`MemoryAuthority`] is the in-memory implementation the data-plane tests
//! and the benchmark use.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use futures::future::BoxFuture;
use tokio::sync::broadcast;
use tuna_protocol::wire::{Binding, BoundTarget, ErrorCode, Rejection, TunnelToken};

/// The identity of a tunnel token (not the secret itself): what revocations name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenId(pub String);

impl std::fmt::Display for TokenId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a valid token entitles a tunnel to.
#[derive(Debug, Clone)]
pub struct Grant {
    /// Which token authenticated the tunnel (revocations match on it).
    pub token_id: TokenId,
    /// The account that owns the token.
    pub account: String,
    /// After this instant the token no longer serves.
    pub expires_at: SystemTime,
    /// Opened with an API key rather than a tunnel token: bounded by its
    /// account's quota, not by the per-token tunnel limit.
    pub api_key: bool,
    /// Bindings the token was created for; `check_binding` is the judge, this
    /// is informative (the in-memory authority uses it).
    pub allowed: Vec<Binding>,
    /// The token's owner labels (those of [`tuna_protocol::api::OWNER_LABELS`] it
    /// carries; none for API keys): a TCP port is never moved from a live
    /// tunnel to one of another owner.
    pub owner: BTreeMap<String, String>,
}

/// The owner labels among a token's `labels` (see [`Grant::owner`]).
pub fn owner_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    tuna_protocol::api::OWNER_LABELS
        .iter()
        .filter_map(|k| labels.get(*k).map(|v| ((*k).to_owned(), v.clone())))
        .collect()
}

/// What must close now: tunnels of a revoked token, tunnels serving a
/// released target, or bindings on a Gateway address given back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Revocation {
    /// The token (or API key, `key:<id>`) was revoked or expired unrenewed.
    Token(TokenId),
    /// The domain or TCP endpoint behind this target was released.
    Target(BoundTarget),
    /// The Gateway address was given back: every binding on it ends.
    Address(std::net::IpAddr),
}

/// Decides who may open a tunnel and what it may bind. See the module docs.
pub trait SessionAuthority: Send + Sync + 'static {
    /// Validates a tunnel token presented in a `Hello` frame.
    fn authenticate<'a>(
        &'a self,
        token: &'a TunnelToken,
    ) -> BoxFuture<'a, Result<Grant, Rejection>>;

    /// Decides whether `grant` may serve `binding`, and resolves it to a public target.
    fn check_binding<'a>(
        &'a self,
        grant: &'a Grant,
        binding: &'a Binding,
    ) -> BoxFuture<'a, Result<BoundTarget, Rejection>>;

    /// Re-validates a grant: the current one, or why it no longer holds.
    fn refresh<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<Grant, Rejection>>;

    /// Revocations and releases, as they happen.
    fn revocations(&self) -> broadcast::Receiver<Revocation>;

    /// Whether `token`, refused by [`SessionAuthority::authenticate`], has
    /// the shape of a credential this authority mints, so that catching up
    /// ([`SessionAuthority::catch_up`]) might find it. The edge pays for a
    /// catch-up only then, and charges it to the source's failure budget
    /// before it: a malformed token never costs a round trip.
    fn may_catch_up(&self, token: &TunnelToken) -> bool {
        let _ = token;
        false
    }

    /// Brings the authority's view up to date (a token minted a moment ago
    /// elsewhere); `false` when it could not. Called after a refusal of a
    /// token [`SessionAuthority::may_catch_up`] accepted, then
    /// `authenticate` runs again.
    fn catch_up(&self) -> BoxFuture<'_, bool> {
        Box::pin(std::future::ready(false))
    }

    /// Whether new agent sessions may be judged now: `Err` (code
    /// `unavailable`) from an authority whose view of revocations is older
    /// than the bound it promises, e.g. a fleet replica cut off from its
    /// store. The edge asks it before judging anything: a hello, and an
    /// `Attach` or an added binding on an open session (which, refused,
    /// ends that session with `go_away{unavailable}`; the agent reconnects).
    fn accepting(&self) -> Result<(), Rejection> {
        Ok(())
    }

    /// Whether tunnels granted earlier may keep serving: `Err` (code
    /// `unavailable`) from an authority whose view of revocations is older
    /// than the longer outage bound it allows (a fleet replica cut off from
    /// its store for longer than `--max-store-staleness-secs`). The edge
    /// checks it every second and then ends every agent session; the agents
    /// reconnect (to another replica, or here once the store is back).
    fn serving(&self) -> Result<(), Rejection> {
        Ok(())
    }
}

/// A token the in-memory authority knows.
#[derive(Debug, Clone)]
struct MemoryToken {
    grant: Grant,
}

/// In-memory [`SessionAuthority`] for tests and benchmarks: tokens in a map,
/// TCP endpoints named by alias or by port number.
#[derive(Clone)]
pub struct MemoryAuthority {
    inner: Arc<MemoryInner>,
}

struct MemoryInner {
    tokens: RwLock<HashMap<String, MemoryToken>>,
    tcp_aliases: RwLock<HashMap<String, u16>>,
    revoked: broadcast::Sender<Revocation>,
}

impl Default for MemoryAuthority {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryAuthority {
    /// An authority that knows no token yet.
    pub fn new() -> Self {
        let (revoked, _) = broadcast::channel(1024);
        Self {
            inner: Arc::new(MemoryInner {
                tokens: RwLock::new(HashMap::new()),
                tcp_aliases: RwLock::new(HashMap::new()),
                revoked,
            }),
        }
    }

    /// Registers `token` (clear text) for `account`, valid until `expires_at`,
    /// allowed to bind `allowed` (TCP endpoints by alias or port text).
    pub fn add_token(
        &self,
        token_id: &str,
        token: &TunnelToken,
        account: &str,
        expires_at: SystemTime,
        allowed: Vec<Binding>,
    ) {
        let grant = Grant {
            token_id: TokenId(token_id.to_owned()),
            account: account.to_owned(),
            expires_at,
            api_key: false,
            allowed,
            owner: BTreeMap::new(),
        };
        self.inner
            .tokens
            .write()
            .expect("token map poisoned")
            .insert(token.expose().to_owned(), MemoryToken { grant });
    }

    /// Names TCP port `port` by `alias`, like a reserved TCP endpoint.
    pub fn add_tcp_alias(&self, alias: &str, port: u16) {
        self.inner
            .tcp_aliases
            .write()
            .expect("alias map poisoned")
            .insert(alias.to_owned(), port);
    }

    /// Gives `address` back, as `DELETE /v1/gateway-addresses/{address}`
    /// does: no token may bind a port of it any more, and the tunnels
    /// bound to it are told.
    pub fn release_address(&self, address: std::net::IpAddr) {
        for token in self
            .inner
            .tokens
            .write()
            .expect("token map poisoned")
            .values_mut()
        {
            token
                .grant
                .allowed
                .retain(|b| !matches!(b, Binding::Address { address: a, .. } if *a == address));
        }
        let _ = self.inner.revoked.send(Revocation::Address(address));
    }

    /// Forgets every token with this id and announces the revocation.
    pub fn revoke(&self, token_id: &str) {
        self.inner
            .tokens
            .write()
            .expect("token map poisoned")
            .retain(|_, t| t.grant.token_id.0 != token_id);
        // No receiver simply means no session is listening yet.
        let _ = self
            .inner
            .revoked
            .send(Revocation::Token(TokenId(token_id.to_owned())));
    }

    /// Forgets every token with this id without announcing it (as if the
    /// announcement were lost): only a re-check finds out.
    pub fn revoke_silently(&self, token_id: &str) {
        self.inner
            .tokens
            .write()
            .expect("token map poisoned")
            .retain(|_, t| t.grant.token_id.0 != token_id);
    }

    fn resolve_port(&self, endpoint: &str) -> Option<u16> {
        if let Some(port) = self
            .inner
            .tcp_aliases
            .read()
            .expect("alias map poisoned")
            .get(endpoint)
        {
            return Some(*port);
        }
        endpoint.parse().ok()
    }
}

impl SessionAuthority for MemoryAuthority {
    fn authenticate<'a>(
        &'a self,
        token: &'a TunnelToken,
    ) -> BoxFuture<'a, Result<Grant, Rejection>> {
        Box::pin(async move {
            let tokens = self.inner.tokens.read().expect("token map poisoned");
            let known = tokens.get(token.expose()).ok_or_else(|| {
                Rejection::new(ErrorCode::BadToken, "unknown or revoked tunnel token")
            })?;
            if known.grant.expires_at <= SystemTime::now() {
                return Err(Rejection::new(
                    ErrorCode::TokenExpired,
                    format!(
                        "tunnel token {} has expired; renew it or create a new one",
                        known.grant.token_id
                    ),
                ));
            }
            Ok(known.grant.clone())
        })
    }

    fn check_binding<'a>(
        &'a self,
        grant: &'a Grant,
        binding: &'a Binding,
    ) -> BoxFuture<'a, Result<BoundTarget, Rejection>> {
        Box::pin(async move {
            let not_allowed = || {
                Rejection::new(
                    ErrorCode::BindingNotAllowed,
                    format!("token {} may not bind {binding}", grant.token_id),
                )
            };
            match binding {
                Binding::Http { host } => {
                    let host = host.to_ascii_lowercase();
                    let allowed = grant.allowed.iter().any(
                        |b| matches!(b, Binding::Http { host: h } if h.eq_ignore_ascii_case(&host)),
                    );
                    if allowed {
                        Ok(BoundTarget::Http { host })
                    } else {
                        Err(not_allowed())
                    }
                }
                Binding::Address { address, port } => {
                    if grant.allowed.contains(binding) {
                        Ok(BoundTarget::Address {
                            address: *address,
                            port: *port,
                        })
                    } else {
                        Err(not_allowed())
                    }
                }
                Binding::Tcp { endpoint } => {
                    let port = self.resolve_port(endpoint).ok_or_else(not_allowed)?;
                    let allowed = grant.allowed.iter().any(|b| match b {
                        Binding::Tcp { endpoint: e } => self.resolve_port(e) == Some(port),
                        Binding::Http { .. } | Binding::Address { .. } => false,
                    });
                    if allowed {
                        Ok(BoundTarget::Tcp { port })
                    } else {
                        Err(not_allowed())
                    }
                }
            }
        })
    }

    fn refresh<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<Grant, Rejection>> {
        Box::pin(async move {
            let tokens = self.inner.tokens.read().expect("token map poisoned");
            let current = tokens
                .values()
                .find(|t| t.grant.token_id == grant.token_id)
                .ok_or_else(|| {
                    Rejection::new(
                        ErrorCode::TokenRevoked,
                        format!("tunnel token {} was revoked", grant.token_id),
                    )
                })?;
            Ok(current.grant.clone())
        })
    }

    fn revocations(&self) -> broadcast::Receiver<Revocation> {
        self.inner.revoked.subscribe()
    }
}
