//! The reservations family: the `controller` role and its reconcilers of
//! `Domain` and `TCPEndpoint`, which reserve names and ports at the edge and
//! release them through a finalizer (unless adopted or `Retain`).
//!
//! It knows the plan ([`crate::plan`]) for the pure checks, the edge API
//! ([`crate::edge::api`]) and the reconciler kit ([`crate::reconcile`]); it
//! opens no tunnel and must not know the agent, connectors or standalone.

pub mod domain;
pub mod role;
pub mod tcpendpoint;
