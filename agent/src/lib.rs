//! The cluster's side of the Tuna edge contract: what the operator runs to
//! reach an edge. The tunnel agent ([`Agent`]) dials out, attaches tunnels
//! and hands each public connection on as a stream; the REST client
//! ([`client::TunaClient`]) reserves domains and TCP endpoints and mints
//! tunnel tokens. Both speak `tuna-protocol`; neither knows how an edge
//! is built.
//!
//! # Contract
//!
//! - **Outbound only.** Nothing here listens: the agent opens one TLS
//!   connection per edge address and reconnects by itself with jittered,
//!   capped exponential backoff; the client makes HTTPS calls.
//! - **Bounded.** Handshakes have deadlines, a missed heartbeat ends a
//!   session, a tunnel's attach is checked against the protocol's size
//!   limits before it is sent, the client's calls time out.
//! - **Secrets stay masked.** API keys and tunnel tokens travel as
//!   `tuna_protocol::api::Secret` / `tuna_protocol::wire::TunnelToken`, whose
//!   `Debug` and `Display` print a mask.
//! - **Errors say what to do.** [`Error`] sorts the edge's answers by what a
//!   caller does about them (adopt, give up with a condition, wait, retry).
//!
//! # May depend on
//!
//! `tuna-protocol`, tokio, rustls (ring) and `reqwest`. Never the edge
//! (`tuna-edge`), a store (`redb`, `tokio-postgres`), an HTTP server
//! (`axum`, hyper's server), Kubernetes or Pingora: `.ci/run` checks it.
//!
//! # The agent
//!
//! One outbound connection to the edge carrying many tunnels,
//! each attached with its own tunnel token and bindings. Public connections
//! arrive as [`MuxStream`](tuna_protocol::mux::MuxStream)s with their
//! [`StreamMeta`](tuna_protocol::wire::StreamMeta), which names the tunnel.
//!
//! ```no_run
//! # async fn demo() -> tuna_agent::Result<()> {
//! use tuna_agent::{Agent, AgentConfig, Trust};
//! use tuna_protocol::wire::{Binding, TunnelToken};
//! let config = AgentConfig::new("edge.example:7443", Trust::SystemRoots);
//! let (handle, mut streams) = Agent::start_with_channel(config, 1024)?;
//! handle
//!     .attach("shop/web", TunnelToken::new("tunat_…"), vec![Binding::http("app.example")])
//!     .await?;
//! while let Some((stream, meta)) = streams.recv().await {
//!     // serve only what tunnel `meta.tunnel` publishes, e.g. serve_stream(stream, meta)
//!     # drop((stream, meta));
//! }
//! # drop(handle); Ok(()) }
//! ```
//!
//! * The agent connects once it has a tunnel, and reconnects by itself with
//!   jittered, capped exponential backoff; every reconnect re-attaches every
//!   tunnel (the first [`tuna_protocol::wire::MAX_HELLO_TUNNELS`] in the hello, the
//!   rest right after it).
//! * [`AgentHandle::attach`], [`AgentHandle::detach`],
//!   [`AgentHandle::set_bindings`] and [`AgentHandle::set_token`] record the
//!   change (kept across reconnects) and send it at once when connected, as a
//!   control message, never as a reconnect. They do not wait for the edge;
//!   watch [`AgentHandle::tunnel_status`] for the outcome.
//! * A tunnel the edge refuses ([`TunnelStatus::Refused`]: bad token, no
//!   binding allowed, quota) or closes ([`TunnelStatus::Closed`]: token
//!   revoked or expired, binding taken over or released) is **not** retried
//!   by the agent, on this connection or after a reconnect, until the caller
//!   calls `attach` or `set_token` for it again — a fixed Secret or a
//!   re-minted token recovers it; retrying a token the edge refused would
//!   only be refused again.
//! * A data stream is handed to the [`StreamHandler`] only if its tunnel is
//!   attached and the stream's host (or TCP endpoint) is one of the bindings
//!   that tunnel declared; other streams are refused. When a tunnel closes,
//!   its open streams fail on their next read or write.
//!
//! Dropping the [`AgentHandle`] stops the agent.

pub mod client;
mod config;
mod error;
mod handle;
mod session;
mod state;
pub mod tls;

pub use config::{AgentConfig, Trust};
pub use error::{Error, Result};
pub use handle::{Agent, AgentHandle};
pub use state::{AgentStatus, StreamHandler, TunnelStatus};
