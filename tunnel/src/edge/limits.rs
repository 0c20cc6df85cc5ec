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
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit for the call's duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit that outlives the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        limit = raised;
    }
    Ok(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raise_fd_limit_reaches_the_hard_limit() {
        let soft = raise_fd_limit().expect("raising RLIMIT_NOFILE");
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `limit` is a valid, writable rlimit for the call's duration.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        assert_eq!(soft, limit.rlim_cur);
        assert_eq!(limit.rlim_cur, limit.rlim_max);
    }
}
