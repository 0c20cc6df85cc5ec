//! The edge's bounds on agent connections, sessions and tunnels, in one
//! place (`docs/tunnel-protocol.md`, "Limits", lists them with their
//! defaults and `tuna-operator edge` flags).

use std::time::Duration;

use crate::control::RateLimit;
use crate::wire::PRE_AUTH_TIMEOUT;

/// Bounds the edge enforces on agents. The defaults suit one edge serving
/// many agents; the benchmark of 10 000 tunnels on one account fits them.
#[derive(Clone, Debug)]
pub struct EdgeLimits {
    /// Unauthenticated agent connections (TCP accept to a judged hello) at
    /// once, edge-wide; more are closed at accept.
    pub max_pending_handshakes: usize,
    /// The same, per client IP address.
    pub max_pending_handshakes_per_ip: usize,
    /// Time an unauthenticated connection gets from TCP accept to a judged hello.
    pub pre_auth_timeout: Duration,
    /// Failed tunnel authentications (bad, expired or revoked tokens in a
    /// hello or attach) per client IP: a token bucket; when it is empty the
    /// address is answered `rate_limited` without a look at its tokens.
    pub auth_failures: RateLimit,
    /// Control frames queued for an agent; an agent that lets more pile up
    /// (it does not read its control stream) loses its session.
    pub control_queue: usize,
    /// A control frame not written within this ends the session (an agent
    /// withholding flow-control window cannot stall the edge's session loop,
    /// which keeps handling revocations meanwhile).
    pub control_write_timeout: Duration,
    /// Opening a data stream waits at most this long for the agent to grant
    /// a stream (h2 concurrency); then the public client gets 502.
    pub open_stream_timeout: Duration,
    /// A session whose last tunnel is gone is closed after this long.
    pub empty_session_grace: Duration,
    /// Tunnels one tunnel token may have open at once, across sessions (an
    /// agent reconnecting overlaps its old session briefly). API-key grants
    /// are bounded by the account's quota only.
    pub max_tunnels_per_token: usize,
    /// Tunnels one account may have open at once.
    pub max_tunnels_per_account: usize,
    /// Sessions (agent connections) carrying tunnels of one account at once.
    pub max_sessions_per_account: usize,
    /// REST API connections: an HTTP/1.1 client must send each request's
    /// headers within this (an idle keep-alive connection closes after it);
    /// HTTP/2 connections are pinged at this interval and closed when a
    /// ping goes unanswered as long.
    pub api_header_timeout: Duration,
}

impl Default for EdgeLimits {
    fn default() -> Self {
        Self {
            max_pending_handshakes: 256,
            max_pending_handshakes_per_ip: 16,
            pre_auth_timeout: PRE_AUTH_TIMEOUT,
            auth_failures: RateLimit {
                burst: 30,
                per_second: 1.0,
            },
            control_queue: 16_384,
            control_write_timeout: Duration::from_secs(30),
            open_stream_timeout: Duration::from_secs(10),
            empty_session_grace: Duration::from_secs(30),
            max_tunnels_per_token: 4,
            max_tunnels_per_account: 20_000,
            max_sessions_per_account: 64,
            api_header_timeout: Duration::from_secs(30),
        }
    }
}

/// Raises this process's soft open-file limit (`RLIMIT_NOFILE`) to its hard
/// limit and returns the new soft limit: every connection the edge holds is
/// a descriptor, and the soft default (often 1024) is far below what a
/// replica serves. The hard limit is the operator's (systemd `LimitNOFILE`).
pub fn raise_fd_limit() -> std::io::Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(getrlimit(Resource::RLIMIT_NOFILE)?.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::resource::{Resource, getrlimit};

    /// Set in the child process the test runs under a low soft limit.
    const CHILD: &str = "TUNA_TEST_FD_LIMIT_CHILD";

    #[test]
    fn raise_fd_limit_reaches_the_hard_limit() {
        if std::env::var_os(CHILD).is_some() {
            assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (512, 4096));
            assert_eq!(raise_fd_limit().expect("raising RLIMIT_NOFILE"), 4096);
            assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (4096, 4096));
            return;
        }
        // In a process of its own, started with a soft limit below the hard
        // one (as a shell's default 1024 is): lowering this test process's
        // limit would starve the tests running beside it.
        let out = std::process::Command::new("prlimit")
            .arg("--nofile=512:4096")
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "edge::limits::tests::raise_fd_limit_reaches_the_hard_limit",
            ])
            .env(CHILD, "1")
            .output()
            .expect("prlimit (util-linux)");
        let log = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{log}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(log.contains("1 passed"), "the child ran the test: {log}");
    }
}
