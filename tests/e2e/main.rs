//! The root crate's end-to-end suites, one module each, in one test binary.
//!
//! One binary rather than one per suite: each root test executable links the
//! whole operator, Pingora, kube and tonic (~100 MB, tens of seconds of
//! linking on two cores), and the suites share `support` anyway.
//!
//! Run one suite alone with a filter on its module:
//! `cargo test --test e2e agent::` (or `chart_offline::`, `connector::trust::`,
//! …); `cargo test --test e2e -- --list` names every test.
//!
//! A suite must not depend on being alone in its process: the suites run side
//! by side on the harness's threads, so nothing here may set environment
//! variables, change the working directory or install a global subscriber.
//! Each process a test needs is its own child (see `support::Process`).
//!
//! A new suite joins with a file `tests/e2e/<suite>.rs` and a `mod <suite>;`
//! line below; it reaches the shared code as `crate::support`,
//! `crate::chart_support` and `crate::pg_support`.

mod chart_support;
// The PostgreSQL server the edge's store tests start (shared with edge/tests).
#[path = "../../edge/tests/pg_support/mod.rs"]
mod pg_support;
mod support;

mod agent;
mod chart;
mod chart_offline;
mod connector;
mod controller;
mod crds_drift;
mod csi;
mod edge_fleet;
mod edge_fleet_store;
mod gateway;
mod harness;
mod route_explain;
mod standalone;
mod standalone_cli;
mod standalone_provider;
mod standalone_remote;
