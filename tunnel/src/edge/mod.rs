//! The self-hosted edge's data plane: agent acceptor, session registry,
//! public HTTP/HTTPS/TCP listeners, and the composition that also serves
//! the control plane's REST API ([`server::EdgeServer`]).

pub mod authority;
#[cfg(feature = "cli")]
pub mod cli;
pub mod fleet;
mod hyper_path;
mod page;
mod proxy_header;
mod public;
mod registry;
mod relay;
pub mod server;
mod session;
mod tasks;

pub use crate::budget::EdgeLimits;
pub use authority::{Grant, MemoryAuthority, Revocation, SessionAuthority, TokenId};
pub use fleet::{FleetConfig, PeerTls};
pub use public::{IpCidr, PublicLimits};
pub use server::{EdgeConfig, EdgeHandle, EdgeServer};
