//! The self-hosted edge's data plane: agent acceptor, session registry,
//! public HTTP/HTTPS/TCP listeners, and the composition that also serves
//! the control plane's REST API ([`server::EdgeServer`]).

pub mod authority;
pub mod cli;
mod hyper_path;
mod page;
mod public;
mod registry;
mod relay;
pub mod server;
mod session;
mod tasks;

pub use authority::{Grant, MemoryAuthority, SessionAuthority, TokenId};
pub use public::{IpCidr, PublicLimits};
pub use server::{EdgeConfig, EdgeHandle, EdgeServer};
