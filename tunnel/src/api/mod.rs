//! The REST API of the Tuna edge (`docs/tuna-api.md`): the JSON types the
//! server and the client share, and [`TunaClient`], the client the
//! operator's reconcilers use.

mod client;
mod secret;
mod types;

pub use client::{ClientOptions, Reserved, TunaClient};
pub use secret::Secret;
pub use types::*;
