//! tuna-tunnel (placeholder until its issue lands; see DESIGN.md §2).

pub mod agent;
pub mod api;
pub mod control;
pub mod edge;
pub mod mux;
pub mod tls;
pub mod wire;
