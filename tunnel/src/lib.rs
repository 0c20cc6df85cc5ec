//! The tunnel: the wire protocol and multiplexer (`wire`, `mux`), the agent
//! that dials out from the cluster (`agent`), the self-hosted edge that
//! faces the internet (`edge`: public HTTP/HTTPS/TCP listeners, the
//! HTTP/1.1 byte relay, sessions), its control plane and REST API
//! (`control`, `api`), and TLS set-up (`tls`). The protocol is specified in
//! `docs/tunnel-protocol.md`, the REST API in `docs/tuna-api.md`. Every
//! module reports failures as the one [`Error`].

pub mod agent;
pub mod api;
pub mod budget;
pub mod control;
pub mod edge;
mod error;
pub mod fsutil;
pub mod mux;
pub mod tls;
pub mod wire;

pub use error::{Error, Result};
