//! The edge's control plane: API keys, reservations (domains, TCP
//! endpoints), tunnel tokens, their persistent store, and the REST API that
//! manages them (`docs/tuna-api.md`).
//!
//! The edge composition opens one [`ControlPlane`] and takes two things from
//! it: [`ControlPlane::router`], the REST API as an axum `Router` (serve it
//! over TLS, e.g. with [`serve_https`]), and the [`ControlPlane`] itself as the
//! data plane's `SessionAuthority` (tunnel tokens, bindings, revocations).
//!
//! Every reservation belongs to an *account*; API keys act for one account.
//! Reserving what the caller's account already holds answers 409 with the
//! existing object (so reconcilers adopt it); what another account holds
//! answers 403.

mod addresses;
mod authority;
#[cfg(feature = "cli")]
pub mod cli;
mod dns;
mod domains;
mod keys;
mod names;
mod plane;
mod secrets;
pub(crate) mod serve;
mod server;
mod store;
mod tcp;
mod tokens;

pub(crate) use crate::budget::RateLimiter;
pub use crate::budget::{FleetShare, RateLimit};
pub use addresses::{AddressPool, MAX_POOL_ADDRESSES};
pub use dns::{DnsVerifier, challenge_record_name};
pub use keys::Caller;
pub use names::RESERVED_SUBDOMAINS;
pub use plane::{
    ControlConfig, ControlPlane, DEFAULT_ACCOUNT, MAX_LIFETIME, MAX_STORE_STALENESS, Quotas,
};
pub use secrets::{API_KEY_PREFIX, KEY_GRANT_PREFIX, TUNNEL_TOKEN_PREFIX};
pub use serve::{
    ClientAddr, HEADER_READ_TIMEOUT, serve_connection, serve_https, serve_tls_connection,
};
pub use server::ROUTES;
#[cfg(feature = "postgres")]
pub(crate) use store::StoreTarget;
pub use store::{STORE_FILE, StoreUrl};
pub use tokens::{DEFAULT_TTL_SECONDS, MAX_TTL_SECONDS};
