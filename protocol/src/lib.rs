//! What crosses the network between a cluster and a Tuna edge, and nothing
//! else: the tunnel's wire format ([`wire`]), the streams multiplexed over
//! one agent connection ([`mux`]), and the JSON bodies of the REST API
//! ([`api`]). The agent (`tuna-agent`) and the edge (`tuna-edge`) both speak
//! it; neither is here.
//!
//! # Contract
//!
//! - **One definition per message.** Every frame, stream header and REST
//!   body has one Rust type, encoded and decoded by the same code on both
//!   sides, so the two sides cannot drift apart. The prose specs are
//!   `docs/tunnel-protocol.md` (frames, handshake, streams) and
//!   `docs/tuna-api.md` (REST).
//! - **Bounded.** A frame's length is checked against [`wire::MAX_FRAME_LEN`]
//!   ([`wire::MAX_HELLO_LEN`] before authentication) before anything is
//!   allocated; the hello, an attach and the bindings of a tunnel have their
//!   own limits, checked on encode as on decode. Frame decoding is fuzzed
//!   (`protocol/fuzz`).
//! - **No I/O policy.** Functions here read and write a byte stream they are
//!   given (`AsyncRead`/`AsyncWrite`), and [`mux`] drives an h2 connection
//!   over one; they open no socket, set no timeout, retry nothing, load no
//!   certificate, keep no state beyond a connection. Dialling, TLS,
//!   handshake deadlines, reconnects and admission belong to the agent and
//!   the edge.
//! - **Values, not failures.** A peer's refusal ([`wire::Rejection`],
//!   [`wire::ErrorCode`]) and an API error body ([`api::ErrorBody`]) are
//!   values the protocol carries; [`Error`] is what went wrong reading or
//!   writing them.
//!
//! # May depend on
//!
//! `bytes`, `h2`, `http`, `serde`, `serde_json`, `time`, `thiserror`, and
//! tokio's I/O traits and channels only. Never an HTTP client or server
//! (`reqwest`, `hyper`, `axum`), TLS, a store (`redb`, `tokio-postgres`),
//! Kubernetes or Pingora: `.ci/run` checks it.

pub mod api;
mod error;
mod limits;
pub mod mux;
pub mod wire;

pub use error::{Error, Result};
