//! The agent family: the `agent` role and what it alone runs — the Tunnel and
//! Ingress reconcilers and the state they share (reflector stores, the edge
//! account, the tunnels open through the [`crate::edge::publisher`]).
//!
//! It knows the plan ([`crate::plan`]), the edge client ([`crate::edge`]) and
//! the reconciler kit ([`crate::reconcile`]); it must not know the other
//! families (reservations, connectors, standalone), nor `route explain`.

pub mod claims;
pub mod gateway;
pub mod gateway_objects;
pub mod index;
pub mod ingress;
pub mod publish;
pub mod role;
pub mod state;
pub mod tunnel;
