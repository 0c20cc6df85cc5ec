//! tuna-tunnel (placeholder until its issue lands; see DESIGN.md §2).
pub mod agent;
pub mod edge;
pub mod mux;
pub mod wire;
