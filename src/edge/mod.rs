//! The edge as the operator sees it: the API that reserves names, ports and
//! tunnel tokens ([`api`]: the [`api::EdgeApi`] trait and its HTTP client), the
//! supervisor that keeps tunnels open and reports their state ([`publisher`]),
//! and the step that hands a tunnel's streams to the proxy core
//! ([`transport`]).
//!
//! Shared by the agent and standalone mode; it knows the plan's resolved
//! upstreams ([`crate::plan::service`]) and nothing of Kubernetes reconcilers.

pub mod api;
pub mod publisher;
pub mod transport;
