//! `--store` of an edge built without the `postgres` feature: the flag
//! parses as it always does (the command line stays the documented one),
//! and opening the store refuses it with the reason
//! ([`super::Store::open_at`]).

use std::fmt;
use std::str::FromStr;

/// Why a `--store` URL cannot be served by this build.
pub(crate) const NO_POSTGRES: &str = "this edge was built without the PostgreSQL store (the `postgres` feature of tuna-edge, on in the tuna-operator binary): leave out --store to use the embedded redb store";

/// A `--store` URL this build cannot open. It keeps no text: it is never
/// used, so it can never be shown.
#[derive(Clone)]
pub struct StoreUrl {
    _insecure_tls: bool,
}

impl FromStr for StoreUrl {
    type Err = std::convert::Infallible;

    fn from_str(_: &str) -> std::result::Result<Self, Self::Err> {
        Ok(Self {
            _insecure_tls: false,
        })
    }
}

impl StoreUrl {
    /// As with the `postgres` feature (`--store-insecure-tls`); nothing
    /// here connects.
    pub fn allowing_insecure_tls(mut self, allow: bool) -> Self {
        self._insecure_tls = allow;
        self
    }

    /// What logs show of the URL: nothing of it.
    pub fn redacted(&self) -> String {
        "<a --store URL this edge cannot open>".to_owned()
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StoreUrl").field(&self.redacted()).finish()
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}
