//! The REST API of the Tuna edge (`docs/tuna-api.md`): the JSON types the
//! edge's control plane (`tuna-edge`) serves and the operator's client
//! (`tuna-agent`'s `TunaClient`) sends, defined once so they cannot drift.

mod secret;
mod types;

pub use secret::Secret;
pub use types::*;
