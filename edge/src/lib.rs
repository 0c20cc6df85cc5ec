//! The self-hosted Tuna edge: the part of the system that faces the
//! internet. It accepts agents' outbound connections, serves public HTTP,
//! HTTPS and TCP traffic to them over multiplexed streams, and keeps the
//! reservations (domains, TCP endpoints), API keys and tunnel tokens behind
//! the REST API of `docs/tuna-api.md`. The operator runs it as
//! `tuna-operator edge` and embeds it in standalone mode; agents and API
//! clients reach it only through `tuna-protocol`.
//!
//! # Layout, one way down
//!
//! - **The composition** ([`server::EdgeServer`], and `cli` for the
//!   `edge` command): binds every listener and wires the planes together.
//! - **The data plane**: the agent acceptor and sessions (`session`), the
//!   registry of live tunnels and their routes (`registry`), the public
//!   listeners and their rules (`public`, `proxy_header`), the HTTP/1.1
//!   byte relay and the hyper path (`relay`, `hyper_path`, `page`), and the
//!   fleet of replicas that hand streams to each other (`fleet`). The
//!   data plane asks a [`SessionAuthority`] whether a token may attach.
//! - **The control plane** ([`control`]): API keys, reservations, tunnel
//!   tokens, DNS checks, the REST API, and the store behind one `Backend`
//!   trait (redb embedded; PostgreSQL for a fleet). Its [`control::ControlPlane`]
//!   is the data plane's `SessionAuthority`.
//! - **Below both**: the budgets a source may spend before and after it
//!   authenticates ([`budget`]), the server side of TLS ([`tls`]), the
//!   session authority's types ([`authority`]), small helpers (`tasks`,
//!   [`fsutil`]) and the one [`Error`].
//!
//! # Contract
//!
//! - **Bounded everywhere**: pre-authentication slots per source and in
//!   total, connection and session caps, frame and header sizes, handshake
//!   and idle timeouts, per-key request rates ([`EdgeLimits`],
//!   [`PublicLimits`], [`control::RateLimit`]).
//! - **A restart loses nothing**: reservations and tokens are durable before
//!   an API call answers; a fleet's replicas share them in PostgreSQL, and a
//!   revocation reaches every replica within a second.
//! - **Secrets never in logs or `Debug`**: keys and tokens are stored as
//!   hashes and printed masked.
//!
//! # May depend on
//!
//! `tuna-protocol`, `tuna-http1`, tokio, rustls, hyper, axum, redb,
//! hickory (DNS checks); the PostgreSQL client only behind the `postgres`
//! feature (on by default: the PostgreSQL store and the `fleet`, which
//! shares it), clap only behind the `cli` feature. Never the agent
//! (`tuna-agent`, a test-only dependency), an HTTP client, Kubernetes or
//! Pingora: `.ci/run` checks it.

pub mod authority;
pub mod budget;
#[cfg(feature = "cli")]
pub mod cli;
pub mod control;
mod error;
#[cfg(feature = "postgres")]
pub mod fleet;
pub mod fsutil;
mod hyper_path;
mod page;
mod proxy_header;
mod public;
mod registry;
mod relay;
pub mod server;
mod session;
mod tasks;
pub mod tls;

pub use authority::{Grant, MemoryAuthority, Revocation, SessionAuthority, TokenId};
pub use budget::EdgeLimits;
pub use error::{Error, Result};
#[cfg(feature = "postgres")]
pub use fleet::{FleetConfig, PeerTls};
pub use public::{IpCidr, PublicLimits};
pub use server::{EdgeConfig, EdgeHandle, EdgeServer};
