//! The edge crate's suites over real sockets (the control API, the data
//! path, the edge's hardening, the store contract on redb and a real
//! PostgreSQL), one module each, in one test binary: one link instead of
//! twelve.
//!
//! One suite alone: `cargo test -p tuna-edge --test edge api_rest::`;
//! `cargo test -p tuna-edge --test edge -- --list` names every test.
//!
//! The suites run side by side on the harness's threads, so none may depend
//! on being alone in its process. `wire_alloc` does (it counts allocations
//! with its own global allocator) and stays a binary of its own.
//!
//! A new suite joins with a file `tests/edge/<suite>.rs`, a `mod <suite>;`
//! line below, and `use crate::api_support;` (or `data_support`,
//! `pg_support`) where it had `mod api_support;`. The support modules stay in
//! `tests/*_support/`, so a suite can also still be a file `tests/<suite>.rs`
//! of its own (`mod data_support;`): it then costs one more link.

#[path = "../api_support/mod.rs"]
mod api_support;
#[path = "../data_support/mod.rs"]
mod data_support;
#[path = "../pg_support/mod.rs"]
mod pg_support;

mod api_authority;
mod api_dns;
mod api_hardening;
mod api_persistence;
mod api_rest;
mod data_address;
mod data_edge_control;
mod data_fleet_revocation;
mod data_multi_tunnel;
mod data_relay;
mod data_tcp_owner;
mod data_tunnel;
mod edge_fd_budget;
mod edge_hardening;
mod edge_shared_source;
mod edge_store_flood;
mod store_contract;
