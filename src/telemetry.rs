//! Logging set-up shared by every subcommand.
//!
//! Whatever `RUST_LOG` asks, the targets in [`CAPPED`] log at `info` at
//! most: below it, Pingora writes request and response heads and bodies as
//! they go over the wire (`pingora_core::protocols::http::v1::client`
//! traces the upstream request head with the injected `Authorization`; the
//! body parsers trace chunks; `pingora_proxy` debugs whole requests and
//! body tasks), and `tokio_postgres` debugs every statement with its
//! parameters (key hashes, token labels, the store's change log). The cap
//! is a filter of its own, beside `RUST_LOG`'s, so no directive — however
//! specific — lifts it.
//!
//! Text lines are coloured only when standard error is a terminal and
//! `NO_COLOR` is unset or empty (<https://no-color.org>): a pipe, a file or
//! a log collector gets plain text.

use tracing::Level;
use tracing_subscriber::filter::{EnvFilter, FilterExt, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, fmt};

/// Crates whose logs below `info` may hold secrets (headers, bodies,
/// statement parameters): Pingora's (every crate of it, read in its sources
/// for v0.9: heads at `debug`/`trace` in `pingora_core` and
/// `pingora_proxy`, chunks in the body parsers) and tokio-postgres
/// (`query.rs` of 0.7: "executing statement … with parameters" at `debug`).
pub const CAPPED: &[&str] = &[
    "pingora",
    "pingora_cache",
    "pingora_core",
    "pingora_error",
    "pingora_header_serde",
    "pingora_http",
    "pingora_load_balancing",
    "pingora_pool",
    "pingora_proxy",
    "pingora_runtime",
    "pingora_rustls",
    "pingora_timeout",
    "tokio_postgres",
];

/// Whether an event of `target` at `level` may be logged at all.
pub fn allowed(target: &str, level: &Level) -> bool {
    let capped = CAPPED.iter().any(|c| {
        target
            .strip_prefix(c)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    });
    !capped || *level <= Level::INFO
}

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (for log collectors).
    Json,
}

/// Installs a `tracing` subscriber that writes to stderr, filtered by `RUST_LOG`
/// (default `info`). Calling it twice is harmless.
pub fn init() {
    init_with(LogFormat::Text);
}

/// Same as [`init`], in the given format.
pub fn init_with(format: LogFormat) {
    let env = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let filter = env.and(filter_fn(|meta| allowed(meta.target(), meta.level())));
    let layer = fmt::layer().with_writer(std::io::stderr).with_ansi(colour(
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::env::var_os("NO_COLOR").as_deref(),
    ));
    let layer = match format {
        LogFormat::Text => layer.boxed(),
        LogFormat::Json => layer.json().boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .try_init();
}

/// Whether text lines are coloured: on a terminal, unless `NO_COLOR` is
/// set to something.
fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pingora_logs_at_info_at_most_whatever_the_target() {
        for target in [
            "pingora_core::protocols::http::v1::client",
            "pingora_proxy",
            "pingora_core::protocols::http::v1::body",
        ] {
            assert!(allowed(target, &Level::INFO), "{target}");
            assert!(allowed(target, &Level::WARN), "{target}");
            assert!(!allowed(target, &Level::DEBUG), "{target}");
            assert!(!allowed(target, &Level::TRACE), "{target}");
        }
        for target in ["tuna_proxy::connect", "pingoraish", "kube_client", "log"] {
            assert!(allowed(target, &Level::TRACE), "{target}");
        }
    }

    #[test]
    fn statements_of_the_store_log_at_info_at_most() {
        for target in [
            "tokio_postgres::query",
            "tokio_postgres::prepare",
            "tokio_postgres",
        ] {
            assert!(allowed(target, &Level::INFO), "{target}");
            assert!(!allowed(target, &Level::DEBUG), "{target}");
        }
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
    }
}
