//! The proxy core's suites over real sockets, one module each, in one test
//! binary: each test executable links Pingora, hyper and rustls, so one link
//! instead of twelve.
//!
//! One suite alone: `cargo test -p tuna-proxy --test proxy fast_path::`;
//! `cargo test -p tuna-proxy --test proxy -- --list` names every test.
//!
//! The suites run side by side on the harness's threads, so none may depend
//! on being alone in its process. Two do and stay binaries of their own:
//! `tests/large_bodies.rs` reads the process's peak resident set, and
//! `tests/tracing_span.rs` sets a thread's default subscriber, which misses
//! the proxy's events once other tests' threads have registered the same
//! callsites (tracing's interest cache is per process: it failed here with
//! "no request event").
//! A new suite joins with a file `tests/proxy/<suite>.rs`, a `mod <suite>;`
//! line below, and `use crate::common;` for the shared helpers.

#[path = "../common/mod.rs"]
mod common;

mod connect_listener;
mod fast_path;
mod gateway_address;
mod gateway_https;
mod gateway_rules;
mod host_and_headers;
mod http_routing;
mod https_upstream;
mod live_swap;
mod shutdown;
mod tcp_and_streams;
mod through_the_edge;
mod upgrade_and_grpc;
mod upstream_errors;
