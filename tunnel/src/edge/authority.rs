//! The seam between the edge's data plane (agent acceptor, public listeners)
//! and its control plane (keys, reservations, tunnel tokens).
//!
//! # For the control plane (edgeapi): the shape to implement
//!
//! ```text
//! pub trait SessionAuthority: Send + Sync + 'static {
//!     fn authenticate<'a>(&'a self, token: &'a TunnelToken) -> BoxFuture<'a, Result<Grant, Rejection>>;
//!     fn check_binding<'a>(&'a self, grant: &'a Grant, binding: &'a Binding) -> BoxFuture<'a, Result<BoundTarget, Rejection>>;
//!     fn revocations(&self) -> broadcast::Receiver<TokenId>;
//! }
//! ```
//!
//! * `authenticate` runs once per agent handshake. Return
//!   `Rejection::new(ErrorCode::BadToken, ..)` for an unknown or revoked token and
//!   `ErrorCode::TokenExpired` for an expired one; the edge also refuses a
//!   [`Grant`] whose `expires_at` is in the past. Compare token hashes in
//!   constant time; never log the token ([`TunnelToken`]'s `Debug` is masked).
//! * `check_binding` runs for every binding an agent declares, at handshake and
//!   for each live `UpdateBindings` control message. Return the concrete
//!   public target: for `Binding::Http` the normalised host, for
//!   `Binding::Tcp { endpoint }` (an alias or a port number as text) the
//!   allocated TCP port. Refuse with `ErrorCode::BindingNotAllowed` when the
//!   token/account may not serve it.
//! * `revocations` hands out a receiver; send a [`TokenId`] on it when a token
//!   is revoked (or expires unrenewed, if you enforce that): every session
//!   authenticated with that token is closed at once (well within the 1 s the
//!   contract promises). A lagged receiver makes the edge re-check nothing,
//!   so keep the channel roomy (e.g. 1024).
//!
//! The trait is object safe (`Arc<dyn SessionAuthority>`) and needs no
//! `async-trait`: methods return boxed futures.
//!
//! [`MemoryAuthority`] is the in-memory implementation the data-plane tests
//! and the benchmark use.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use futures::future::BoxFuture;
use tokio::sync::broadcast;

use crate::wire::{Binding, BoundTarget, ErrorCode, Rejection, TunnelToken};

/// The identity of a tunnel token (not the secret itself): what revocations name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenId(pub String);

impl std::fmt::Display for TokenId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a valid token entitles a session to.
#[derive(Debug, Clone)]
pub struct Grant {
    /// Which token authenticated the session (revocations match on it).
    pub token_id: TokenId,
    /// The account that owns the token; sessions of one account may replace
    /// each other's bindings (an agent reconnecting before its old session timed out).
    pub account: String,
    /// After this instant the token no longer opens sessions.
    pub expires_at: SystemTime,
    /// Bindings the token was created for; `check_binding` is the judge, this
    /// is informative (the in-memory authority uses it).
    pub allowed: Vec<Binding>,
}

/// Decides who may open a session and what it may bind. See the module docs.
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

    /// Revoked token ids, as they happen.
    fn revocations(&self) -> broadcast::Receiver<TokenId>;
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
    revoked: broadcast::Sender<TokenId>,
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
            allowed,
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

    /// Forgets every token with this id and announces the revocation.
    pub fn revoke(&self, token_id: &str) {
        self.inner
            .tokens
            .write()
            .expect("token map poisoned")
            .retain(|_, t| t.grant.token_id.0 != token_id);
        // No receiver simply means no session is listening yet.
        let _ = self.inner.revoked.send(TokenId(token_id.to_owned()));
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
                Binding::Tcp { endpoint } => {
                    let port = self.resolve_port(endpoint).ok_or_else(not_allowed)?;
                    let allowed = grant.allowed.iter().any(|b| match b {
                        Binding::Tcp { endpoint: e } => self.resolve_port(e) == Some(port),
                        Binding::Http { .. } => false,
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

    fn revocations(&self) -> broadcast::Receiver<TokenId> {
        self.inner.revoked.subscribe()
    }
}
