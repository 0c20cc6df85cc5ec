//! What a source may spend before and after it authenticates, below both
//! the edge's data plane (`edge`) and its control plane (`control`), which
//! draw from the same budgets: the pre-authentication slots every listener
//! takes per source and in total, the edge's connection and session bounds
//! (`preauth.rs`), and the per-key request rate with its fleet share
//! (`rate.rs`). It imports neither of them.

mod preauth;
mod rate;

pub use preauth::*;
pub(crate) use rate::RateLimiter;
pub use rate::{FleetShare, RateLimit};
